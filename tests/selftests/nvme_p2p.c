// SPDX-License-Identifier: GPL-2.0
/*
 * The GPUDirect Storage path without nvidia-fs: O_DIRECT I/O between the NVMe namespace and
 * the mmap of a p2pbuf buffer (device memory with p2pdma pages). O_DIRECT never bounces, so
 * a transfer that completes went between the drive and the device's BAR: the block layer
 * accepts p2pdma pages only for queues that support peer-to-peer DMA, and the driver's DMA
 * mapping fails when the topology has no P2P path (EINVAL on the root-port topology without
 * a Zen CPU, with the kernel naming the bridges in its log).
 *
 * Host-side half: "# hostcheck target=nvme|gpu offset=X len=N seed=S" lines; xtask checks the
 * NVMe backing file and the ivshmem backing file. And the proof that the drive moved the data
 * peer-to-peer: "# hostcheck target=nvmedma ..." lines make xtask read QEMU's trace of the
 * NVMe controller (pci_nvme_read/_write and the data addresses of each, pci_nvme_map_addr)
 * and check that every address it was given for the transfer lies inside the exporter's
 * buffer in the ivshmem BAR, and, as a control, that a host-memory transfer's lie outside
 * the BAR.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

#define LEN (4UL << 20)
#define NVME_OFF (8UL << 20)
/* The host-memory control's drive region. */
#define CTL_OFF (16UL << 20)
#define CTL_LEN (1UL << 20)

static int p2p_alloc(int dev, __u64 length, __u64 *offset)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = length };

	if (p2pbuf_test_alloc(dev, &a))
		return -errno;
	*offset = a.offset;
	return a.fd;
}

static const char *topology(void)
{
	static char buf[4096];
	FILE *f = fopen("/proc/cmdline", "r");

	if (!f || !fgets(buf, sizeof(buf), f)) {
		if (f)
			fclose(f);
		return "";
	}
	fclose(f);
	return strstr(buf, "p2pbuf.topology=rootports") ? "rootports" : "switch";
}

/* Start and end (exclusive) of the provider's BAR, from sysfs; 0 when unknown. */
static int provider_bar(int dev, unsigned long long *lo, unsigned long long *hi)
{
	struct p2pbuf_provider_info p = { .size = sizeof(p) };
	char path[4096];

	*lo = *hi = 0;
	if (p2pbuf_first_provider_info(dev, &p))
		return -errno;
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", p.pci_name);
	return p2pbuf_bar_range(path, (int)p.bar, lo, hi);
}

/*
 * Whether the drive sees the BAR at its CPU physical address: no IOMMU translating its DMA
 * (with one, a THRU_HOST_BRIDGE mapping hands it IOVAs), and x86, where bus addresses are
 * CPU physical addresses.
 */
static int bus_addr_is_phys(void)
{
	const char *iommu = getenv("P2PBUF_IOMMU");

	return !iommu || strcmp(iommu, "1");
}

static void dma_check(const char *op, unsigned long off, unsigned long len, const char *expect,
		      unsigned long long lo, unsigned long long hi)
{
	printf("# hostcheck target=nvmedma op=%s offset=%lu len=%lu expect=%s lo=%#llx hi=%#llx\n",
	       op, off, len, expect, lo, hi);
	fflush(stdout);
}

FIXTURE(nvme)
{
	int dev, nvme;
};

FIXTURE_SETUP(nvme)
{
	self->dev = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->dev, 0) TH_LOG("/dev/p2pbuf: %s", strerror(errno));
	self->nvme = open("/dev/nvme0n1", O_RDWR | O_DIRECT | O_CLOEXEC);
	if (self->nvme < 0)
		SKIP(return, "no /dev/nvme0n1: %s", strerror(errno));
}

FIXTURE_TEARDOWN(nvme)
{
	close(self->dev);
	p2pbuf_close(&self->nvme);
}

/* Device memory -> drive -> other device memory, with the CPU never touching the data. */
TEST_F(nvme, device_memory_round_trip)
{
	unsigned int seed = ((unsigned int)getpid() & 0x7f) + 1;
	struct p2pbuf_provider_info p = { .size = sizeof(p) };
	struct p2pbuf_buf buf[2];
	__u64 off_a, off_b;
	unsigned long long lo, hi;
	uint8_t *a, *b;
	ssize_t n;
	size_t i;

	/* Put the buffers at 1/2 of the BAR: below exporter_3_mmap.c's (3/4), above later tests' ones. */
	ASSERT_EQ(0, p2pbuf_first_provider_info(self->dev, &p));
	ASSERT_EQ(0, p2pbuf_devbuf_pair_at(self->dev, (p.total / 2) & ~4095ULL, LEN, buf));
	a = buf[0].map, off_a = buf[0].bar_offset;
	b = buf[1].map, off_b = buf[1].bar_offset;
	for (i = 0; i < LEN; i++)
		a[i] = p2pbuf_pattern(i, seed);

	n = pwrite(self->nvme, a, LEN, NVME_OFF);
	if (n < 0 && (errno == EREMOTEIO || errno == EINVAL) && !strcmp(topology(), "rootports")) {
		/*
		 * No P2P path between drive and memory: refused, not bounced. Measured on the
		 * root-port topology with -cpu max: EINVAL from the NVMe driver's DMA mapping, and
		 * the kernel logs which bridges block the path.
		 */
		TH_LOG("refused as expected on the root-port topology: %s", strerror(errno));
		goto out;
	}
	ASSERT_EQ((ssize_t)LEN, n) TH_LOG("O_DIRECT write from device memory: %s", strerror(errno));
	ASSERT_EQ(0, fsync(self->nvme));
	n = pread(self->nvme, b, LEN, NVME_OFF);
	ASSERT_EQ((ssize_t)LEN, n) TH_LOG("O_DIRECT read into device memory: %s", strerror(errno));
	for (i = 0; i < LEN; i++)
		ASSERT_EQ(p2pbuf_pattern(i, seed), b[i]) TH_LOG("byte %zu", i);
	printf("# hostcheck target=nvme offset=%lu len=%lu seed=%u\n", NVME_OFF, LEN, seed);
	printf("# hostcheck target=gpu offset=%llu len=%lu seed=%u\n", (unsigned long long)off_b,
	       LEN, seed);
	fflush(stdout);
	/* The drive's own view: it was handed the buffers' BAR addresses, nothing else. */
	if (!provider_bar(self->dev, &lo, &hi) && bus_addr_is_phys()) {
		TH_LOG("BAR %#llx-%#llx: wrote from +%#llx, read into +%#llx", lo, hi - 1,
		       (unsigned long long)off_a, (unsigned long long)off_b);
		dma_check("write", NVME_OFF, LEN, "p2p", lo + off_a, lo + off_a + LEN);
		dma_check("read", NVME_OFF, LEN, "p2p", lo + off_b, lo + off_b + LEN);
	}
out:
	p2pbuf_buf_free(&buf[0]);
	p2pbuf_buf_free(&buf[1]);
}

/*
 * The control for the trace check: the same O_DIRECT transfers through host memory reach the
 * drive as addresses outside the device memory's BAR. (If the check could not tell the two
 * apart, this would fail together with the peer-to-peer one passing.)
 */
TEST_F(nvme, host_memory_control)
{
	unsigned int seed = ((unsigned int)getpid() & 0x7f) + 9;
	unsigned long long lo, hi;
	uint8_t *h;
	size_t i;

	ASSERT_EQ(0, provider_bar(self->dev, &lo, &hi));
	ASSERT_EQ(0, posix_memalign((void **)&h, 4096, CTL_LEN));
	for (i = 0; i < CTL_LEN; i++)
		h[i] = p2pbuf_pattern(i, seed);
	ASSERT_EQ((ssize_t)CTL_LEN, pwrite(self->nvme, h, CTL_LEN, CTL_OFF));
	memset(h, 0, CTL_LEN);
	ASSERT_EQ((ssize_t)CTL_LEN, pread(self->nvme, h, CTL_LEN, CTL_OFF));
	for (i = 0; i < CTL_LEN; i++)
		ASSERT_EQ(p2pbuf_pattern(i, seed), h[i]) TH_LOG("byte %zu", i);
	dma_check("write", CTL_OFF, CTL_LEN, "host", lo, hi);
	dma_check("read", CTL_OFF, CTL_LEN, "host", lo, hi);
	printf("# hostcheck target=nvme offset=%lu len=%lu seed=%u\n", CTL_OFF, CTL_LEN, seed);
	free(h);
}

/* Unaligned O_DIRECT is refused by the block layer, as for host memory. */
TEST_F(nvme, unaligned_direct_io_refused)
{
	__u64 off = 0;
	uint8_t *a;
	int fa;

	fa = p2p_alloc(self->dev, 1UL << 20, &off);
	ASSERT_GE(fa, 0);
	a = mmap(NULL, 1UL << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fa, 0);
	ASSERT_NE(MAP_FAILED, a);
	EXPECT_ERRNO(EINVAL, pread(self->nvme, a + 1, 4096, 0));
	munmap(a, 1UL << 20);
	close(fa);
}

TEST_HARNESS_MAIN

// SPDX-License-Identifier: GPL-2.0
/*
 * The NVMe controller memory buffer (CMB) as a second peer-to-peer provider. The nvme driver
 * registers the CMB as p2pdma memory and publishes it; the kernel's p2pdma sysfs allocator
 * (/sys/bus/pci/devices/<nvme>/p2pmem/allocate: mmap allocates, munmap frees) hands it to
 * user space, where O_DIRECT moves data between the namespace and the CMB, and between the
 * CMB and the exporter's device memory (through the drive: CMB -> namespace -> device memory
 * and back), all verified by the CPU here and by the host (NVMe backing file, ivshmem file).
 *
 * Each transfer also asks the host to check the NVMe controller's own view from QEMU's trace
 * ("# hostcheck target=nvmedma ...", xtask/src/judge/hostcheck.rs): every data address the drive
 * was given for that command lies in the CMB (expect=cmb: the controller recognised its own
 * memory, pci_nvme_map_addr_cmb), in the exporter's buffer (expect=p2p), or, for the control
 * transfer through host memory, outside both BARs (expect=host).
 *
 * Map types (kernel p2pdma): the CMB seen from its own controller is PCI_P2PDMA_MAP_BUS_ADDR
 * (provider = client, distance 0); CMB and ivshmem behind one switch are BUS_ADDR too.
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

#define MIB (1UL << 20)
#define LEN (2 * MIB)
/* Drive regions of this test (byte offsets), apart from every other test's. */
#define R_HOST (96 * MIB)
#define R_CMB (100 * MIB)
#define R_DEV (104 * MIB)
#define R_DEV2 (108 * MIB)

static void fill(uint8_t *p, size_t len, unsigned int seed)
{
	size_t i;

	for (i = 0; i < len; i++)
		p[i] = p2pbuf_pattern(i, seed);
}

/* Index of the first byte that differs from the pattern, or -1. */
static long check(const uint8_t *p, size_t len, unsigned int seed)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i] != p2pbuf_pattern(i, seed))
			return (long)i;
	return -1;
}

/* The PCI device of /dev/nvme0n1's controller, as a sysfs path. */
static int nvme_pci(char *path, size_t len)
{
	char link[PATH_MAX];

	if (!realpath("/sys/class/nvme/nvme0/device", link))
		return -errno;
	snprintf(path, len, "%s", link);
	return 0;
}

/* The BAR of `dev` that contains the p2pmem (the one of p2pmem/size bytes or more). */
static int cmb_bar(const char *dev, unsigned long long size, unsigned long long *lo,
		   unsigned long long *hi)
{
	int bar;

	for (bar = 0; bar < 6; bar++)
		if (!p2pbuf_bar_range(dev, bar, lo, hi) && *hi - *lo >= size && bar != 0)
			return bar;
	return -ENOENT;
}

static unsigned long long sysfs_ull(const char *dev, const char *file)
{
	char path[PATH_MAX + 64], s[64] = "";
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dev, file);
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (!fgets(s, sizeof(s), f))
		s[0] = 0;
	fclose(f);
	return strtoull(s, NULL, 0);
}

static void trace_check(const char *op, size_t off, size_t len, const char *expect,
			unsigned long long lo, unsigned long long hi)
{
	printf("# hostcheck target=nvmedma op=%s offset=%zu len=%zu expect=%s lo=%#llx hi=%#llx\n",
	       op, off, len, expect, lo, hi);
	fflush(stdout);
}

FIXTURE(cmb)
{
	char dev[PATH_MAX];
	char alloc[PATH_MAX + 32];
	int nvme, afd;
	unsigned long long lo, hi;	/* the CMB's BAR */
	unsigned long long size;
	uint8_t *cmb;	/* LEN bytes of it */
};

FIXTURE_SETUP(cmb)
{
	int bar;

	self->afd = -1;
	self->cmb = MAP_FAILED;
	self->nvme = open("/dev/nvme0n1", O_RDWR | O_DIRECT | O_CLOEXEC);
	if (self->nvme < 0)
		SKIP(return, "no /dev/nvme0n1: %s", strerror(errno));
	ASSERT_EQ(0, nvme_pci(self->dev, sizeof(self->dev)));
	snprintf(self->alloc, sizeof(self->alloc), "%s/p2pmem/allocate", self->dev);
	self->afd = open(self->alloc, O_RDWR | O_CLOEXEC);
	if (self->afd < 0)
		SKIP(return, "p2pmem/allocate: %s (no CMB registered as p2pmem)", strerror(errno));
	self->size = sysfs_ull(self->dev, "p2pmem/size");
	bar = cmb_bar(self->dev, self->size, &self->lo, &self->hi);
	ASSERT_GE(bar, 0);
	TH_LOG("CMB: %llu bytes of p2pmem, %llu available, BAR%d %#llx-%#llx", self->size,
	       sysfs_ull(self->dev, "p2pmem/available"), bar, self->lo, self->hi - 1);
	self->cmb = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, self->afd, 0);
	ASSERT_NE(MAP_FAILED, self->cmb) TH_LOG("mmap of p2pmem/allocate: %s", strerror(errno));
}

FIXTURE_TEARDOWN(cmb)
{
	if (self->cmb != MAP_FAILED)
		munmap(self->cmb, LEN);
	p2pbuf_close(&self->afd);
	p2pbuf_close(&self->nvme);
}

/* The allocator: mmap takes CMB memory, munmap gives it back; misuse is refused. */
TEST_F(cmb, allocator_accounting_and_errors)
{
	unsigned long long before = sysfs_ull(self->dev, "p2pmem/available"), avail;
	void *p;

	p = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_SHARED, self->afd, 0);
	ASSERT_NE(MAP_FAILED, p);
	EXPECT_EQ(before - MIB, sysfs_ull(self->dev, "p2pmem/available"));
	/* Freshly allocated CMB memory is readable and writable by the CPU. */
	memset(p, 0x5a, MIB);
	EXPECT_EQ(0x5a, ((volatile uint8_t *)p)[MIB - 1]);
	munmap(p, MIB);
	EXPECT_EQ(before, sysfs_ull(self->dev, "p2pmem/available"));
	/* Private mappings and offsets are refused; so is more than there is. */
	EXPECT_EQ(MAP_FAILED, mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE, self->afd, 0));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_SHARED, self->afd, MIB));
	EXPECT_EQ(EINVAL, errno);
	avail = sysfs_ull(self->dev, "p2pmem/available");
	EXPECT_EQ(MAP_FAILED, mmap(NULL, (avail + 2 * MIB) & ~(MIB - 1), PROT_READ | PROT_WRITE,
				   MAP_SHARED, self->afd, 0));
	EXPECT_EQ(ENOMEM, errno);
	EXPECT_EQ(avail, sysfs_ull(self->dev, "p2pmem/available"));
}

/* Namespace <-> CMB, with a host-memory transfer as the control. */
TEST_F(cmb, namespace_to_cmb_and_back)
{
	unsigned int seed = ((unsigned int)getpid() & 0x3f) + 3;
	uint8_t *host;
	long bad;

	ASSERT_EQ(0, posix_memalign((void **)&host, 4096, LEN));
	/* Host memory -> drive (the control: not in the CMB). */
	fill(host, LEN, seed);
	ASSERT_EQ((ssize_t)LEN, pwrite(self->nvme, host, LEN, R_HOST));
	trace_check("write", R_HOST, LEN, "host", self->lo, self->hi);
	/* Drive -> CMB: the controller writes into its own memory. */
	memset(self->cmb, 0, LEN);
	ASSERT_EQ((ssize_t)LEN, pread(self->nvme, self->cmb, LEN, R_HOST))
		TH_LOG("O_DIRECT read into the CMB: %s", strerror(errno));
	trace_check("read", R_HOST, LEN, "cmb", self->lo, self->hi);
	bad = check(self->cmb, LEN, seed);
	EXPECT_EQ(-1, bad) TH_LOG("CMB byte %ld", bad);
	/* CMB -> drive, another region; the host checks the backing file. */
	fill(self->cmb, LEN, seed + 1);
	ASSERT_EQ((ssize_t)LEN, pwrite(self->nvme, self->cmb, LEN, R_CMB))
		TH_LOG("O_DIRECT write from the CMB: %s", strerror(errno));
	ASSERT_EQ(0, fsync(self->nvme));
	trace_check("write", R_CMB, LEN, "cmb", self->lo, self->hi);
	printf("# hostcheck target=nvme offset=%lu len=%lu seed=%u\n", R_CMB, LEN, seed + 1);
	/* And back into host memory. */
	memset(host, 0, LEN);
	ASSERT_EQ((ssize_t)LEN, pread(self->nvme, host, LEN, R_CMB));
	bad = check(host, LEN, seed + 1);
	EXPECT_EQ(-1, bad) TH_LOG("byte %ld read back from the drive", bad);
	free(host);
}

/* Exporter device memory -> drive -> CMB -> drive -> other device memory. */
TEST_F(cmb, cmb_and_device_memory)
{
	struct p2pbuf_provider_info p = { .size = sizeof(p) };
	unsigned int seed = ((unsigned int)getpid() & 0x3f) + 71;
	unsigned long long glo, ghi;
	char gdev[PATH_MAX];
	struct p2pbuf_buf buf[2];
	__u64 off_a, off_b;
	const char *iommu = getenv("P2PBUF_IOMMU");
	/* With an IOMMU the drive gets IOVAs for the device memory, not its BAR addresses. */
	int phys = !iommu || strcmp(iommu, "1");
	ssize_t n;
	int p2p;
	uint8_t *a, *b;
	long bad;

	p2p = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	if (p2p < 0)
		SKIP(return, "/dev/p2pbuf: %s", strerror(errno));
	ASSERT_EQ(0, p2pbuf_first_provider_info(p2p, &p));
	snprintf(gdev, sizeof(gdev), "/sys/bus/pci/devices/%s", p.pci_name);
	ASSERT_EQ(0, p2pbuf_bar_range(gdev, (int)p.bar, &glo, &ghi));
	/* Buffers at 5/8 of the BAR, where no other test of the boot puts its own. */
	ASSERT_EQ(0, p2pbuf_devbuf_pair_at(p2p, (p.total / 8 * 5) & ~4095ULL, LEN, buf));
	a = buf[0].map, off_a = buf[0].bar_offset;
	b = buf[1].map, off_b = buf[1].bar_offset;
	TH_LOG("device memory %s BAR%u %#llx-%#llx, buffers at +%#llx and +%#llx", p.pci_name,
	       p.bar, glo, ghi - 1, (unsigned long long)off_a, (unsigned long long)off_b);

	fill(a, LEN, seed);
	n = pwrite(self->nvme, a, LEN, R_DEV);
	if (n < 0 && (errno == EREMOTEIO || errno == EINVAL)) {
		/* No P2P path between drive and device memory on this fabric. */
		TH_LOG("device memory -> drive refused: %s", strerror(errno));
		goto out;
	}
	ASSERT_EQ((ssize_t)LEN, n) TH_LOG("O_DIRECT write from device memory: %s", strerror(errno));
	if (phys)
		trace_check("write", R_DEV, LEN, "p2p", glo + off_a, glo + off_a + LEN);
	memset(self->cmb, 0, LEN);
	ASSERT_EQ((ssize_t)LEN, pread(self->nvme, self->cmb, LEN, R_DEV));
	trace_check("read", R_DEV, LEN, "cmb", self->lo, self->hi);
	bad = check(self->cmb, LEN, seed);
	EXPECT_EQ(-1, bad) TH_LOG("CMB byte %ld", bad);
	ASSERT_EQ((ssize_t)LEN, pwrite(self->nvme, self->cmb, LEN, R_DEV2));
	ASSERT_EQ(0, fsync(self->nvme));
	trace_check("write", R_DEV2, LEN, "cmb", self->lo, self->hi);
	ASSERT_EQ((ssize_t)LEN, pread(self->nvme, b, LEN, R_DEV2));
	if (phys)
		trace_check("read", R_DEV2, LEN, "p2p", glo + off_b, glo + off_b + LEN);
	bad = check(b, LEN, seed);
	EXPECT_EQ(-1, bad) TH_LOG("device memory byte %ld", bad);
	printf("# hostcheck target=nvme offset=%lu len=%lu seed=%u\n", R_DEV2, LEN, seed);
	printf("# hostcheck target=gpu offset=%llu len=%lu seed=%u\n", (unsigned long long)off_b,
	       LEN, seed);
	fflush(stdout);
out:
	p2pbuf_buf_free(&buf[0]);
	p2pbuf_buf_free(&buf[1]);
	close(p2p);
}

TEST_HARNESS_MAIN

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
 * NVMe backing file and the ivshmem backing file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"

#define LEN (4UL << 20)
#define NVME_OFF (8UL << 20)

static uint8_t pat(size_t i, unsigned int seed)
{
	return (uint8_t)(i * 13 + seed + (i >> 12));
}

static int p2p_alloc(int dev, __u64 length, __u64 *offset)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = length };

	if (ioctl(dev, P2PBUF_IOCTL_ALLOC, &a))
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
	if (self->nvme >= 0)
		close(self->nvme);
}

/* Device memory -> drive -> other device memory, with the CPU never touching the data. */
TEST_F(nvme, device_memory_round_trip)
{
	unsigned int seed = ((unsigned int)getpid() & 0x7f) + 1;
	__u64 off_a = 0, off_b = 0;
	uint8_t *a, *b;
	ssize_t n;
	size_t i;
	int fa, fb;

	struct p2pbuf_provider_info p = { .size = sizeof(p) };
	__u64 spacer_off;
	int spacer;

	/* Put the buffers at 1/2 of the BAR: below exporter.c's (3/4), above later tests' ones. */
	ASSERT_EQ(0, ioctl(self->dev, P2PBUF_IOCTL_PROVIDER_INFO, &p));
	spacer = p2p_alloc(self->dev, (p.total / 2) & ~4095ULL, &spacer_off);
	ASSERT_GE(spacer, 0);
	fa = p2p_alloc(self->dev, LEN, &off_a);
	fb = p2p_alloc(self->dev, LEN, &off_b);
	close(spacer);
	ASSERT_GE(fa, 0);
	ASSERT_GE(fb, 0);
	a = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fa, 0);
	b = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fb, 0);
	ASSERT_NE(MAP_FAILED, a);
	ASSERT_NE(MAP_FAILED, b);
	for (i = 0; i < LEN; i++)
		a[i] = pat(i, seed);

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
		ASSERT_EQ(pat(i, seed), b[i]) TH_LOG("byte %zu", i);
	printf("# hostcheck target=nvme offset=%lu len=%lu seed=%u\n", NVME_OFF, LEN, seed);
	printf("# hostcheck target=gpu offset=%llu len=%lu seed=%u\n", (unsigned long long)off_b,
	       LEN, seed);
	fflush(stdout);
out:
	munmap(a, LEN);
	munmap(b, LEN);
	close(fa);
	close(fb);
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
	EXPECT_EQ(-1, pread(self->nvme, a + 1, 4096, 0));
	EXPECT_EQ(EINVAL, errno);
	munmap(a, 1UL << 20);
	close(fa);
}

TEST_HARNESS_MAIN

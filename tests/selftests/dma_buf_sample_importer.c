// SPDX-License-Identifier: GPL-2.0
/*
 * The in-tree user of the Rust dma-buf importer: samples/rust/rust_dma_buf_importer.rs (series
 * 4, last patch), bound to the lab's edu device in place of p2pbuf_dma, copying between system
 * memory (udmabuf) and the exporter sample's device memory (ivshmem's BAR, lent to
 * rust_dma_buf_exporter in place of p2pbuf_exporter). Its one ioctl and every errno it
 * documents, data in and out of the BAR in several engine steps at odd offsets, and the revoke:
 * the exporter unbound after a copy and during one, and the importer itself unbound with its
 * misc device open. Both devices go back to the lab's drivers after every test.
 *
 * Runs on the engine boot only (its name starts with dma_buf_sample): each engine transfer takes
 * 100 ms of QEMU's virtual clock.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "p2pbuf_test.h"
#include "dma_buf_sample.h"

/* The lab runs QEMU's edu with dma_mask=~0 (xtask/src/vm/qemu.rs): the engine reaches 64 bits. */
#define IMPORTER_PARAMS "dma_bits=64"

/* Modules this test loaded, to unload when it ends. */
static int loaded_exporter, loaded_dma, loaded_sample, loaded_importer;

__attribute__((constructor)) static void load_modules(void)
{
	/* The lab's drivers first: they take the devices, which the tests lend to the samples. */
	loaded_exporter = p2pbuf_load_module("p2pbuf_exporter");
	loaded_dma = p2pbuf_load_module("p2pbuf_dma");
	loaded_sample = p2pbuf_load_module(SAMPLE);
	loaded_importer = p2pbuf_load_module_params(SAMPLE_IMPORTER, IMPORTER_PARAMS);
}

__attribute__((destructor)) static void unload_modules(void)
{
	p2pbuf_unload_module(SAMPLE_IMPORTER, loaded_importer);
	p2pbuf_unload_module(SAMPLE, loaded_sample);
	p2pbuf_unload_module("p2pbuf_dma", loaded_dma);
	p2pbuf_unload_module("p2pbuf_exporter", loaded_exporter);
}

/* COPY of len bytes from dma-buf src at src_off to dma-buf dst at dst_off: 0 or -errno. */
static int importer_copy(int dev, int src, __u64 src_off, int dst, __u64 dst_off, __u64 len)
{
	struct rust_dma_buf_importer_copy c = {
		.src_fd = src, .dst_fd = dst, .src_offset = src_off, .dst_offset = dst_off, .len = len,
	};

	return ioctl(dev, RUST_DMA_BUF_IMPORTER_COPY, &c) ? -errno : 0;
}

/* Byte i of what the tests copy: the lab's pattern (p2pbuf_pattern.h), seed 5. */
#define pattern(i) p2pbuf_pattern(i, 5)

/* How many of len bytes at p differ from the pattern from byte `from` on. */
static size_t pattern_misses(const uint8_t *p, size_t len, size_t from)
{
	size_t i, bad = 0;

	for (i = 0; i < len; i++)
		bad += p[i] != pattern(from + i);
	return bad;
}

FIXTURE(sample_importer)
{
	char ivshmem[64];	/* lent to rust_dma_buf_exporter */
	char edu[64];		/* lent to rust_dma_buf_importer */
	int exporter;		/* /dev/rust-dma-buf-exporter */
	int dev;		/* /dev/rust-dma-buf-importer */
	struct p2pbuf_buf a, b;	/* system memory, 3 pages each */
};

/* Lends ivshmem and edu to the samples, opens both, and allocates two udmabufs. */
FIXTURE_SETUP(sample_importer)
{
	int r;

	self->exporter = self->dev = -1;
	self->a.fd = self->a.memfd = self->b.fd = self->b.memfd = -1;
	ASSERT_EQ(0, p2pbuf_pci_find("0x1af4", "0x1110", self->ivshmem, sizeof(self->ivshmem)))
		TH_LOG("no ivshmem device in this VM");
	ASSERT_EQ(0, p2pbuf_pci_find("0x1234", "0x11e8", self->edu, sizeof(self->edu)))
		TH_LOG("no edu device in this VM");
	ASSERT_EQ(0, access(SAMPLE_IMPORTER_DRV, F_OK))
		TH_LOG(SAMPLE_IMPORTER " is not loaded: is CONFIG_SAMPLE_RUST_DMA_BUF_IMPORTER=m "
		       "built and in /lib/modules/p2pbuf?");
	ASSERT_EQ(0, access(SAMPLE_DRV, F_OK)) TH_LOG(SAMPLE " is not loaded");
	r = lend_device(self->ivshmem, EXPORTER_DRV, SAMPLE_DRV);
	ASSERT_EQ(0, r) TH_LOG("lend %s to " SAMPLE ": %s", self->ivshmem, strerror(-r));
	r = lend_device(self->edu, IMPORTER_DRV, SAMPLE_IMPORTER_DRV);
	ASSERT_EQ(0, r) TH_LOG("lend %s to " SAMPLE_IMPORTER ": %s", self->edu, strerror(-r));
	self->exporter = open(SAMPLE_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, self->exporter) TH_LOG(SAMPLE_DEV ": %s", strerror(errno));
	self->dev = open(SAMPLE_IMPORTER_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, self->dev) TH_LOG(SAMPLE_IMPORTER_DEV ": %s", strerror(errno));
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&self->a, 3 * PAGE));
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&self->b, 3 * PAGE));
}

/* Gives the devices back to p2pbuf_dma and p2pbuf_exporter, whatever the test left. */
FIXTURE_TEARDOWN(sample_importer)
{
	p2pbuf_buf_free(&self->a);
	p2pbuf_buf_free(&self->b);
	p2pbuf_close(&self->dev);
	p2pbuf_close(&self->exporter);
	return_device(_metadata, SAMPLE_IMPORTER_DRV, self->edu, IMPORTER_DRV);
	return_device(_metadata, SAMPLE_DRV, self->ivshmem, EXPORTER_DRV);
}

/* Every errno of the sample's documentation; a refused copy writes nothing. */
TEST_F(sample_importer, bad_arguments)
{
	int a = self->a.fd, b = self->b.fd;
	size_t i, changed = 0;

	for (i = 0; i < PAGE; i++)
		self->a.map[i] = pattern(i);
	memset(self->b.map, 0x5a, 3 * PAGE);

	EXPECT_EQ(-EINVAL, importer_copy(self->dev, a, 0, b, 0, 0));
	EXPECT_EQ(-EINVAL, importer_copy(self->dev, a, 0, b, 0, (1 << 20) + 1));
	EXPECT_EQ(-EBADF, importer_copy(self->dev, -1, 0, b, 0, 16));
	EXPECT_EQ(-EBADF, importer_copy(self->dev, a, 0, 4096, 0, 16));
	/* An open fd that is not a dma-buf. */
	EXPECT_EQ(-EINVAL, importer_copy(self->dev, self->dev, 0, b, 0, 16));
	/* Ranges beyond their buffer, and offsets whose end overflows. */
	EXPECT_EQ(-EINVAL, importer_copy(self->dev, a, 3 * PAGE, b, 0, 1));
	EXPECT_EQ(-EINVAL, importer_copy(self->dev, a, 0, b, 2 * PAGE + 1, PAGE));
	EXPECT_EQ(-EINVAL, importer_copy(self->dev, a, UINT64_MAX, b, 0, 16));
	EXPECT_EQ(-EINVAL, importer_copy(self->dev, a, 0, b, UINT64_MAX - 8, 16));
	/* Overlapping ranges of one buffer (the engine's window is not a memmove). */
	EXPECT_EQ(-EINVAL, importer_copy(self->dev, a, 0, a, 100, 200));
	EXPECT_EQ(-EINVAL, importer_copy(self->dev, a, 100, a, 0, 200));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IO('|', 0x92)));
	for (i = 0; i < 3 * PAGE; i++)
		changed += self->b.map[i] != 0x5a;
	EXPECT_EQ(0UL, changed) TH_LOG("a refused copy wrote into the destination");

	/* Ranges of one buffer that do not overlap are fine. */
	ASSERT_EQ(0, importer_copy(self->dev, a, 0, a, PAGE, 200));
	EXPECT_EQ(0UL, pattern_misses(self->a.map + PAGE, 200, 0));
}

/*
 * System memory -> the exporter sample's BAR -> system memory, 2 pages and 123 bytes (three
 * engine steps) at odd offsets: the bytes arrive in the BAR (read through the buffer's mapping)
 * and come back; the bytes around the ranges are untouched.
 */
TEST_F(sample_importer, copies_through_device_memory)
{
	size_t len = 2 * PAGE + 123, i, outside = 0;
	uint8_t *m;
	int d;

	d = sample_export(self->exporter, 3 * PAGE, 0);
	ASSERT_LE(0, d) TH_LOG("export: %s", strerror(-d));
	m = sample_mmap(d, 3 * PAGE, 0);
	ASSERT_NE(NULL, m) TH_LOG("mmap of the sample's buffer: %s", strerror(errno));
	for (i = 0; i < 3 * PAGE; i++)
		self->a.map[i] = pattern(i);
	memset(self->b.map, 0, 3 * PAGE);

	ASSERT_EQ(0, importer_copy(self->dev, self->a.fd, 7, d, 100, len));
	EXPECT_EQ(0UL, pattern_misses(m + 100, len, 7)) TH_LOG("in the BAR");
	ASSERT_EQ(0, importer_copy(self->dev, d, 100, self->b.fd, 1, len));
	EXPECT_EQ(0UL, pattern_misses(self->b.map + 1, len, 7)) TH_LOG("back in system memory");
	for (i = 0; i < 100; i++)
		outside += m[i] != 0;
	for (i = 100 + len; i < 3 * PAGE; i++)
		outside += m[i] != 0;
	outside += self->b.map[0] != 0;
	for (i = 1 + len; i < 3 * PAGE; i++)
		outside += self->b.map[i] != 0;
	EXPECT_EQ(0UL, outside) TH_LOG("bytes outside the ranges changed");

	munmap(m, 3 * PAGE);
	close(d);
}

/*
 * The exporter revokes (its device unbinds) while the importer holds the fd: every copy to or
 * from the buffer fails with ENODEV, and copies between other buffers still work.
 */
TEST_F(sample_importer, exporter_unbind_revokes)
{
	int d, r;

	d = sample_export(self->exporter, PAGE, 0);
	ASSERT_LE(0, d);
	ASSERT_EQ(0, importer_copy(self->dev, self->a.fd, 0, d, 0, PAGE));

	r = sysfs_write(SAMPLE_DRV "/unbind", self->ivshmem);
	ASSERT_EQ(0, r) TH_LOG("unbind " SAMPLE ": %s", strerror(-r));
	EXPECT_EQ(-ENODEV, importer_copy(self->dev, self->a.fd, 0, d, 0, PAGE));
	EXPECT_EQ(-ENODEV, importer_copy(self->dev, d, 0, self->b.fd, 0, PAGE));
	EXPECT_EQ(0, importer_copy(self->dev, self->a.fd, 0, self->b.fd, 0, PAGE));
	close(d);
}

struct copy_job {
	int dev, src, dst;
	__u64 len;
	int result;
};

static void *run_copy(void *arg)
{
	struct copy_job *j = arg;

	j->result = importer_copy(j->dev, j->src, 0, j->dst, 0, j->len);
	return NULL;
}

/*
 * The exporter unbinds during a 1 MiB copy into its BAR (257 engine steps): the unbind waits
 * for the step in flight, the copy ends with ENODEV, and nothing is reported on the console
 * (the boot fails on any KASAN, lockdep or DMA-API report).
 */
TEST_F_TIMEOUT(sample_importer, exporter_unbind_during_copy, 300)
{
	struct p2pbuf_buf big = { .fd = -1, .memfd = -1 };
	struct copy_job job = { .dev = self->dev, .len = 1 << 20 };
	pthread_t t;
	int d, r;

	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&big, 1 << 20));
	d = sample_export(self->exporter, 1 << 20, 0);
	ASSERT_LE(0, d) TH_LOG("export: %s", strerror(-d));
	job.src = big.fd;
	job.dst = d;
	ASSERT_EQ(0, pthread_create(&t, NULL, run_copy, &job));
	usleep(300 * 1000);
	r = sysfs_write(SAMPLE_DRV "/unbind", self->ivshmem);
	ASSERT_EQ(0, pthread_join(t, NULL));
	EXPECT_EQ(0, r) TH_LOG("unbind " SAMPLE ": %s", strerror(-r));
	EXPECT_EQ(-ENODEV, job.result) TH_LOG("copy across the unbind: %s", strerror(-job.result));
	close(d);
	p2pbuf_buf_free(&big);
}

/* Unbinds edu from the importer sample and loads the sample again with `params`: 0 or -1. */
static int reload_importer(const char *edu, const char *params)
{
	if (sysfs_write(SAMPLE_IMPORTER_DRV "/unbind", edu))
		return -1;
	if (system("rmmod " SAMPLE_IMPORTER))
		return -1;
	/* Its driver registration binds edu, which no driver has now. */
	return p2pbuf_load_module_params(SAMPLE_IMPORTER, params) == 1 ? 0 : -1;
}

/*
 * Loaded with dma_bits=32 (an engine that reaches 4 GiB), the sample refuses to aim the engine
 * at the BAR, which the lab places above 4 GiB: ERANGE, and nothing arrives there; system memory
 * still works. With QEMU's default dma_mask the model would truncate the address and write
 * below 4 GiB; the lab's model reaches 64 bits, so without the check (a mutant) the bytes
 * arrived in the BAR.
 */
TEST_F(sample_importer, wide_address_refused)
{
	unsigned long long lo, hi;
	char path[512];
	size_t i, nonzero = 0;
	uint8_t *m;
	int d;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", self->ivshmem);
	ASSERT_EQ(0, p2pbuf_bar_range(path, 2, &lo, &hi));
	if (hi < 1ULL << 32)
		SKIP(return, "BAR 2 lies below 4 GiB: nothing for a 32-bit engine to refuse");
	d = sample_export(self->exporter, PAGE, 0);
	ASSERT_LE(0, d);
	m = sample_mmap(d, PAGE, 0);
	ASSERT_NE(NULL, m);
	for (i = 0; i < PAGE; i++)
		self->a.map[i] = pattern(i);

	p2pbuf_close(&self->dev);
	ASSERT_EQ(0, reload_importer(self->edu, "dma_bits=32"));
	self->dev = open(SAMPLE_IMPORTER_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, self->dev) TH_LOG(SAMPLE_IMPORTER_DEV ": %s", strerror(errno));
	EXPECT_EQ(-ERANGE, importer_copy(self->dev, self->a.fd, 0, d, 0, PAGE));
	for (i = 0; i < PAGE; i++)
		nonzero += m[i] != 0;
	EXPECT_EQ(0UL, nonzero) TH_LOG("a refused copy wrote into the BAR");
	EXPECT_EQ(0, importer_copy(self->dev, self->a.fd, 0, self->b.fd, 0, PAGE));
	EXPECT_EQ(0UL, pattern_misses(self->b.map, PAGE, 0));

	p2pbuf_close(&self->dev);
	ASSERT_EQ(0, reload_importer(self->edu, IMPORTER_PARAMS));
	munmap(m, PAGE);
	close(d);
}

/*
 * The importer's own device unbinds with its misc device open: copies fail with ENODEV, the
 * misc device is gone, and the buffers the copies used are not held (their fds close as
 * usual).
 */
TEST_F(sample_importer, importer_unbind)
{
	int r;

	ASSERT_EQ(0, importer_copy(self->dev, self->a.fd, 0, self->b.fd, 0, PAGE));
	r = sysfs_write(SAMPLE_IMPORTER_DRV "/unbind", self->edu);
	ASSERT_EQ(0, r) TH_LOG("unbind " SAMPLE_IMPORTER ": %s", strerror(-r));
	EXPECT_EQ(-ENODEV, importer_copy(self->dev, self->a.fd, 0, self->b.fd, 0, PAGE));
	EXPECT_ERRNO(ENOENT, open(SAMPLE_IMPORTER_DEV, O_RDWR | O_CLOEXEC));
}

TEST_HARNESS_MAIN

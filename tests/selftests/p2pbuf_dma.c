// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf-dma: the DMA engine (QEMU's edu device, the FPGA stand-in) behind
 * /dev/p2pbuf-dma imports dma-buf fds and copies between them, verified byte for byte:
 * system memory (udmabuf) to system memory at sizes from 1 byte up and unaligned offsets,
 * every documented error, and, when the exporter's /dev/p2pbuf is there, device memory to
 * device memory, device to system and back, and a revoke in the middle of a copy.
 *
 * The engine moves at most 4095 bytes per transfer, and QEMU's model finishes each transfer
 * 100 ms after it starts, so a copy runs at 10 to 20 KiB/s: the largest system-memory copy is
 * 256 KiB unless the kernel command line says p2pbuf.importer_max_kib=N (cargo xtask test
 * --append p2pbuf.importer_max_kib=N).
 *
 * The test loads p2pbuf_dma (and p2pbuf_exporter) from /lib/modules/p2pbuf if they are
 * not loaded, and unloads what it loaded when it ends.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <linux/dma-buf.h>
#include <linux/udmabuf.h>

#include "kselftest_harness.h"

#if __has_include("uapi/linux/p2pbuf-dma.h")
#include "uapi/linux/p2pbuf.h"
#include "uapi/linux/p2pbuf-dma.h"
#include "p2pbuf_test.h"
#endif

#ifndef P2PBUF_DMA_IOCTL_COPY

TEST(p2pbuf_dma_uapi)
{
	SKIP(return, "no uapi/linux/p2pbuf-dma.h");
}

#else

#define PAGE 4096UL
#define DMA_DEV "/dev/p2pbuf-dma"

/* Modules this test loaded, to unload when it ends. */
static int loaded_dma, loaded_exporter;

__attribute__((constructor)) static void load_modules(void)
{
	loaded_exporter = p2pbuf_load_module("p2pbuf_exporter");
	loaded_dma = p2pbuf_load_module("p2pbuf_dma");
}

__attribute__((destructor)) static void unload_modules(void)
{
	p2pbuf_unload_module("p2pbuf_dma", loaded_dma);
	p2pbuf_unload_module("p2pbuf_exporter", loaded_exporter);
}

static uint8_t pat(size_t i, unsigned int seed)
{
	return (uint8_t)(i * 31 + seed + (i >> 11));
}

static void fill(struct p2pbuf_buf *b, unsigned int seed)
{
	size_t i;

	p2pbuf_cpu_access(b, 1);
	for (i = 0; i < b->size; i++)
		b->map[i] = pat(i, seed);
	p2pbuf_cpu_access(b, 0);
}

/*
 * Copies src[soff..+len] to dst[doff..+len] with the engine and checks dst byte for byte:
 * the range holds the source's bytes and everything around it is untouched. Returns the
 * number of bad bytes (0: good), or -errno if the copy failed.
 */
static long copy_and_check(struct __test_metadata *_metadata, int dev, struct p2pbuf_buf *src,
			   __u32 hs, size_t soff, struct p2pbuf_buf *dst, __u32 hd, size_t doff, size_t len,
			   unsigned int seed)
{
	struct p2pbuf_dma_copy a = {
		.src_handle = hs, .src_offset = soff,
		.dst_handle = hd, .dst_offset = doff, .len = len,
	};
	size_t i, bad = 0, first = 0;
	double t;
	long r;

	fill(src, seed);
	fill(dst, seed + 101);
	t = now();
	r = dma_copy_args(dev, &a);
	t = now() - t;
	if (r < 0) {
		TH_LOG("copy %zu bytes %zu -> %zu: %s (copied %llu)", len, soff, doff,
		       strerror((int)-r), (unsigned long long)a.copied);
		return r;
	}
	EXPECT_EQ((long)len, r);
	EXPECT_EQ((__u64)len, a.copied);
	p2pbuf_cpu_access(dst, 1);
	for (i = 0; i < dst->size; i++) {
		uint8_t want = (i >= doff && i < doff + len) ? pat(i - doff + soff, seed) :
							       pat(i, seed + 101);

		if (dst->map[i] != want && !bad++)
			first = i;
	}
	p2pbuf_cpu_access(dst, 0);
	if (bad)
		TH_LOG("copy %zu bytes %zu -> %zu: %zu bad bytes, first at %zu", len, soff, doff,
		       bad, first);
	else
		TH_LOG("copy %7zu bytes %5zu -> %5zu: ok, %u transfers, %.2f s (%.1f KiB/s)", len,
		       soff, doff, a.nr_transfers, t, len / 1024.0 / (t > 0 ? t : 1));
	return (long)bad;
}

/* Attached devices of the dma-buf fd as /sys/kernel/debug/dma_buf/bufinfo lists them. */
static int attached_devices(int fd)
{
	char line[512], ino[32];
	struct stat st;
	int in = 0, n = -1;
	FILE *f;

	if (fstat(fd, &st))
		return -1;
	snprintf(ino, sizeof(ino), "\t%08llu\t", (unsigned long long)st.st_ino);
	f = fopen("/sys/kernel/debug/dma_buf/bufinfo", "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (!in && strstr(line, ino) && line[0] != '\t')
			in = 1;
		else if (in && sscanf(line, "Total %d devices attached", &n) == 1)
			break;
	}
	fclose(f);
	return n;
}

static const char *map_type_name(__u32 t)
{
	switch (t) {
	case P2PBUF_DMA_MAP_HOST_MEMORY: return "HOST_MEMORY";
	case P2PBUF_DMA_MAP_BUS_ADDR: return "BUS_ADDR";
	case P2PBUF_DMA_MAP_THRU_HOST_BRIDGE: return "THRU_HOST_BRIDGE";
	default: return "UNKNOWN";
	}
}

struct bg_copy {
	int dev;
	struct p2pbuf_dma_copy a;
	long ret;
	volatile int done;	/* set once the copy returned */
};

static void *bg_copy_fn(void *arg)
{
	struct bg_copy *c = arg;

	c->ret = dma_copy_args(c->dev, &c->a);
	__atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* The bus-master bit (PCI_COMMAND_MASTER) of PCI function pci, from its config space: 1 or 0,
 * -1 if it cannot be read. */
static int bus_master(const char *pci)
{
	char path[128];
	uint16_t cmd;
	int fd, r;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/config", pci);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	r = pread(fd, &cmd, sizeof(cmd), 4) == sizeof(cmd) ? !!(cmd & 0x4) : -1;
	close(fd);
	return r;
}

FIXTURE(importer)
{
	int dev;
	struct p2pbuf_buf a, b;	/* two system-memory buffers */
	int ha, hb;
};

FIXTURE_SETUP(importer)
{
	size_t size = cmdline_ul("importer_max_kib", 256) * 1024 + 64 * 1024;
	int r;

	self->a.fd = self->b.fd = self->a.memfd = self->b.memfd = -1;
	self->dev = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	if (self->dev < 0)
		SKIP(return, DMA_DEV ": %s (no edu device 1234:11e8, or p2pbuf_dma not loaded)",
		     strerror(errno));
	r = p2pbuf_udmabuf_alloc(&self->a, size);
	if (r == -ENOENT)
		SKIP(return, "no /dev/udmabuf");
	ASSERT_EQ(0, r) TH_LOG("udmabuf: %s", strerror(-r));
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&self->b, size));
	self->ha = dma_import_out(self->dev, self->a.fd, NULL);
	ASSERT_GT(self->ha, 0) TH_LOG("import: %s", strerror(-self->ha));
	self->hb = dma_import_out(self->dev, self->b.fd, NULL);
	ASSERT_GT(self->hb, 0) TH_LOG("import: %s", strerror(-self->hb));
}

FIXTURE_TEARDOWN(importer)
{
	p2pbuf_buf_free(&self->a);
	p2pbuf_buf_free(&self->b);
	p2pbuf_close(&self->dev);
}

TEST_F(importer, import_reports_the_buffer)
{
	struct p2pbuf_dma_import info = { 0 };
	struct stat st;
	struct p2pbuf_buf c;
	int h;

	/* The device node is root's only. */
	ASSERT_EQ(0, stat(DMA_DEV, &st));
	EXPECT_EQ(0600U, st.st_mode & 0777);
	EXPECT_EQ(0U, st.st_uid);
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&c, 3 * PAGE));
	h = dma_import_out(self->dev, c.fd, &info);
	ASSERT_GT(h, 0);
	EXPECT_NE(self->ha, h);
	EXPECT_NE(self->hb, h);
	EXPECT_EQ(3 * PAGE, info.length);
	EXPECT_EQ(P2PBUF_DMA_MAP_HOST_MEMORY, info.map_type);
	EXPECT_GE(info.nr_ranges, 1U);
	EXPECT_LE(info.nr_ranges, 3U);
	/* The engine's PCI device is attached, and only while imported. */
	EXPECT_EQ(1, attached_devices(c.fd));
	EXPECT_EQ(0, dma_release(self->dev, h));
	EXPECT_EQ(0, attached_devices(c.fd));
	p2pbuf_buf_free(&c);
}

TEST_F_TIMEOUT(importer, copy_system_memory_sizes_and_offsets, 600)
{
	struct { size_t len, soff, doff; } c[] = {
		{ 1, 0, 0 },
		{ 1, PAGE - 1, PAGE - 1 },
		{ 7, 13, PAGE - 3 },
		{ PAGE - 1, 3, 5 },
		{ PAGE, 0, 0 },
		{ PAGE, 1, PAGE - 1 },
		{ PAGE + 1, PAGE - 1, 2 },
		{ 3 * PAGE + 5, 100, 7 },
		{ 16 * PAGE + 123, 777, 3333 },
		{ cmdline_ul("importer_max_kib", 256) * 1024, 0, 0 },
	};
	size_t i;

	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++)
		ASSERT_EQ(0, copy_and_check(_metadata, self->dev, &self->a, self->ha, c[i].soff,
					    &self->b, self->hb, c[i].doff, c[i].len, (unsigned int)i));
}

TEST_F(importer, copy_within_one_buffer)
{
	fill(&self->a, 5);
	/* Disjoint ranges of one buffer are fine, in both orders. */
	EXPECT_EQ((long)PAGE, dma_copy_at(self->dev, self->ha, 0, self->ha, 2 * PAGE + 1, PAGE));
	EXPECT_EQ(10L, dma_copy_at(self->dev, self->ha, 5 * PAGE, self->ha, 10, 10));
	p2pbuf_cpu_access(&self->a, 1);
	EXPECT_EQ(0, memcmp(self->a.map + 2 * PAGE + 1, self->a.map, 10));
	p2pbuf_cpu_access(&self->a, 0);
	/* Overlapping ranges are refused (the engine's window is no memmove). */
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, 0, self->ha, 100, 200));
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, 100, self->ha, 0, 200));
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, 0, self->ha, 0, 1));
}

TEST_F(importer, import_errors)
{
	struct p2pbuf_dma_import a = { .size = sizeof(a) };
	struct { struct p2pbuf_dma_import i; __u32 extra[2]; } big;
	int fd, memfd, r;

	/* Not an fd, a closed fd: EBADF. */
	EXPECT_EQ(-EBADF, dma_import_out(self->dev, -1, NULL));
	fd = dup(self->a.fd);
	close(fd);
	EXPECT_EQ(-EBADF, dma_import_out(self->dev, fd, NULL));
	/* Files that are not dma-bufs: EINVAL. */
	memfd = memfd_create("not-a-dma-buf", MFD_CLOEXEC);
	ASSERT_GE(memfd, 0);
	EXPECT_EQ(-EINVAL, dma_import_out(self->dev, memfd, NULL));
	close(memfd);
	EXPECT_EQ(-EINVAL, dma_import_out(self->dev, self->dev, NULL));
	/* The same buffer again, through the same or another fd: EEXIST. */
	EXPECT_EQ(-EEXIST, dma_import_out(self->dev, self->a.fd, NULL));
	fd = dup(self->a.fd);
	EXPECT_EQ(-EEXIST, dma_import_out(self->dev, fd, NULL));
	close(fd);
	/* Unknown flags. */
	a.fd = self->a.fd;
	a.flags = 1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_DMA_IOCTL_IMPORT, &a));
	/* Struct sizes: too small; larger with a non-zero tail; larger with a zero tail. */
	a.flags = 0;
	a.size = 8;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_DMA_IOCTL_IMPORT, &a));
	memset(&big, 0, sizeof(big));
	big.i.size = sizeof(big);
	big.i.fd = self->a.fd;
	big.extra[1] = 1;
	EXPECT_ERRNO(E2BIG, ioctl(self->dev, P2PBUF_DMA_IOCTL_IMPORT, &big));
	big.extra[1] = 0;
	EXPECT_ERRNO(EEXIST, ioctl(self->dev, P2PBUF_DMA_IOCTL_IMPORT, &big));
	/* Bad pointers, unknown ioctls. */
	EXPECT_ERRNO(EFAULT, ioctl(self->dev, P2PBUF_DMA_IOCTL_IMPORT, (void *)16));
	EXPECT_ERRNO(EFAULT, ioctl(self->dev, P2PBUF_DMA_IOCTL_IMPORT, NULL));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IO(P2PBUF_IOCTL_MAGIC, 0x1f), &a));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IO(P2PBUF_IOCTL_MAGIC, 0x02), &a));
	/* The numbers carry direction and the first version's size (strace decodes them); the
	 * same nr with no direction, or another size, is not the ioctl. */
	EXPECT_EQ(_IOC_READ | _IOC_WRITE, _IOC_DIR(P2PBUF_DMA_IOCTL_IMPORT));
	EXPECT_EQ(sizeof(struct p2pbuf_dma_import), _IOC_SIZE(P2PBUF_DMA_IOCTL_IMPORT));
	EXPECT_EQ(_IOC_WRITE, _IOC_DIR(P2PBUF_DMA_IOCTL_RELEASE));
	EXPECT_EQ(_IOC_READ | _IOC_WRITE, _IOC_DIR(P2PBUF_DMA_IOCTL_COPY));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IO(P2PBUF_IOCTL_MAGIC, 0x10), &a));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IOWR(P2PBUF_IOCTL_MAGIC, 0x10, big), &a));
	/* After all that, a release and a new import work. */
	EXPECT_EQ(0, dma_release(self->dev, self->ha));
	r = dma_import_out(self->dev, self->a.fd, NULL);
	EXPECT_GT(r, 0);
	self->ha = r;
}

TEST_F(importer, copy_errors)
{
	struct p2pbuf_dma_copy a = {
		.src_handle = self->ha, .dst_handle = self->hb, .len = 1,
	};
	__u64 size = self->a.size;
	struct p2pbuf_buf small;
	int hs;

	/* Unknown handles. */
	EXPECT_EQ(-ENOENT, dma_copy_at(self->dev, 0, 0, self->hb, 0, 1));
	EXPECT_EQ(-ENOENT, dma_copy_at(self->dev, self->ha, 0, 999999, 0, 1));
	/* Ranges past the end, on either side, and arithmetic overflow. */
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, size, self->hb, 0, 1));
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, 0, self->hb, size - 1, 2));
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, 0, self->hb, 0, size + 1));
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, ~0ULL, self->hb, 0, 2));
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, 0, self->hb, 2, ~0ULL));
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, 0, self->hb, 0, 0));
	/* A smaller destination bounds the copy. */
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&small, PAGE));
	hs = dma_import_out(self->dev, small.fd, NULL);
	ASSERT_GT(hs, 0);
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, 0, hs, 0, PAGE + 1));
	EXPECT_EQ(-EINVAL, dma_copy_at(self->dev, self->ha, 0, hs, 1, PAGE));
	/* Unknown flags, bad pointers. */
	a.flags = 1;
	EXPECT_EQ(-EINVAL, dma_copy_args(self->dev, &a));
	EXPECT_ERRNO(EFAULT, ioctl(self->dev, P2PBUF_DMA_IOCTL_COPY, (void *)8));
	/* A released handle is unknown. */
	EXPECT_EQ(0, dma_release(self->dev, hs));
	EXPECT_EQ(-ENOENT, dma_copy_at(self->dev, self->ha, 0, hs, 0, 1));
	p2pbuf_buf_free(&small);
}

TEST_F(importer, release_errors)
{
	struct p2pbuf_dma_release r = { .size = sizeof(r), .handle = self->ha, .flags = 1 }, *big;

	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_DMA_IOCTL_RELEASE, &r));
	r.flags = 0;
	r.reserved = 1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_DMA_IOCTL_RELEASE, &r));
	EXPECT_EQ(-ENOENT, dma_release(self->dev, 0));
	EXPECT_EQ(-ENOENT, dma_release(self->dev, 999999));
	/* A size above the page size is E2BIG, even with a zero tail (the engine shares the
	 * exporter's copy rules: exporter_1_uapi.c arg_size_is_capped_at_a_page). */
	big = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, big);
	big->size = PAGE + 1;
	big->handle = self->ha;
	EXPECT_ERRNO(E2BIG, ioctl(self->dev, P2PBUF_DMA_IOCTL_RELEASE, big));
	munmap(big, 2 * PAGE);
	EXPECT_EQ(0, dma_release(self->dev, self->ha));
	EXPECT_EQ(-ENOENT, dma_release(self->dev, self->ha));
	EXPECT_ERRNO(EFAULT, ioctl(self->dev, P2PBUF_DMA_IOCTL_RELEASE, (void *)8));
}

TEST_F(importer, handles_are_per_file_and_released_on_close)
{
	int other = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	int h;

	ASSERT_GE(other, 0);
	/* Another file does not see our handles, and may import the same buffer. */
	EXPECT_EQ(-ENOENT, dma_copy_at(other, self->ha, 0, self->hb, 0, 1));
	EXPECT_EQ(-ENOENT, dma_release(other, self->ha));
	h = dma_import_out(other, self->a.fd, NULL);
	ASSERT_GT(h, 0);
	EXPECT_EQ(2, attached_devices(self->a.fd));
	/* Closing it detaches its buffers, and only those. */
	close(other);
	EXPECT_EQ(1, attached_devices(self->a.fd));
	EXPECT_EQ(1, attached_devices(self->b.fd));
	EXPECT_EQ(1L, dma_copy_at(self->dev, self->ha, 0, self->hb, 0, 1));
}

TEST_F(importer, timeout)
{
	struct p2pbuf_dma_copy a = {
		.src_handle = self->ha, .dst_handle = self->hb, .len = 2 * PAGE,
		.timeout_ms = 1,
	};

	/* A transfer takes the model 100 ms: 1 ms is too short. */
	EXPECT_EQ(-ETIMEDOUT, dma_copy_args(self->dev, &a));
	EXPECT_EQ(0ULL, a.copied);
	EXPECT_EQ(1U, a.nr_transfers);
	/* The engine is usable again afterwards. */
	EXPECT_EQ(0, copy_and_check(_metadata, self->dev, &self->a, self->ha, 1, &self->b,
				    self->hb, 2, 2 * PAGE, 9));
}

/*
 * N11: a transfer that did not complete in time may still be running (the model ends it
 * 100 ms after its start): the engine must not master the bus while the memory it was given is
 * unmapped. The driver turns bus mastering off as soon as the wait times out, before anything
 * is unmapped, and on again once the engine is idle (the copy then returns ETIMEDOUT). Seen
 * from user space: the bit is off in the config space while the timed-out copy waits (it
 * never was before), and on again, with a working engine, afterwards.
 */
TEST_F_TIMEOUT(importer, timeout_turns_bus_mastering_off, 60)
{
	struct bg_copy c = {
		.dev = self->dev,
		.a = { .src_handle = self->ha, .dst_handle = self->hb, .len = PAGE,
		       .timeout_ms = 1 },
	};
	int off = 0, polls = 0;
	char name[64];
	pthread_t t;

	ASSERT_EQ(0, p2pbuf_bound_device("/sys/bus/pci/drivers/p2pbuf_dma", name, sizeof(name)));
	ASSERT_EQ(1, bus_master(name));
	ASSERT_EQ(0, pthread_create(&t, NULL, bg_copy_fn, &c));
	while (!__atomic_load_n(&c.done, __ATOMIC_ACQUIRE)) {
		if (bus_master(name) == 0)
			off++;
		polls++;
		usleep(1000);
	}
	ASSERT_EQ(0, pthread_join(t, NULL));
	EXPECT_EQ(-ETIMEDOUT, c.ret);
	TH_LOG("bus mastering off in %d of %d polls during the timed-out copy", off, polls);
	EXPECT_GT(off, 0);
	/* The engine was idle when the copy returned: mastering is back on, and it copies. */
	EXPECT_EQ(1, bus_master(name));
	EXPECT_EQ(0, copy_and_check(_metadata, self->dev, &self->a, self->ha, 5, &self->b,
				    self->hb, 7, 3 * PAGE, 13));
}

TEST_F_TIMEOUT(importer, concurrent_copies, 120)
{
	struct bg_copy c[2] = {
		{ .dev = self->dev, .a = { .src_handle = self->ha, .src_offset = 0,
					   .dst_handle = self->hb, .dst_offset = 0,
					   .len = 5 * PAGE } },
		{ .dev = self->dev, .a = { .src_handle = self->ha, .src_offset = 8 * PAGE + 3,
					   .dst_handle = self->hb, .dst_offset = 8 * PAGE + 11,
					   .len = 5 * PAGE } },
	};
	pthread_t t[2];
	int i;

	fill(&self->a, 21);
	fill(&self->b, 22);
	for (i = 0; i < 2; i++)
		ASSERT_EQ(0, pthread_create(&t[i], NULL, bg_copy_fn, &c[i]));
	for (i = 0; i < 2; i++) {
		ASSERT_EQ(0, pthread_join(t[i], NULL));
		EXPECT_EQ((long)(5 * PAGE), c[i].ret);
	}
	p2pbuf_cpu_access(&self->b, 1);
	EXPECT_EQ(0, memcmp(self->b.map, self->a.map, 5 * PAGE));
	EXPECT_EQ(0, memcmp(self->b.map + 8 * PAGE + 11, self->a.map + 8 * PAGE + 3, 5 * PAGE));
	p2pbuf_cpu_access(&self->b, 0);
}

static void on_sigusr1(int sig)
{
	(void)sig;
}

/* A signal ends a long copy early with a short count. */
TEST_F_TIMEOUT(importer, signal_gives_short_count, 120)
{
	struct bg_copy c = {
		.dev = self->dev,
		.a = { .src_handle = self->ha, .dst_handle = self->hb, .len = 64 * 1024 },
	};
	struct sigaction sa = { .sa_handler = on_sigusr1 };	/* no SA_RESTART */
	pthread_t t;

	ASSERT_EQ(0, sigaction(SIGUSR1, &sa, NULL));
	fill(&self->a, 31);
	fill(&self->b, 32);
	ASSERT_EQ(0, pthread_create(&t, NULL, bg_copy_fn, &c));
	usleep(700 * 1000);
	ASSERT_EQ(0, pthread_kill(t, SIGUSR1));
	ASSERT_EQ(0, pthread_join(t, NULL));
	TH_LOG("interrupted copy returned %ld, copied %llu", c.ret,
	       (unsigned long long)c.a.copied);
	ASSERT_GT(c.ret, 0L);
	EXPECT_LT(c.ret, 64 * 1024L);
	EXPECT_EQ((__u64)c.ret, c.a.copied);
	p2pbuf_cpu_access(&self->b, 1);
	EXPECT_EQ(0, memcmp(self->b.map, self->a.map, c.a.copied));
	EXPECT_NE(0, memcmp(self->b.map + c.a.copied, self->a.map + c.a.copied, PAGE));
	p2pbuf_cpu_access(&self->b, 0);
}

/* Unbinding the engine stops a copy in flight, detaches every buffer; binding again works. */
TEST_F_TIMEOUT(importer, unbind_mid_copy_and_rebind, 120)
{
	struct bg_copy c = {
		.dev = self->dev,
		.a = { .src_handle = self->ha, .dst_handle = self->hb, .len = 64 * 1024 },
	};
	char name[64];
	pthread_t t;
	int fd, r;

	ASSERT_EQ(0, p2pbuf_bound_device("/sys/bus/pci/drivers/p2pbuf_dma", name, sizeof(name)));
	ASSERT_EQ(0, pthread_create(&t, NULL, bg_copy_fn, &c));
	usleep(700 * 1000);
	r = sysfs_write("/sys/bus/pci/drivers/p2pbuf_dma/unbind", name);
	ASSERT_EQ(0, r) TH_LOG("unbind %s: %s", name, strerror(-r));
	ASSERT_EQ(0, pthread_join(t, NULL));
	TH_LOG("copy ended with %s after %llu bytes", c.ret < 0 ? strerror((int)-c.ret) : "success",
	       (unsigned long long)c.a.copied);
	EXPECT_EQ(-ENODEV, c.ret);
	EXPECT_LT(c.a.copied, 64 * 1024ULL);
	/* Nothing is attached any more; the open file only gets ENODEV. */
	EXPECT_EQ(0, attached_devices(self->a.fd));
	EXPECT_EQ(0, attached_devices(self->b.fd));
	EXPECT_EQ(-ENODEV, dma_copy_at(self->dev, self->ha, 0, self->hb, 0, 1));
	EXPECT_EQ(-ENODEV, dma_import_out(self->dev, self->a.fd, NULL));
	EXPECT_ERRNO(ENODEV, open(DMA_DEV, O_RDWR));
	/* Bound again, the engine serves new files. */
	r = sysfs_write("/sys/bus/pci/drivers/p2pbuf_dma/bind", name);
	ASSERT_EQ(0, r) TH_LOG("bind %s: %s", name, strerror(-r));
	fd = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	close(self->dev);
	self->dev = fd;
	self->ha = dma_import_out(self->dev, self->a.fd, NULL);
	ASSERT_GT(self->ha, 0);
	self->hb = dma_import_out(self->dev, self->b.fd, NULL);
	ASSERT_GT(self->hb, 0);
	EXPECT_EQ(0, copy_and_check(_metadata, self->dev, &self->a, self->ha, 3, &self->b,
				    self->hb, 5, 100, 7));
}

/*
 * Once the engine is unbound, every ioctl of a file opened before says ENODEV, RELEASE too
 * (the header's shared rule; it used to answer ENOENT, as for a handle never given out):
 * for a handle the file had, and for one it never had. Binds the engine again.
 */
TEST_F(importer, release_after_unbind_is_enodev)
{
	char name[64];
	int r;

	ASSERT_EQ(0, p2pbuf_bound_device("/sys/bus/pci/drivers/p2pbuf_dma", name, sizeof(name)));
	r = sysfs_write("/sys/bus/pci/drivers/p2pbuf_dma/unbind", name);
	ASSERT_EQ(0, r) TH_LOG("unbind %s: %s", name, strerror(-r));
	EXPECT_EQ(-ENODEV, dma_release(self->dev, self->ha));
	EXPECT_EQ(-ENODEV, dma_release(self->dev, self->hb + 1000));
	EXPECT_EQ(-ENODEV, dma_copy_at(self->dev, self->ha, 0, self->hb, 0, 1));
	EXPECT_EQ(-ENODEV, dma_import_out(self->dev, self->a.fd, NULL));
	r = sysfs_write("/sys/bus/pci/drivers/p2pbuf_dma/bind", name);
	ASSERT_EQ(0, r) TH_LOG("bind %s: %s", name, strerror(-r));
}

/* Device memory from the exporter (/dev/p2pbuf), with system memory beside it. */
FIXTURE(devmem)
{
	int dev, p2p;
	struct p2pbuf_buf d1, d2, s;
	int h1, h2, hs;
	struct p2pbuf_dma_import info;
};

#define DEVMEM_SIZE (1UL << 20)

FIXTURE_SETUP(devmem)
{
	int r;

	self->d1.fd = self->d2.fd = self->s.fd = -1;
	self->d1.memfd = self->d2.memfd = self->s.memfd = -1;
	self->p2p = -1;
	self->dev = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	if (self->dev < 0)
		SKIP(return, DMA_DEV ": %s", strerror(errno));
	self->p2p = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	if (self->p2p < 0)
		SKIP(return, "/dev/p2pbuf: %s (p2pbuf_exporter not loaded or not bound)",
		     strerror(errno));
	r = p2pbuf_devbuf_alloc(self->p2p, &self->d1, DEVMEM_SIZE);
	if (r)
		SKIP(return, "/dev/p2pbuf alloc: %s", strerror(-r));
	ASSERT_EQ(0, p2pbuf_devbuf_alloc(self->p2p, &self->d2, DEVMEM_SIZE));
	r = p2pbuf_udmabuf_alloc(&self->s, DEVMEM_SIZE);
	if (r == -ENOENT)
		SKIP(return, "no /dev/udmabuf");
	ASSERT_EQ(0, r);
	self->h1 = dma_import_out(self->dev, self->d1.fd, &self->info);
	if (self->h1 == -EOPNOTSUPP)
		SKIP(return, "the exporter refuses the engine: no peer-to-peer path in this topology");
	ASSERT_GT(self->h1, 0) TH_LOG("import device memory: %s", strerror(-self->h1));
	self->h2 = dma_import_out(self->dev, self->d2.fd, NULL);
	ASSERT_GT(self->h2, 0);
	self->hs = dma_import_out(self->dev, self->s.fd, NULL);
	ASSERT_GT(self->hs, 0);
}

FIXTURE_TEARDOWN(devmem)
{
	p2pbuf_buf_free(&self->d1);
	p2pbuf_buf_free(&self->d2);
	p2pbuf_buf_free(&self->s);
	p2pbuf_close(&self->p2p);
	p2pbuf_close(&self->dev);
}

TEST_F(devmem, import_reports_peer_to_peer)
{
	const char *topo = getenv("P2PBUF_TOPOLOGY");
	struct p2pbuf_attachment a;

	TH_LOG("device memory: map type %s, %u range(s), %llu bytes",
	       map_type_name(self->info.map_type), self->info.nr_ranges,
	       (unsigned long long)self->info.length);
	EXPECT_EQ(DEVMEM_SIZE, self->info.length);
	EXPECT_TRUE(self->info.map_type == P2PBUF_DMA_MAP_BUS_ADDR ||
		    self->info.map_type == P2PBUF_DMA_MAP_THRU_HOST_BRIDGE);

	/* The exporter lists the engine as its attachment: it passed dma_buf_phys_vec_check(). */
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.fd = self->d1.fd;
	ASSERT_EQ(0, ioctl(self->p2p, P2PBUF_IOCTL_ATTACHMENT, &a))
		TH_LOG("P2PBUF_IOCTL_ATTACHMENT: %s", strerror(errno));
	TH_LOG("exporter: %u attachment(s), %s", a.nr_attachments, a.device);
	EXPECT_EQ(1U, a.nr_attachments);
	EXPECT_NE(0, a.device[0]);
	EXPECT_EQ(0U, a.reserved);
	/*
	 * Behind one switch the engine (no IOMMU in the lab's switch topology) gets the peer's bus
	 * addresses.
	 */
	if (topo && !strcmp(topo, "switch"))
		EXPECT_EQ(P2PBUF_DMA_MAP_BUS_ADDR, self->info.map_type);
	/* Released: the exporter lists no attachment any more. */
	ASSERT_EQ(0, dma_release(self->dev, self->h1));
	self->h1 = 0;
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.fd = self->d1.fd;
	EXPECT_ERRNO(ENOENT, ioctl(self->p2p, P2PBUF_IOCTL_ATTACHMENT, &a));
	EXPECT_EQ(0U, a.nr_attachments);
}

TEST_F_TIMEOUT(devmem, device_to_device, 300)
{
	EXPECT_EQ(0, copy_and_check(_metadata, self->dev, &self->d1, self->h1, 0, &self->d2,
				    self->h2, 0, 1, 1));
	EXPECT_EQ(0, copy_and_check(_metadata, self->dev, &self->d1, self->h1, 5, &self->d2,
				    self->h2, 4099, 3 * PAGE + 17, 2));
	EXPECT_EQ(0, copy_and_check(_metadata, self->dev, &self->d1, self->h1, 0, &self->d2,
				    self->h2, 0, 64 * 1024, 3));
}

TEST_F_TIMEOUT(devmem, device_to_system_and_back, 300)
{
	EXPECT_EQ(0, copy_and_check(_metadata, self->dev, &self->d1, self->h1, 123, &self->s,
				    self->hs, 4000, 5 * PAGE + 1, 4));
	EXPECT_EQ(0, copy_and_check(_metadata, self->dev, &self->s, self->hs, 4000, &self->d1,
				    self->h1, 123, 5 * PAGE + 1, 5));
	EXPECT_EQ(0, copy_and_check(_metadata, self->dev, &self->s, self->hs, 0, &self->d2,
				    self->h2, 0, 64 * 1024, 6));
}

static int p2p_revoke(int p2p, int fd)
{
	struct p2pbuf_revoke r = { .size = sizeof(r), .fd = fd };

	return ioctl(p2p, P2PBUF_IOCTL_REVOKE, &r) ? -errno : 0;
}

TEST_F_TIMEOUT(devmem, revoke_mid_copy, 300)
{
	struct bg_copy c = {
		.dev = self->dev,
		.a = { .src_handle = self->h1, .dst_handle = self->hs, .len = DEVMEM_SIZE },
	};
	size_t i, bad = 0;
	pthread_t t;
	double t0;
	int r;

	fill(&self->d1, 42);
	fill(&self->s, 99);
	t0 = now();
	ASSERT_EQ(0, pthread_create(&t, NULL, bg_copy_fn, &c));
	usleep(1500 * 1000);
	r = p2p_revoke(self->p2p, self->d1.fd);
	ASSERT_EQ(0, r) TH_LOG("revoke: %s", strerror(-r));
	ASSERT_EQ(0, pthread_join(t, NULL));
	TH_LOG("copy stopped after %.2f s with %s, %llu of %lu bytes copied", now() - t0,
	       c.ret < 0 ? strerror((int)-c.ret) : "success", (unsigned long long)c.a.copied,
	       DEVMEM_SIZE);
	EXPECT_EQ(-ENODEV, c.ret);
	EXPECT_GT(c.a.copied, 0ULL);
	EXPECT_LT(c.a.copied, (__u64)DEVMEM_SIZE);
	/* What was copied is right, and nothing past it was written. */
	p2pbuf_cpu_access(&self->s, 1);
	for (i = 0; i < DEVMEM_SIZE; i++)
		if (self->s.map[i] != (i < c.a.copied ? pat(i, 42) : pat(i, 99)))
			bad++;
	p2pbuf_cpu_access(&self->s, 0);
	EXPECT_EQ(0UL, bad);
	/* Every later use of the revoked buffer fails the same way; the others still work. */
	EXPECT_EQ(-ENODEV, dma_copy_at(self->dev, self->h1, 0, self->hs, 0, 1));
	EXPECT_EQ(-ENODEV, dma_copy_at(self->dev, self->hs, 0, self->h1, 0, 1));
	EXPECT_EQ(1L, dma_copy_at(self->dev, self->h2, 0, self->hs, 0, 1));
	/* Importing it again is refused; releasing the handle works. */
	EXPECT_EQ(0, dma_release(self->dev, self->h1));
	r = dma_import_out(self->dev, self->d1.fd, NULL);
	EXPECT_EQ(-ENODEV, r);
}

#endif /* P2PBUF_DMA_IOCTL_COPY */

TEST_HARNESS_MAIN

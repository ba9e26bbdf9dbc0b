// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf-dma, large copies: the DMA engine (QEMU's edu, the FPGA stand-in behind
 * /dev/p2pbuf-dma) copies from 1 byte to 64 MiB, device memory to device memory, device to
 * system memory and back (and system to system), at unaligned offsets, verified byte for
 * byte together with a margin on both sides of the destination range.
 *
 * The engine moves 4095 bytes per transfer and QEMU's model finishes a transfer 100 ms of
 * virtual time after it starts: 64 MiB is 16,394 windows, 32,788 transfers, 3,279 s of
 * virtual time. This test is meant for the "p2pbuf-dma-icount" boot of `cargo xtask test`
 * (xtask/src/judge/boots.rs), which runs QEMU with -icount shift=auto,sleep=off: the virtual
 * clock jumps to the engine's timer while the guest waits for the interrupt, so the wall
 * time is what the guest's own work costs. Times printed here are guest (virtual) times.
 *
 * The last copy (system memory into device memory, 64 MiB) is also checked from the host:
 * "# hostcheck target=gpu ..." makes xtask read the ivshmem backing file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <linux/dma-buf.h>
#include <linux/udmabuf.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

#define PAGE 4096UL
#define MIB (1UL << 20)
#define DMA_DEV "/dev/p2pbuf-dma"
#define UDMABUF_LIMIT "/sys/module/udmabuf/parameters/size_limit_mb"
/* Room for 64 MiB at any offset below one page, and a margin. */
#define BUF_SIZE (64 * MIB + 16 * PAGE)
/* Bytes checked on each side of a destination range. */
#define MARGIN (2 * PAGE)
/* The engine's window (p2pbuf-dma/edu.rs WINDOW). */
#define WINDOW 4095UL
/*
 * Test timeouts are in guest time, which icount advances by 100 ms per engine transfer:
 * 3,279 s per 64 MiB. Without icount the same numbers are wall time (and far too long).
 */
#define TIMEOUT_64MIB 4000

/* A byte of a position-dependent pattern that no shift of the data can reproduce. */
static uint8_t pat(size_t i, unsigned int seed)
{
	uint32_t x = (uint32_t)(i >> 2) * 0x9e3779b1u + seed * 0x85ebca6bu;

	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	return (uint8_t)(x >> ((i & 3) * 8));
}

static void fill(struct p2pbuf_buf *b, size_t from, size_t len, unsigned int seed, int host)
{
	size_t i;

	p2pbuf_cpu_access(b, 1);
	for (i = 0; i < len; i++)
		b->map[from + i] = host ? p2pbuf_pattern(i, seed) : pat(from + i, seed);
	p2pbuf_cpu_access(b, 0);
}

static int sysfs_read_int(const char *path)
{
	char s[32] = "";
	int fd = open(path, O_RDONLY), n;

	if (fd < 0)
		return -1;
	n = read(fd, s, sizeof(s) - 1);
	close(fd);
	return n > 0 ? atoi(s) : -1;
}

static int sysfs_write_int(const char *path, int v)
{
	char s[32];
	int fd = open(path, O_WRONLY), n;

	if (fd < 0)
		return -errno;
	n = snprintf(s, sizeof(s), "%d", v);
	n = write(fd, s, n) < 0 ? -errno : 0;
	close(fd);
	return n;
}

/*
 * kmemleak scans every 600 s of guest time; a 64 MiB copy is 3,279 s of it, and each scan of a
 * debug kernel costs about a minute of TCG. Automatic scans are off while this test runs (the
 * suite's final kmemleak check scans explicitly) and back on afterwards.
 */
#define KMEMLEAK "/sys/kernel/debug/kmemleak"
static int kmemleak_paused;

static int kmemleak_write(const char *cmd)
{
	int fd = open(KMEMLEAK, O_WRONLY), r;

	if (fd < 0)
		return -errno;
	r = write(fd, cmd, strlen(cmd)) < 0 ? -errno : 0;
	close(fd);
	return r;
}

__attribute__((constructor)) static void kmemleak_pause(void)
{
	kmemleak_paused = !kmemleak_write("scan=off");
}

__attribute__((destructor)) static void kmemleak_resume(void)
{
	if (kmemleak_paused && kmemleak_write("scan=on"))
		fprintf(stderr, "# could not turn kmemleak's automatic scans back on\n");
}

FIXTURE(engine)
{
	int dev, p2p, spacer, old_limit;
	struct p2pbuf_buf d1, d2, s1, s2;
};

FIXTURE_SETUP(engine)
{
	struct p2pbuf_provider_info p = { .size = sizeof(p) };
	struct p2pbuf_alloc sp = { .size = sizeof(sp) };
	struct p2pbuf_buf *all[] = { &self->d1, &self->d2, &self->s1, &self->s2 };
	size_t i;

	self->p2p = self->spacer = self->old_limit = -1;
	for (i = 0; i < 4; i++)
		all[i]->fd = all[i]->memfd = -1;
	self->dev = -1;
	/* Outside the icount boot the model's 100 ms per transfer are wall time: hours. */
	if (!getenv("P2PBUF_SUITE") || strcmp(getenv("P2PBUF_SUITE"), "p2pbuf-dma-icount"))
		SKIP(return, "needs QEMU -icount (over 3 h of engine time otherwise): "
			     "cargo xtask test --boot p2pbuf-dma-icount");
	self->dev = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	if (self->dev < 0)
		SKIP(return, DMA_DEV ": %s (no edu device, or p2pbuf_dma not loaded)",
		     strerror(errno));
	self->p2p = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	if (self->p2p < 0)
		SKIP(return, "/dev/p2pbuf: %s", strerror(errno));
	if (access("/dev/udmabuf", F_OK))
		SKIP(return, "no /dev/udmabuf");
	/* udmabuf refuses buffers over size_limit_mb (64 by default): allow ours. */
	self->old_limit = sysfs_read_int(UDMABUF_LIMIT);
	if (self->old_limit >= 0 && self->old_limit < (int)(BUF_SIZE / MIB) + 1)
		ASSERT_EQ(0, sysfs_write_int(UDMABUF_LIMIT, BUF_SIZE / MIB + 1));
	/* Device buffers above the first quarter of the BAR (the host check's data stays). */
	ASSERT_EQ(0, p2pbuf_first_provider_info(self->p2p, &p));
	ASSERT_GE(p.free, 2 * BUF_SIZE + p.total / 4);
	sp.length = (p.total / 4) & ~(PAGE - 1);
	ASSERT_EQ(0, p2pbuf_test_alloc(self->p2p, &sp));
	self->spacer = sp.fd;
}

/*
 * Two device buffers and two system buffers of `size` bytes, imported into the engine. (Each
 * test allocates what it needs: zeroing 64 MiB of device memory costs seconds under TCG.)
 */
static int alloc_bufs(struct __test_metadata *_metadata, FIXTURE_DATA(engine) *self,
		      size_t size)
{
	struct p2pbuf_dma_import info = { .size = sizeof(info) };
	struct p2pbuf_buf *all[] = { &self->d1, &self->d2, &self->s1, &self->s2 };
	size_t i;
	int r;

	ASSERT_EQ(0, p2pbuf_devbuf_alloc(self->p2p, &self->d1, size));
	ASSERT_EQ(0, p2pbuf_devbuf_alloc(self->p2p, &self->d2, size));
	r = p2pbuf_udmabuf_alloc(&self->s1, size);
	ASSERT_EQ(0, r) TH_LOG("udmabuf of %zu bytes: %s", size, strerror(-r));
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&self->s2, size));
	for (i = 0; i < 4; i++) {
		info.fd = all[i]->fd;
		r = ioctl(self->dev, P2PBUF_DMA_IOCTL_IMPORT, &info) ? -errno : (int)info.handle;
		if (r == -EOPNOTSUPP)
			SKIP(return -1, "the exporter refuses the engine: no P2P path on this fabric");
		ASSERT_GT(r, 0) TH_LOG("import %s memory: %s", all[i]->what, strerror(-r));
		all[i]->handle = r;
		TH_LOG("%s buffer %zu, %zu bytes: map type %u, %u DMA range(s)", all[i]->what, i,
		       size, info.map_type, info.nr_ranges);
	}
	return 0;
}

FIXTURE_TEARDOWN(engine)
{
	p2pbuf_buf_free(&self->d1);
	p2pbuf_buf_free(&self->d2);
	p2pbuf_buf_free(&self->s1);
	p2pbuf_buf_free(&self->s2);
	p2pbuf_close(&self->spacer);
	if (self->old_limit >= 0)
		sysfs_write_int(UDMABUF_LIMIT, self->old_limit);
	p2pbuf_close(&self->p2p);
	p2pbuf_close(&self->dev);
}

/*
 * Copies src[soff..+len] to dst[doff..+len] and checks dst from doff - MARGIN to
 * doff + len + MARGIN (whole buffer when `whole`): the range holds the source's bytes, the
 * margins their old contents. host: fill the source with the host check's pattern for `seed`
 * (counted from soff) and print the host check request. Returns the bad bytes, or -errno.
 */
static long copy_check(struct __test_metadata *_metadata, int dev, struct p2pbuf_buf *src,
		       size_t soff, struct p2pbuf_buf *dst, size_t doff, size_t len, unsigned int seed,
		       int host)
{
	struct p2pbuf_dma_copy a = {
		.size = sizeof(a),
		.src_handle = src->handle, .src_offset = soff,
		.dst_handle = dst->handle, .dst_offset = doff, .len = len,
	};
	size_t lo = doff > MARGIN ? doff - MARGIN : 0;
	size_t hi = doff + len + MARGIN < dst->size ? doff + len + MARGIN : dst->size;
	size_t i, bad = 0, first = 0;
	double t;
	int r;

	fill(src, soff, len, seed, host);
	fill(dst, lo, hi - lo, seed + 1000, 0);
	t = now();
	r = ioctl(dev, P2PBUF_DMA_IOCTL_COPY, &a);
	t = now() - t;
	if (r < 0) {
		r = -errno;
		TH_LOG("%s -> %s, %zu bytes %zu -> %zu: %s after %llu bytes", src->what, dst->what,
		       len, soff, doff, strerror(-r), (unsigned long long)a.copied);
		return r;
	}
	EXPECT_EQ((long)len, (long)r);
	EXPECT_EQ((__u64)len, a.copied);
	EXPECT_GE(a.nr_transfers, 2 * ((len + WINDOW - 1) / WINDOW));
	p2pbuf_cpu_access(dst, 1);
	for (i = lo; i < hi; i++) {
		uint8_t want;

		if (i < doff || i >= doff + len)
			want = pat(i, seed + 1000);
		else if (host)
			want = p2pbuf_pattern(i - doff, seed);
		else
			want = pat(i - doff + soff, seed);
		if (dst->map[i] != want && !bad++)
			first = i;
	}
	p2pbuf_cpu_access(dst, 0);
	if (bad) {
		TH_LOG("%s -> %s, %zu bytes %zu -> %zu: %zu bad bytes, first at %zu", src->what,
		       dst->what, len, soff, doff, bad, first);
	} else {
		printf("# %-6s -> %-6s %9zu bytes %5zu -> %5zu: ok, %6u transfers, %8.1f s guest time\n",
		       src->what, dst->what, len, soff, doff, a.nr_transfers, t);
		fflush(stdout);
	}
	if (host && !bad && !strcmp(dst->what, "device")) {
		printf("# hostcheck target=gpu offset=%llu len=%zu seed=%u\n",
		       (unsigned long long)(dst->bar_offset + doff), len, seed);
		fflush(stdout);
	}
	return (long)bad;
}

/* Every size class the window arithmetic has an edge at, in all four directions. */
TEST_F_TIMEOUT(engine, sweep_1_byte_to_4_mib, 3600)
{
	const size_t sizes[] = {
		1, 2, 3, WINDOW - 1, WINDOW, WINDOW + 1, PAGE, PAGE + 1, 2 * WINDOW,
		2 * WINDOW + 1, 3 * PAGE + 17, 64 * 1024 + 1, MIB + 7, 4 * MIB - 3,
	};
	const struct { size_t soff, doff; } offs[] = {
		{ 0, 0 }, { 1, PAGE - 1 }, { PAGE - 1, 3 }, { 5 * PAGE + 13, 7 * PAGE + 4093 },
	};
	struct p2pbuf_buf *pairs[4][2] = {
		{ &self->d1, &self->d2 }, { &self->d1, &self->s1 },
		{ &self->s1, &self->d1 }, { &self->s1, &self->s2 },
	};
	size_t i, p;
	unsigned int seed = 1;

	if (alloc_bufs(_metadata, self, 4 * MIB + 16 * PAGE))
		return;
	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (p = 0; p < 4; p++) {
			size_t k = (i + p) % 4;

			ASSERT_EQ(0, copy_check(_metadata, self->dev, pairs[p][0], offs[k].soff,
						pairs[p][1], offs[k].doff, sizes[i], seed++, 0));
		}
}

/*
 * 16 MiB device to device, then 64 MiB device to device, device to system, and system to
 * device (last, host-checked: its bytes stay in the BAR when the VM ends), all at unaligned
 * offsets. One test: the buffers are allocated and zeroed once.
 */
TEST_F_TIMEOUT(engine, copy_16_mib_and_64_mib, 4 * TIMEOUT_64MIB)
{
	if (alloc_bufs(_metadata, self, BUF_SIZE))
		return;
	EXPECT_EQ(0, copy_check(_metadata, self->dev, &self->d1, 3, &self->d2, PAGE - 2,
				16 * MIB + 5, 101, 0));
	EXPECT_EQ(0, copy_check(_metadata, self->dev, &self->d1, PAGE - 3, &self->d2, 7, 64 * MIB,
				102, 0));
	EXPECT_EQ(0, copy_check(_metadata, self->dev, &self->d2, 1, &self->s1, PAGE - 1, 64 * MIB,
				103, 0));
	EXPECT_EQ(0, copy_check(_metadata, self->dev, &self->s2, PAGE - 2, &self->d1, 5, 64 * MIB,
				104, 1));
}

TEST_HARNESS_MAIN

// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf fault tests: a process killed in the middle of an engine copy, a process killed
 * while it holds mapped device memory that it passed to another process, and a structured
 * ioctl fuzzer for /dev/p2pbuf and /dev/p2pbuf-dma (every ioctl number of the 0xBB range,
 * every size-field case, biased field values, bad pointers, planted valid fds and handles).
 *
 * What must hold: nothing crashes (the harness fails the run on any Oops/WARN/lockdep splat),
 * every refused call fails with an errno from the documented set, the device memory of the
 * dead or fuzzed processes returns to the provider, and the engine works afterwards. The
 * final kmemleak scan of the suite covers leaks.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/dma-buf.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

#define PAGE 4096UL
#define P2P_DEV "/dev/p2pbuf"
#define DMA_DEV "/dev/p2pbuf-dma"

/* Free bytes of the first bound provider, or -1. */
static long long provider_free(int p2p)
{
	struct p2pbuf_provider_info p;

	if (p2pbuf_first_provider_info(p2p, &p))
		return -1;
	return (long long)p.free;
}

/* Imports a dma-buf into the engine; the handle, or -errno. */
static long engine_import(int dma, int fd)
{
	struct p2pbuf_dma_import im = { .size = sizeof(im), .fd = fd };

	if (ioctl(dma, P2PBUF_DMA_IOCTL_IMPORT, &im))
		return -errno;
	return im.handle;
}

static long engine_copy(int dma, __u32 src, __u32 dst, __u64 len)
{
	struct p2pbuf_dma_copy c = {
		.size = sizeof(c), .src_handle = src, .dst_handle = dst, .len = len,
	};

	return ioctl(dma, P2PBUF_DMA_IOCTL_COPY, &c);
}

static void sync_cpu(int fd, int start)
{
	struct dma_buf_sync s = {
		.flags = (start ? DMA_BUF_SYNC_START : DMA_BUF_SYNC_END) | DMA_BUF_SYNC_RW,
	};

	ioctl(fd, DMA_BUF_IOCTL_SYNC, &s);
}

FIXTURE(faults) {
	int p2p;
	int dma;
	long long free0;
};

FIXTURE_SETUP(faults)
{
	self->p2p = open(P2P_DEV, O_RDWR | O_CLOEXEC);
	self->dma = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	if (self->p2p < 0)
		SKIP(return, "no %s (p2pbuf_exporter not loaded?)", P2P_DEV);
	self->free0 = provider_free(self->p2p);
	ASSERT_GT(self->free0, 0);
}

FIXTURE_TEARDOWN(faults)
{
	if (self->p2p >= 0) {
		/* Whatever the test did, the provider's memory is all back. */
		EXPECT_EQ(self->free0, provider_free(self->p2p));
		close(self->p2p);
	}
	p2pbuf_close(&self->dma);
}

/*
 * A process killed with SIGKILL while the engine copies device memory for it: it dies
 * promptly (the copy does not hold it for the rest of the transfer), its buffers and
 * imports are released, and the engine works for the next process.
 */
TEST_F_TIMEOUT(faults, sigkill_mid_engine_copy, 120)
{
	const size_t len = 128 * 1024;	/* ~8 s of edu transfers */
	int go[2], s0, d0, d1;
	long h0, h1;
	uint8_t *m0, *m1;
	double t0, dt;
	pid_t pid;
	int status;
	char c;

	if (self->dma < 0)
		SKIP(return, "no %s (p2pbuf_dma not loaded or no edu device)", DMA_DEV);
	s0 = p2pbuf_alloc_fd(self->p2p, PAGE);
	ASSERT_GE(s0, 0);
	h0 = engine_import(self->dma, s0);
	if (h0 == -EOPNOTSUPP) {
		close(s0);
		SKIP(return, "no peer-to-peer path between the engine and device memory here");
	}
	ASSERT_GE(h0, 0);
	close(s0);	/* the import holds the buffer until the engine file is closed */
	ASSERT_EQ(0, pipe(go));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		int dma = open(DMA_DEV, O_RDWR), a = p2pbuf_alloc_fd(self->p2p, len);
		int b = p2pbuf_alloc_fd(self->p2p, len);
		long ha = engine_import(dma, a), hb = engine_import(dma, b);

		if (dma < 0 || a < 0 || b < 0 || ha < 0 || hb < 0)
			_exit(2);
		if (write(go[1], "g", 1) != 1)
			_exit(3);
		engine_copy(dma, ha, hb, len);
		_exit(4);	/* not reached: killed mid-copy */
	}
	close(go[1]);
	ASSERT_EQ(1, read(go[0], &c, 1));
	close(go[0]);
	usleep(1000 * 1000);	/* a few windows into the copy */
	t0 = now();
	ASSERT_EQ(0, kill(pid, SIGKILL));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	dt = now() - t0;
	TH_LOG("killed mid-copy, reaped after %.3f s", dt);
	ASSERT_TRUE(WIFSIGNALED(status));
	EXPECT_EQ(SIGKILL, WTERMSIG(status));
	EXPECT_LT(dt, 3.0);
	/* Only this process's import is left: free = start - one page. */
	EXPECT_EQ(self->free0 - (long long)PAGE, provider_free(self->p2p));

	/* The engine serves the next user: a verified copy. */
	d0 = p2pbuf_alloc_fd(self->p2p, PAGE);
	d1 = p2pbuf_alloc_fd(self->p2p, PAGE);
	ASSERT_GE(d0, 0);
	ASSERT_GE(d1, 0);
	m0 = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, d0, 0);
	m1 = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, d1, 0);
	ASSERT_NE(MAP_FAILED, m0);
	ASSERT_NE(MAP_FAILED, m1);
	sync_cpu(d0, 1);
	for (size_t i = 0; i < PAGE; i++)
		m0[i] = (uint8_t)(i * 7 + 3);
	sync_cpu(d0, 0);
	h0 = engine_import(self->dma, d0);
	h1 = engine_import(self->dma, d1);
	ASSERT_GE(h0, 0);
	ASSERT_GE(h1, 0);
	EXPECT_EQ(2000, engine_copy(self->dma, h0, h1, 2000));
	sync_cpu(d1, 1);
	EXPECT_EQ(0, memcmp(m0, m1, 2000));
	sync_cpu(d1, 0);
	munmap(m0, PAGE);
	munmap(m1, PAGE);
	close(d0);
	close(d1);
	/* Closing the engine file releases every import: all memory back (teardown checks). */
	close(self->dma);
	self->dma = -1;
}

/*
 * A process allocates device memory, writes it through its mapping, passes the fd to its
 * parent and is killed while it still maps it: the parent's fd keeps the memory alive and
 * intact; when the parent closes it, the memory returns to the provider.
 */
TEST_F(faults, sigkill_while_mapped_after_passing)
{
	const size_t len = 64 * 1024;
	int sv[2], fd = -1, status;
	uint8_t *m;
	pid_t pid;
	char c;
	struct msghdr msg = { 0 };
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec io = { .iov_base = &c, .iov_len = 1 };
	struct cmsghdr *cm;

	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		int b = p2pbuf_alloc_fd(self->p2p, len);
		uint8_t *cm_map;

		if (b < 0)
			_exit(2);
		cm_map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, b, 0);
		if (cm_map == MAP_FAILED)
			_exit(3);
		sync_cpu(b, 1);
		for (size_t i = 0; i < len; i++)
			cm_map[i] = (uint8_t)(i * 13 + 5);
		sync_cpu(b, 0);
		msg.msg_iov = &io;
		msg.msg_iovlen = 1;
		msg.msg_control = cbuf;
		msg.msg_controllen = sizeof(cbuf);
		p2pbuf_cmsg_fd(&msg, b);
		if (sendmsg(sv[1], &msg, 0) != 1)
			_exit(4);
		pause();	/* mapped, fd open: until killed */
		_exit(5);
	}
	close(sv[1]);
	msg.msg_iov = &io;
	msg.msg_iovlen = 1;
	msg.msg_control = cbuf;
	msg.msg_controllen = sizeof(cbuf);
	ASSERT_EQ(1, recvmsg(sv[0], &msg, 0));
	cm = CMSG_FIRSTHDR(&msg);
	ASSERT_NE(NULL, cm);
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	close(sv[0]);
	ASSERT_EQ(0, kill(pid, SIGKILL));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFSIGNALED(status));
	EXPECT_EQ(self->free0 - (long long)len, provider_free(self->p2p));
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, m);
	sync_cpu(fd, 1);
	for (size_t i = 0; i < len; i++)
		if (m[i] != (uint8_t)(i * 13 + 5)) {
			TH_LOG("byte %zu is %u after the writer died", i, m[i]);
			ASSERT_TRUE(0);
		}
	sync_cpu(fd, 0);
	munmap(m, len);
	close(fd);
	/* teardown: all memory back */
}

/* xorshift64*, seeded per run and printed so a failure can be replayed. */
static uint64_t rng_state;

static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ULL;
}

/* A biased random field value: boundaries more often than uniform noise. */
static uint64_t field(uint64_t planted)
{
	static const uint64_t special[] = {
		0, 1, 2, 3, 4095, 4096, 4097, 65536, 0x7fffffff, 0x80000000, 0xffffffff,
		0x100000000ULL, 1ULL << 30, (1ULL << 30) + 1, 0x7fffffffffffffffULL,
		0xfffffffffffff000ULL, ~0ULL,
	};

	switch (rnd() % 4) {
	case 0:
		return special[rnd() % (sizeof(special) / sizeof(special[0]))];
	case 1:
		return planted;
	case 2:
		return rnd() % 8192;
	default:
		return rnd();
	}
}

/* The errnos include/uapi/linux/p2pbuf.h documents; anything else is a bug. */
static int errno_allowed(int e)
{
	switch (e) {
	case EBADF: case EEXIST: case EFAULT: case EINTR: case EINVAL: case ENODEV:
	case ENOENT: case ENOMEM: case ENOTTY: case EOPNOTSUPP: case ETIMEDOUT: case E2BIG:
		return 1;
	}
	return 0;
}

/* Engine handles the fuzzer got from successful imports: copies and releases use them. */
static uint32_t known[256];
static unsigned int nknown;

static uint32_t pick_handle(void)
{
	return nknown && rnd() % 4 ? known[rnd() % nknown] : (uint32_t)(rnd() % 6);
}

/* The provider id the templates use (looked up when the fuzzer starts). */
static uint32_t fuzz_provider;

/* The header's ioctl number for nr; any other nr: _IO(), which no ioctl is. */
static unsigned long real_cmd(unsigned long nr)
{
	switch (nr) {
	case 0x00: return P2PBUF_IOCTL_INFO;
	case 0x01: return P2PBUF_IOCTL_PROVIDER_INFO;
	case 0x02: return P2PBUF_IOCTL_ALLOC;
	case 0x03: return P2PBUF_IOCTL_REVOKE;
	case 0x04: return P2PBUF_IOCTL_REFUSAL;
	case 0x05: return P2PBUF_IOCTL_ATTACHMENT;
	case 0x10: return P2PBUF_DMA_IOCTL_IMPORT;
	case 0x11: return P2PBUF_DMA_IOCTL_RELEASE;
	case 0x12: return P2PBUF_DMA_IOCTL_COPY;
	}
	return _IO(P2PBUF_IOCTL_MAGIC, nr);
}

/* A valid argument for ioctl number nr (any other nr: an empty struct with a size field). */
/* An fd for a fuzzed struct: mostly the planted valid one, else a small number. */
static int fuzz_fd(int planted)
{
	return rnd() % 4 ? planted : (int)(rnd() % 8);
}

static void template(uint32_t *d, unsigned long nr, int planted)
{
	memset(d, 0, 512);
	switch (nr) {
	case 0x00:
		d[0] = sizeof(struct p2pbuf_info);
		break;
	case 0x01: {
		struct p2pbuf_provider_info *p = (void *)d;

		p->size = sizeof(*p);
		p->id = fuzz_provider + rnd() % 3 - 1;
		p->flags = rnd() % 4 == 0;
		break;
	}
	case 0x02: {
		struct p2pbuf_alloc *a = (void *)d;

		a->size = sizeof(*a);
		a->length = field(PAGE);
		a->provider = rnd() % 4 ? fuzz_provider : (uint32_t)(rnd() % 3);
		break;
	}
	case 0x03: {
		struct p2pbuf_revoke *r = (void *)d;

		r->size = sizeof(*r);
		r->fd = fuzz_fd(planted);
		break;
	}
	case 0x04: {
		struct p2pbuf_refusal *r = (void *)d;

		r->size = sizeof(*r);
		r->fd = fuzz_fd(planted);
		break;
	}
	case 0x05: {
		struct p2pbuf_attachment *a = (void *)d;

		a->size = sizeof(*a);
		a->fd = fuzz_fd(planted);
		a->index = rnd() % 4 ? 0 : (uint32_t)rnd();
		break;
	}
	case 0x10: {
		struct p2pbuf_dma_import *im = (void *)d;

		im->size = sizeof(*im);
		im->fd = fuzz_fd(planted);
		break;
	}
	case 0x11: {
		struct p2pbuf_dma_release *r = (void *)d;

		r->size = sizeof(*r);
		r->handle = pick_handle();
		break;
	}
	case 0x12: {
		struct p2pbuf_dma_copy *c = (void *)d;

		c->size = sizeof(*c);
		c->src_handle = pick_handle();
		c->dst_handle = pick_handle();
		c->src_offset = rnd() % 2 ? rnd() % PAGE : field(0);
		c->dst_offset = rnd() % 2 ? rnd() % PAGE : field(0);
		c->len = rnd() % 5000;
		c->timeout_ms = rnd() % 2000;
		break;
	}
	default:
		d[0] = 8 * (rnd() % 9);
	}
}

/*
 * Fuzzes one device: iters calls with a random ioctl number (mostly the project's, nr
 * 0x00-0x1f as the header defines them, or with other direction/size bits, or as _IO()), a
 * random argument (a 512-byte buffer of biased fields with a random size field, or NULL, or
 * an unmapped or kernel pointer). A planted valid dma-buf fd and valid engine handles make the calls reach past the argument
 * checks. Copies are capped by closing the buffers they could run on: a planted buffer is
 * one page, so a copy is at most one page. Returns the number of calls that failed with an
 * errno outside the documented set.
 */
static int fuzz(struct __test_metadata *_metadata, int dev, int p2p, int iters,
		int *ok_calls, int *fds_made)
{
	union {
		uint64_t q[64];
		uint32_t d[128];
		int32_t i[128];
	} u;
	int bad = 0, i;
	int planted = p2pbuf_alloc_fd(p2p, PAGE);

	fuzz_provider = p2pbuf_first_provider(p2p);
	static const unsigned long bad_ptrs[] = {
		0, 1, 0xfff, 0xffff888000000000UL, 0xffffffffff600000UL, ~0UL,
	};

	if (planted < 0)
		return 0;
	for (i = 0; i < iters; i++) {
		static const unsigned long real[] = { 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x10, 0x11, 0x12 };
		unsigned long cmd, nr = rnd() % 4 ? real[rnd() % (sizeof(real) / sizeof(real[0]))] : rnd() % 0x20;
		void *arg = &u;
		int ret, e;

		switch (rnd() % 8) {
		case 0:
			cmd = _IOWR(P2PBUF_IOCTL_MAGIC, nr, struct p2pbuf_dma_copy);
			break;
		case 1:
			cmd = (unsigned long)(uint32_t)rnd();
			break;
		case 2:
			cmd = _IO(P2PBUF_IOCTL_MAGIC, nr);
			break;
		default:
			cmd = real_cmd(nr);
		}
		if (i % 50 == 49) {
			/* A fresh planted buffer now and then: the fuzzer may have revoked it. */
			close(planted);
			planted = p2pbuf_alloc_fd(p2p, PAGE);
			if (planted < 0)
				break;
		}
		if (rnd() % 3 == 0) {
			/* Noise: biased random fields and a random size field. */
			for (size_t w = 0; w < 64; w++)
				u.q[w] = field(w % 2 ? (uint64_t)planted : (uint64_t)(rnd() % 4));
			u.d[0] = (uint32_t)field(8 * (rnd() % 9));
			if (rnd() % 2)
				u.i[1] = planted;
		} else {
			/* A valid argument for the command, then zero to two fields mutated: the
			 * calls get past the size and flags checks into the real work. */
			template(&u.d[0], nr, planted);
			for (int k = rnd() % 3; k > 0; k--)
				u.d[1 + rnd() % 11] = (uint32_t)field(rnd() % 4);
		}
		/*
		 * Allocations stay out of the memory that other tests left for the host check
		 * after the run (spacer-placed buffers at 3/8, 1/2, 3/4 of the BAR): the
		 * allocator is first fit and zeroes what it hands out, so a fuzzed length is
		 * either at most 1 MiB (from the bottom of the BAR) or more than the BAR holds
		 * (refused without touching memory).
		 */
		if (dev == p2p && nr == 0x02 && u.q[1] > (1ULL << 20) && u.q[1] <= (8ULL << 30))
			u.q[1] = rnd() % 2 ? u.q[1] % (1ULL << 20) : u.q[1] + (8ULL << 30);
		/* Copy lengths stay small: the engine does ~15 KiB/s. */
		if (nr == 0x12 && u.q[4] > 5000)
			u.q[4] = rnd() % 5000;	/* struct p2pbuf_dma_copy.len */
		if (rnd() % 10 == 0)
			arg = (void *)bad_ptrs[rnd() % (sizeof(bad_ptrs) / sizeof(bad_ptrs[0]))];
		ret = ioctl(dev, cmd, arg);
		e = errno;
		if (ret >= 0) {
			(*ok_calls)++;
			if (dev != p2p && nr == 0x10 && arg == &u && nknown < 256)
				known[nknown++] = u.d[3];	/* p2pbuf_dma_import.handle */
			/* A successful alloc made a dma-buf fd: close it (fd field at byte 20). */
			if (dev == p2p && nr == 0x02 && arg == &u) {
				int fd = u.i[5];

				if (fd > 2 && fd != planted && fd != dev && fd != p2p &&
				    fcntl(fd, F_GETFD) >= 0) {
					close(fd);
					(*fds_made)++;
				}
			}
		} else if (!errno_allowed(e)) {
			bad++;
			TH_LOG("ioctl(cmd %#lx, nr %#lx, size field %u) failed with errno %d (%s)",
			       cmd, nr, u.d[0], e, strerror(e));
		}
	}
	close(planted);
	return bad;
}

TEST_F_TIMEOUT(faults, ioctl_fuzz_exporter, 300)
{
	struct p2pbuf_info info;
	int ok = 0, made = 0, bad;
	unsigned long seed = (unsigned long)time(NULL) ^ ((unsigned long)getpid() << 16);

	rng_state = seed | 1;
	TH_LOG("seed %#lx", seed);
	bad = fuzz(_metadata, self->p2p, self->p2p, 4000, &ok, &made);
	TH_LOG("4000 calls: %d succeeded (%d dma-bufs made and closed), %d bad errnos",
	       ok, made, bad);
	EXPECT_EQ(0, bad);
	EXPECT_GT(ok, 100);	/* the fuzzer reached past the argument checks */
	/* The device still answers as documented. */
	memset(&info, 0, sizeof(info));
	info.size = sizeof(info);
	EXPECT_EQ(0, ioctl(self->p2p, P2PBUF_IOCTL_INFO, &info));
	EXPECT_EQ((__u32)P2PBUF_API_VERSION, info.api_version);
}

TEST_F_TIMEOUT(faults, ioctl_fuzz_importer, 600)
{
	int ok = 0, made = 0, bad;
	unsigned long seed = (unsigned long)time(NULL) ^ ((unsigned long)getpid() << 16);

	if (self->dma < 0)
		SKIP(return, "no %s (p2pbuf_dma not loaded or no edu device)", DMA_DEV);
	rng_state = seed | 1;
	nknown = 0;
	TH_LOG("seed %#lx", seed);
	bad = fuzz(_metadata, self->dma, self->p2p, 1500, &ok, &made);
	TH_LOG("1500 calls: %d succeeded (%u imports), %d bad errnos", ok, nknown, bad);
	EXPECT_GT(ok, 10);	/* the fuzzer reached past the argument checks */
	EXPECT_EQ(0, bad);
	/* Imports made by the fuzzer go away with the file. */
	close(self->dma);
	self->dma = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->dma, 0);
}

TEST_HARNESS_MAIN

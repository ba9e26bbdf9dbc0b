/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The wrappers of fail_nth.c: fault injection through /proc/thread-self/fail-nth, and each
 * swept operation's setup, run, verify and undo (the table of operations, the fixture and the
 * sweep are in fail_nth.c).
 */
#ifndef P2PBUF_FAIL_NTH_H
#define P2PBUF_FAIL_NTH_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <linux/dma-buf.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

#define PAGE 4096UL
#define P2P_DEV "/dev/p2pbuf"
#define DMA_DEV "/dev/p2pbuf-dma"
#define FAIL_NTH "/proc/thread-self/fail-nth"
#define DEBUGFS "/sys/kernel/debug"
/* As iommufd's: a bound for the sweep, not a property of the code under test. */
#define MAX_POINTS 1000
/* Bytes each COPY moves (one engine window: two transfers of 100 ms on the main boot). */
#define COPY_LEN 64

/* What one operation works on; every fd -1 and handle 0 when unused. */
struct ctx {
	int p2p, dma;		/* the fixture's /dev/p2pbuf and /dev/p2pbuf-dma */
	int fd, fd2;		/* dma-bufs of device memory */
	int out;		/* an fd the operation made (open) */
	int dma2;		/* a second engine file (close_engine_file) */
	__u32 h, h2;		/* engine handles */
	uint8_t *map;		/* a mapping of fd */
	struct p2pbuf_buf ubuf;	/* system memory (udmabuf) */
	struct p2pbuf_alloc alloc;
	volatile uint8_t seen;	/* what the fault read */
	volatile int sigbus;	/* the fault raised SIGBUS */
};

/* One operation: setup (outside injection), run (the swept call: 0, or -1 and errno), then
 * verify that a successful result works, undo it and tear down. */
struct op {
	const char *name;
	int engine;		/* needs /dev/p2pbuf-dma and a peer-to-peer path to it */
	int (*setup)(struct ctx *c);
	int (*run)(struct ctx *c);
	int (*verify)(struct ctx *c);
	void (*undo)(struct ctx *c);
};


/* The provider ALLOC asks (looked up outside the injection window). */
static __u32 provider_id;

static long long provider_free(int p2p)
{
	struct p2pbuf_provider_info p;

	return p2pbuf_first_provider_info(p2p, &p) ? -1 : (long long)p.free;
}

/* Open fds of this process. */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;	/* the directory's own fd */
}

/* Attachments of the dma-buf fd as the exporter counts them, or -1. */
static int attachments(int p2p, int fd)
{
	struct p2pbuf_attachment a = { .size = sizeof(a), .fd = fd };

	if (fd < 0)
		return 0;
	if (ioctl(p2p, P2PBUF_IOCTL_ATTACHMENT, &a) && errno != ENOENT)
		return -1;
	return (int)a.nr_attachments;
}

static int write_file(const char *path, const char *val)
{
	return sysfs_write(path, val);
}

/*
 * Fault injection for this test: every allocation may fail (sleeping ones included, order 0
 * and highmem pages too), nothing fails except through fail-nth (probability 0, task filter),
 * and each forced failure prints one line (verbose 1: no stack dump) for the console log.
 * 0, or -errno when the kernel has no such debugfs files.
 */
static int setup_fault_injection(void)
{
	static const char *const caps[] = { "failslab", "fail_page_alloc" };
	char path[256];
	unsigned int i;
	int err;

	for (i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
		static const char *const kv[][2] = {
			{ "ignore-gfp-wait", "N" }, { "probability", "0" },
			{ "task-filter", "Y" }, { "verbose", "1" },
		};
		unsigned int j;

		for (j = 0; j < sizeof(kv) / sizeof(kv[0]); j++) {
			snprintf(path, sizeof(path), DEBUGFS "/%s/%s", caps[i], kv[j][0]);
			err = write_file(path, kv[j][1]);
			if (err)
				return err;
		}
	}
	err = write_file(DEBUGFS "/fail_page_alloc/ignore-gfp-highmem", "N");
	return err ? err : write_file(DEBUGFS "/fail_page_alloc/min-order", "0");
}

/* Arms fail-nth: the nth injection point this task passes fails. */
static int arm(int nth, unsigned int n)
{
	char buf[16];
	int len = snprintf(buf, sizeof(buf), "%u", n);

	return pwrite(nth, buf, len, 0) == len ? 0 : -1;
}

/* Disarms fail-nth; what was left of it (0: the failure was injected), or -1. */
static long disarm(int nth)
{
	char buf[16] = "";
	ssize_t n = pread(nth, buf, sizeof(buf) - 1, 0);

	if (pwrite(nth, "0", 1, 0) != 1 || n <= 0)
		return -1;
	return strtol(buf, NULL, 10);
}

/*
 * This test runs last on its boot (tests/vm/run-tests.sh), after tests that leave bytes at the
 * start of the BAR for the host to check when the run is over (rdma_7_peermem.sh: the first
 * 3 MiB). Allocation is first fit, and this test's buffers are small and mostly zeroed: an
 * uninitialized guard, allocated first and held, keeps them above those bytes.
 */
#define GUARD (16UL << 20)

/* --- setups --- */

static int alloc_dev(struct ctx *c, int *fd, __u32 flags)
{
	struct p2pbuf_alloc a = {
		.size = sizeof(a), .flags = flags, .length = 2 * PAGE, .provider = provider_id,
	};

	if (ioctl(c->p2p, P2PBUF_IOCTL_ALLOC, &a))
		return -errno;
	*fd = a.fd;
	return 0;
}

static int setup_none(struct ctx *c)
{
	(void)c;
	return 0;
}

static int setup_buf(struct ctx *c)
{
	return alloc_dev(c, &c->fd, 0);
}

static int setup_mapped(struct ctx *c)
{
	int err = setup_buf(c);

	if (err)
		return err;
	c->map = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
	return c->map == MAP_FAILED ? (c->map = NULL, -errno) : 0;
}

static int setup_imported(struct ctx *c)
{
	int err = setup_buf(c), h;

	if (err)
		return err;
	h = dma_import(c->dma, c->fd);
	if (h < 0)
		return h;
	c->h = h;
	return 0;
}

static int setup_udmabuf(struct ctx *c)
{
	return p2pbuf_udmabuf_alloc(&c->ubuf, 2 * PAGE);
}

/* Two imported buffers, the source's first COPY_LEN bytes a pattern. */
static int setup_copy(struct ctx *c)
{
	uint8_t *m;
	int err = setup_imported(c), h;
	size_t i;

	if (err)
		return err;
	err = alloc_dev(c, &c->fd2, 0);
	if (err)
		return err;
	h = dma_import(c->dma, c->fd2);
	if (h < 0)
		return h;
	c->h2 = h;
	m = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
	if (m == MAP_FAILED)
		return -errno;
	for (i = 0; i < COPY_LEN; i++)
		m[i] = p2pbuf_pattern(i, 27);
	munmap(m, PAGE);
	return 0;
}

static int setup_engine_file(struct ctx *c)
{
	int err = setup_buf(c), h;

	if (err)
		return err;
	c->dma2 = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	if (c->dma2 < 0)
		return -errno;
	h = dma_import(c->dma2, c->fd);
	return h < 0 ? h : 0;
}

/* --- the swept operations --- */

static int run_open_p2p(struct ctx *c)
{
	c->out = open(P2P_DEV, O_RDWR | O_CLOEXEC);
	return c->out < 0 ? -1 : 0;
}

static int run_open_dma(struct ctx *c)
{
	c->out = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	return c->out < 0 ? -1 : 0;
}

static int run_info(struct ctx *c)
{
	struct p2pbuf_info i = { .size = sizeof(i) };

	if (ioctl(c->p2p, P2PBUF_IOCTL_INFO, &i))
		return -1;
	c->seen = i.api_version == P2PBUF_API_VERSION && i.nr_providers > 0;
	return 0;
}

static int run_provider_info(struct ctx *c)
{
	struct p2pbuf_provider_info p = {
		.size = sizeof(p), .id = 1, .flags = P2PBUF_PROVIDER_INFO_NEXT,
	};

	if (ioctl(c->p2p, P2PBUF_IOCTL_PROVIDER_INFO, &p))
		return -1;
	c->seen = p.id != 0 && p.total != 0;
	return 0;
}

static int run_alloc(struct ctx *c, __u32 flags)
{
	c->alloc = (struct p2pbuf_alloc){
		.size = sizeof(c->alloc), .flags = flags, .length = 2 * PAGE,
		.provider = provider_id,
	};
	if (ioctl(c->p2p, P2PBUF_IOCTL_ALLOC, &c->alloc))
		return -1;
	c->fd = c->alloc.fd;
	return 0;
}

static int run_alloc_zeroed(struct ctx *c)
{
	return run_alloc(c, 0);
}

static int run_alloc_uninit(struct ctx *c)
{
	return run_alloc(c, P2PBUF_ALLOC_UNINITIALIZED);
}

static int run_revoke(struct ctx *c)
{
	struct p2pbuf_revoke r = { .size = sizeof(r), .fd = c->fd };

	return ioctl(c->p2p, P2PBUF_IOCTL_REVOKE, &r);
}

static int run_refusal(struct ctx *c)
{
	struct p2pbuf_refusal r = { .size = sizeof(r), .fd = c->fd };

	if (ioctl(c->p2p, P2PBUF_IOCTL_REFUSAL, &r))
		return -1;
	c->seen = r.reason == P2PBUF_REFUSAL_NONE && r.provider != 0;
	return 0;
}

static int run_attachment(struct ctx *c)
{
	struct p2pbuf_attachment a = { .size = sizeof(a), .fd = c->fd };

	if (ioctl(c->p2p, P2PBUF_IOCTL_ATTACHMENT, &a))
		return -1;
	c->seen = a.nr_attachments == 1 && a.device[0];
	return 0;
}

static int run_mmap(struct ctx *c)
{
	c->map = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
	if (c->map == MAP_FAILED) {
		c->map = NULL;
		return -1;
	}
	return 0;
}

static sigjmp_buf fault_jmp;
static struct ctx *fault_ctx;

static void on_sigbus(int sig)
{
	(void)sig;
	fault_ctx->sigbus = 1;
	siglongjmp(fault_jmp, 1);
}

/*
 * The first access to each page of the mapping: the exporter inserts the page (and the kernel
 * a page table). An injected ENOMEM is an out-of-memory fault, which the kernel retries: the
 * access completes either way; SIGBUS would be a bug.
 */
static int run_fault(struct ctx *c)
{
	if (sigsetjmp(fault_jmp, 1))
		return 0;
	c->seen = c->map[0] | c->map[PAGE + 17];
	return 0;
}

static int run_sync(int fd)
{
	struct dma_buf_sync s = { .flags = DMA_BUF_SYNC_START | DMA_BUF_SYNC_RW };

	return ioctl(fd, DMA_BUF_IOCTL_SYNC, &s);
}

static int run_sync_dev(struct ctx *c)
{
	return run_sync(c->fd);
}

static int run_sync_udmabuf(struct ctx *c)
{
	return run_sync(c->ubuf.fd);
}

/* The last close of a buffer: its release gives the memory back before close returns. */
static int run_free(struct ctx *c)
{
	int r = close(c->fd);

	c->fd = -1;
	return r;
}

static int run_import(struct ctx *c, int fd)
{
	int h = dma_import(c->dma, fd);

	if (h < 0) {
		errno = -h;
		return -1;
	}
	c->h = h;
	return 0;
}

static int run_import_dev(struct ctx *c)
{
	return run_import(c, c->fd);
}

static int run_import_udmabuf(struct ctx *c)
{
	return run_import(c, c->ubuf.fd);
}

static int run_copy(struct ctx *c)
{
	long n = dma_copy(c->dma, c->h, c->h2, COPY_LEN);

	if (n < 0) {
		errno = (int)-n;
		return -1;
	}
	c->seen = n == COPY_LEN;
	return 0;
}

static int run_release(struct ctx *c)
{
	int r = dma_release(c->dma, c->h);

	if (r) {
		errno = -r;
		return -1;
	}
	c->h = 0;
	return 0;
}

static int run_close_engine_file(struct ctx *c)
{
	int r = close(c->dma2);

	c->dma2 = -1;
	return r;
}

/* --- checks of a successful result (outside injection) --- */

static int verify_none(struct ctx *c)
{
	(void)c;
	return 0;
}

static int verify_seen(struct ctx *c)
{
	return c->seen ? 0 : -1;
}

static int verify_out(struct ctx *c)
{
	return fcntl(c->out, F_GETFD) < 0 ? -1 : 0;
}

/* The new buffer maps, and a zeroed one reads zeroes. */
static int verify_alloc(struct ctx *c)
{
	uint8_t *m = mmap(NULL, 2 * PAGE, PROT_READ, MAP_SHARED, c->fd, 0);
	int bad = 0;
	size_t i;

	if (m == MAP_FAILED)
		return -1;
	if (!(c->alloc.flags & P2PBUF_ALLOC_UNINITIALIZED))
		for (i = 0; i < 2 * PAGE; i++)
			bad |= m[i];
	munmap(m, 2 * PAGE);
	return bad ? -1 : 0;
}

/* The mapping reads the zeroed buffer. */
static int verify_map(struct ctx *c)
{
	return c->map && !c->map[0] && !c->map[2 * PAGE - 1] ? 0 : -1;
}

static int verify_fault(struct ctx *c)
{
	return !c->sigbus && !c->seen ? 0 : -1;
}

/* Revoked: a new mapping is refused with ENODEV. */
static int verify_revoked(struct ctx *c)
{
	void *m = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, c->fd, 0);

	if (m != MAP_FAILED) {
		munmap(m, PAGE);
		return -1;
	}
	return errno == ENODEV ? 0 : -1;
}

/* Revoked with the engine attached: its copies fail with ENODEV. */
static int verify_revoked_import(struct ctx *c)
{
	/* One byte from the first page to the second: a copy within one buffer must not overlap
	 * (EINVAL before anything else), so offset 0 to 0 would not ask about the revoke. */
	long n = dma_copy_at(c->dma, c->h, 0, c->h, PAGE, 1);

	return n == -ENODEV && !verify_revoked(c) ? 0 : -1;
}

static int verify_attached(struct ctx *c)
{
	return attachments(c->p2p, c->fd) == 1 ? 0 : -1;
}

static int verify_detached(struct ctx *c)
{
	return attachments(c->p2p, c->fd) == 0 ? 0 : -1;
}

static int verify_copy(struct ctx *c)
{
	uint8_t *m = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, c->fd2, 0);
	int bad = !c->seen;
	size_t i;

	if (m == MAP_FAILED)
		return -1;
	for (i = 0; i < COPY_LEN; i++)
		bad |= m[i] != p2pbuf_pattern(i, 27);
	munmap(m, PAGE);
	return bad ? -1 : 0;
}

/* --- undo and teardown --- */

static void undo_none(struct ctx *c)
{
	(void)c;
}

static void undo_out(struct ctx *c)
{
	p2pbuf_close(&c->out);
}

static void undo_sync_dev(struct ctx *c)
{
	p2pbuf_cpu_access(&(struct p2pbuf_buf){ .fd = c->fd }, 0);
}

static void undo_sync_udmabuf(struct ctx *c)
{
	p2pbuf_cpu_access(&c->ubuf, 0);
}

/* Everything a ctx holds, released; then empty. */
static void teardown(struct ctx *c)
{
	if (c->map)
		munmap(c->map, 2 * PAGE);
	if (c->dma >= 0) {
		if (c->h)
			dma_release(c->dma, c->h);
		if (c->h2)
			dma_release(c->dma, c->h2);
	}
	p2pbuf_close(&c->fd);
	p2pbuf_close(&c->fd2);
	p2pbuf_close(&c->out);
	p2pbuf_close(&c->dma2);
	if (c->ubuf.fd >= 0 || c->ubuf.memfd >= 0 || c->ubuf.map)
		p2pbuf_buf_free(&c->ubuf);
	c->map = NULL;
	c->h = c->h2 = 0;
	c->seen = 0;
	c->sigbus = 0;
}

static void ctx_init(struct ctx *c, int p2p, int dma)
{
	memset(c, 0, sizeof(*c));
	c->p2p = p2p;
	c->dma = dma;
	c->fd = c->fd2 = c->out = c->dma2 = -1;
	c->ubuf.fd = c->ubuf.memfd = -1;
}

#endif /* P2PBUF_FAIL_NTH_H */

// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf fail-nth test (issue 27), as iommufd's tools/testing/selftests/iommu/iommufd_fail_nth.c
 * sweeps its ioctls: for each operation of both modules, fail the Nth fault-injection point the
 * operation passes (failslab and fail_page_alloc, through /proc/thread-self/fail-nth), for
 * N = 1, 2, ... until the operation succeeds with the injection still pending (it passed every
 * point).
 *
 * What must hold after each injected failure: the operation returns -1 with ENOMEM (an
 * allocation failure is ENOMEM to userspace; the lab has no usercopy injection, so no EFAULT),
 * never success with a result that does not work; it leaves nothing (no new fd, the provider's
 * free bytes as before, no attachment left on the buffer); the same operation without injection
 * then succeeds. An injected failure the operation absorbs (a fallback, an optional allocation)
 * is fine if its result works. After every round the provider's memory and the fd table are as
 * at the start. The suite's final kmemleak scan catches leaked kernel objects, and the console
 * scan every report (KASAN, lockdep, WARN, ...) that an error path provokes; each forced failure
 * is printed to the console ("FAULT_INJECTION: forcing a failure.", verbose 1) so that such a
 * report can be traced to the injection before it, and xtask counts them.
 *
 * Covered: every ioctl of /dev/p2pbuf (INFO, PROVIDER_INFO, ALLOC zeroed and uninitialized,
 * REVOKE with and without an importer, REFUSAL, ATTACHMENT), open of both devices, mmap and the
 * first fault of a buffer's mapping, DMA_BUF_IOCTL_SYNC on device memory and on a udmabuf
 * (whose first SYNC builds its CPU-access table), the last close of a buffer (its release), and
 * every ioctl of /dev/p2pbuf-dma (IMPORT of device and system memory: the dynamic attach and
 * map; COPY; RELEASE: the detach) and the close of an engine file holding an import. Not
 * reachable from userspace here: the exporter's vmap (only in-kernel importers vmap; issue 27
 * N1's vivid test reaches it), and ibv_reg_dmabuf_mr (out of scope).
 */
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

/* Totals over the tests: each test runs in a child of the harness; this page is shared. */
static struct totals {
	pid_t parent;
	unsigned int ops, points, failed, absorbed;
} *totals;

static __attribute__((constructor)) void totals_init(void)
{
	totals = mmap(NULL, sizeof(*totals), PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (totals == MAP_FAILED)
		totals = NULL;
	else
		totals->parent = getpid();
}

static __attribute__((destructor)) void totals_print(void)
{
	if (totals && totals->parent == getpid() && totals->ops)
		ksft_print_msg("fail-nth: %u operations x %u injection points (in all: %u failed with ENOMEM, %u absorbed)\n",
			       totals->ops, totals->points, totals->failed, totals->absorbed);
}

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
	h = p2pbuf_engine_import(c->dma, c->fd);
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
	h = p2pbuf_engine_import(c->dma, c->fd2);
	if (h < 0)
		return h;
	c->h2 = h;
	m = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
	if (m == MAP_FAILED)
		return -errno;
	for (i = 0; i < COPY_LEN; i++)
		m[i] = p2pbuf_host_pattern(i, 27);
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
	h = p2pbuf_engine_import(c->dma2, c->fd);
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
	int h = p2pbuf_engine_import(c->dma, fd);

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
	long n = p2pbuf_engine_copy(c->dma, c->h, c->h2, COPY_LEN);

	if (n < 0) {
		errno = (int)-n;
		return -1;
	}
	c->seen = n == COPY_LEN;
	return 0;
}

static int run_release(struct ctx *c)
{
	int r = p2pbuf_engine_release(c->dma, c->h);

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
	long n = p2pbuf_engine_copy_at(c->dma, c->h, 0, c->h, PAGE, 1);

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
		bad |= m[i] != p2pbuf_host_pattern(i, 27);
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
			p2pbuf_engine_release(c->dma, c->h);
		if (c->h2)
			p2pbuf_engine_release(c->dma, c->h2);
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

#define OP(n, e, s, r, v, u) \
	static const struct op op_##n = { #n, e, s, r, v, u }

OP(open_p2pbuf, 0, setup_none, run_open_p2p, verify_out, undo_out);
OP(info, 0, setup_none, run_info, verify_seen, undo_none);
OP(provider_info, 0, setup_none, run_provider_info, verify_seen, undo_none);
OP(alloc_zeroed, 0, setup_none, run_alloc_zeroed, verify_alloc, undo_none);
OP(alloc_uninitialized, 0, setup_none, run_alloc_uninit, verify_alloc, undo_none);
OP(refusal, 0, setup_buf, run_refusal, verify_seen, undo_none);
OP(mmap, 0, setup_buf, run_mmap, verify_map, undo_none);
OP(fault, 0, setup_mapped, run_fault, verify_fault, undo_none);
OP(sync_device_memory, 0, setup_buf, run_sync_dev, verify_none, undo_sync_dev);
OP(sync_udmabuf_first, 0, setup_udmabuf, run_sync_udmabuf, verify_none, undo_sync_udmabuf);
OP(revoke, 0, setup_mapped, run_revoke, verify_revoked, undo_none);
OP(free, 0, setup_buf, run_free, verify_none, undo_none);
OP(open_p2pbuf_dma, 1, setup_none, run_open_dma, verify_out, undo_out);
OP(import_device_memory, 1, setup_buf, run_import_dev, verify_attached, undo_none);
OP(import_udmabuf, 1, setup_udmabuf, run_import_udmabuf, verify_none, undo_none);
OP(attachment, 1, setup_imported, run_attachment, verify_seen, undo_none);
OP(copy, 1, setup_copy, run_copy, verify_copy, undo_none);
OP(revoke_imported, 1, setup_imported, run_revoke, verify_revoked_import, undo_none);
OP(release, 1, setup_imported, run_release, verify_detached, undo_none);
OP(close_engine_file, 1, setup_engine_file, run_close_engine_file, verify_detached, undo_none);

FIXTURE(fail_nth) {
	/* An uninitialized buffer held at the start of the BAR during the test: see GUARD. */
	int guard;
	int p2p, dma, nth;
	long long free0;
	int fds0;
};

FIXTURE_VARIANT(fail_nth) {
	const struct op *op;
};

#define VARIANT(n) FIXTURE_VARIANT_ADD(fail_nth, n) { .op = &op_##n }

VARIANT(open_p2pbuf);
VARIANT(info);
VARIANT(provider_info);
VARIANT(alloc_zeroed);
VARIANT(alloc_uninitialized);
VARIANT(refusal);
VARIANT(mmap);
VARIANT(fault);
VARIANT(sync_device_memory);
VARIANT(sync_udmabuf_first);
VARIANT(revoke);
VARIANT(free);
VARIANT(open_p2pbuf_dma);
VARIANT(import_device_memory);
VARIANT(import_udmabuf);
VARIANT(attachment);
VARIANT(copy);
VARIANT(revoke_imported);
VARIANT(release);
VARIANT(close_engine_file);

FIXTURE_SETUP(fail_nth)
{
	struct p2pbuf_alloc guard = {
		.size = sizeof(guard), .flags = P2PBUF_ALLOC_UNINITIALIZED, .length = GUARD,
	};
	int err;

	self->dma = self->nth = self->guard = -1;
	self->p2p = open(P2P_DEV, O_RDWR | O_CLOEXEC);
	if (self->p2p < 0)
		SKIP(return, "no %s (p2pbuf_exporter not loaded?)", P2P_DEV);
	provider_id = p2pbuf_first_provider(self->p2p);
	ASSERT_NE(0U, provider_id);
	guard.provider = provider_id;
	ASSERT_EQ(0, ioctl(self->p2p, P2PBUF_IOCTL_ALLOC, &guard))
		TH_LOG("the guard: %s", strerror(errno));
	self->guard = guard.fd;
	self->nth = open(FAIL_NTH, O_RDWR | O_CLOEXEC);
	if (self->nth < 0)
		SKIP(return, "no %s: the kernel has no CONFIG_FAULT_INJECTION (the debug lab kernel has)",
		     FAIL_NTH);
	err = setup_fault_injection();
	if (err)
		SKIP(return, "cannot configure %s/failslab and fail_page_alloc (%s): the kernel needs CONFIG_FAILSLAB, CONFIG_FAIL_PAGE_ALLOC and CONFIG_FAULT_INJECTION_DEBUG_FS",
		     DEBUGFS, strerror(-err));
	if (variant->op->engine) {
		struct ctx c;
		int h;

		self->dma = open(DMA_DEV, O_RDWR | O_CLOEXEC);
		if (self->dma < 0)
			SKIP(return, "no %s (p2pbuf_importer not loaded or no edu device)", DMA_DEV);
		/* The engine must reach device memory here (not on a topology that refuses it). */
		ctx_init(&c, self->p2p, self->dma);
		ASSERT_EQ(0, setup_buf(&c));
		h = p2pbuf_engine_import(self->dma, c.fd);
		if (h > 0)
			p2pbuf_engine_release(self->dma, h);
		teardown(&c);
		if (h == -EOPNOTSUPP)
			SKIP(return, "no peer-to-peer path between the engine and device memory here");
		ASSERT_GT(h, 0);
	}
	self->free0 = provider_free(self->p2p);
	ASSERT_GT(self->free0, 0);
	self->fds0 = count_fds();
	ASSERT_GT(self->fds0, 0);
}

FIXTURE_TEARDOWN(fail_nth)
{
	if (self->nth >= 0)
		pwrite(self->nth, "0", 1, 0);
	p2pbuf_close(&self->nth);
	p2pbuf_close(&self->dma);
	p2pbuf_close(&self->guard);
	p2pbuf_close(&self->p2p);
}

/* Names of the errnos an operation failed with (bit e set for errno e < 64). */
static void errno_names(uint64_t set, char *buf, size_t len)
{
	int e, n = 0;

	buf[0] = 0;
	for (e = 1; e < 64; e++)
		if (set & (1ULL << e))
			n += snprintf(buf + n, len - n, "%s%s", n ? "/" : "",
				      e == ENOMEM ? "ENOMEM" : strerror(e));
}

TEST_F_TIMEOUT(fail_nth, sweep, 600)
{
	const struct op *op = variant->op;
	unsigned int n, failed = 0, absorbed = 0;
	uint64_t errnos = 0;
	struct sigaction sa = { .sa_handler = on_sigbus };
	char names[128];
	struct ctx c;

	sigemptyset(&sa.sa_mask);
	ASSERT_EQ(0, sigaction(SIGBUS, &sa, NULL));
	fault_ctx = &c;
	for (n = 1;; n++) {
		long long free1;
		long left;
		int fds1, att1, rc, err;

		ASSERT_GT(MAX_POINTS, (int)n) TH_LOG("%s: more than %d injection points?", op->name,
						MAX_POINTS);
		ctx_init(&c, self->p2p, self->dma);
		ASSERT_EQ(0, op->setup(&c)) TH_LOG("%s: setup failed", op->name);
		free1 = provider_free(self->p2p);
		fds1 = count_fds();
		att1 = attachments(self->p2p, c.fd);

		ASSERT_EQ(0, arm(self->nth, n));
		rc = op->run(&c);
		err = errno;
		left = disarm(self->nth);
		ASSERT_LE(0, left);

		if (rc) {
			/* Only an injected failure may make it fail, and only with ENOMEM. */
			EXPECT_EQ(0, left) TH_LOG("%s: failed (%s) with fail-nth %u not reached",
						  op->name, strerror(err), n);
			EXPECT_EQ(ENOMEM, err) TH_LOG("%s: injection point %u: errno %d (%s)",
						      op->name, n, err, strerror(err));
			if (err > 0 && err < 64)
				errnos |= 1ULL << err;
			failed++;
			/* It left nothing. */
			EXPECT_EQ(fds1, count_fds()) TH_LOG("%s: point %u left an fd", op->name, n);
			EXPECT_EQ(free1, provider_free(self->p2p))
				TH_LOG("%s: point %u kept device memory", op->name, n);
			EXPECT_EQ(att1, attachments(self->p2p, c.fd))
				TH_LOG("%s: point %u left an attachment", op->name, n);
			/* The same call without injection works. */
			rc = op->run(&c);
			EXPECT_EQ(0, rc) TH_LOG("%s: the retry after point %u failed: %s",
						op->name, n, strerror(errno));
		} else if (left == 0) {
			absorbed++;
		}
		if (!rc) {
			EXPECT_EQ(0, op->verify(&c))
				TH_LOG("%s: the result does not work (injection point %u%s)",
				       op->name, n, left ? " not reached" : " absorbed");
			op->undo(&c);
		}
		teardown(&c);
		/* Everything is back as at the start. */
		EXPECT_EQ(self->free0, provider_free(self->p2p))
			TH_LOG("%s: after point %u the provider misses memory", op->name, n);
		EXPECT_EQ(self->fds0, count_fds())
			TH_LOG("%s: after point %u an fd leaked", op->name, n);
		if (_metadata->exit_code != KSFT_PASS)
			break;
		if (left)
			break;	/* passed every injection point */
	}
	n--;
	errno_names(errnos, names, sizeof(names));
	if (!n)
		TH_LOG("%s: 0 injection points (no allocation the kernel could fail)", op->name);
	else if (!absorbed)
		TH_LOG("%s: %u injection points, all returned %s and left nothing; each retry worked",
		       op->name, n, names);
	else
		TH_LOG("%s: %u injection points: %u returned %s, %u absorbed (the result works); none left anything",
		       op->name, n, failed, failed ? names : "-", absorbed);
	if (totals && _metadata->exit_code == KSFT_PASS) {
		__atomic_add_fetch(&totals->ops, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&totals->points, n, __ATOMIC_RELAXED);
		__atomic_add_fetch(&totals->failed, failed, __ATOMIC_RELAXED);
		__atomic_add_fetch(&totals->absorbed, absorbed, __ATOMIC_RELAXED);
		ksft_print_msg("fail-nth so far: %u operations x %u injection points\n",
			       totals->ops, totals->points);
		fflush(stdout);	/* the harness's child ends with _exit() */
	}
}

TEST_HARNESS_MAIN

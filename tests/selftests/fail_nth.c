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
#include "fail_nth.h"

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
			SKIP(return, "no %s (p2pbuf_dma not loaded or no edu device)", DMA_DEV);
		/* The engine must reach device memory here (not on a topology that refuses it). */
		ctx_init(&c, self->p2p, self->dma);
		ASSERT_EQ(0, setup_buf(&c));
		h = dma_import(self->dma, c.fd);
		if (h > 0)
			dma_release(self->dma, h);
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

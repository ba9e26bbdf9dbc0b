// SPDX-License-Identifier: GPL-2.0
/*
 * Review finding N7 (issue 27): a REVOKE waits for the fences of the buffer, and any holder of
 * the buffer's fd can add one that never signals (DMA_BUF_IOCTL_IMPORT_SYNC_FILE of a sw_sync
 * point). Before the fix the revoke held the buffer's reservation lock across that unbounded
 * wait, so every importer that let go of the buffer meanwhile (dma_buf_detach() takes the
 * lock: the engine's RELEASE and close, rxe's MR deregistration and kworkers) waited behind it
 * in D state, as long as the fence did.
 *
 * - importer_detach_while_revoke_waits: the engine imports the buffer (a dynamic attachment,
 *   mapped), a fence that only the test signals is planted, REVOKE starts and waits for it;
 *   the engine's RELEASE of the buffer must return within DETACH_BOUND_S. Then the fence is
 *   signalled and the REVOKE must return 0. Every wait is bounded: the test signals the fence
 *   whatever happened, which frees anything stuck behind it.
 */
#include <poll.h>

#include "kselftest_harness.h"
#include "races.h"

#define DETACH_BOUND_S 3.0

/* A call run in a child process: its result (0 or -errno) comes back through a pipe. */
struct call {
	pid_t pid;
	int rfd;
	int result;
	int done;
	double start, secs;
};

enum { CALL_REVOKE, CALL_RELEASE };

static void call_start(struct call *c, int kind, int p2p, int fd, int dma, __u32 handle,
		       int close_fd)
{
	int p[2];

	memset(c, 0, sizeof(*c));
	c->rfd = -1;
	if (pipe2(p, O_CLOEXEC))
		return;
	c->start = now();
	c->pid = fork();
	if (c->pid == 0) {
		int r;

		/* The timeline: a child holding it would keep its fence from being signalled. */
		close(close_fd);
		close(p[0]);
		r = kind == CALL_REVOKE ? p2p_revoke(p2p, fd) : dma_release(dma, handle);
		_exit(write(p[1], &r, sizeof(r)) == sizeof(r) ? 0 : 1);
	}
	close(p[1]);
	if (c->pid < 0) {
		close(p[0]);
		return;
	}
	c->rfd = p[0];
}

/* Whether the call has returned, waiting up to secs. */
static int call_wait(struct call *c, double secs)
{
	struct pollfd pfd = { .fd = c->rfd, .events = POLLIN };
	int st;

	if (c->done || c->rfd < 0)
		return c->done;
	if (poll(&pfd, 1, (int)(secs * 1000)) == 1 &&
	    read(c->rfd, &c->result, sizeof(c->result)) == sizeof(c->result)) {
		c->done = 1;
		c->secs = now() - c->start;
		close(c->rfd);
		c->rfd = -1;
		waitpid(c->pid, &st, 0);
	}
	return c->done;
}

FIXTURE(fence)
{
	int unused;
};

FIXTURE_SETUP(fence)
{
}

FIXTURE_TEARDOWN(fence)
{
}

TEST_F_TIMEOUT(fence, importer_detach_while_revoke_waits, 120)
{
	struct call rev, rel = { .rfd = -1 };
	int p2p, dma, x, tl, h, released = -1;

	p2p = open(P2P_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, p2p) TH_LOG("%s: %s", P2P_DEV, strerror(errno));
	dma = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	if (dma < 0)
		SKIP(return, "%s: %s (importer not loaded)", DMA_DEV, strerror(errno));
	{
		/*
		 * Not zeroed: a zeroed ALLOC would clear the low BAR range where
		 * rdma_4_hostcheck.sh left bytes for the host to check after the run.
		 */
		struct p2pbuf_alloc a = {
			.size = sizeof(a), .length = 1UL << 20, .flags = P2PBUF_ALLOC_UNINITIALIZED,
		};

		ASSERT_EQ(0, p2pbuf_test_alloc(p2p, &a)) TH_LOG("ALLOC: %s", strerror(errno));
		x = a.fd;
	}
	h = dma_import(dma, x);
	if (h < 0)
		SKIP(return, "engine IMPORT: %s (no peer-to-peer path here)", strerror(-h));
	PLANT_FENCE_OR_SKIP(tl, x, 0);

	call_start(&rev, CALL_REVOKE, p2p, x, dma, 0, tl);
	ASSERT_LT(0, rev.pid);
	if (call_wait(&rev, 1.0)) {
		TH_LOG("REVOKE returned (%s) without waiting for the buffer's fence",
		       strerror(-rev.result));
	} else {
		call_start(&rel, CALL_RELEASE, p2p, x, dma, (__u32)h, tl);
		ASSERT_LT(0, rel.pid);
		released = call_wait(&rel, DETACH_BOUND_S);
		TH_LOG("the engine's RELEASE while REVOKE waits for a fence: %s",
		       released ? "returned" : "still waiting");
		EXPECT_TRUE(released)
			TH_LOG("RELEASE (dma_buf_detach) has not returned after %.0f s: it waits for the reservation lock that REVOKE holds across its fence wait (N7)",
			       DETACH_BOUND_S);
	}
	fence_signal(tl);
	EXPECT_TRUE(call_wait(&rev, 20)) TH_LOG("REVOKE did not return once the fence was signalled");
	EXPECT_EQ(0, rev.result);
	if (released >= 0) {
		EXPECT_TRUE(call_wait(&rel, 20)) TH_LOG("RELEASE never returned");
		EXPECT_EQ(0, rel.result) TH_LOG("RELEASE: %s", strerror(-rel.result));
		TH_LOG("RELEASE returned after %.2f s, REVOKE after %.2f s", rel.secs, rev.secs);
	}
	close(tl);
	close(x);
	close(dma);
	close(p2p);
}

TEST_HARNESS_MAIN

// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf races with deterministic windows: a fence that userspace controls
 * (CONFIG_SW_SYNC) holds REVOKE (M2) or the last close during an unbind (H1) where the
 * test wants it. The fixture is in races_fixture.h.
 */
#include "races_fixture.h"

/* ---- Deterministic windows with a fence that userspace controls (CONFIG_SW_SYNC) -------- */

enum { OP_REVOKE, OP_INFO, OP_ALLOC, OP_MMAP, OP_DEBUGFS, OP_CLOSE, OP_ATTACHMENT };

static int op_body(int kind, int p2p, int fd)
{
	struct p2pbuf_attachment att;
	char buf[4096];
	void *m;
	int r, dfd;

	switch (kind) {
	case OP_REVOKE:
		return p2p_revoke(p2p, fd);
	case OP_INFO:
		return provider_free(p2p) < 0 ? -EIO : 0;
	case OP_ALLOC:
		r = p2pbuf_alloc_fd(p2p, PAGE);
		if (r >= 0)
			close(r);
		return r < 0 ? r : 0;
	case OP_MMAP:
		m = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			return -errno;
		munmap(m, PAGE);
		return 0;
	case OP_DEBUGFS:
		dfd = open("/sys/kernel/debug/p2pbuf/buffers", O_RDONLY);
		if (dfd < 0)
			return -errno;
		while ((r = read(dfd, buf, sizeof(buf))) > 0)
			;
		close(dfd);
		return r < 0 ? -errno : 0;
	case OP_CLOSE:
		return close(fd) ? -errno : 0;
	case OP_ATTACHMENT:
		memset(&att, 0, sizeof(att));
		att.size = sizeof(att);
		att.fd = fd;
		/* Nobody is attached: -ENOENT is the answer once it can be given. */
		return ioctl(p2p, P2PBUF_IOCTL_ATTACHMENT, &att) ? -errno : 0;
	}
	return -EINVAL;
}

struct op_arg {
	int kind, p2p, fd;
};

static int op_run(void *arg)
{
	struct op_arg *a = arg;

	return op_body(a->kind, a->p2p, a->fd);
}

/* An operation run in a child process (a kid of the fixture), so that the test never blocks. */
static void op_start(FIXTURE_DATA(races) *self, struct child_call *o, int kind, int fd,
		     int go_fd)
{
	struct op_arg a = { .kind = kind, .p2p = self->p2p, .fd = fd };

	child_call_start(o, op_run, &a, self->timeline, go_fd);
	if (o->pid > 0)
		add_kid(self, o->pid);
}

/*
 * M2: while a REVOKE waits for a fence of the buffer (without limit, uninterruptibly), the
 * rest of the exporter keeps working: PROVIDER_INFO, ALLOC of another buffer and a debugfs
 * read return within 3 s, and so does an mmap() of the buffer being revoked (with ENODEV: it
 * is revoked) and ATTACHMENT of it (with EBUSY: its attachments are walked under the lock
 * the revoke holds while it waits). Needs CONFIG_SW_SYNC for a fence that userspace controls.
 */
TEST_F_TIMEOUT(races, m2_revoke_waiting_on_fence, 120)
{
	struct child_call rev, ops[5];
	const char *names[5] = { "PROVIDER_INFO", "ALLOC (another buffer)",
				 "mmap() of the buffer being revoked", "read of debugfs p2pbuf/buffers",
				 "ATTACHMENT of the buffer being revoked" };
	const int kinds[5] = { OP_INFO, OP_ALLOC, OP_MMAP, OP_DEBUGFS, OP_ATTACHMENT };
	int x, blocked = 0, waited = 0;

	x = p2pbuf_alloc_fd(self->p2p, 1UL << 20);
	ASSERT_GE(x, 0);
	PLANT_FENCE_OR_SKIP(self->timeline, x, 1);
	op_start(self, &rev, OP_REVOKE, x, -1);
	ASSERT_LT(0, rev.pid);
	if (child_call_wait(&rev, 1.0)) {
		ksft_print_msg("REVOKE returned (%s) without waiting for the buffer's fence\n",
			       strerror(-rev.result));
	} else {
		waited = 1;
		for (int i = 0; i < 5; i++)
			op_start(self, &ops[i], kinds[i], x, -1);
		for (int i = 0; i < 5; i++) {
			double left = ops[i].start + 3.0 - now();

			if (!child_call_wait(&ops[i], left > 0 ? left : 0)) {
				blocked++;
				ksft_print_msg("%s has not returned after 3 s: it waits behind a REVOKE "
					       "that waits for a fence without limit (M2)\n", names[i]);
			}
		}
	}
	fence_signal(self->timeline);
	EXPECT_TRUE(child_call_wait(&rev, 20)) TH_LOG("REVOKE did not return once the fence was signalled");
	EXPECT_EQ(0, rev.result);
	if (!waited)
		goto out;
	for (int i = 0; i < 5; i++) {
		EXPECT_TRUE(child_call_wait(&ops[i], 20)) TH_LOG("%s never returned", names[i]);
		if (kinds[i] == OP_MMAP) {
			EXPECT_EQ(-ENODEV, ops[i].result) TH_LOG("%s", names[i]);
		} else if (kinds[i] == OP_ATTACHMENT) {
			/* Answered at once, without waiting behind the revoke. */
			EXPECT_EQ(-EBUSY, ops[i].result) TH_LOG("%s", names[i]);
		} else {
			EXPECT_EQ(0, ops[i].result) TH_LOG("%s: %s", names[i], strerror(-ops[i].result));
		}
	}
	EXPECT_EQ(0, blocked);
out:
	close(self->timeline);
	self->timeline = -1;
	close(x);
}

/*
 * H1, deterministic: the unbind's revoke of a buffer waits (holding the buffer's lock) for a
 * fence of the buffer while another process closes the buffer's last fd, so that the final
 * fput() frees the dma-buf's inode; 0.5 s later (RCU grace periods pass) the fence is
 * signalled and the revoke goes on to zap the mappings of that inode's address_space. With
 * KASAN that use-after-free is reported on the console (and the harness fails the run).
 * The test itself checks that the unbind and the close return and the memory comes back.
 */
TEST_F_TIMEOUT(races, h1_fence_last_close_during_unbind, 120)
{
	struct child_call closer;
	int x, go[2], st = 0, done;
	uint8_t *m;

	x = p2pbuf_alloc_fd(self->p2p, 1UL << 20);
	ASSERT_GE(x, 0);
	m = mmap(NULL, 1UL << 20, PROT_READ | PROT_WRITE, MAP_SHARED, x, 0);
	ASSERT_NE(MAP_FAILED, m);
	m[0] = 1;
	munmap(m, 1UL << 20);
	PLANT_FENCE_OR_SKIP(self->timeline, x, 1);
	races_child_close_fd = self->timeline;
	ASSERT_EQ(0, pipe2(go, O_CLOEXEC));
	/* The closer holds the last reference once we close ours. */
	op_start(self, &closer, OP_CLOSE, x, go[0]);
	ASSERT_LT(0, closer.pid);
	close(go[0]);
	close(x);
	done = unbind_waited(_metadata, UNBIND, self->pci, &self->unbinder, 1.0, &st);
	if (done == 1)
		ksft_print_msg("the unbind returned without waiting for the buffer's fence\n");
	ASSERT_EQ(1, write(go[1], "c", 1));
	close(go[1]);
	if (child_call_wait(&closer, 0.5))
		ksft_print_msg("the last close returned while the unbind's revoke waited\n");
	else
		ksft_print_msg("the last close waits for the unbind's revoke (in the dma-buf's "
			       "release, after its inode was freed)\n");
	fence_signal(self->timeline);
	if (done != 1)
		done = wait_for(self->unbinder, UNBIND_LIMIT_S, &st);
	EXPECT_EQ(1, done) TH_LOG("the unbind did not return after the fence was signalled");
	if (done == 1) {
		self->unbinder = 0;
		EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) TH_LOG("unbind status %#x", st);
	}
	EXPECT_TRUE(child_call_wait(&closer, 20));
	EXPECT_EQ(0, closer.result);
	races_child_close_fd = -1;
	close(self->timeline);
	self->timeline = -1;
	ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
	EXPECT_EQ((long long)self->total, provider_free(self->p2p));
}

TEST_HARNESS_MAIN

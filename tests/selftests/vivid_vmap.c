// SPDX-License-Identifier: GPL-2.0
/*
 * N1 of ../shared/KERNEL_REVIEW.md (issue 27): an unprivileged holder of a p2pbuf fd hands it
 * to an in-tree importer that vmaps without an attachment. videobuf2-vmalloc (vivid, uvcvideo)
 * imports a V4L2_MEMORY_DMABUF buffer with a bare dma_buf_vmap_unlocked() at QBUF time; the
 * exporter offers vmap on device memory, so the importer gets an iomem mapping of the BAR that
 * no revoke can take back:
 *  - REVOKE (and the unbind of the provider) then waits, uninterruptibly and without a bound,
 *    until vb2 vunmaps, i.e. until the unprivileged user lets go;
 *  - when the user closes the video node, vb2 vunmaps with a plain (not iomem) map and the
 *    kernel hits BUG_ON(!iosys_map_is_equal()) in dma_buf_vunmap (drivers/dma-buf/dma-buf.c),
 *    with the reservation lock held by the dying task.
 *
 * The importer is a child process that drops to uid/gid 65534 and uses plain V4L2 ioctls on a
 * vivid video capture node (made 0666 by the test, as a udev uaccess rule makes it for the
 * seat's user), with the dma-buf fd inherited through fork: REQBUFS(1, DMABUF), QBUF(m.fd),
 * STREAMON; it reports the errno of each step through a pipe and keeps the buffer queued.
 *
 * What the fixed code must do: QBUF (or STREAMON, whichever first reaches dma_buf_vmap) fails
 * with an errno (vb2-vmalloc turns every vmap error into EFAULT; EOPNOTSUPP, EINVAL and ENOMEM
 * are accepted too), the exporter's debugfs never counts a vmap ("vmaps 0"), and REVOKE and
 * unbind return promptly.
 *
 * On the old code the tests fail without hanging the suite: every operation that can block in
 * the kernel (ALLOC, REVOKE, bind/unbind, the debugfs read, the importer's close) runs in a
 * helper process with its output on /dev/null, and the test waits for it at most a bound
 * (REVOKE and unbind: 20 s, under the lab's 30 s hung-task limit). A helper still blocked then
 * is left behind (a task in D state cannot be killed) and reported. An importer whose queued
 * buffer is vmapped is left parked in its own session (not killed): its exit would close the
 * video node and hit the BUG above, which only the last test, close_video_node, triggers on
 * purpose. The vivid video capture queue that a parked importer owns is busy for later tests,
 * so an importer takes the first vivid capture node (/dev/video*, then vivid's touch node
 * /dev/v4l-touch*, also a V4L2_BUF_TYPE_VIDEO_CAPTURE queue of videobuf2-vmalloc) whose REQBUFS
 * is not EBUSY.
 */
#include "vivid_vmap.h"

/* ---- The fixture ------------------------------------------------------------------------- */

FIXTURE(vivid) {
	int p2p;
	char pci[64];
	struct node nodes[MAX_NODES];
	mode_t modes[MAX_NODES];
	int nnodes;
	__u64 len;		/* buffer size: the largest sizeimage, page-rounded */
	int buf;		/* the p2pbuf dma-buf, or -1 */
	unsigned long long offset;
	struct importer imp;
	int park;		/* leave the importer parked at teardown */
};

FIXTURE_SETUP(vivid)
{
	struct bres r;
	struct write_arg w = { .path = EXPORTER_DRV "/bind" };
	char path[512];
	struct stat st;

	self->p2p = -1;
	self->buf = -1;
	self->imp.pid = 0;
	self->imp.cmd = -1;
	self->imp.rep = -1;
	self->park = 0;
	signal(SIGPIPE, SIG_IGN);
	self->nnodes = find_vivid_nodes(self->nodes, MAX_NODES);
	if (!self->nnodes)
		SKIP(return, "no vivid video capture node (/dev/video* with driver \"vivid\" and "
		     "V4L2_CAP_VIDEO_CAPTURE): the kernel needs CONFIG_VIDEO_VIVID=y");
	if (p2pbuf_pci_find(IVSHMEM_VENDOR, IVSHMEM_DEVICE, self->pci, sizeof(self->pci)))
		SKIP(return, "no ivshmem-plain device (the emulated GPU memory) on this boot");
	if (access(EXPORTER_DRV, F_OK))
		SKIP(return, "p2pbuf_exporter is not loaded");
	/*
	 * A test before may have left the provider unbound (or an unbind in flight, whose
	 * device lock the bind write waits for: bounded).
	 */
	snprintf(path, sizeof(path), "%s/%s", EXPORTER_DRV, self->pci);
	if (access(path, F_OK)) {
		w.val = self->pci;
		ASSERT_EQ(0, bounded_run(fn_write, &w, BIND_LIMIT_S, &r));
		ASSERT_TRUE(r.done) TH_LOG("bind %s did not return within %.0f s (an unbind of an "
					   "earlier test still blocked?)", self->pci, BIND_LIMIT_S);
		ASSERT_EQ(0, access(path, F_OK)) TH_LOG("bind %s: %s", self->pci, strerror(-r.rc));
	}
	self->p2p = open(P2P_DEV, O_RDWR | O_CLOEXEC);
	if (self->p2p < 0)
		SKIP(return, "no %s: %s", P2P_DEV, strerror(errno));
	self->len = 0;
	for (int i = 0; i < self->nnodes; i++) {
		if (self->nodes[i].sizeimage > self->len)
			self->len = self->nodes[i].sizeimage;
		/* What a udev uaccess rule gives the seat's user: the node is reachable. */
		self->modes[i] = stat(self->nodes[i].path, &st) ? 0 : (st.st_mode & 07777);
		ASSERT_EQ(0, chmod(self->nodes[i].path, 0666))
			TH_LOG("chmod %s: %s", self->nodes[i].path, strerror(errno));
	}
	self->len = (self->len + PAGE - 1) & ~(PAGE - 1);
	TH_LOG("vivid capture nodes: %d (first %s, sizeimage %u); buffer %llu bytes",
	       self->nnodes, self->nodes[0].path, self->nodes[0].sizeimage,
	       (unsigned long long)self->len);
}

FIXTURE_TEARDOWN(vivid)
{
	struct importer *imp = &self->imp;
	int st;

	if (imp->pid > 0) {
		if (self->park) {
			/* Exiting would close the video node: on the old code, the BUG of N1. */
			if (write(imp->cmd, "p", 1) != 1)
				TH_LOG("could not tell importer %d to stay parked", imp->pid);
			TH_LOG("importer pid %d left parked with its buffer queued and vmapped: "
			       "closing its video node would hit the kernel BUG in dma_buf_vunmap "
			       "(N1), which only close_video_node triggers", imp->pid);
		} else {
			double end = now() + STEP_LIMIT_S;

			if (write(imp->cmd, "x", 1) != 1)
				TH_LOG("could not tell importer %d to exit", imp->pid);
			while (waitpid(imp->pid, &st, WNOHANG) == 0 && now() < end)
				usleep(2000);
		}
	}
	p2pbuf_close(&imp->cmd);
	p2pbuf_close(&imp->rep);
	for (int i = 0; i < self->nnodes; i++)
		if (self->modes[i])
			chmod(self->nodes[i].path, self->modes[i]);
	p2pbuf_close(&self->buf);
	p2pbuf_close(&self->p2p);
}

/* ALLOC of self->len bytes, bounded: self->buf and self->offset. */
static int alloc_buf(struct __test_metadata *_metadata, FIXTURE_DATA(vivid) *self)
{
	struct alloc_arg a = { .p2p = self->p2p, .len = self->len };
	struct bres r;

	if (bounded_run(fn_alloc, &a, STEP_LIMIT_S, &r))
		return -1;
	if (!r.done) {
		TH_LOG("ALLOC of %llu bytes did not return within %.0f s",
		       (unsigned long long)self->len, STEP_LIMIT_S);
		return -1;
	}
	if (r.rc || r.fd < 0) {
		TH_LOG("ALLOC of %llu bytes: %s", (unsigned long long)self->len, strerror(-r.rc));
		return -1;
	}
	self->buf = r.fd;
	self->offset = strtoull(r.out, NULL, 10);
	return 0;
}

/* Starts the importer child on self->buf and waits (bounded) for its report. */
static int start_importer(struct __test_metadata *_metadata, FIXTURE_DATA(vivid) *self)
{
	struct importer *imp = &self->imp;
	int cmd[2], rep[2];

	if (pipe(cmd) || pipe(rep))
		return -1;
	fflush(stdout);
	fflush(stderr);
	imp->pid = fork();
	if (imp->pid < 0)
		return -1;
	if (imp->pid == 0) {
		close(cmd[1]);
		close(rep[0]);
		importer_main(self->nodes, self->nnodes, self->buf, self->len, self->p2p, cmd[0],
			      rep[1]);
	}
	close(cmd[0]);
	close(rep[1]);
	imp->cmd = cmd[1];
	imp->rep = rep[0];
	if (read_within(imp->rep, &imp->r, sizeof(imp->r), STEP_LIMIT_S) != (ssize_t)sizeof(imp->r)) {
		TH_LOG("the importer (uid 65534) did not report within %.0f s", STEP_LIMIT_S);
		return -1;
	}
	imp->reported = 1;
	TH_LOG("importer uid %d on %s: REQBUFS(1, DMABUF) %s (count %d), QBUF(p2pbuf fd) %s "
	       "(%.1f ms), STREAMON %s", imp->r.uid,
	       imp->r.node >= 0 ? self->nodes[imp->r.node].path : "no node",
	       imp->r.reqbufs_err ? strerror(imp->r.reqbufs_err) : "ok", imp->r.count,
	       imp->r.qbuf_err ? strerror(imp->r.qbuf_err) : "ok", imp->r.qbuf_ms,
	       imp->r.streamon_err ? strerror(imp->r.streamon_err) : "ok");
	return 0;
}

/* Whether errno e is one the fixed code may give at the step that reaches dma_buf_vmap. */
static int vmap_refused_errno(int e)
{
	return e == EOPNOTSUPP || e == EINVAL || e == ENOMEM || e == EFAULT;
}

/*
 * The expectations on the importer's report: it ran unprivileged, got a queue, and QBUF (or,
 * if QBUF passed, STREAMON) failed with an accepted errno. The errno of the failing step.
 */
static int check_report(struct __test_metadata *_metadata, FIXTURE_DATA(vivid) *self)
{
	struct imp_report *r = &self->imp.r;
	int e;

	EXPECT_EQ(0, r->priv_err) TH_LOG("dropping to uid 65534: %s", strerror(r->priv_err));
	EXPECT_EQ(65534, r->uid);
	EXPECT_EQ(0, r->open_err) TH_LOG("open of the video node as uid 65534: %s",
					 strerror(r->open_err));
	EXPECT_EQ(0, r->reqbufs_err) TH_LOG("REQBUFS(1, DMABUF): %s%s", strerror(r->reqbufs_err),
					    r->reqbufs_err == EBUSY ?
					    " on every vivid capture node (each is owned by an "
					    "importer an earlier test had to leave parked: N1)" :
					    "");
	EXPECT_LE(0, r->node);
	if (r->node < 0)
		return -1;
	e = r->qbuf_err ? r->qbuf_err : r->streamon_err;
	EXPECT_TRUE(vmap_refused_errno(e))
		TH_LOG("%s: videobuf2-vmalloc imported device memory with a bare dma_buf_vmap(), "
		       "no attachment that revoke could invalidate (N1)",
		       e ? strerror(e) : "QBUF and STREAMON both succeeded");
	if (e)
		TH_LOG("the importer was refused at %s with %s (%d)",
		       r->qbuf_err ? "QBUF" : "STREAMON", strerror(e), e);
	return e;
}

/* The vmaps count of self's buffer, logged; see debugfs_vmaps(). */
static long buf_vmaps(struct __test_metadata *_metadata, FIXTURE_DATA(vivid) *self,
		      const char *when)
{
	long v = debugfs_vmaps(self->offset);

	if (v >= 0)
		TH_LOG("debugfs %s: vmaps %ld", when, v);
	else
		TH_LOG("debugfs %s: %s", when, v == -1 ? "the buffer is not listed" :
		       v == -2 ? "p2pbuf/buffers cannot be read" :
		       "the read of p2pbuf/buffers did not return within 10 s");
	return v;
}

/* REVOKE of self's buffer, bounded by REVOKE_LIMIT_S: 1 if it returned (rc in *rc). */
static int revoke_bounded(struct __test_metadata *_metadata, FIXTURE_DATA(vivid) *self, int *rc)
{
	struct revoke_arg a = { .p2p = self->p2p, .fd = self->buf };
	struct bres r;

	*rc = -EIO;
	if (bounded_run(fn_revoke, &a, REVOKE_LIMIT_S, &r))
		return 0;
	if (!r.done) {
		TH_LOG(N1_REVOKE_MSG "; the revoking helper (pid %d) is left in the kernel",
		       r.pid);
		return 0;
	}
	*rc = r.rc;
	TH_LOG("REVOKE returned %s after %.0f ms", r.rc ? strerror(-r.rc) : "0", r.ms);
	return 1;
}

/*
 * Whether a buffer of an earlier test is still vmapped (or debugfs, which walks every buffer,
 * does not answer): on the old code, an unbind now would wait behind it in D state.
 */
static int poisoned(struct __test_metadata *_metadata)
{
	long v = debugfs_vmaps(~0ULL);

	if (v > 0) {
		TH_LOG("a buffer of an earlier test is still vmapped (vmaps %ld) by a parked "
		       "vivid importer (N1): an unbind now would block in D state behind it, so "
		       "it is not tried", v);
		return 1;
	}
	if (v == -3) {
		TH_LOG("debugfs p2pbuf/buffers did not answer within 10 s: an earlier test left "
		       "the exporter blocked (N1?), so no unbind is tried");
		return 1;
	}
	return 0;
}

/*
 * The unprivileged importer keeps the buffer queued (REQBUFS, QBUF, STREAMON) while root
 * revokes it. Fixed: QBUF (or STREAMON) is refused, debugfs never counts a vmap, REVOKE returns
 * 0 at once. Old code: QBUF succeeds, "vmaps 1", REVOKE blocks in D state (failure after 20 s;
 * the importer is left parked, as closing would hit the BUG that close_video_node shows).
 */
TEST_F_TIMEOUT(vivid, revoke_while_queued, 180)
{
	long v0, v1;
	int done, rc;

	ASSERT_EQ(0, alloc_buf(_metadata, self));
	ASSERT_EQ(0, start_importer(_metadata, self));
	check_report(_metadata, self);
	v0 = buf_vmaps(_metadata, self, "with the buffer queued");
	/* Parked unless the vmap is known to be absent. */
	self->park = self->imp.r.node >= 0 && !self->imp.r.qbuf_err && v0 != 0;
	done = revoke_bounded(_metadata, self, &rc);
	if (!done)
		self->park = 1;
	v1 = done ? buf_vmaps(_metadata, self, "after REVOKE") : -4;
	EXPECT_EQ(0, v0) TH_LOG("the exporter counts a vmap without an attachment (N1)");
	EXPECT_TRUE(done) TH_LOG(N1_REVOKE_MSG);
	if (done) {
		EXPECT_EQ(0, rc);
		EXPECT_EQ(0, v1);
	}
}

/*
 * The unprivileged importer holds the buffer (queued, or at least the fd after a refused QBUF)
 * while root unbinds the provider. Fixed: the unbind returns within 20 s, and the device is
 * rebound. Old code: the unbind blocks behind the vmap (failure after 20 s, or at once when an
 * earlier test left a vmapped buffer: then nothing is unbound).
 */
TEST_F_TIMEOUT(vivid, unbind_while_queued, 180)
{
	struct write_arg w = { .path = EXPORTER_DRV "/unbind" };
	char path[512];
	struct bres r;
	long v0;

	w.val = self->pci;
	ASSERT_FALSE(poisoned(_metadata));
	ASSERT_EQ(0, alloc_buf(_metadata, self));
	ASSERT_EQ(0, start_importer(_metadata, self));
	check_report(_metadata, self);
	v0 = buf_vmaps(_metadata, self, "with the buffer queued");
	self->park = self->imp.r.node >= 0 && !self->imp.r.qbuf_err && v0 != 0;
	EXPECT_EQ(0, v0) TH_LOG("the exporter counts a vmap without an attachment (N1)");
	ASSERT_EQ(0, bounded_run(fn_write, &w, REVOKE_LIMIT_S, &r));
	if (!r.done) {
		self->park = 1;
		TH_LOG(N1_UNBIND_MSG "; the unbinding helper (pid %d) is left in the kernel "
		       "holding the device lock", r.pid);
	} else {
		TH_LOG("unbind of %s returned %s after %.0f ms", self->pci,
		       r.rc ? strerror(-r.rc) : "0", r.ms);
	}
	EXPECT_TRUE(r.done) TH_LOG(N1_UNBIND_MSG);
	if (!r.done)
		return;
	EXPECT_EQ(0, r.rc);
	/* Rebind (bounded) for the tests after this one. */
	w.path = EXPORTER_DRV "/bind";
	ASSERT_EQ(0, bounded_run(fn_write, &w, BIND_LIMIT_S, &r));
	EXPECT_TRUE(r.done) TH_LOG("the rebind of %s did not return within %.0f s", self->pci,
				   BIND_LIMIT_S);
	snprintf(path, sizeof(path), "%s/%s", EXPORTER_DRV, self->pci);
	EXPECT_EQ(0, access(path, F_OK)) TH_LOG("%s is not bound again", self->pci);
}

/*
 * Must stay the last test of the file: on the old code it hits the kernel BUG in
 * dma_buf_vunmap (vb2-vmalloc unmaps with a plain map what the exporter vmapped as iomem), and
 * the dying task keeps the buffer's reservation lock.
 *
 * The unprivileged importer queues the buffer and then only closes the video node; root then
 * revokes (bounded) and frees the buffer. Fixed: QBUF was refused, the close returns 0, no
 * vmap is counted, REVOKE returns 0 at once.
 */
TEST_F_TIMEOUT(vivid, close_video_node, 180)
{
	struct imp_closed cl = { .close_err = -1 };
	int done, rc, st = 0, ended = 0, closed;
	double end;
	long v0, v1;

	ASSERT_EQ(0, alloc_buf(_metadata, self));
	ASSERT_EQ(0, start_importer(_metadata, self));
	check_report(_metadata, self);
	v0 = buf_vmaps(_metadata, self, "with the buffer queued");
	EXPECT_EQ(0, v0) TH_LOG("the exporter counts a vmap without an attachment (N1)");
	ASSERT_EQ(1, write(self->imp.cmd, "c", 1));
	closed = read_within(self->imp.rep, &cl, sizeof(cl), STEP_LIMIT_S) == (ssize_t)sizeof(cl);
	end = now() + STEP_LIMIT_S;
	if (closed && write(self->imp.cmd, "x", 1) != 1)
		TH_LOG("could not tell the importer to exit");
	while (!(ended = waitpid(self->imp.pid, &st, WNOHANG) == self->imp.pid) && now() < end)
		usleep(2000);
	if (ended)
		self->imp.pid = 0;
	if (closed)
		TH_LOG("the importer's close() of the video node returned %s after %.1f ms",
		       cl.close_err ? strerror(cl.close_err) : "0", cl.close_ms);
	else if (ended && WIFSIGNALED(st))
		TH_LOG("the importer died in close() of the video node (signal %d): on the old "
		       "code, the kernel BUG in dma_buf_vunmap (N1, see the console)",
		       WTERMSIG(st));
	else if (ended)
		TH_LOG("the importer ended without reporting its close() (status %#x)", st);
	else
		TH_LOG("the importer's close() of the video node did not return within %.0f s",
		       STEP_LIMIT_S);
	EXPECT_TRUE(closed) TH_LOG("close() of the video node did not complete (N1)");
	EXPECT_EQ(0, cl.close_err);
	EXPECT_TRUE(ended && WIFEXITED(st) && WEXITSTATUS(st) == 0)
		TH_LOG("importer status %#x", st);
	v1 = buf_vmaps(_metadata, self, "after the importer closed the video node");
	EXPECT_EQ(0, v1);
	done = revoke_bounded(_metadata, self, &rc);
	EXPECT_TRUE(done) TH_LOG(N1_REVOKE_MSG);
	if (done)
		EXPECT_EQ(0, rc);
	/* Free: the last reference, unless a blocked helper still holds one. */
	p2pbuf_close(&self->buf);
}

TEST_HARNESS_MAIN

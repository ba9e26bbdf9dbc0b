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
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/videodev2.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

#define PAGE 4096UL
#define P2P_DEV "/dev/p2pbuf"
#define EXPORTER_DRV "/sys/bus/pci/drivers/p2pbuf_exporter"
#define DEBUGFS_BUFFERS "/sys/kernel/debug/p2pbuf/buffers"
/* The emulated GPU memory (QEMU ivshmem-plain). */
#define IVSHMEM_VENDOR "0x1af4"
#define IVSHMEM_DEVICE "0x1110"

/* How long REVOKE and unbind may take (the lab's hung-task detector fires at 30 s). */
#define REVOKE_LIMIT_S 20.0
/* How long a bind may take (it waits for an unbind in flight). */
#define BIND_LIMIT_S 40.0
/* Every other operation that may block: ALLOC, the debugfs read, an importer's step. */
#define STEP_LIMIT_S 10.0

#define N1_REVOKE_MSG "REVOKE blocked > 20 s: a bare vmap pins device memory (N1)"
#define N1_UNBIND_MSG "unbind blocked > 20 s: a bare vmap pins device memory (N1)"

#define MAX_NODES 16

/* ---- Bounded helpers --------------------------------------------------------------------- */

/* What a helper function hands back: text (up to cap bytes) and one fd. */
struct bctx {
	char out[16384];
	size_t len;
	int fd_out;
};

/* The result of bounded_run(). */
struct bres {
	int done;	/* 1: the helper answered within the bound */
	int rc;		/* when done: the helper function's result (0 or -errno) */
	double ms;	/* how long the helper took (or the bound, if not done) */
	pid_t pid;	/* the helper, which is left behind if not done */
	int fd;		/* an fd the helper passed back, or -1 */
	char out[16384];
	size_t len;
};

struct bhdr {
	int rc;
	int has_fd;
	unsigned int len;
};

/*
 * Runs fn(arg, ctx) in a child process (stdin, stdout and stderr on /dev/null, so that a child
 * stuck in the kernel keeps no pipe of the suite open) and waits at most secs for its answer.
 * A child that does not answer in time is left where it is (in D state it cannot be killed):
 * r->done is 0 then. 0 if the helper could be started, else -errno.
 */
static int bounded_run(int (*fn)(void *arg, struct bctx *c), void *arg, double secs,
		       struct bres *r)
{
	double t0 = now(), end = t0 + secs;
	int sv[2], null, st;
	pid_t pid;

	memset(r, 0, sizeof(*r));
	r->fd = -1;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		return -errno;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		close(sv[0]);
		close(sv[1]);
		return -errno;
	}
	if (pid == 0) {
		static struct bctx c;
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct bhdr h = { 0 };
		struct iovec io = { .iov_base = &h, .iov_len = sizeof(h) };
		struct msghdr msg = { .msg_iov = &io, .msg_iovlen = 1 };
		size_t off = 0;

		close(sv[0]);
		null = open("/dev/null", O_RDWR);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			dup2(null, 2);
		}
		c.fd_out = -1;
		h.rc = fn(arg, &c);
		h.len = (unsigned int)c.len;
		if (c.fd_out >= 0) {
			struct cmsghdr *cm;

			h.has_fd = 1;
			msg.msg_control = cbuf;
			msg.msg_controllen = sizeof(cbuf);
			cm = CMSG_FIRSTHDR(&msg);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &c.fd_out, sizeof(int));
		}
		if (sendmsg(sv[1], &msg, 0) != sizeof(h))
			_exit(1);
		while (off < c.len) {
			ssize_t n = write(sv[1], c.out + off, c.len - off);

			if (n <= 0)
				_exit(1);
			off += n;
		}
		_exit(0);
	}
	close(sv[1]);
	r->pid = pid;
	{
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct bhdr h;
		struct iovec io = { .iov_base = &h, .iov_len = sizeof(h) };
		struct msghdr msg = {
			.msg_iov = &io, .msg_iovlen = 1,
			.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
		};
		struct pollfd p = { .fd = sv[0], .events = POLLIN };
		int left = (int)((end - now()) * 1000);
		ssize_t n;

		if (left < 1)
			left = 1;
		if (poll(&p, 1, left) <= 0)
			goto out;
		n = recvmsg(sv[0], &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
		if (n != sizeof(h))
			goto out;
		if (h.has_fd) {
			struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

			if (cm && cm->cmsg_type == SCM_RIGHTS)
				memcpy(&r->fd, CMSG_DATA(cm), sizeof(int));
		}
		if (h.len > sizeof(r->out))
			h.len = sizeof(r->out);
		while (r->len < h.len) {
			p.revents = 0;
			left = (int)((end - now()) * 1000);
			if (left < 1)
				left = 1;
			if (poll(&p, 1, left) <= 0)
				break;
			n = read(sv[0], r->out + r->len, h.len - r->len);
			if (n <= 0)
				break;
			r->len += n;
		}
		r->rc = h.rc;
		r->done = 1;
	}
out:
	close(sv[0]);
	r->ms = (now() - t0) * 1000;
	if (r->len >= sizeof(r->out))
		r->len = sizeof(r->out) - 1;
	r->out[r->len] = 0;
	/* A helper that answered exits at once; one that did not is left behind. */
	if (r->done) {
		for (int i = 0; i < 1000 && waitpid(pid, &st, WNOHANG) == 0; i++)
			usleep(1000);
	}
	return 0;
}

struct alloc_arg {
	int p2p;
	__u64 len;
};

/* ALLOC from the first bound provider; passes the dma-buf fd back, the BAR offset as text. */
static int fn_alloc(void *arg, struct bctx *c)
{
	struct alloc_arg *a = arg;
	/*
	 * Not zeroed: a zeroed ALLOC would clear the low BAR range where rdma_4_hostcheck.sh left
	 * bytes for the host to check after the run (first fit from offset 0). Nothing here reads
	 * the buffer's contents.
	 */
	struct p2pbuf_alloc al = {
		.size = sizeof(al), .length = a->len, .flags = P2PBUF_ALLOC_UNINITIALIZED,
	};

	if (p2pbuf_test_alloc(a->p2p, &al))
		return -errno;
	c->fd_out = al.fd;
	c->len = snprintf(c->out, sizeof(c->out), "%llu", (unsigned long long)al.offset);
	return 0;
}

struct revoke_arg {
	int p2p;
	int fd;
};

static int fn_revoke(void *arg, struct bctx *c)
{
	struct revoke_arg *a = arg;
	struct p2pbuf_revoke r = { .size = sizeof(r), .fd = a->fd };

	(void)c;
	return ioctl(a->p2p, P2PBUF_IOCTL_REVOKE, &r) ? -errno : 0;
}

/* The whole text of the file at arg. */
static int fn_read(void *arg, struct bctx *c)
{
	int fd = open((const char *)arg, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	while (c->len < sizeof(c->out) - 1) {
		n = read(fd, c->out + c->len, sizeof(c->out) - 1 - c->len);
		if (n < 0) {
			n = -errno;
			close(fd);
			return (int)n;
		}
		if (n == 0)
			break;
		c->len += n;
	}
	close(fd);
	return 0;
}

struct write_arg {
	const char *path;
	const char *val;
};

static int fn_write(void *arg, struct bctx *c)
{
	struct write_arg *a = arg;

	(void)c;
	return sysfs_write(a->path, a->val);
}

/* ---- The exporter's debugfs --------------------------------------------------------------- */

/*
 * From the text of debugfs p2pbuf/buffers: the "vmaps N" count of the buffer at BAR offset
 * off (off == ~0: the largest count of any buffer), or -1 if there is no such buffer.
 * A buffer line reads
 * "buffer ID on PCI: SIZE bytes at BAR offset 0xOFF[, revoked]..., vmaps N, ...".
 */
static long vmaps_in(const char *text, unsigned long long off)
{
	const char *l = text;
	long best = -1;

	while (l && *l) {
		const char *nl = strchr(l, '\n'), *o, *v;

		if (!strncmp(l, "buffer ", 7)) {
			o = strstr(l, "at BAR offset ");
			v = strstr(l, "vmaps ");
			if (o && v && (!nl || (o < nl && v < nl))) {
				unsigned long long bo = strtoull(o + 14, NULL, 0);
				long n = strtol(v + 6, NULL, 10);

				if (off == ~0ULL) {
					if (n > best)
						best = n;
				} else if (bo == off) {
					return n;
				}
			}
		}
		l = nl ? nl + 1 : NULL;
	}
	return best;
}

/*
 * The debugfs vmaps count of the buffer at BAR offset off (~0: the largest of any buffer), read
 * by a bounded helper; -1: no such buffer, -2: debugfs could not be read, -3: the read did not
 * return within STEP_LIMIT_S.
 */
static long debugfs_vmaps(unsigned long long off)
{
	static struct bres r;

	if (bounded_run(fn_read, (void *)DEBUGFS_BUFFERS, STEP_LIMIT_S, &r))
		return -2;
	if (!r.done)
		return -3;
	if (r.rc)
		return -2;
	return vmaps_in(r.out, off);
}

/* ---- vivid ------------------------------------------------------------------------------- */

struct node {
	char path[64];
	__u32 sizeimage;
};

/*
 * The vivid nodes with a single-planar video capture queue (VIDIOC_QUERYCAP: driver "vivid",
 * V4L2_CAP_VIDEO_CAPTURE and V4L2_CAP_STREAMING among the device's caps): /dev/video* in
 * numeric order, then vivid's touch nodes /dev/v4l-touch*. Their number.
 */
static int find_vivid_nodes(struct node *nodes, int max)
{
	static const char *const prefixes[] = { "/dev/video", "/dev/v4l-touch" };
	int n = 0;

	for (unsigned int p = 0; p < sizeof(prefixes) / sizeof(prefixes[0]); p++) {
		for (int i = 0; i < 256 && n < max; i++) {
			struct v4l2_capability cap;
			struct v4l2_format f;
			char path[64];
			__u32 caps;
			int fd;

			snprintf(path, sizeof(path), "%s%d", prefixes[p], i);
			fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
			if (fd < 0)
				continue;
			memset(&cap, 0, sizeof(cap));
			if (ioctl(fd, VIDIOC_QUERYCAP, &cap)) {
				close(fd);
				continue;
			}
			caps = (cap.capabilities & V4L2_CAP_DEVICE_CAPS) ? cap.device_caps :
									    cap.capabilities;
			memset(&f, 0, sizeof(f));
			f.type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
			if (!strcmp((const char *)cap.driver, "vivid") &&
			    (caps & V4L2_CAP_VIDEO_CAPTURE) && (caps & V4L2_CAP_STREAMING) &&
			    !ioctl(fd, VIDIOC_G_FMT, &f) && f.fmt.pix.sizeimage) {
				snprintf(nodes[n].path, sizeof(nodes[n].path), "%s", path);
				nodes[n].sizeimage = f.fmt.pix.sizeimage;
				n++;
			}
			close(fd);
		}
	}
	return n;
}

/* What the importer child reports once it has queued (or failed to). */
struct imp_report {
	int uid;		/* getuid() after the drop */
	int priv_err;		/* errno of setgroups/setgid/setuid, 0 */
	int node;		/* index of the node it uses, -1: none */
	int open_err;		/* errno of open() of the last node tried, 0 */
	int reqbufs_err;	/* errno of VIDIOC_REQBUFS(1, DMABUF), 0 */
	int count;		/* buffers REQBUFS allocated */
	int qbuf_err;		/* errno of VIDIOC_QBUF(m.fd = the p2pbuf fd), 0 */
	int streamon_err;	/* errno of VIDIOC_STREAMON, 0 */
	double qbuf_ms;		/* how long QBUF took */
};

/* What the importer child reports after a 'c' command (close the video node). */
struct imp_closed {
	int close_err;
	double close_ms;
};

struct importer {
	pid_t pid;
	int cmd;	/* write end: 'c' closes the video node, 'x' exits */
	int rep;	/* read end of the reports */
	struct imp_report r;
	int reported;
};

static int write_all(int fd, const void *p, size_t len)
{
	const char *c = p;

	while (len) {
		ssize_t n = write(fd, c, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		c += n;
		len -= n;
	}
	return 0;
}

/* The importer child: never returns. */
static void importer_main(const struct node *nodes, int nnodes, int dmabuf, __u64 len,
			  int p2p, int cmd, int rep)
{
	struct imp_report r = { .node = -1 };
	struct v4l2_requestbuffers rb;
	struct v4l2_buffer b;
	int type = V4L2_BUF_TYPE_VIDEO_CAPTURE, vfd = -1, null;
	double t;
	char c;

	/*
	 * Its own session: a harness timeout kills the test's process group, and this process
	 * must not exit while vb2 holds a vmap of device memory (see the top of the file).
	 */
	setsid();
	null = open("/dev/null", O_RDWR);
	if (null >= 0) {
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
	}
	signal(SIGPIPE, SIG_IGN);
	close(p2p);
	if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
		r.priv_err = errno;
	r.uid = (int)getuid();
	for (int i = 0; i < nnodes && !r.priv_err; i++) {
		vfd = open(nodes[i].path, O_RDWR | O_CLOEXEC);
		if (vfd < 0) {
			r.open_err = errno;
			continue;
		}
		r.open_err = 0;
		memset(&rb, 0, sizeof(rb));
		rb.count = 1;
		rb.type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
		rb.memory = V4L2_MEMORY_DMABUF;
		if (ioctl(vfd, VIDIOC_REQBUFS, &rb)) {
			r.reqbufs_err = errno;
			close(vfd);
			vfd = -1;
			/* Busy: an importer an earlier test had to leave parked owns the queue. */
			if (r.reqbufs_err == EBUSY)
				continue;
			break;
		}
		r.reqbufs_err = 0;
		r.count = (int)rb.count;
		r.node = i;
		break;
	}
	if (r.node >= 0) {
		memset(&b, 0, sizeof(b));
		b.index = 0;
		b.type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
		b.memory = V4L2_MEMORY_DMABUF;
		b.m.fd = dmabuf;
		b.length = (__u32)len;
		t = now();
		r.qbuf_err = ioctl(vfd, VIDIOC_QBUF, &b) ? errno : 0;
		r.qbuf_ms = (now() - t) * 1000;
		r.streamon_err = ioctl(vfd, VIDIOC_STREAMON, &type) ? errno : 0;
	}
	if (write_all(rep, &r, sizeof(r)))
		_exit(1);
	for (;;) {
		ssize_t n = read(cmd, &c, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			/* The test is gone without a word: leave only if nothing is queued. */
			if (vfd >= 0 && !r.qbuf_err)
				for (;;)
					pause();
			_exit(0);
		}
		if (c == 'c') {
			struct imp_closed cl = { 0 };

			t = now();
			if (vfd >= 0 && close(vfd))
				cl.close_err = errno;
			cl.close_ms = (now() - t) * 1000;
			vfd = -1;
			write_all(rep, &cl, sizeof(cl));
		} else if (c == 'p') {
			for (;;)
				pause();
		} else if (c == 'x') {
			_exit(0);
		}
	}
}

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

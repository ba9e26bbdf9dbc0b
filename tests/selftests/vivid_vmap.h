/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The wrappers of vivid_vmap.c (finding N1): bounded helpers (an operation that may block in
 * the kernel runs in a child process that the test waits for at most a bound), the
 * exporter's debugfs, and the unprivileged V4L2 importer on a vivid capture node.
 */
#ifndef P2PBUF_VIVID_VMAP_H
#define P2PBUF_VIVID_VMAP_H

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
 * Over 100 lines on purpose: fork, the child's side, and the parent's bounded wait share the
 * pipe and the shared context, and each half only makes sense beside the other.
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
			h.has_fd = 1;
			msg.msg_control = cbuf;
			msg.msg_controllen = sizeof(cbuf);
			p2pbuf_cmsg_fd(&msg, c.fd_out);
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

#endif /* P2PBUF_VIVID_VMAP_H */

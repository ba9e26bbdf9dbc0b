// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf races: revoke (the REVOKE ioctl, and unbinding the provider, which revokes every
 * buffer) against mmap, against the last close, and against itself, with threads and with
 * processes; and when device memory goes back to its provider. Findings of the first kernel
 * review (summed up in section 1 of the second, KERNEL_REVIEW.md, shared with the project;
 * answered in docs/exporter.md, "Races") that each test aims at: H2 (a VMA whose mmap() is in
 * progress survives revoke), H2b (its page references then hold up the unbind), H1 (revoke
 * racing the final fput), M1 (a second revoke caller returns before the revoke has run), M2
 * (revoke waits without limit, holding a lock that mmap, ALLOC and PROVIDER_INFO need).
 *
 * How the windows are hit: the exporter's mmap callback inserts every page of the buffer with
 * the buffer's lock held, so the tests map buffers large enough that the callback takes a few
 * scheduler ticks (calibrated at the start of each test), and run the revoking side pinned to
 * the same CPU at SCHED_FIFO, waking at a random tick: when it wakes inside the callback it
 * blocks on the buffer's lock, and the unlock hands it the CPU at once, before mmap() has
 * linked the new VMA. Half of each budget is spent without that amplifier (both sides free
 * on two CPUs, random busy-loop delays) to show what plain racing hits.
 *
 * Assertions: no stale access (a read through a mapping that succeeds after REVOKE returned
 * 0 or after the unbind revoked it), unbind returns within 20 s, every call fails only with a
 * documented errno, after any REVOKE returned 0 the buffer is revoked for real (fresh mmap
 * ENODEV, existing mapping SIGBUS, memory back in the pool), memory goes back to the pool as
 * soon as its last user is gone, and the provider's memory is all back at the end. The
 * harness also fails the run on any Oops/WARN/KASAN/hung-task line on the console.
 *
 * Budgets: each race phase runs races_s() seconds (12, or p2pbuf.races_s=N on the kernel
 * command line) or up to its iteration cap; each test prints how many iterations ran.
 * Tests that unbind always rebind the device before they end (and the fixture rebinds it if
 * a test could not).
 */
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/socket.h>
#include <linux/dma-buf.h>

#include "kselftest_harness.h"
#include "races.h"

#define UNBIND EXPORTER_DRV "/unbind"

enum { MODE_RT, MODE_FREE };

static const char *mode_name(int mode)
{
	return mode == MODE_RT ? "RT same-CPU" : "free-running";
}

/* Mappings a test keeps on purpose (a stale one, to see what an unbind does with it). */
static struct {
	void *p;
	size_t len;
} kept[256];
static int nkept;

static int map_keep(void *p, size_t len)
{
	if (nkept >= (int)(sizeof(kept) / sizeof(kept[0])))
		return -1;
	kept[nkept].p = p;
	kept[nkept].len = len;
	nkept++;
	return 0;
}

static void maps_release(void)
{
	while (nkept > 0) {
		nkept--;
		munmap(kept[nkept].p, kept[nkept].len);
	}
}

static int sem_wait_intr(sem_t *s)
{
	int r;

	while ((r = sem_wait(s)) && errno == EINTR)
		;
	return r;
}

static int send_fd(int sock, int fd)
{
	char c = 'f', cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec io = { .iov_base = &c, .iov_len = 1 };
	struct msghdr msg = {
		.msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &msg, 0) == 1 ? 0 : -errno;
}

static int recv_fd(int sock)
{
	char c, cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec io = { .iov_base = &c, .iov_len = 1 };
	struct msghdr msg = {
		.msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};
	struct cmsghdr *cm;
	int fd;

	if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1)
		return -EIO;
	cm = CMSG_FIRSTHDR(&msg);
	if (!cm || cm->cmsg_type != SCM_RIGHTS)
		return -EIO;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

FIXTURE(races) {
	int p2p;
	char pci[64];
	__u64 total;
	long long free0, avail0;
	int cpu_a, cpu_b;
	/* Helper processes to kill if the test ends early, and an unbind in flight. */
	pid_t kids[64];
	int nkids;
	pid_t unbinder;
	int timeline;
};

static void add_kid(FIXTURE_DATA(races) *self, pid_t pid)
{
	if (pid > 0 && self->nkids < (int)(sizeof(self->kids) / sizeof(self->kids[0])))
		self->kids[self->nkids++] = pid;
}

FIXTURE_SETUP(races)
{
	struct p2pbuf_provider_info p;
	const char *why;

	self->p2p = -1;
	self->timeline = -1;
	self->unbinder = 0;
	self->nkids = 0;
	/* A test before may have failed to rebind: the fixture always starts bound. */
	why = exporter_ready(_metadata, self->pci, sizeof(self->pci), &self->p2p);
	if (why)
		SKIP(return, "%s", why);
	ASSERT_EQ(0, p2p_provider(self->p2p, &p));
	ASSERT_STREQ(self->pci, p.pci_name);
	self->total = p.total;
	self->free0 = provider_free(self->p2p);	/* also forgets released buffers */
	self->avail0 = pool_avail(self->pci);
	ASSERT_GT(self->free0, 0);
	self->cpu_a = 0;
	self->cpu_b = ncpus() > 1 ? 1 : 0;
	install_fault_handlers();
	rnd_seed((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20));
}

FIXTURE_TEARDOWN(races)
{
	int st;

	p2pbuf_close(&self->timeline);	/* signals any fence still planted */
	for (int i = 0; i < self->nkids; i++)
		if (kill(self->kids[i], SIGKILL) == 0)
			wait_for(self->kids[i], 20, &st);
	maps_release();
	if (self->unbinder > 0 && wait_for(self->unbinder, 30, &st) != 1)
		TH_LOG("an unbind of %s is still in flight at teardown", self->pci);
	if (self->p2p < 0)
		return;
	EXPECT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
	expect_memory_back(_metadata, self->p2p, self->pci, self->free0, self->avail0);
	close(self->p2p);
}

/*
 * Memory goes back to the provider as soon as the last user of a buffer is gone: after the
 * last close() the p2pdma pool (the kernel's count, /sys/bus/pci/devices/X/p2pmem/available)
 * is what it was before the allocation, with no ALLOC, PROVIDER_INFO or unbind in between
 * (those prune released buffers and would hide a buffer that is only freed then).
 */
TEST_F(races, memory_returns_on_last_close)
{
	const size_t len = 1UL << 20;
	long long a0, a1, a2, a3, f;
	int fd;

	a0 = pool_avail(self->pci);
	if (a0 < 0)
		SKIP(return, "no p2pmem/available for %s", self->pci);
	fd = p2pbuf_alloc_fd(self->p2p, len);
	ASSERT_GE(fd, 0);
	a1 = pool_avail(self->pci);
	/* The measure works: the allocation shows. */
	ASSERT_EQ(a0 - (long long)len, a1);
	close(fd);
	a2 = pool_avail(self->pci);
	f = provider_free(self->p2p);
	a3 = pool_avail(self->pci);
	ksft_print_msg("pool available: %lld before, %lld allocated, %lld right after the last close, "
		       "%lld after a PROVIDER_INFO (which reported %lld free)\n", a0, a1, a2, a3, f);
	EXPECT_EQ(a0, a2) TH_LOG("%lld bytes of device memory are still allocated after the buffer's "
				 "last fd was closed: it goes back only when ALLOC, PROVIDER_INFO or an "
				 "unbind prunes the provider's list", a0 - a2);
	EXPECT_EQ(self->free0, f);
}

/* The same when the last user is a mapping: close the fd, then munmap. */
TEST_F(races, memory_returns_on_munmap_after_close)
{
	const size_t len = 1UL << 20;
	long long a0, a1, a2;
	uint8_t *m;
	int fd;

	a0 = pool_avail(self->pci);
	if (a0 < 0)
		SKIP(return, "no p2pmem/available for %s", self->pci);
	fd = p2pbuf_alloc_fd(self->p2p, len);
	ASSERT_GE(fd, 0);
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, m);
	m[0] = 1;
	close(fd);
	a1 = pool_avail(self->pci);
	/* The mapping keeps the buffer, and its memory, alive. */
	EXPECT_EQ(a0 - (long long)len, a1);
	EXPECT_EQ(0, probe_read(m + len - PAGE));
	munmap(m, len);
	a2 = pool_avail(self->pci);
	ksft_print_msg("pool available: %lld before, %lld mapped after close, %lld right after munmap\n",
		       a0, a1, a2);
	EXPECT_EQ(a0, a2) TH_LOG("%lld bytes still allocated after the last mapping went away",
				 a0 - a2);
}

/* ---- H2: mmap against revoke ---------------------------------------------------------- */

struct h2_cfg {
	int p2p;
	size_t len;		/* buffer length: its mmap takes t_mmap */
	double t_mmap;
	double rate;		/* spin() iterations per second */
	int cpu_a;		/* the mmapper's CPU (and the RT revoker's) */
	int cpu_b;		/* the free-running revoker's CPU */
	int keep_stale;		/* keep stale mappings mapped (an unbind follows) */
};

/* What the mmapper and the revoker share (MAP_SHARED: a thread or a child process). */
struct h2_shared {
	sem_t go, done;
	volatile int start, quit, mode;
	int fd;			/* the buffer, for a thread revoker */
	long delay_ns;		/* RT: sleep before revoking */
	unsigned long spins;	/* free-running: busy loop before revoking */
	int rev_ret;
};

struct h2_stats {
	unsigned long iters, mapped, enodev, faulted, stale, other, rev_err, first_stale;
	int last_errno, last_rev_errno;
	double secs;
};

struct h2_revoker {
	struct h2_shared *s;
	const struct h2_cfg *c;
	pthread_t thread;
	pid_t pid;
	int sock;		/* child revoker: the buffers are sent over it */
};

static void h2_revoker_loop(struct h2_shared *s, const struct h2_cfg *c, int sock)
{
	int mode = -1;

	for (;;) {
		int fd;

		if (sem_wait_intr(&s->go))
			break;
		if (s->quit)
			break;
		if (s->mode != mode) {
			mode = s->mode;
			if (mode == MODE_RT) {
				pin_cpu(c->cpu_a);
				/* Unprivileged this fails, but then the thread inherited it. */
				set_fifo(RT_PRIO);
			} else {
				set_fifo(0);
				pin_cpu(c->cpu_b);
			}
		}
		fd = sock >= 0 ? recv_fd(sock) : s->fd;
		if (mode == MODE_RT) {
			sleep_ns(s->delay_ns);
		} else {
			while (!s->start)
				;
			spin(s->spins);
		}
		s->rev_ret = fd < 0 ? fd : p2p_revoke(c->p2p, fd);
		if (sock >= 0 && fd >= 0)
			close(fd);
		sem_post(&s->done);
	}
}

static void *h2_revoker_thread(void *arg)
{
	struct h2_revoker *r = arg;

	h2_revoker_loop(r->s, r->c, -1);
	return NULL;
}

/* Starts the revoker: a thread, or (process) a child process. 0 or -errno. */
static int h2_start(struct h2_revoker *r, const struct h2_cfg *c, int process)
{
	memset(r, 0, sizeof(*r));
	r->c = c;
	r->sock = -1;
	r->s = mmap(NULL, sizeof(*r->s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (r->s == MAP_FAILED)
		return -errno;
	memset(r->s, 0, sizeof(*r->s));
	sem_init(&r->s->go, 1, 0);
	sem_init(&r->s->done, 1, 0);
	r->s->mode = -1;
	if (process) {
		int sv[2];

		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv))
			return -errno;
		r->pid = fork();
		if (r->pid < 0)
			return -errno;
		if (r->pid == 0) {
			close(sv[0]);
			h2_revoker_loop(r->s, c, sv[1]);
			_exit(0);
		}
		close(sv[1]);
		r->sock = sv[0];
		return 0;
	}
	return -pthread_create(&r->thread, NULL, h2_revoker_thread, r);
}

static void h2_stop(struct h2_revoker *r)
{
	int st;

	r->s->quit = 1;
	sem_post(&r->s->go);
	if (r->pid > 0) {
		if (wait_for(r->pid, 10, &st) != 1) {
			kill(r->pid, SIGKILL);
			waitpid(r->pid, &st, 0);
		}
		close(r->sock);
	} else {
		pthread_join(r->thread, NULL);
	}
	sem_destroy(&r->s->go);
	sem_destroy(&r->s->done);
	munmap(r->s, sizeof(*r->s));
}

/*
 * Races mmap() of a fresh buffer (this thread, on cpu_a, SCHED_OTHER) against REVOKE of it
 * (the revoker), for budget seconds or max iterations. After both returned, a mapping that
 * was created must fault: a read that succeeds is a stale BAR access after revoke.
 */
static void h2_run(struct h2_revoker *r, int mode, double budget, unsigned long max,
		   struct h2_stats *st)
{
	const struct h2_cfg *c = r->c;
	struct h2_shared *s = r->s;
	double t0 = now(), span = c->t_mmap * 1.3;

	set_fifo(0);
	pin_cpu(c->cpu_a);
	s->mode = mode;
	while (st->iters < max && now() - t0 < budget) {
		int fd = p2pbuf_alloc_fd(c->p2p, c->len), e, s0, s1;
		uint8_t *m;

		if (fd < 0) {
			st->other++;
			st->last_errno = -fd;
			break;
		}
		s->fd = fd;
		s->start = 0;
		s->delay_ns = 1 + (long)(rnd() % (uint64_t)(span * 1e9 + 1));
		s->spins = rnd() % (unsigned long)(span * c->rate + 1);
		if (r->sock >= 0 && send_fd(r->sock, fd)) {
			st->other++;
			st->last_errno = EIO;
			close(fd);
			break;
		}
		sem_post(&s->go);
		s->start = 1;
		m = mmap(NULL, c->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		e = errno;
		sem_wait_intr(&s->done);
		st->iters++;
		if (s->rev_ret) {
			st->rev_err++;
			st->last_rev_errno = -s->rev_ret;
		}
		if (m == MAP_FAILED) {
			if (e == ENODEV) {
				st->enodev++;
			} else {
				st->other++;
				st->last_errno = e;
			}
			close(fd);
			continue;
		}
		st->mapped++;
		s0 = probe_read(m);
		s1 = probe_read(m + c->len - 1);
		if (s0 == SIGBUS && s1 == SIGBUS) {
			st->faulted++;
			munmap(m, c->len);
		} else if (s->rev_ret == 0) {
			st->stale++;
			if (!st->first_stale)
				st->first_stale = st->iters;
			if (st->stale <= 5)
				ksft_print_msg("%s iteration %lu: stale BAR access after revoke: the mapping "
					       "made by an mmap() racing REVOKE reads without a fault after "
					       "REVOKE returned 0 (first page: %s, last page: %s)\n",
					       mode_name(mode), st->iters, s0 ? strsignal(s0) : "read",
					       s1 ? strsignal(s1) : "read");
			if (!c->keep_stale || map_keep(m, c->len))
				munmap(m, c->len);
		} else {
			munmap(m, c->len);
		}
		close(fd);
	}
	st->secs += now() - t0;
}

static void h2_print(const char *what, int mode, const struct h2_stats *st)
{
	ksft_print_msg("%s, %s: %lu iterations in %.1f s: mmap succeeded %lu (then faulted %lu, "
		       "stale %lu), failed with ENODEV %lu, other errors %lu (last %s); REVOKE "
		       "errors %lu (last %s)\n", what, mode_name(mode), st->iters, st->secs,
		       st->mapped, st->faulted, st->stale, st->enodev, st->other,
		       st->other ? strerror(st->last_errno) : "-", st->rev_err,
		       st->rev_err ? strerror(st->last_rev_errno) : "-");
}

/* Time of one mmap() of a fresh buffer of len bytes, or -1. */
static double time_mmap(int p2p, size_t len)
{
	int fd = p2pbuf_alloc_fd(p2p, len);
	double t0, t;
	void *m;

	if (fd < 0)
		return -1;
	t0 = now();
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	t = now() - t0;
	if (m == MAP_FAILED)
		t = -1;
	else
		munmap(m, len);
	close(fd);
	return t;
}

/*
 * Picks the buffer length: mmap() of it takes at least 12 ms (three ticks), so that a revoker
 * waking at a tick lands inside the mmap callback; at most 64 MiB and 1/8 of the BAR.
 */
static void h2_calibrate(struct h2_cfg *c, FIXTURE_DATA(races) *self)
{
	size_t cap = self->total / 8 < (64UL << 20) ? self->total / 8 : (64UL << 20);

	memset(c, 0, sizeof(*c));
	c->p2p = self->p2p;
	c->cpu_a = self->cpu_a;
	c->cpu_b = self->cpu_b;
	pin_cpu(c->cpu_a);
	c->len = 1UL << 20;
	for (;;) {
		c->t_mmap = time_mmap(self->p2p, c->len);
		if (c->t_mmap < 0 || c->t_mmap >= 0.012 || c->len * 2 > cap)
			break;
		c->len *= 2;
	}
	c->rate = spin_rate();
	ksft_print_msg("calibration: mmap() of a %zu KiB buffer takes %.2f ms; %.0f busy-loop "
		       "iterations per ms; %d CPUs\n", c->len >> 10, c->t_mmap * 1e3, c->rate / 1e3,
		       ncpus());
}

static void h2_race_test(struct __test_metadata *_metadata, FIXTURE_DATA(races) *self,
			 int process)
{
	const char *what = process ? "H2 mmap vs REVOKE (processes)" : "H2 mmap vs REVOKE (threads)";
	struct h2_stats rt = { 0 }, fr = { 0 };
	struct h2_revoker r;
	struct h2_cfg c;

	h2_calibrate(&c, self);
	ASSERT_LT(0, c.t_mmap);
	ASSERT_EQ(0, h2_start(&r, &c, process));
	if (r.pid > 0)
		add_kid(self, r.pid);
	h2_run(&r, MODE_RT, races_s() / 2, 5000, &rt);
	h2_run(&r, MODE_FREE, races_s() / 2, 5000, &fr);
	h2_stop(&r);
	h2_print(what, MODE_RT, &rt);
	h2_print(what, MODE_FREE, &fr);
	EXPECT_EQ(0UL, rt.stale + fr.stale)
		TH_LOG("stale BAR access after revoke in %lu of %lu mappings (first at RT iteration "
		       "%lu, free-running iteration %lu)", rt.stale + fr.stale, rt.mapped + fr.mapped,
		       rt.first_stale, fr.first_stale);
	EXPECT_EQ(0UL, rt.other + fr.other);
	EXPECT_EQ(0UL, rt.rev_err + fr.rev_err);
	EXPECT_LT(0UL, rt.iters + fr.iters);
}

TEST_F_TIMEOUT(races, h2_mmap_vs_revoke_threads, 150)
{
	h2_race_test(_metadata, self, 0);
}

TEST_F_TIMEOUT(races, h2_mmap_vs_revoke_processes, 150)
{
	h2_race_test(_metadata, self, 1);
}

/*
 * Page faults against revoke. With pages inserted at fault time (the H2 fix), the race moves
 * from mmap() to the fault handler: a fault that inserts a page after the revoke zapped the
 * mapping would leave a stale PTE. One thread touches every page of a fresh mapping (each
 * touch a fault, or a read of a page mmap() already populated) while the revoker revokes:
 * no read that starts after REVOKE returned 0 may succeed, and afterwards no page of the
 * mapping may be readable.
 */
struct fr_shared {
	sem_t go_t, go_r, done;
	volatile int start, quit, mode;
	int p2p, fd, cpu_a, cpu_b;
	uint8_t *map;
	size_t len;
	long delay_ns;
	unsigned long spins;
	int revoked;		/* set (atomically) once REVOKE returned 0 */
	int ret;
	unsigned long late_reads;	/* reads that began after REVOKE returned and succeeded */
	long first_late;
};

static void *fr_toucher(void *p)
{
	struct fr_shared *s = p;
	int mode = -1;

	for (;;) {
		if (sem_wait_intr(&s->go_t) || s->quit)
			break;
		if (s->mode != mode) {
			mode = s->mode;
			set_fifo(0);
			pin_cpu(s->cpu_a);
		}
		while (!s->start)
			;
		for (size_t off = 0; off < s->len; off += PAGE) {
			int was = __atomic_load_n(&s->revoked, __ATOMIC_SEQ_CST);
			int sig = probe_read(s->map + off);

			if (sig == 0 && was) {
				if (!s->late_reads++)
					s->first_late = (long)(off / PAGE);
			}
			if (sig == SIGBUS && was)
				break;	/* revoked, and it shows */
		}
		sem_post(&s->done);
	}
	return NULL;
}

static void *fr_revoker(void *p)
{
	struct fr_shared *s = p;
	int mode = -1;

	for (;;) {
		if (sem_wait_intr(&s->go_r) || s->quit)
			break;
		if (s->mode != mode) {
			mode = s->mode;
			if (mode == MODE_RT) {
				pin_cpu(s->cpu_a);
				set_fifo(RT_PRIO);
			} else {
				set_fifo(0);
				pin_cpu(s->cpu_b);
			}
		}
		if (mode == MODE_RT) {
			sleep_ns(s->delay_ns);
		} else {
			while (!s->start)
				;
			spin(s->spins);
		}
		s->ret = p2p_revoke(s->p2p, s->fd);
		if (!s->ret)
			__atomic_store_n(&s->revoked, 1, __ATOMIC_SEQ_CST);
		sem_post(&s->done);
	}
	return NULL;
}

/* Time to read every page of a fresh mapping of len bytes once, or -1. */
static double time_touch(int p2p, size_t len)
{
	int fd = p2pbuf_alloc_fd(p2p, len);
	uint8_t *m;
	double t0, t;

	if (fd < 0)
		return -1;
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return -1;
	}
	t0 = now();
	for (size_t off = 0; off < len; off += PAGE)
		probe_read(m + off);
	t = now() - t0;
	munmap(m, len);
	close(fd);
	return t;
}

TEST_F_TIMEOUT(races, h2_fault_vs_revoke_threads, 150)
{
	struct fr_shared s = { .p2p = self->p2p, .cpu_a = self->cpu_a, .cpu_b = self->cpu_b };
	unsigned long iters[2] = { 0, 0 }, stale_final = 0, bad_ret = 0, mapped_fail = 0;
	double t_touch, rate, t0;
	pthread_t tt, tr;

	pin_cpu(self->cpu_a);
	s.len = 1UL << 20;
	for (;;) {
		t_touch = time_touch(self->p2p, s.len);
		if (t_touch < 0 || t_touch >= 0.012 || s.len >= (16UL << 20))
			break;
		s.len *= 2;
	}
	ASSERT_LT(0, t_touch);
	rate = spin_rate();
	ksft_print_msg("calibration: reading every page of a fresh %zu KiB mapping takes %.2f ms\n",
		       s.len >> 10, t_touch * 1e3);
	sem_init(&s.go_t, 0, 0);
	sem_init(&s.go_r, 0, 0);
	sem_init(&s.done, 0, 0);
	s.mode = -1;
	ASSERT_EQ(0, pthread_create(&tt, NULL, fr_toucher, &s));
	ASSERT_EQ(0, pthread_create(&tr, NULL, fr_revoker, &s));
	pin_cpu(self->cpu_b);
	for (int mode = MODE_RT; mode <= MODE_FREE; mode++) {
		t0 = now();
		s.mode = mode;
		while (iters[mode] < 2000 && now() - t0 < races_s() / 2) {
			double span = t_touch * 1.3;

			s.fd = p2pbuf_alloc_fd(self->p2p, s.len);
			ASSERT_GE(s.fd, 0);
			s.map = mmap(NULL, s.len, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
			if (s.map == MAP_FAILED) {
				mapped_fail++;
				close(s.fd);
				break;
			}
			s.revoked = 0;
			s.start = 0;
			s.delay_ns = 1 + (long)(rnd() % (uint64_t)(span * 1e9 + 1));
			s.spins = rnd() % (unsigned long)(span * rate + 1);
			sem_post(&s.go_t);
			sem_post(&s.go_r);
			s.start = 1;
			sem_wait_intr(&s.done);
			sem_wait_intr(&s.done);
			if (s.ret)
				bad_ret++;
			for (size_t off = 0; off < s.len; off += PAGE)
				if (probe_read(s.map + off) == 0) {
					if (!stale_final++)
						ksft_print_msg("%s iteration %lu: page %zu of the mapping is "
							       "readable after REVOKE returned\n",
							       mode_name(mode), iters[mode], off / PAGE);
				}
			munmap(s.map, s.len);
			close(s.fd);
			iters[mode]++;
		}
	}
	s.quit = 1;
	sem_post(&s.go_t);
	sem_post(&s.go_r);
	pthread_join(tt, NULL);
	pthread_join(tr, NULL);
	ksft_print_msg("faults vs REVOKE: %lu RT same-CPU + %lu free-running iterations of a %zu KiB "
		       "mapping: reads that succeeded after REVOKE returned: %lu (first at page %ld), "
		       "pages readable afterwards: %lu, REVOKE errors %lu\n", iters[0], iters[1],
		       s.len >> 10, s.late_reads, s.late_reads ? s.first_late : -1L, stale_final,
		       bad_ret);
	EXPECT_EQ(0UL, s.late_reads) TH_LOG("stale BAR access after revoke (a fault raced it)");
	EXPECT_EQ(0UL, stale_final);
	EXPECT_EQ(0UL, bad_ret);
	EXPECT_EQ(0UL, mapped_fail);
	EXPECT_LT(0UL, iters[0] + iters[1]);
}

/* ---- M1: concurrent revoke callers ------------------------------------------------------ */

#define M1_THREADS 4

struct m1_shared {
	sem_t go[M1_THREADS], done;
	volatile int start, quit, mode;
	int p2p, fd, cpu_a, cpu_b;
	int check_mem;		/* the pool is there to check (no unbind racing) */
	const char *pci;
	uint8_t *map;		/* a page of the buffer, mapped before the race */
	long long avail_before;	/* the pool before the buffer was allocated */
	long delay_ns;
	unsigned long spins[M1_THREADS];
	int ret[M1_THREADS];
	unsigned long iter;
	/* Violations, counted by the revokers. */
	unsigned long v_mem, v_sigbus, v_mmap, v_mmap_errno, ok;
};

struct m1_arg {
	struct m1_shared *s;
	int idx;
};

static void m1_check(struct m1_shared *s, int i)
{
	long long av = s->check_mem ? pool_avail(s->pci) : -1;
	unsigned long n;
	void *m2;
	int sig;

	__atomic_add_fetch(&s->ok, 1, __ATOMIC_RELAXED);
	/* First the memory, as it is at the moment REVOKE returned. */
	if (av > 0 && av != s->avail_before) {
		n = __atomic_add_fetch(&s->v_mem, 1, __ATOMIC_RELAXED);
		if (n <= 5)
			ksft_print_msg("iteration %lu, revoker %d: REVOKE returned 0 while %lld bytes of "
				       "the buffer were not yet back in the pool: it returned before the "
				       "revoke had run\n", s->iter, i, s->avail_before - av);
	}
	sig = probe_read(s->map);
	if (sig != SIGBUS) {
		n = __atomic_add_fetch(&s->v_sigbus, 1, __ATOMIC_RELAXED);
		if (n <= 5)
			ksft_print_msg("iteration %lu, revoker %d: the existing mapping %s after REVOKE "
				       "returned 0\n", s->iter, i, sig ? strsignal(sig) : "still reads");
	}
	m2 = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, s->fd, 0);
	if (m2 != MAP_FAILED) {
		munmap(m2, PAGE);
		n = __atomic_add_fetch(&s->v_mmap, 1, __ATOMIC_RELAXED);
		if (n <= 5)
			ksft_print_msg("iteration %lu, revoker %d: a fresh mmap() succeeded after "
				       "REVOKE returned 0\n", s->iter, i);
	} else if (errno != ENODEV) {
		__atomic_add_fetch(&s->v_mmap_errno, 1, __ATOMIC_RELAXED);
	}
}

static void *m1_revoker(void *p)
{
	struct m1_arg *a = p;
	struct m1_shared *s = a->s;
	int i = a->idx, mode = -1;

	for (;;) {
		if (sem_wait_intr(&s->go[i]) || s->quit)
			break;
		if (s->mode != mode) {
			mode = s->mode;
			pin_cpu(i < 2 ? s->cpu_a : s->cpu_b);
			set_fifo(mode == MODE_RT && i == 1 ? RT_PRIO : 0);
		}
		if (mode == MODE_RT && i == 1) {
			/* Wakes at a random tick during revoker 0's REVOKE and preempts it. */
			sleep_ns(s->delay_ns);
		} else {
			while (!s->start)
				;
			spin(s->spins[i]);
		}
		s->ret[i] = p2p_revoke(s->p2p, s->fd);
		if (s->ret[i] == 0)
			m1_check(s, i);
		sem_post(&s->done);
	}
	return NULL;
}

/* Time of one REVOKE of a fresh, mapped buffer of len bytes, or -1. */
static double time_revoke(int p2p, size_t len)
{
	int fd = p2pbuf_alloc_fd(p2p, len);
	double t0, t = -1;
	void *m;

	if (fd < 0)
		return -1;
	m = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0);
	t0 = now();
	if (!p2p_revoke(p2p, fd))
		t = now() - t0;
	if (m != MAP_FAILED)
		munmap(m, PAGE);
	close(fd);
	return t;
}

/*
 * Several threads revoke one buffer at once (revoker 1 at SCHED_FIFO on revoker 0's CPU, so
 * that it wakes inside revoker 0's REVOKE; then all free-running). Whoever gets 0 back checks
 * at once that the buffer is revoked for real: its memory is back in the pool, the existing
 * mapping faults with SIGBUS, a fresh mmap() fails with ENODEV.
 */
TEST_F_TIMEOUT(races, m1_concurrent_revokes, 150)
{
	size_t len = 1UL << 20, cap = self->total / 8 < (64UL << 20) ? self->total / 8 : (64UL << 20);
	struct m1_arg args[M1_THREADS];
	pthread_t th[M1_THREADS];
	struct m1_shared *s;
	unsigned long iters[2] = { 0, 0 }, bad_ret = 0;
	double t_rev = 0, rate, t0;

	if (self->avail0 < 0)
		SKIP(return, "no p2pmem/available for %s", self->pci);
	pin_cpu(self->cpu_a);
	for (;;) {
		t_rev = time_revoke(self->p2p, len);
		if (t_rev < 0 || t_rev >= 0.012 || len * 2 > cap)
			break;
		len *= 2;
	}
	ASSERT_LT(0, t_rev);
	rate = spin_rate();
	ksft_print_msg("calibration: REVOKE of a %zu KiB buffer takes %.2f ms\n", len >> 10,
		       t_rev * 1e3);
	s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, s);
	memset(s, 0, sizeof(*s));
	s->p2p = self->p2p;
	s->pci = self->pci;
	s->cpu_a = self->cpu_a;
	s->cpu_b = self->cpu_b;
	s->check_mem = 1;
	s->mode = -1;
	sem_init(&s->done, 0, 0);
	for (int i = 0; i < M1_THREADS; i++) {
		sem_init(&s->go[i], 0, 0);
		args[i].s = s;
		args[i].idx = i;
		ASSERT_EQ(0, pthread_create(&th[i], NULL, m1_revoker, &args[i]));
	}
	pin_cpu(self->cpu_b);
	for (int mode = MODE_RT; mode <= MODE_FREE; mode++) {
		t0 = now();
		s->mode = mode;
		while (iters[mode] < 2000 && now() - t0 < races_s() / 2) {
			double span = t_rev * 1.3;

			s->avail_before = pool_avail(self->pci);
			s->fd = p2pbuf_alloc_fd(self->p2p, len);
			ASSERT_GE(s->fd, 0);
			s->map = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
			ASSERT_NE(MAP_FAILED, s->map);
			s->map[0] = 1;
			s->iter = iters[mode];
			s->start = 0;
			s->delay_ns = 1 + (long)(rnd() % (uint64_t)(span * 1e9 + 1));
			for (int i = 0; i < M1_THREADS; i++)
				s->spins[i] = mode == MODE_RT && i == 0 ? 0 :
					      rnd() % (unsigned long)(span * rate / 4 + 1);
			for (int i = 0; i < M1_THREADS; i++)
				sem_post(&s->go[i]);
			s->start = 1;
			for (int i = 0; i < M1_THREADS; i++)
				sem_wait_intr(&s->done);
			for (int i = 0; i < M1_THREADS; i++)
				if (s->ret[i]) {
					bad_ret++;
					ksft_print_msg("REVOKE failed: %s\n", strerror(-s->ret[i]));
				}
			munmap(s->map, PAGE);
			close(s->fd);
			iters[mode]++;
		}
	}
	s->quit = 1;
	for (int i = 0; i < M1_THREADS; i++) {
		sem_post(&s->go[i]);
		pthread_join(th[i], NULL);
	}
	ksft_print_msg("M1: %lu RT same-CPU + %lu free-running iterations of %d concurrent REVOKEs "
		       "of a %zu KiB buffer: %lu returned 0; returned before the memory was back: "
		       "%lu, mapping did not fault: %lu, fresh mmap succeeded: %lu (other errno: %lu)\n",
		       iters[0], iters[1], M1_THREADS, len >> 10, s->ok, s->v_mem, s->v_sigbus,
		       s->v_mmap, s->v_mmap_errno);
	EXPECT_EQ(0UL, s->v_mem) TH_LOG("REVOKE returned 0 before the buffer's memory was given back");
	EXPECT_EQ(0UL, s->v_sigbus);
	EXPECT_EQ(0UL, s->v_mmap + s->v_mmap_errno);
	EXPECT_EQ(0UL, bad_ret);
	EXPECT_LT(0UL, iters[0] + iters[1]);
	munmap(s, sizeof(*s));
}

/* ---- H1: revoke against the last close ------------------------------------------------- */

struct h1_shared {
	sem_t go_c, go_r, done;
	volatile int start, quit;
	int p2p, fd, order;
	uint8_t *map;
	size_t len;
	unsigned long spin_c, spin_r;
	int ret;
};

static void *h1_closer(void *p)
{
	struct h1_shared *s = p;

	for (;;) {
		if (sem_wait_intr(&s->go_c) || s->quit)
			break;
		while (!s->start)
			;
		spin(s->spin_c);
		if (s->order) {
			munmap(s->map, s->len);
			close(s->fd);
		} else {
			close(s->fd);
			munmap(s->map, s->len);
		}
		sem_post(&s->done);
	}
	return NULL;
}

static void *h1_revoker(void *p)
{
	struct h1_shared *s = p;

	for (;;) {
		if (sem_wait_intr(&s->go_r) || s->quit)
			break;
		while (!s->start)
			;
		spin(s->spin_r);
		s->ret = p2p_revoke(s->p2p, s->fd);
		sem_post(&s->done);
	}
	return NULL;
}

/*
 * One thread closes the last fd (and drops the mapping, in either order) of a buffer while
 * another revokes it by fd. REVOKE may see the fd gone (EBADF); nothing else is allowed, and
 * all memory is back afterwards (teardown). The REVOKE ioctl holds a file reference for the
 * call, so this is the safe variant; the unbind one below has no such reference.
 */
TEST_F_TIMEOUT(races, h1_close_vs_revoke_threads, 120)
{
	struct h1_shared s = { .p2p = self->p2p, .len = 64 * 1024 };
	unsigned long iters = 0, ok = 0, ebadf = 0, einval = 0, bad = 0;
	double t0, rate = spin_rate();
	pthread_t tc, tr;
	int last_bad = 0;

	sem_init(&s.go_c, 0, 0);
	sem_init(&s.go_r, 0, 0);
	sem_init(&s.done, 0, 0);
	ASSERT_EQ(0, pthread_create(&tc, NULL, h1_closer, &s));
	ASSERT_EQ(0, pthread_create(&tr, NULL, h1_revoker, &s));
	t0 = now();
	while (iters < 20000 && now() - t0 < races_s()) {
		s.fd = p2pbuf_alloc_fd(self->p2p, s.len);
		ASSERT_GE(s.fd, 0);
		s.map = mmap(NULL, s.len, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
		ASSERT_NE(MAP_FAILED, s.map);
		s.map[0] = 1;
		s.order = rnd() % 2;
		/* Delays around the cost of a close (~100 us here): either side may go first. */
		s.spin_c = rnd() % (unsigned long)(rate * 2e-4 + 1);
		s.spin_r = rnd() % (unsigned long)(rate * 2e-4 + 1);
		s.start = 0;
		sem_post(&s.go_c);
		sem_post(&s.go_r);
		s.start = 1;
		sem_wait_intr(&s.done);
		sem_wait_intr(&s.done);
		iters++;
		switch (-s.ret) {
		case 0: ok++; break;
		case EBADF: ebadf++; break;
		case EINVAL: einval++; break;
		default: bad++; last_bad = -s.ret;
		}
	}
	s.quit = 1;
	sem_post(&s.go_c);
	sem_post(&s.go_r);
	pthread_join(tc, NULL);
	pthread_join(tr, NULL);
	ksft_print_msg("H1 last close vs REVOKE (threads): %lu iterations in %.1f s: REVOKE returned "
		       "0 %lu, EBADF %lu, EINVAL %lu, other %lu (last %s)\n", iters, now() - t0, ok,
		       ebadf, einval, bad, bad ? strerror(last_bad) : "-");
	EXPECT_EQ(0UL, bad);
	EXPECT_LT(0UL, iters);
}

/* ---- Tests that unbind the provider ----------------------------------------------------- */

/*
 * H2b: mmap() of a fresh buffer races the unbind of the provider (which revokes every buffer
 * without holding a file reference). A mapping that survives the revoke keeps its pages
 * referenced, and the unbind waits for them in memunmap_pages(): the test fails if the unbind
 * has not returned 20 s after it started ("unbind hangs on page references"), then removes
 * the mapping so that the unbind can finish, and rebinds.
 */
TEST_F_TIMEOUT(races, h2b_mmap_vs_unbind, 240)
{
	unsigned long it, mapped = 0, enodev = 0, faulted = 0, stale = 0, hung = 0, other = 0;
	unsigned long unbind_err = 0;
	double t0, worst = 0, budget = 2 * races_s();
	struct h2_cfg c;

	h2_calibrate(&c, self);
	ASSERT_LT(0, c.t_mmap);
	t0 = now();
	for (it = 0; it < 12 && (it < 3 || now() - t0 < budget); it++) {
		int mode = it % 3 == 2 ? MODE_FREE : MODE_RT;
		double span = c.t_mmap * 1.3, tu, tb;
		int go[2], status = 0, fd, e, done, sig;
		uint8_t *m;
		pid_t u;

		tb = now();
		ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
		if (it)
			ksft_print_msg("iteration %lu: rebind took %.1f s\n", it, now() - tb);
		fd = p2pbuf_alloc_fd(self->p2p, c.len);
		ASSERT_GE(fd, 0) TH_LOG("alloc: %s", strerror(-fd));
		ASSERT_EQ(0, pipe2(go, O_CLOEXEC));
		if (mode == MODE_RT)
			u = sysfs_write_child(UNBIND, self->pci, go[0], c.cpu_a, 1,
					      1 + (long)(rnd() % (uint64_t)(span * 1e9)), 0);
		else
			u = sysfs_write_child(UNBIND, self->pci, go[0], c.cpu_b, 0, 0,
					      rnd() % (unsigned long)(span * c.rate + 1));
		ASSERT_LT(0, u);
		self->unbinder = u;
		close(go[0]);
		set_fifo(0);
		pin_cpu(c.cpu_a);
		tu = now();
		ASSERT_EQ(1, write(go[1], "g", 1));
		m = mmap(NULL, c.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		e = errno;
		close(go[1]);
		done = wait_for(u, UNBIND_LIMIT_S, &status);
		if (m != MAP_FAILED) {
			mapped++;
			sig = probe_read(m);
			if (sig == SIGBUS) {
				faulted++;
			} else {
				stale++;
				ksft_print_msg("%s iteration %lu: stale BAR access after revoke: a "
					       "mapping made while the provider was being unbound %s\n",
					       mode_name(mode), it, sig ? strsignal(sig) : "reads without a fault");
			}
		} else if (e == ENODEV) {
			enodev++;
		} else {
			other++;
			ksft_print_msg("iteration %lu: mmap failed with %s\n", it, strerror(e));
		}
		if (done != 1) {
			hung++;
			ksft_print_msg("%s iteration %lu: unbind hangs on page references: it has not "
				       "returned %.0f s after it started, while a mapping made during it "
				       "exists\n", mode_name(mode), it, UNBIND_LIMIT_S);
		} else if (now() - tu > worst) {
			worst = now() - tu;
		}
		if (m != MAP_FAILED)
			munmap(m, c.len);
		close(fd);
		if (done != 1) {
			done = wait_for(u, UNBIND_LIMIT_S, &status);
			ASSERT_EQ(1, done) TH_LOG("the unbind did not return even once the mapping was gone");
			ksft_print_msg("iteration %lu: the unbind returned %.1f s after it started, once "
				       "the mapping was removed\n", it, now() - tu);
		}
		self->unbinder = 0;
		if (!WIFEXITED(status) || WEXITSTATUS(status)) {
			unbind_err++;
			ksft_print_msg("iteration %lu: the unbind write failed (status %#x)\n", it, status);
		}
	}
	ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
	ksft_print_msg("H2b mmap vs unbind: %lu iterations in %.1f s (2 of 3 RT same-CPU): mmap "
		       "succeeded %lu (faulted %lu, stale %lu), ENODEV %lu, other %lu; unbinds that "
		       "hung %lu, slowest prompt unbind %.2f s\n", it, now() - t0, mapped, faulted,
		       stale, enodev, other, hung, worst);
	EXPECT_EQ(0UL, stale);
	EXPECT_EQ(0UL, hung) TH_LOG("unbind hangs on page references");
	EXPECT_EQ(0UL, other);
	EXPECT_EQ(0UL, unbind_err);
}

struct nonroot_report {
	struct h2_stats rt, fr;
	int uid, open_errno, setup;
};

/* Phase 2: the unprivileged process maps one buffer again and again while root unbinds. */
struct nonroot_report2 {
	unsigned long mapped, faulted, stale, other;
	int enodev_seen, last_errno;
};

/* The unprivileged side of phase 2: maps buf until mmap() says ENODEV (the unbind revoked
 * it), keeping every mapping; then probes them all. */
static void nonroot_phase2(const struct h2_cfg *c, int rp, struct nonroot_report2 *r)
{
	int fd = p2pbuf_alloc_fd(c->p2p, c->len);
	double t0;

	memset(r, 0, sizeof(*r));
	if (fd < 0) {
		r->other++;
		r->last_errno = -fd;
	}
	if (write(rp, "r", 1) != 1)
		_exit(5);
	t0 = now();
	while (fd >= 0 && now() - t0 < 15 && nkept < 256) {
		void *m = mmap(NULL, c->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

		if (m == MAP_FAILED) {
			if (errno == ENODEV) {
				r->enodev_seen = 1;
			} else {
				r->other++;
				r->last_errno = errno;
			}
			break;
		}
		r->mapped++;
		if (map_keep(m, c->len))
			munmap(m, c->len);
	}
	for (int i = 0; i < nkept; i++) {
		int sig = probe_read(kept[i].p);

		if (sig == SIGBUS)
			r->faulted++;
		else
			r->stale++;
	}
	if (fd >= 0)
		close(fd);
}

/*
 * An unprivileged process (uid/gid 65534) that got the /dev/p2pbuf fd from root:
 *  1. races mmap against REVOKE on its own buffers: it must not keep access after revoke.
 *     Root then unbinds the provider while that process still holds everything it mapped;
 *     the unbind must return within 20 s.
 *  2. maps one buffer again and again while root unbinds the provider: no mapping may stay
 *     readable once the unbind revoked the buffer, and the unbind must return within 20 s
 *     although an unprivileged process holds mappings ("unbind hangs on page references").
 * The SCHED_FIFO amplifier (the revoking thread in 1, the unbinding process in 2) is set up
 * by root: in 1 before the privileges are dropped (the thread inherits it).
 */
TEST_F_TIMEOUT(races, h2_nonroot_mmap_vs_revoke_then_unbind, 300)
{
	struct nonroot_report rep;
	struct nonroot_report2 rep2;
	int rp[2], hold[2], st = 0, done, done2 = 1, cst, got2 = 0;
	struct h2_cfg c;
	pid_t child, u;
	double tu;
	char ch;

	h2_calibrate(&c, self);
	ASSERT_LT(0, c.t_mmap);
	c.keep_stale = 1;
	ASSERT_EQ(0, pipe2(rp, O_CLOEXEC));
	ASSERT_EQ(0, pipe2(hold, O_CLOEXEC));
	child = fork();
	ASSERT_LE(0, child);
	if (child == 0) {
		struct h2_revoker r;
		int fd;

		memset(&rep, 0, sizeof(rep));
		close(rp[0]);
		close(hold[1]);
		pin_cpu(c.cpu_a);
		set_fifo(RT_PRIO);	/* inherited by the revoker thread */
		if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
			_exit(2);
		rep.uid = (int)geteuid();
		fd = open(P2P_DEV, O_RDWR);
		rep.open_errno = fd < 0 ? errno : 0;
		if (fd >= 0)
			close(fd);
		rep.setup = h2_start(&r, &c, 0);
		if (!rep.setup) {
			h2_run(&r, MODE_RT, races_s() / 2, 5000, &rep.rt);
			h2_run(&r, MODE_FREE, races_s() / 2, 5000, &rep.fr);
			h2_stop(&r);
		}
		if (write(rp[1], &rep, sizeof(rep)) != sizeof(rep))
			_exit(3);
		/* Hold every stale mapping until root has tried to unbind. */
		if (read(hold[0], &ch, 1) != 1)
			_exit(0);
		maps_release();
		set_fifo(0);
		pin_cpu(c.cpu_a);
		nonroot_phase2(&c, rp[1], &rep2);
		if (write(rp[1], &rep2, sizeof(rep2)) != sizeof(rep2))
			_exit(6);
		/* Hold the mappings until root is done with the unbind. */
		if (read(hold[0], &ch, 1) < 0)
			_exit(7);
		_exit(0);
	}
	add_kid(self, child);
	close(rp[1]);
	close(hold[0]);
	ASSERT_EQ((ssize_t)sizeof(rep), read_within(rp[0], &rep, sizeof(rep), races_s() + 120))
		TH_LOG("the unprivileged child did not report");
	ASSERT_EQ(0, rep.setup);
	ksft_print_msg("unprivileged child: euid %d, open(%s) itself: %s\n", rep.uid, P2P_DEV,
		       rep.open_errno ? strerror(rep.open_errno) : "allowed");
	h2_print("H2 as uid 65534", MODE_RT, &rep.rt);
	h2_print("H2 as uid 65534", MODE_FREE, &rep.fr);
	EXPECT_EQ(65534, rep.uid);

	/* 1: root unbinds while the unprivileged process still holds its mappings. */
	tu = now();
	u = sysfs_write_child(UNBIND, self->pci, -1, -1, 0, 0, 0);
	ASSERT_LT(0, u);
	self->unbinder = u;
	done = wait_for(u, UNBIND_LIMIT_S, &st);
	if (done != 1) {
		ksft_print_msg("phase 1: unbind hangs on page references: not returned %.0f s after "
			       "it started, while uid 65534 holds %lu stale mapping(s); killing that "
			       "process\n", UNBIND_LIMIT_S, rep.rt.stale + rep.fr.stale);
		kill(child, SIGKILL);
		EXPECT_EQ(1, wait_for(child, 20, &cst));
		ASSERT_EQ(1, wait_for(u, UNBIND_LIMIT_S, &st))
			TH_LOG("the unbind did not return even after the process was killed");
	} else {
		ksft_print_msg("phase 1: unbind returned in %.2f s (it zaps again every mapping "
			       "that is linked by now)\n", now() - tu);
	}
	self->unbinder = 0;
	EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) TH_LOG("unbind status %#x", st);
	ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));

	/* 2: the unprivileged process maps while root unbinds. */
	if (done == 1) {
		double span = c.t_mmap * 1.3;

		ASSERT_EQ(1, write(hold[1], "2", 1));
		ASSERT_EQ(1, read_within(rp[0], &ch, 1, 30)) TH_LOG("phase 2 did not start");
		tu = now();
		u = sysfs_write_child(UNBIND, self->pci, -1, c.cpu_a, 1,
				      1 + (long)(rnd() % (uint64_t)(span * 1e9)), 0);
		ASSERT_LT(0, u);
		self->unbinder = u;
		done2 = wait_for(u, UNBIND_LIMIT_S, &st);
		got2 = read_within(rp[0], &rep2, sizeof(rep2), done2 == 1 ? 30 : 1) == sizeof(rep2);
		if (done2 != 1) {
			ksft_print_msg("phase 2: unbind hangs on page references: not returned %.0f s "
				       "after it started, while uid 65534 maps the buffer; killing "
				       "that process\n", UNBIND_LIMIT_S);
			kill(child, SIGKILL);
			EXPECT_EQ(1, wait_for(child, 20, &cst));
			ASSERT_EQ(1, wait_for(u, UNBIND_LIMIT_S, &st))
				TH_LOG("the unbind did not return even after the process was killed");
			ksft_print_msg("phase 2: the unbind returned %.1f s after it started, once the "
				       "process was gone\n", now() - tu);
		} else {
			ksft_print_msg("phase 2: unbind returned in %.2f s\n", now() - tu);
		}
		self->unbinder = 0;
		EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) TH_LOG("unbind status %#x", st);
		if (got2)
			ksft_print_msg("phase 2, uid 65534 mapping during the unbind: %lu mappings, %lu "
				       "faulted afterwards, %lu stale, mmap ENODEV seen: %s, other "
				       "errors %lu (last %s)\n", rep2.mapped, rep2.faulted, rep2.stale,
				       rep2.enodev_seen ? "yes" : "no", rep2.other,
				       rep2.other ? strerror(rep2.last_errno) : "-");
		ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
	}
	close(hold[1]);
	close(rp[0]);
	if (wait_for(child, 20, &cst) != 1)
		kill(child, SIGKILL);
	EXPECT_EQ(0UL, rep.rt.stale + rep.fr.stale)
		TH_LOG("an unprivileged process kept CPU access to device memory after REVOKE "
		       "(%lu stale mapping(s))", rep.rt.stale + rep.fr.stale);
	EXPECT_EQ(1, done) TH_LOG("unbind hangs on page references held by an unprivileged process");
	EXPECT_EQ(1, done2) TH_LOG("unbind hangs on page references of a mapping an unprivileged "
				   "process made while the provider was being unbound");
	if (got2) {
		EXPECT_EQ(0UL, rep2.stale) TH_LOG("stale BAR access after revoke by uid 65534");
		EXPECT_EQ(0UL, rep2.other);
	}
	EXPECT_EQ(0UL, rep.rt.other + rep.fr.other + rep.rt.rev_err + rep.fr.rev_err);
}

/*
 * A holder process: allocates 1 to 3 buffers, maps and touches them, says it is ready, and
 * when the race starts, after a random 0-8 ms, closes its fds and unmaps (in either order) or
 * just exits (exit closes and unmaps). In RT mode it runs at SCHED_FIFO on the unbinder's
 * CPU, so its wake-up preempts the unbind wherever it is, and it spins 20 ms before exiting
 * (starving the unbinder, so that an RCU grace period can pass inside its window).
 */
static void holder(int p2p, int ready, int go, int rt, int cpu, unsigned long spin20ms,
		   uint64_t seed)
{
	int fds[3], n;
	uint8_t *maps[3];
	size_t lens[3];
	char ch;

	rnd_seed(seed);
	n = 1 + rnd() % 3;
	if (rt) {
		pin_cpu(cpu);
		set_fifo(RT_PRIO + 1);
	}
	for (int i = 0; i < n; i++) {
		lens[i] = PAGE << (rnd() % 6);
		fds[i] = p2pbuf_alloc_fd(p2p, lens[i]);
		if (fds[i] < 0)
			_exit(10);
		maps[i] = mmap(NULL, lens[i], PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
		if (maps[i] == MAP_FAILED)
			_exit(11);
		maps[i][0] = 1;
	}
	if (write(ready, "r", 1) != 1)
		_exit(12);
	if (read(go, &ch, 1) != 1)	/* the race starts */
		_exit(13);
	sleep_ns(1 + (long)(rnd() % 8000000));
	switch (rnd() % 3) {
	case 0:
		for (int i = 0; i < n; i++)
			close(fds[i]);
		for (int i = 0; i < n; i++)
			munmap(maps[i], lens[i]);
		break;
	case 1:
		for (int i = 0; i < n; i++)
			munmap(maps[i], lens[i]);
		for (int i = 0; i < n; i++)
			close(fds[i]);
		break;
	default:
		break;
	}
	if (rt)
		spin(spin20ms);
	_exit(0);
}

/*
 * H1 with processes: holders close their last fds or exit at a random moment while the
 * provider is unbound (unbind revokes every buffer without holding a file reference). Then
 * rebind. All calls succeed, the unbind returns in time, and all memory comes back.
 */
TEST_F_TIMEOUT(races, h1_exit_vs_unbind_processes, 240)
{
	const int K = 4;
	unsigned long cyc, holder_bad = 0, unbind_bad = 0, late = 0;
	double t0 = now(), rate = spin_rate(), worst = 0;

	for (cyc = 0; cyc < 500 && (cyc < 2 || now() - t0 < 2 * races_s()); cyc++) {
		int rt = cyc % 2, ready[2], go[2], st, done;
		pid_t hs[8], u;
		char buf[8];
		double tu;

		ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
		ASSERT_EQ((long long)self->total, provider_free(self->p2p));
		ASSERT_EQ(0, pipe2(ready, O_CLOEXEC));
		ASSERT_EQ(0, pipe2(go, O_CLOEXEC));
		for (int k = 0; k < K; k++) {
			uint64_t seed = rnd();

			hs[k] = fork();
			ASSERT_LE(0, hs[k]);
			if (hs[k] == 0) {
				close(ready[0]);
				close(go[1]);
				holder(self->p2p, ready[1], go[0], rt, self->cpu_a,
				       (unsigned long)(rate * 0.02), seed);
			}
			add_kid(self, hs[k]);
		}
		close(ready[1]);
		ASSERT_EQ(K, read_within(ready[0], buf, K, 30)) TH_LOG("holders not ready");
		close(ready[0]);
		u = sysfs_write_child(UNBIND, self->pci, go[0], rt ? self->cpu_a : -1, 0,
				      1 + (long)(rnd() % 8000000), 0);
		ASSERT_LT(0, u);
		self->unbinder = u;
		close(go[0]);
		tu = now();
		/* Everyone starts: one byte per holder and one for the unbinder. */
		ASSERT_EQ(K + 1, write(go[1], "gggggggg", K + 1));
		close(go[1]);
		done = wait_for(u, UNBIND_LIMIT_S, &st);
		if (done != 1) {
			late++;
			ksft_print_msg("cycle %lu: the unbind has not returned after %.0f s\n", cyc,
				       UNBIND_LIMIT_S);
			ASSERT_EQ(1, wait_for(u, UNBIND_LIMIT_S, &st));
		} else if (now() - tu > worst) {
			worst = now() - tu;
		}
		self->unbinder = 0;
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			unbind_bad++;
			ksft_print_msg("cycle %lu: unbind status %#x\n", cyc, st);
		}
		for (int k = 0; k < K; k++) {
			ASSERT_EQ(1, wait_for(hs[k], 20, &st));
			if (!WIFEXITED(st) || WEXITSTATUS(st)) {
				holder_bad++;
				ksft_print_msg("cycle %lu: holder %d status %#x\n", cyc, k, st);
			}
		}
		self->nkids = 0;
	}
	ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
	ksft_print_msg("H1 exit/close vs unbind: %lu cycles of %d holder processes in %.1f s (odd "
		       "cycles RT same-CPU); slowest unbind %.2f s\n", cyc, K, now() - t0, worst);
	EXPECT_EQ(0UL, holder_bad);
	EXPECT_EQ(0UL, unbind_bad);
	EXPECT_EQ(0UL, late);
	EXPECT_EQ((long long)self->total, provider_free(self->p2p));
	EXPECT_EQ((long long)self->total, pool_avail(self->pci));
}

/*
 * M1 with the unbind as one of the revoke callers: three threads REVOKE a mapped buffer while
 * the provider is unbound. A REVOKE that returns 0 must leave the buffer revoked for real
 * (mapping faults, fresh mmap ENODEV, memory back unless the pool is already gone). A REVOKE
 * that comes once the unbind has taken the buffer off the provider's list returns 0 too (the
 * unbind revoked it, and the same checks hold); it used to say EINVAL, which the header does
 * not allow for a p2pbuf buffer. Then rebind.
 */
TEST_F_TIMEOUT(races, m1_revokes_vs_unbind, 240)
{
	const size_t len = 4UL << 20;
	struct m1_arg args[3];
	pthread_t th[3];
	struct m1_shared *s;
	unsigned long cyc, bad_ret = 0, einval = 0, late = 0, unbind_bad = 0;
	double t0 = now(), rate = spin_rate();

	s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, s);
	memset(s, 0, sizeof(*s));
	s->p2p = self->p2p;
	s->pci = self->pci;
	s->cpu_a = self->cpu_a;
	s->cpu_b = self->cpu_b;
	s->check_mem = 1;
	s->mode = -1;
	sem_init(&s->done, 0, 0);
	for (int i = 0; i < 3; i++) {
		sem_init(&s->go[i], 0, 0);
		args[i].s = s;
		args[i].idx = i;
		ASSERT_EQ(0, pthread_create(&th[i], NULL, m1_revoker, &args[i]));
	}
	s->mode = MODE_FREE;
	for (cyc = 0; cyc < 500 && (cyc < 2 || now() - t0 < 2 * races_s()); cyc++) {
		int go[2], st, done;
		pid_t u;

		ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
		s->avail_before = pool_avail(self->pci);
		s->fd = p2pbuf_alloc_fd(self->p2p, len);
		ASSERT_GE(s->fd, 0);
		s->map = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
		ASSERT_NE(MAP_FAILED, s->map);
		s->map[0] = 1;
		s->iter = cyc;
		for (int i = 0; i < 3; i++)
			s->spins[i] = rnd() % (unsigned long)(rate * 0.01 + 1);
		ASSERT_EQ(0, pipe2(go, O_CLOEXEC));
		u = sysfs_write_child(UNBIND, self->pci, go[0], -1, 0, 0,
				      rnd() % (unsigned long)(rate * 0.01 + 1));
		ASSERT_LT(0, u);
		self->unbinder = u;
		close(go[0]);
		s->start = 0;
		for (int i = 0; i < 3; i++)
			sem_post(&s->go[i]);
		ASSERT_EQ(1, write(go[1], "g", 1));
		s->start = 1;
		close(go[1]);
		for (int i = 0; i < 3; i++)
			sem_wait_intr(&s->done);
		done = wait_for(u, UNBIND_LIMIT_S, &st);
		if (done != 1) {
			late++;
			munmap(s->map, PAGE);
			s->map = NULL;
			ASSERT_EQ(1, wait_for(u, UNBIND_LIMIT_S, &st));
		}
		self->unbinder = 0;
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			unbind_bad++;
		for (int i = 0; i < 3; i++) {
			if (s->ret[i] == -EINVAL)
				einval++;
			else if (s->ret[i])
				bad_ret++;
		}
		if (s->map)
			munmap(s->map, PAGE);
		close(s->fd);
	}
	s->quit = 1;
	for (int i = 0; i < 3; i++) {
		sem_post(&s->go[i]);
		pthread_join(th[i], NULL);
	}
	ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
	ksft_print_msg("M1 REVOKEs vs unbind: %lu cycles in %.1f s: REVOKE returned 0 %lu times, "
		       "EINVAL (buffer taken by the unbind: wrong) %lu, other errors %lu; returned "
		       "before the memory was back %lu, mapping did not fault %lu, fresh mmap "
		       "succeeded %lu; late unbinds %lu\n", cyc, now() - t0, s->ok, einval, bad_ret,
		       s->v_mem, s->v_sigbus, s->v_mmap, late);
	EXPECT_EQ(0UL, s->v_mem);
	EXPECT_EQ(0UL, s->v_sigbus);
	EXPECT_EQ(0UL, s->v_mmap + s->v_mmap_errno);
	EXPECT_EQ(0UL, bad_ret);
	EXPECT_EQ(0UL, einval);
	EXPECT_EQ(0UL, late);
	EXPECT_EQ(0UL, unbind_bad);
	munmap(s, sizeof(*s));
}

/* ---- Deterministic windows with a fence that userspace controls (CONFIG_SW_SYNC) -------- */

/* An operation run in a child process, so that the test never blocks on it. */
struct op {
	const char *name;
	pid_t pid;
	int rfd;
	int done;
	int result;
	double secs;
};

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

static void op_start(FIXTURE_DATA(races) *self, struct op *o, const char *name, int kind,
		     int fd, int go_fd)
{
	int p[2];

	memset(o, 0, sizeof(*o));
	o->name = name;
	o->rfd = -1;
	if (pipe2(p, O_CLOEXEC))
		return;
	o->secs = now();
	o->pid = fork();
	if (o->pid == 0) {
		int r;
		char ch;

		if (self->timeline >= 0)
			close(self->timeline);
		close(p[0]);
		if (go_fd >= 0 && read(go_fd, &ch, 1) < 0)
			_exit(1);
		r = op_body(kind, self->p2p, fd);
		if (write(p[1], &r, sizeof(r)) != sizeof(r))
			_exit(1);
		_exit(0);
	}
	close(p[1]);
	if (o->pid < 0) {
		close(p[0]);
		return;
	}
	add_kid(self, o->pid);
	o->rfd = p[0];
}

/* Whether the op has finished (waiting up to secs); its result is in o->result. */
static int op_wait(struct op *o, double secs)
{
	if (!o->done && o->rfd >= 0 &&
	    read_within(o->rfd, &o->result, sizeof(o->result), secs) == sizeof(o->result)) {
		int st;

		o->done = 1;
		o->secs = now() - o->secs;
		close(o->rfd);
		o->rfd = -1;
		waitpid(o->pid, &st, 0);
	}
	return o->done;
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
	struct op rev, ops[5];
	const char *names[5] = { "PROVIDER_INFO", "ALLOC (another buffer)",
				 "mmap() of the buffer being revoked", "read of debugfs p2pbuf/buffers",
				 "ATTACHMENT of the buffer being revoked" };
	const int kinds[5] = { OP_INFO, OP_ALLOC, OP_MMAP, OP_DEBUGFS, OP_ATTACHMENT };
	int x, blocked = 0, waited = 0;

	x = p2pbuf_alloc_fd(self->p2p, 1UL << 20);
	ASSERT_GE(x, 0);
	self->timeline = plant_fence(x);
	if (self->timeline == -ENOENT) {
		close(x);
		SKIP(return, "no %s (CONFIG_SW_SYNC=n): no fence that userspace controls",
		     SW_SYNC_PATH);
	}
	ASSERT_LE(0, self->timeline) TH_LOG("plant a fence: %s", strerror(-self->timeline));
	op_start(self, &rev, "REVOKE", OP_REVOKE, x, -1);
	ASSERT_LT(0, rev.pid);
	if (op_wait(&rev, 1.0)) {
		ksft_print_msg("REVOKE returned (%s) without waiting for the buffer's fence\n",
			       strerror(-rev.result));
	} else {
		waited = 1;
		for (int i = 0; i < 5; i++)
			op_start(self, &ops[i], names[i], kinds[i], x, -1);
		for (int i = 0; i < 5; i++) {
			double left = ops[i].secs + 3.0 - now();

			if (!op_wait(&ops[i], left > 0 ? left : 0)) {
				blocked++;
				ksft_print_msg("%s has not returned after 3 s: it waits behind a REVOKE "
					       "that waits for a fence without limit (M2)\n", names[i]);
			}
		}
	}
	fence_signal(self->timeline);
	EXPECT_TRUE(op_wait(&rev, 20)) TH_LOG("REVOKE did not return once the fence was signalled");
	EXPECT_EQ(0, rev.result);
	if (!waited)
		goto out;
	for (int i = 0; i < 5; i++) {
		EXPECT_TRUE(op_wait(&ops[i], 20)) TH_LOG("%s never returned", names[i]);
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
	struct op closer;
	int x, go[2], st = 0, done;
	uint8_t *m;
	pid_t u;

	x = p2pbuf_alloc_fd(self->p2p, 1UL << 20);
	ASSERT_GE(x, 0);
	m = mmap(NULL, 1UL << 20, PROT_READ | PROT_WRITE, MAP_SHARED, x, 0);
	ASSERT_NE(MAP_FAILED, m);
	m[0] = 1;
	munmap(m, 1UL << 20);
	self->timeline = plant_fence(x);
	if (self->timeline == -ENOENT) {
		close(x);
		SKIP(return, "no %s (CONFIG_SW_SYNC=n): no fence that userspace controls",
		     SW_SYNC_PATH);
	}
	ASSERT_LE(0, self->timeline) TH_LOG("plant a fence: %s", strerror(-self->timeline));
	races_child_close_fd = self->timeline;
	ASSERT_EQ(0, pipe2(go, O_CLOEXEC));
	/* The closer holds the last reference once we close ours. */
	op_start(self, &closer, "close", OP_CLOSE, x, go[0]);
	ASSERT_LT(0, closer.pid);
	close(go[0]);
	close(x);
	u = sysfs_write_child(UNBIND, self->pci, -1, -1, 0, 0, 0);
	ASSERT_LT(0, u);
	self->unbinder = u;
	done = wait_for(u, 1.0, &st);
	if (done == 1)
		ksft_print_msg("the unbind returned without waiting for the buffer's fence\n");
	ASSERT_EQ(1, write(go[1], "c", 1));
	close(go[1]);
	if (op_wait(&closer, 0.5))
		ksft_print_msg("the last close returned while the unbind's revoke waited\n");
	else
		ksft_print_msg("the last close waits for the unbind's revoke (in the dma-buf's "
			       "release, after its inode was freed)\n");
	fence_signal(self->timeline);
	if (done != 1)
		done = wait_for(u, UNBIND_LIMIT_S, &st);
	EXPECT_EQ(1, done) TH_LOG("the unbind did not return after the fence was signalled");
	if (done == 1) {
		self->unbinder = 0;
		EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) TH_LOG("unbind status %#x", st);
	}
	EXPECT_TRUE(op_wait(&closer, 20));
	EXPECT_EQ(0, closer.result);
	races_child_close_fd = -1;
	close(self->timeline);
	self->timeline = -1;
	ASSERT_EQ(0, ensure_bound(EXPORTER_DRV, self->pci));
	EXPECT_EQ((long long)self->total, provider_free(self->p2p));
}

TEST_HARNESS_MAIN

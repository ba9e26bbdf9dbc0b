/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The fixture and the racing sides of the exporter's race tests (races_close.c,
 * races_fence.c, races_mmap.c, races_revoke.c, races_unbind.c: one program per race
 * family, as iommufd's selftests keep their wrappers in iommufd_utils.h). What they test:
 *
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
#ifndef P2PBUF_RACES_FIXTURE_H
#define P2PBUF_RACES_FIXTURE_H

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

RACES_HELPER const char *mode_name(int mode)
{
	return mode == MODE_RT ? "RT same-CPU" : "free-running";
}

/*
 * A revoker thread's scheduling in `mode`: RT same-CPU pinned to cpu_a at SCHED_FIFO (unprivileged
 * this fails, but then the thread inherited it), free-running at SCHED_OTHER on cpu_b.
 */
RACES_HELPER void revoker_mode(int mode, int cpu_a, int cpu_b)
{
	if (mode == MODE_RT) {
		pin_cpu(cpu_a);
		set_fifo(RT_PRIO);
	} else {
		set_fifo(0);
		pin_cpu(cpu_b);
	}
}

/*
 * A revoker's start in `mode`: RT same-CPU wakes after delay_ns (to preempt the other side at a
 * random tick), free-running waits for *start and spins `spins` times.
 */
RACES_HELPER void revoker_start(int mode, long delay_ns, volatile int *start, unsigned long spins)
{
	if (mode == MODE_RT) {
		sleep_ns(delay_ns);
	} else {
		while (!*start)
			;
		spin(spins);
	}
}

/* Mappings a test keeps on purpose (a stale one, to see what an unbind does with it). */
static struct {
	void *p;
	size_t len;
} kept[256];
static int nkept;

RACES_HELPER int map_keep(void *p, size_t len)
{
	if (nkept >= (int)(sizeof(kept) / sizeof(kept[0])))
		return -1;
	kept[nkept].p = p;
	kept[nkept].len = len;
	nkept++;
	return 0;
}

RACES_HELPER void maps_release(void)
{
	while (nkept > 0) {
		nkept--;
		munmap(kept[nkept].p, kept[nkept].len);
	}
}

RACES_HELPER int sem_wait_intr(sem_t *s)
{
	int r;

	while ((r = sem_wait(s)) && errno == EINTR)
		;
	return r;
}

/*
 * Two racing threads, each woken for a round by its own semaphore (go), let go together by
 * *start, and reporting on one done semaphore; *quit ends them.
 */

/* A racing thread's wait for its next round: 0 once the test has set *quit. */
RACES_HELPER int race_next(sem_t *go, volatile int *quit)
{
	return !sem_wait_intr(go) && !*quit;
}

/* One round (*start 0 until both threads are woken): both let go, both done. */
RACES_HELPER void race_round(sem_t *go_a, sem_t *go_b, volatile int *start, sem_t *done)
{
	sem_post(go_a);
	sem_post(go_b);
	*start = 1;
	sem_wait_intr(done);
	sem_wait_intr(done);
}

/* The end: *quit set, each thread woken and joined. */
RACES_HELPER void race_stop(volatile int *quit, sem_t *go_a, pthread_t a, sem_t *go_b,
			    pthread_t b)
{
	*quit = 1;
	sem_post(go_a);
	sem_post(go_b);
	pthread_join(a, NULL);
	pthread_join(b, NULL);
}

RACES_HELPER int send_fd(int sock, int fd)
{
	char c = 'f', cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec io = { .iov_base = &c, .iov_len = 1 };
	struct msghdr msg = {
		.msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};

	p2pbuf_cmsg_fd(&msg, fd);
	return sendmsg(sock, &msg, 0) == 1 ? 0 : -errno;
}

RACES_HELPER int recv_fd(int sock)
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

RACES_HELPER void add_kid(FIXTURE_DATA(races) *self, pid_t pid)
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
	why = exporter_ready(_metadata, self->pci, sizeof(self->pci), &self->p2p, &p);
	if (why)
		SKIP(return, "%s", why);
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

RACES_HELPER void h2_revoker_loop(struct h2_shared *s, const struct h2_cfg *c, int sock)
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
			revoker_mode(mode, c->cpu_a, c->cpu_b);
		}
		fd = sock >= 0 ? recv_fd(sock) : s->fd;
		revoker_start(mode, s->delay_ns, &s->start, s->spins);
		s->rev_ret = fd < 0 ? fd : p2p_revoke(c->p2p, fd);
		if (sock >= 0 && fd >= 0)
			close(fd);
		sem_post(&s->done);
	}
}

RACES_HELPER void *h2_revoker_thread(void *arg)
{
	struct h2_revoker *r = arg;

	h2_revoker_loop(r->s, r->c, -1);
	return NULL;
}

/* Starts the revoker: a thread, or (process) a child process. 0 or -errno. */
RACES_HELPER int h2_start(struct h2_revoker *r, const struct h2_cfg *c, int process)
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

RACES_HELPER void h2_stop(struct h2_revoker *r)
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
RACES_HELPER void h2_run(struct h2_revoker *r, int mode, double budget, unsigned long max,
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

RACES_HELPER void h2_print(const char *what, int mode, const struct h2_stats *st)
{
	ksft_print_msg("%s, %s: %lu iterations in %.1f s: mmap succeeded %lu (then faulted %lu, "
		       "stale %lu), failed with ENODEV %lu, other errors %lu (last %s); REVOKE "
		       "errors %lu (last %s)\n", what, mode_name(mode), st->iters, st->secs,
		       st->mapped, st->faulted, st->stale, st->enodev, st->other,
		       st->other ? strerror(st->last_errno) : "-", st->rev_err,
		       st->rev_err ? strerror(st->last_rev_errno) : "-");
}

/* Time of one mmap() of a fresh buffer of len bytes, or -1. */
RACES_HELPER double time_mmap(int p2p, size_t len)
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
RACES_HELPER void h2_calibrate(struct h2_cfg *c, FIXTURE_DATA(races) *self)
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

/*
 * The state of `n` M1 revokers of the fixture's provider, shared with any child (MAP_SHARED),
 * zeroed, the pool checked; NULL if it cannot be mapped.
 */
RACES_HELPER struct m1_shared *m1_shared_new(FIXTURE_DATA(races) *self, int n)
{
	struct m1_shared *s;

	s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (s == MAP_FAILED)
		return NULL;
	memset(s, 0, sizeof(*s));
	s->p2p = self->p2p;
	s->pci = self->pci;
	s->cpu_a = self->cpu_a;
	s->cpu_b = self->cpu_b;
	s->check_mem = 1;
	s->mode = -1;
	sem_init(&s->done, 0, 0);
	for (int i = 0; i < n; i++)
		sem_init(&s->go[i], 0, 0);
	return s;
}

/*
 * M1's iteration `iter`: a new buffer of `len` bytes for the revokers, a page of it mapped and
 * touched, and the pool as it was before the buffer.
 */
RACES_HELPER void m1_arm(struct __test_metadata *_metadata, struct m1_shared *s, size_t len,
			 unsigned long iter)
{
	s->avail_before = pool_avail(s->pci);
	s->fd = p2pbuf_alloc_fd(s->p2p, len);
	ASSERT_GE(s->fd, 0);
	s->map = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
	ASSERT_NE(MAP_FAILED, s->map);
	s->map[0] = 1;
	s->iter = iter;
}

RACES_HELPER void m1_check(struct m1_shared *s, int i)
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

RACES_HELPER void *m1_revoker(void *p)
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
		/* RT: revoker 1 wakes at a random tick during revoker 0's REVOKE and preempts it. */
		revoker_start(mode == MODE_RT && i == 1 ? MODE_RT : MODE_FREE, s->delay_ns, &s->start,
			      s->spins[i]);
		s->ret[i] = p2p_revoke(s->p2p, s->fd);
		if (s->ret[i] == 0)
			m1_check(s, i);
		sem_post(&s->done);
	}
	return NULL;
}

#endif /* P2PBUF_RACES_FIXTURE_H */

// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf races: mmap() and page faults against REVOKE (H2), with threads and with
 * processes. The fixture and the racing sides are in races_fixture.h, which says how the
 * windows are hit.
 */
#include "races_fixture.h"

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

/*
 * A thread's wait for its next round (race_next), moved first to the test's mode where that
 * changed since its last round (*mode, -1 at first): setup(s, mode).
 */
static int fr_next(struct fr_shared *s, sem_t *go, int *mode,
		   void (*setup)(struct fr_shared *s, int mode))
{
	if (!race_next(go, &s->quit))
		return 0;
	if (s->mode != *mode) {
		*mode = s->mode;
		setup(s, *mode);
	}
	return 1;
}

/* The toucher runs on CPU A, not real-time, in either mode. */
static void fr_toucher_mode(struct fr_shared *s, int mode)
{
	(void)mode;
	set_fifo(0);
	pin_cpu(s->cpu_a);
}

static void fr_revoker_mode(struct fr_shared *s, int mode)
{
	revoker_mode(mode, s->cpu_a, s->cpu_b);
}

static void *fr_toucher(void *p)
{
	struct fr_shared *s = p;
	int mode = -1;

	while (fr_next(s, &s->go_t, &mode, fr_toucher_mode)) {
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

	while (fr_next(s, &s->go_r, &mode, fr_revoker_mode)) {
		revoker_start(mode, s->delay_ns, &s->start, s->spins);
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
			race_round(&s.go_t, &s.go_r, &s.start, &s.done);
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
	race_stop(&s.quit, &s.go_t, tt, &s.go_r, tr);
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

TEST_HARNESS_MAIN

// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf races: concurrent REVOKE callers (M1). The fixture and the racing sides are in
 * races_fixture.h, which says how the windows are hit.
 */
#include "races_fixture.h"

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
	s = m1_shared_new(self, M1_THREADS);
	ASSERT_NE(NULL, s);
	for (int i = 0; i < M1_THREADS; i++) {
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

			m1_arm(_metadata, s, len, iters[mode]);
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

TEST_HARNESS_MAIN

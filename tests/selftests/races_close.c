// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf races against the last close: memory goes back to the provider as soon as the
 * last user of a buffer is gone, and revoke races the final fput (H1). The fixture and the
 * racing sides are in races_fixture.h, which says how the windows are hit.
 */
#include "races_fixture.h"

/*
 * Memory goes back to the provider as soon as the last user of a buffer is gone: after the
 * last close() the p2pdma pool (the kernel's count, /sys/bus/pci/devices/X/p2pmem/available)
 * is what it was before the allocation, with no ALLOC, PROVIDER_INFO or unbind in between
 * (those prune released buffers and would hide a buffer that is only freed then).
 */
/*
 * A buffer of len bytes for a test of the pool's count: its fd, with the pool's available
 * bytes before it in *before; -1, the test skipped, where the pool has no count.
 */
static int pool_buffer(struct __test_metadata *_metadata, const char *pci, int p2p, size_t len,
		       long long *before)
{
	int fd;

	*before = pool_avail(pci);
	if (*before < 0)
		SKIP(return -1, "no p2pmem/available for %s", pci);
	fd = p2pbuf_alloc_fd(p2p, len);
	ASSERT_GE(fd, 0);
	return fd;
}

TEST_F(races, memory_returns_on_last_close)
{
	const size_t len = 1UL << 20;
	long long a0, a1, a2, a3, f;
	int fd;

	fd = pool_buffer(_metadata, self->pci, self->p2p, len, &a0);
	if (fd < 0)
		return;
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

	fd = pool_buffer(_metadata, self->pci, self->p2p, len, &a0);
	if (fd < 0)
		return;
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

	while (race_next(&s->go_c, &s->quit)) {
		revoker_start(MODE_FREE, 0, &s->start, s->spin_c);
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

	while (race_next(&s->go_r, &s->quit)) {
		revoker_start(MODE_FREE, 0, &s->start, s->spin_r);
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
		race_round(&s.go_c, &s.go_r, &s.start, &s.done);
		iters++;
		switch (-s.ret) {
		case 0: ok++; break;
		case EBADF: ebadf++; break;
		case EINVAL: einval++; break;
		default: bad++; last_bad = -s.ret;
		}
	}
	race_stop(&s.quit, &s.go_c, tc, &s.go_r, tr);
	ksft_print_msg("H1 last close vs REVOKE (threads): %lu iterations in %.1f s: REVOKE returned "
		       "0 %lu, EBADF %lu, EINVAL %lu, other %lu (last %s)\n", iters, now() - t0, ok,
		       ebadf, einval, bad, bad ? strerror(last_bad) : "-");
	EXPECT_EQ(0UL, bad);
	EXPECT_LT(0UL, iters);
}

TEST_HARNESS_MAIN

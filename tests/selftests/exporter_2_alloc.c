// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf exporter, 2 of 4: ALLOC (sizes, the whole BAR, a caught signal). Wrappers and
 * fixture: exporter.h.
 */
#include "exporter.h"

TEST_F(p2pbuf, alloc_sizes_are_dma_bufs)
{
	__u64 sizes[] = { PAGE, 2 * PAGE, 1UL << 20, 2UL << 20, 64UL << 20 };
	char v[64];
	size_t i;

	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		int fd = p2p_alloc(self->dev, sizes[i], 0, NULL);

		ASSERT_GE(fd, 0) TH_LOG("alloc %llu: %s", (unsigned long long)sizes[i], strerror(-fd));
		ASSERT_EQ(0, fdinfo(fd, "exp_name", v, sizeof(v)));
		EXPECT_STREQ("p2pbuf", v);
		ASSERT_EQ(0, fdinfo(fd, "size", v, sizeof(v)));
		EXPECT_EQ(sizes[i], strtoull(v, NULL, 0));
		EXPECT_EQ(FD_CLOEXEC, fcntl(fd, F_GETFD) & FD_CLOEXEC);
		EXPECT_EQ((off_t)sizes[i], lseek(fd, 0, SEEK_END));
		close(fd);
	}
}

TEST_F(p2pbuf, whole_bar_exhaustion_and_return)
{
	struct p2pbuf_provider_info p;
	int fd, fd2;

	fd = p2p_alloc(self->dev, self->prov.total, 0, NULL);
	ASSERT_GE(fd, 0) TH_LOG("whole provider: %s", strerror(-fd));
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(0ULL, p.free);
	fd2 = p2p_alloc(self->dev, PAGE, 0, NULL);
	EXPECT_EQ(-ENOMEM, fd2);
	if (fd2 >= 0)
		close(fd2);
	close(fd);
	/* The memory comes back once the last reference is gone. */
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(self->prov.total, p.free);
	fd = p2p_alloc(self->dev, self->prov.total, 0, NULL);
	EXPECT_GE(fd, 0);
	close(fd);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

/*
 * One zeroed ALLOC of the whole BAR with SIGALRM caught from 20 ms in (every 10 ms when
 * periodic); flags: the handler's sa_flags. Returns the ALLOC's fd or -errno; *caught: how
 * many alarms the handler saw during the ALLOC. The timer is stopped before the handler goes.
 */
static int alloc_with_alarm(struct __test_metadata *_metadata, FIXTURE_DATA(p2pbuf) *self,
			    int flags, int periodic, int *caught)
{
	struct sigaction sa = { .sa_handler = on_alarm, .sa_flags = flags }, old;
	struct itimerval it = { .it_value = { .tv_usec = 20 * 1000 } }, off = { 0 };
	const __u64 len = self->prov.total;
	double t0;
	int fd;

	if (periodic)
		it.it_interval.tv_usec = 10 * 1000;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGALRM, &sa, &old))
		return -errno;
	alarms = 0;
	if (setitimer(ITIMER_REAL, &it, NULL))
		return -errno;
	t0 = now();
	fd = p2p_alloc(self->dev, len, 0, NULL);
	*caught = alarms;
	setitimer(ITIMER_REAL, &off, NULL);
	TH_LOG("zeroed ALLOC of %llu MiB, SIGALRM from 20 ms%s%s: %s after %.3f s, %d alarm(s)",
	       (unsigned long long)len >> 20, periodic ? " every 10 ms" : "",
	       flags & SA_RESTART ? " (SA_RESTART)" : "", fd >= 0 ? "succeeded" : strerror(-fd),
	       now() - t0, *caught);
	sigaction(SIGALRM, &old, NULL);
	return fd;
}

/*
 * A zeroed ALLOC clears 2 MiB at a time and stops for a signal: a caught one ends it with EINTR
 * and nothing allocated, or restarts it for an SA_RESTART handler (the header says both). SKIP
 * if the whole BAR clears in less than 20 ms (no signal can arrive during it).
 */
TEST_F(p2pbuf, alloc_interrupted_by_a_caught_signal)
{
	struct p2pbuf_provider_info p;
	int fd, caught = 0;

	fd = alloc_with_alarm(_metadata, self, 0, 1, &caught);
	if (fd >= 0 && !caught) {
		close(fd);
		SKIP(return, "the clearing took less than 20 ms: no signal arrived during it");
	}
	EXPECT_EQ(-EINTR, fd);
	if (fd >= 0)
		close(fd);
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(self->prov.total, p.free) TH_LOG("the interrupted ALLOC left memory allocated");

	fd = alloc_with_alarm(_metadata, self, SA_RESTART, 0, &caught);
	EXPECT_GE(fd, 0) TH_LOG("restarted ALLOC: %s", strerror(-fd));
	if (fd >= 0)
		close(fd);
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(self->prov.total, p.free);
}

TEST_HARNESS_MAIN

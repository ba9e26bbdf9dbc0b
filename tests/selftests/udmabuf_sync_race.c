// SPDX-License-Identifier: GPL-2.0
/*
 * udmabuf's table for CPU access is made by the first DMA_BUF_IOCTL_SYNC (begin_cpu_access) of
 * a buffer (review finding N2, issue 27). Two first users at once each made one before series
 * 1's "udmabuf: Serialise the creation of the table for CPU access", and one table leaked with
 * its DMA mapping; with a failed creation the other user synced an ERR_PTR.
 *
 * - first_syncs_race: ROUNDS fresh buffers, each hit by THREADS threads that start their first
 *   SYNC together (a barrier). Every SYNC must succeed; a leaked table is what the suite's final
 *   kmemleak scan reports (and DMA-API debugging, at the end of the run).
 * - first_syncs_race_failslab: the same with failslab failing 1 in 20 slab allocations of the
 *   racing threads (task-filter): a SYNC may fail with ENOMEM, but never oops, and a later SYNC
 *   on the buffer works.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <linux/dma-buf.h>
#include <linux/udmabuf.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

#define ROUNDS 100
#define THREADS 4
#define SIZE (64 * 4096)
#define FAILSLAB "/sys/kernel/debug/failslab/"

struct race {
	pthread_barrier_t go;
	int fd;
	int fail;		/* whether the thread asks failslab to fail it */
	int err[THREADS];
};

static void *first_sync(void *arg)
{
	struct race *r = arg;
	struct dma_buf_sync s = { .flags = DMA_BUF_SYNC_START | DMA_BUF_SYNC_RW };
	int me, fd;
	static int next;

	me = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) % THREADS;
	if (r->fail) {
		fd = open("/proc/thread-self/make-it-fail", O_WRONLY);
		if (fd >= 0) {
			if (write(fd, "1", 1) != 1)
				r->err[me] = -EIO;
			close(fd);
		}
	}
	pthread_barrier_wait(&r->go);
	r->err[me] = ioctl(r->fd, DMA_BUF_IOCTL_SYNC, &s) ? errno : 0;
	if (!r->err[me]) {
		s.flags = DMA_BUF_SYNC_END | DMA_BUF_SYNC_RW;
		if (ioctl(r->fd, DMA_BUF_IOCTL_SYNC, &s))
			r->err[me] = errno;
	}
	return NULL;
}

/* ROUNDS fresh buffers, THREADS first SYNCs each; the number of SYNCs that failed, or -1. */
static int race_rounds(struct __test_metadata *_metadata, int fail)
{
	int round, i, failed = 0;

	for (round = 0; round < ROUNDS; round++) {
		struct dma_buf_sync s = { .flags = DMA_BUF_SYNC_START | DMA_BUF_SYNC_READ };
		pthread_t t[THREADS];
		struct p2pbuf_buf b;
		struct race r = { .fail = fail };

		if (p2pbuf_udmabuf_alloc(&b, SIZE))
			return -1;
		r.fd = b.fd;
		pthread_barrier_init(&r.go, NULL, THREADS);
		for (i = 0; i < THREADS; i++)
			pthread_create(&t[i], NULL, first_sync, &r);
		for (i = 0; i < THREADS; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&r.go);
		for (i = 0; i < THREADS; i++) {
			if (!r.err[i])
				continue;
			failed++;
			EXPECT_EQ(ENOMEM, r.err[i])
				TH_LOG("round %d thread %d: SYNC failed with %s", round, i,
				       strerror(r.err[i]));
		}
		/* Without injection the buffer works, whatever the race left. */
		EXPECT_EQ(0, ioctl(b.fd, DMA_BUF_IOCTL_SYNC, &s))
			TH_LOG("round %d: a later SYNC failed: %s", round, strerror(errno));
		s.flags = DMA_BUF_SYNC_END | DMA_BUF_SYNC_READ;
		EXPECT_EQ(0, ioctl(b.fd, DMA_BUF_IOCTL_SYNC, &s));
		p2pbuf_buf_free(&b);
	}
	return failed;
}

TEST(first_syncs_race)
{
	int failed = race_rounds(_metadata, 0);

	ASSERT_GE(failed, 0) TH_LOG("udmabuf: %s", strerror(errno));
	EXPECT_EQ(0, failed);
	TH_LOG("%d buffers, %d first SYNCs each at once: all succeeded", ROUNDS, THREADS);
}

static int write_str(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY), ok;

	if (fd < 0)
		return -1;
	ok = write(fd, val, strlen(val)) == (ssize_t)strlen(val);
	close(fd);
	return ok ? 0 : -1;
}

TEST(first_syncs_race_failslab)
{
	int failed;

	if (access(FAILSLAB "probability", W_OK) || access("/proc/self/make-it-fail", W_OK))
		SKIP(return, "no failslab (CONFIG_FAILSLAB, CONFIG_FAULT_INJECTION_DEBUG_FS)");
	ASSERT_EQ(0, write_str(FAILSLAB "task-filter", "Y"));
	ASSERT_EQ(0, write_str(FAILSLAB "ignore-gfp-wait", "N"));
	/* Each forced failure is said on the console, where the run counts them (and forgives
	 * dma-debug for switching itself off after one: this test runs last on its boot). */
	ASSERT_EQ(0, write_str(FAILSLAB "verbose", "1"));
	ASSERT_EQ(0, write_str(FAILSLAB "times", "-1"));
	ASSERT_EQ(0, write_str(FAILSLAB "interval", "1"));
	ASSERT_EQ(0, write_str(FAILSLAB "probability", "5"));
	failed = race_rounds(_metadata, 1);
	/* Probability 0 again: nothing else fails. */
	EXPECT_EQ(0, write_str(FAILSLAB "probability", "0"));
	ASSERT_GE(failed, 0) TH_LOG("udmabuf: %s", strerror(errno));
	TH_LOG("%d buffers, %d first SYNCs each at once, 5%% of their slab allocations failing: %d SYNCs failed with ENOMEM, every buffer worked afterwards",
	       ROUNDS, THREADS, failed);
}

TEST_HARNESS_MAIN

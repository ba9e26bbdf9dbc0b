/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * What the peermem check programs (cuda-peermem-check: cuda_peermem_check*.c; verbs_rdma_write.c)
 * share: the monotonic clock in microseconds and the count of this process's open fds. The
 * fault-injection selftest (tests/selftests/fail_nth.h) counts its fds with it too.
 */
#ifndef P2PBUF_PEERMEM_CHECK_UTIL_H
#define P2PBUF_PEERMEM_CHECK_UTIL_H

#include <dirent.h>
#include <time.h>

/* Microseconds on the monotonic clock. */
static inline double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Open fds of this process (a leak check), or -1. */
static inline int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own fd */
}

#endif

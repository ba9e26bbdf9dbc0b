/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers the p2pbuf selftests and benchmarks share: which provider to allocate from, the
 * monotonic clock, numbers from the kernel command line, and sysfs writes.
 */
#ifndef P2PBUF_TEST_H
#define P2PBUF_TEST_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include "uapi/linux/p2pbuf.h"

/*
 * The id of the bound provider with the smallest id, or 0 (no id) when none is bound.
 * Provider ids are stable (they start at 1 and a rebound device gets a new one), so tests
 * that run after an unbind/bind must look the id up rather than assume one.
 */
static inline __u32 p2pbuf_first_provider(int dev)
{
	struct p2pbuf_provider_info p = {
		.size = sizeof(p), .id = 1, .flags = P2PBUF_PROVIDER_INFO_NEXT,
	};

	return ioctl(dev, P2PBUF_IOCTL_PROVIDER_INFO, &p) ? 0 : p.id;
}

/*
 * PROVIDER_INFO of the bound provider with the smallest id into *p (its id in p->id);
 * ioctl()'s return value (-1 and errno ENOENT when none is bound).
 */
static inline int p2pbuf_first_provider_info(int dev, struct p2pbuf_provider_info *p)
{
	__builtin_memset(p, 0, sizeof(*p));
	p->size = sizeof(*p);
	p->id = 1;
	p->flags = P2PBUF_PROVIDER_INFO_NEXT;
	return ioctl(dev, P2PBUF_IOCTL_PROVIDER_INFO, p);
}

/* ALLOC, from the first bound provider when a->provider is 0; ioctl()'s return value. */
static inline int p2pbuf_test_alloc(int dev, struct p2pbuf_alloc *a)
{
	if (!a->provider)
		a->provider = p2pbuf_first_provider(dev);
	return ioctl(dev, P2PBUF_IOCTL_ALLOC, a);
}

/* Seconds on the monotonic clock. */
static inline double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A number from the kernel command line (p2pbuf.<key>=N), or def. */
static inline unsigned long cmdline_ul(const char *key, unsigned long def)
{
	char line[4096], pat[64], *p;
	FILE *f = fopen("/proc/cmdline", "r");
	unsigned long v = def;

	if (!f)
		return def;
	snprintf(pat, sizeof(pat), "p2pbuf.%s=", key);
	if (fgets(line, sizeof(line), f) && (p = strstr(line, pat)))
		v = strtoul(p + strlen(pat), NULL, 0);
	fclose(f);
	return v;
}

/* Write val to the sysfs file path: 0, or -errno. */
static inline int sysfs_write(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = write(fd, val, strlen(val));
	n = n < 0 ? -errno : 0;
	close(fd);
	return (int)n;
}

/* The PCI name (0000:...) of the first device bound to driver (its sysfs directory,
 * /sys/bus/pci/drivers/NAME) into name; 0, or -1 for none. */
static inline int p2pbuf_bound_device(const char *driver, char *name, size_t len)
{
	DIR *d = opendir(driver);
	struct dirent *e;
	int ret = -1;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, "0000:", 5)) {
			size_t n = strlen(e->d_name);

			if (n >= len)
				n = len - 1;
			memcpy(name, e->d_name, n);
			name[n] = 0;
			ret = 0;
			break;
		}
	closedir(d);
	return ret;
}

/* Start and end (exclusive) of BAR bar of the PCI device at sysfs path dev (its
 * "resource" file); 0 or -errno (both 0 then). */
static inline int p2pbuf_bar_range(const char *dev, int bar, unsigned long long *lo,
				   unsigned long long *hi)
{
	char path[4096 + 16], line[256];
	unsigned long long s, e, fl;
	FILE *f;
	int i;

	*lo = *hi = 0;
	snprintf(path, sizeof(path), "%s/resource", dev);
	f = fopen(path, "r");
	if (!f)
		return -errno;
	for (i = 0; i <= bar; i++)
		if (!fgets(line, sizeof(line), f)) {
			fclose(f);
			return -EIO;
		}
	fclose(f);
	if (sscanf(line, "%llx %llx %llx", &s, &e, &fl) != 3 || !s)
		return -EIO;
	*lo = s;
	*hi = e + 1;
	return 0;
}

#endif

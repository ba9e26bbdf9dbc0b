/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers the p2pbuf selftests and benchmarks share: which provider to allocate from, device
 * memory and udmabuf buffers with a CPU mapping, the lab pattern (p2pbuf_pattern.h), the
 * monotonic clock, numbers from the kernel command line, sysfs writes and PCI look-ups.
 */
#ifndef P2PBUF_TEST_H
#define P2PBUF_TEST_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/dma-buf.h>
#include <linux/udmabuf.h>
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_pattern.h"
#include "uapi/linux/p2pbuf-dma.h"

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

/* In a kselftest: expect the ioctl-style call expr to fail (-1) with errno err. */
#define EXPECT_ERRNO(err, expr)				\
	do {						\
		EXPECT_EQ(-1, (expr));			\
		EXPECT_EQ(err, errno);			\
	} while (0)

/* Device memory of the first bound provider as a dma-buf fd, or -errno. */
static inline int p2pbuf_alloc_fd(int dev, __u64 len)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = len };

	if (p2pbuf_test_alloc(dev, &a))
		return -errno;
	return a.fd;
}

/* A dma-buf with a CPU mapping: device memory (p2pbuf_devbuf_alloc) or system memory
 * (p2pbuf_udmabuf_alloc). */
struct p2pbuf_buf {
	int fd;			/* the dma-buf */
	int memfd;		/* system memory: its memfd; device memory: -1 */
	uint8_t *map;
	size_t size;
	__u64 bar_offset;	/* device memory: where it starts in the BAR */
	int handle;		/* the engine tests: its handle on /dev/p2pbuf-dma */
	const char *what;	/* "device" or "system" */
};

/* Unmaps and closes what b holds; b is then empty (fds -1). */
static inline void p2pbuf_buf_free(struct p2pbuf_buf *b)
{
	if (b->map && b->map != MAP_FAILED)
		munmap(b->map, b->size);
	if (b->fd >= 0)
		close(b->fd);
	if (b->memfd >= 0)
		close(b->memfd);
	memset(b, 0, sizeof(*b));
	b->fd = b->memfd = -1;
}

/* System memory: a sealed memfd turned into a dma-buf by /dev/udmabuf, mapped through the
 * memfd. 0, or -errno with b empty. */
static inline int p2pbuf_udmabuf_alloc(struct p2pbuf_buf *b, size_t size)
{
	struct udmabuf_create c = { .flags = UDMABUF_FLAGS_CLOEXEC, .size = size };
	int dev, err;

	memset(b, 0, sizeof(*b));
	b->fd = -1;
	b->size = size;
	b->what = "system";
	b->memfd = memfd_create("p2pbuf-test", MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (b->memfd < 0)
		return -errno;
	if (ftruncate(b->memfd, size) || fcntl(b->memfd, F_ADD_SEALS, F_SEAL_SHRINK))
		goto fail;
	b->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, b->memfd, 0);
	if (b->map == MAP_FAILED)
		goto fail;
	dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		goto fail;
	c.memfd = b->memfd;
	b->fd = ioctl(dev, UDMABUF_CREATE, &c);
	err = errno;
	close(dev);
	if (b->fd < 0) {
		errno = err;
		goto fail;
	}
	return 0;
fail:
	err = -errno;
	p2pbuf_buf_free(b);
	return err;
}

/* Device memory from the first bound provider, mapped. 0, or -errno with b empty. */
static inline int p2pbuf_devbuf_alloc(int p2p, struct p2pbuf_buf *b, size_t size)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = size };
	int err;

	memset(b, 0, sizeof(*b));
	b->fd = b->memfd = -1;
	b->size = size;
	b->what = "device";
	if (p2pbuf_test_alloc(p2p, &a))
		return -errno;
	b->fd = a.fd;
	b->bar_offset = a.offset;
	b->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
	if (b->map == MAP_FAILED) {
		err = -errno;
		p2pbuf_buf_free(b);
		return err;
	}
	return 0;
}

/*
 * Two buffers of device memory of size bytes each, mapped (b[0], b[1]), placed after the first
 * `at` bytes of the provider's free memory: a spacer of that size is allocated first and freed
 * after them. 0, or -errno with both empty.
 */
static inline int p2pbuf_devbuf_pair_at(int p2p, __u64 at, size_t size, struct p2pbuf_buf b[2])
{
	int spacer = p2pbuf_alloc_fd(p2p, at), err;

	b[0].fd = b[0].memfd = b[1].fd = b[1].memfd = -1;
	b[0].map = b[1].map = NULL;
	if (spacer < 0)
		return spacer;
	err = p2pbuf_devbuf_alloc(p2p, &b[0], size);
	if (!err)
		err = p2pbuf_devbuf_alloc(p2p, &b[1], size);
	close(spacer);
	if (err) {
		p2pbuf_buf_free(&b[0]);
		p2pbuf_buf_free(&b[1]);
	}
	return err;
}

/* DMA_BUF_IOCTL_SYNC start (start != 0) or end of read/write CPU access to b. */
static inline void p2pbuf_cpu_access(struct p2pbuf_buf *b, int start)
{
	struct dma_buf_sync s = {
		.flags = (start ? DMA_BUF_SYNC_START : DMA_BUF_SYNC_END) | DMA_BUF_SYNC_RW,
	};

	ioctl(b->fd, DMA_BUF_IOCTL_SYNC, &s);
}

/* Closes *fd if it is open, and marks it closed (-1). */
/*
 * Puts fd into msg as its SCM_RIGHTS control message, in the control buffer msg already has
 * (CMSG_SPACE(sizeof(int)) bytes at least).
 */
static inline void p2pbuf_cmsg_fd(struct msghdr *msg, int fd)
{
	struct cmsghdr *cm = CMSG_FIRSTHDR(msg);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
}

static inline void p2pbuf_close(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* Seconds on the monotonic clock. */
static inline double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Reads len bytes from fd within secs (less on a timeout, EOF or error): the number read. */
static inline ssize_t read_within(int fd, void *buf, size_t len, double secs)
{
	double end = now() + secs;
	size_t got = 0;

	while (got < len) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int left = (int)((end - now()) * 1000);
		ssize_t n;

		if (left <= 0 || poll(&p, 1, left) <= 0)
			break;
		n = read(fd, (char *)buf + got, len - got);
		if (n <= 0)
			break;
		got += n;
	}
	return got;
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

/*
 * insmod /lib/modules/p2pbuf/NAME.ko PARAMS unless module NAME is loaded: 1 if this loaded it
 * (the caller unloads it when done), 0 if it was loaded already or has no .ko, or insmod failed.
 */
static inline int p2pbuf_load_module_params(const char *name, const char *params)
{
	char path[256], cmd[512];

	snprintf(path, sizeof(path), "/sys/module/%s", name);
	if (access(path, F_OK) == 0)
		return 0;
	snprintf(path, sizeof(path), "/lib/modules/p2pbuf/%s.ko", name);
	if (access(path, F_OK))
		return 0;
	snprintf(cmd, sizeof(cmd), "insmod %s %s", path, params);
	return system(cmd) == 0;
}

/* p2pbuf_load_module_params() without parameters. */
static inline int p2pbuf_load_module(const char *name)
{
	return p2pbuf_load_module_params(name, "");
}

/* rmmod NAME if p2pbuf_load_module() loaded it (loaded != 0); complains if that fails. */
static inline void p2pbuf_unload_module(const char *name, int loaded)
{
	char cmd[256];

	if (!loaded)
		return;
	snprintf(cmd, sizeof(cmd), "rmmod %s", name);
	if (system(cmd))
		fprintf(stderr, "# rmmod %s failed\n", name);
}

#ifdef P2PBUF_DMA_IOCTL_COPY
/*
 * The DMA engine (/dev/p2pbuf-dma, fd dma): its handle on dma-buf fd, or -errno; the whole
 * answer (map type, ranges) in *out if out is not NULL.
 */
static inline int dma_import_out(int dma, int fd, struct p2pbuf_dma_import *out)
{
	struct p2pbuf_dma_import a = { .size = sizeof(a), .fd = fd };

	if (ioctl(dma, P2PBUF_DMA_IOCTL_IMPORT, &a))
		return -errno;
	if (out)
		*out = a;
	return (int)a.handle;
}

static inline int dma_import(int dma, int fd)
{
	return dma_import_out(dma, fd, NULL);
}

/* Releases the engine's handle: 0 or -errno. */
static inline int dma_release(int dma, __u32 handle)
{
	struct p2pbuf_dma_release r = { .size = sizeof(r), .handle = handle };

	return ioctl(dma, P2PBUF_DMA_IOCTL_RELEASE, &r) ? -errno : 0;
}

/* Engine copy as *a says (size set here; the kernel updates *a): bytes copied or -errno. */
static inline long dma_copy_args(int dma, struct p2pbuf_dma_copy *a)
{
	int r;

	a->size = sizeof(*a);
	r = ioctl(dma, P2PBUF_DMA_IOCTL_COPY, a);
	return r < 0 ? -errno : r;
}

/* Engine copy of len bytes from handle src at soff to handle dst at doff. */
static inline long dma_copy_at(int dma, __u32 src, __u64 soff, __u32 dst, __u64 doff,
					 __u64 len)
{
	struct p2pbuf_dma_copy c = {
		.src_handle = src, .src_offset = soff,
		.dst_handle = dst, .dst_offset = doff, .len = len,
	};

	return dma_copy_args(dma, &c);
}

/* Engine copy of len bytes from handle src to handle dst (offsets 0): bytes copied or -errno. */
static inline long dma_copy(int dma, __u32 src, __u32 dst, __u64 len)
{
	return dma_copy_at(dma, src, 0, dst, 0, len);
}
#endif

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

/* The first line of the file at path into buf (empty if it has none); 0, or -1 when it
 * cannot be opened. */
static inline int p2pbuf_read_line(const char *path, char *buf, int len)
{
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	if (!fgets(buf, len, f))
		buf[0] = 0;
	fclose(f);
	return 0;
}

/* The PCI name of the first function vendor:device (e.g. "0x1af4", "0x1110") into name;
 * 0, or -1 for none. */
static inline int p2pbuf_pci_find(const char *vendor, const char *device, char *name, size_t len)
{
	DIR *d = opendir("/sys/bus/pci/devices");
	struct dirent *e;
	char path[512], v[16], dv[16];
	int ret = -1;

	if (!d)
		return -1;
	while (ret && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/vendor", e->d_name);
		if (p2pbuf_read_line(path, v, sizeof(v)))
			continue;
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/device", e->d_name);
		if (p2pbuf_read_line(path, dv, sizeof(dv)))
			continue;
		if (!strncmp(v, vendor, strlen(vendor)) && !strncmp(dv, device, strlen(device))) {
			size_t n = strnlen(e->d_name, len - 1);

			memcpy(name, e->d_name, n);
			name[n] = 0;
			ret = 0;
		}
	}
	closedir(d);
	return ret;
}

#endif

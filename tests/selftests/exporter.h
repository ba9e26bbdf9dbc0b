/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The exporter's tests (exporter_1_uapi.c, exporter_2_alloc.c, exporter_3_mmap.c,
 * exporter_4_unbind.c: one program each, numbered in the order they run): their ioctl
 * wrappers and fixture, as iommufd's selftests keep theirs in iommufd_utils.h.
 *
 * p2pbuf exporter: /dev/p2pbuf ioctls, dma-buf fds of device memory, mmap, fd passing, revoke.
 *
 * Needs the p2pbuf_exporter module bound to the lab's emulated GPU memory (ivshmem BAR2).
 * The host-side half of the mmap test: the test prints "# hostcheck target=gpu offset=X len=N seed=S"
 * and `cargo xtask test` checks those bytes in the ivshmem backing file.
 */
#ifndef P2PBUF_EXPORTER_H
#define P2PBUF_EXPORTER_H

#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/capability.h>
#include <linux/dma-buf.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

/* A wrapper that some of the programs do not use. */
#define EXPORTER_HELPER static __attribute__((unused))

#define PAGE 4096UL

EXPORTER_HELPER int p2p_info(int dev, struct p2pbuf_info *info)
{
	memset(info, 0, sizeof(*info));
	info->size = sizeof(*info);
	return ioctl(dev, P2PBUF_IOCTL_INFO, info);
}

EXPORTER_HELPER int p2p_provider(int dev, __u32 id, struct p2pbuf_provider_info *p)
{
	memset(p, 0, sizeof(*p));
	p->size = sizeof(*p);
	p->id = id;
	return ioctl(dev, P2PBUF_IOCTL_PROVIDER_INFO, p);
}

/* The provider the tests allocate from (set up by the fixture). */
static __u32 prov_id;

/* Returns the dma-buf fd, or -errno. */
EXPORTER_HELPER int p2p_alloc(int dev, __u64 length, __u32 flags, __u64 *offset)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .flags = flags, .length = length,
				  .provider = prov_id };

	if (ioctl(dev, P2PBUF_IOCTL_ALLOC, &a))
		return -errno;
	if (offset)
		*offset = a.offset;
	return a.fd;
}

EXPORTER_HELPER int p2p_revoke(int dev, int fd)
{
	struct p2pbuf_revoke r = { .size = sizeof(r), .fd = fd };

	return ioctl(dev, P2PBUF_IOCTL_REVOKE, &r) ? -errno : 0;
}

/* Reads "key:\t<value>" from /proc/self/fdinfo/<fd>. */
EXPORTER_HELPER int fdinfo(int fd, const char *key, char *out, size_t len)
{
	char path[64], line[256];
	size_t klen = strlen(key);
	FILE *f;
	int ret = -1;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, key, klen) && line[klen] == ':') {
			char *v = line + klen + 1;

			while (*v == ' ' || *v == '\t')
				v++;
			v[strcspn(v, "\n")] = 0;
			snprintf(out, len, "%s", v);
			ret = 0;
			break;
		}
	}
	fclose(f);
	return ret;
}

EXPORTER_HELPER void sync_buf(int fd, __u64 flags)
{
	struct dma_buf_sync s = { .flags = flags };

	ioctl(fd, DMA_BUF_IOCTL_SYNC, &s);
}

static sigjmp_buf bus_jmp;

EXPORTER_HELPER void on_sigbus(int sig)
{
	(void)sig;
	siglongjmp(bus_jmp, 1);
}

/* Returns 1 if reading *p raises SIGBUS. */
EXPORTER_HELPER int read_faults(volatile uint8_t *p)
{
	struct sigaction sa = { .sa_handler = on_sigbus }, old;
	int faulted = 0;

	sigaction(SIGBUS, &sa, &old);
	if (sigsetjmp(bus_jmp, 1) == 0)
		(void)*p;
	else
		faulted = 1;
	sigaction(SIGBUS, &old, NULL);
	return faulted;
}

FIXTURE(p2pbuf)
{
	int dev;
	struct p2pbuf_provider_info prov;
};

FIXTURE_SETUP(p2pbuf)
{
	self->dev = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->dev, 0) TH_LOG("/dev/p2pbuf: %s (is p2pbuf_exporter loaded and bound?)",
				       strerror(errno));
	prov_id = p2pbuf_first_provider(self->dev);
	ASSERT_NE(0U, prov_id) TH_LOG("no provider bound");
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &self->prov))
		TH_LOG("provider %u: %s", prov_id, strerror(errno));
}

FIXTURE_TEARDOWN(p2pbuf)
{
	close(self->dev);
}

#endif /* P2PBUF_EXPORTER_H */

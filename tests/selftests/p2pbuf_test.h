/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers the p2pbuf selftests and benchmarks share: which provider to allocate from.
 */
#ifndef P2PBUF_TEST_H
#define P2PBUF_TEST_H

#include <sys/ioctl.h>
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

#endif

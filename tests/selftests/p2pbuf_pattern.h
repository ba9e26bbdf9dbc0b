/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The lab's byte pattern, the one C definition: byte i of what a test writes (counted from the
 * transfer's first byte) for a seed. The Rust definition is userspace/p2pbuf/src/pattern.rs
 * (`p2pbuf::pattern::byte`); its test `c_header_agrees` compiles this header and compares the
 * two. Kept apart from p2pbuf_test.h (which includes it) so that programs built without the
 * p2pbuf uAPI headers (userspace/p2pbuf-peermem/c/verbs_rdma_write.c) include it too.
 */
#ifndef P2PBUF_PATTERN_H
#define P2PBUF_PATTERN_H

#include <stddef.h>
#include <stdint.h>

static inline uint8_t p2pbuf_pattern(size_t i, unsigned int seed)
{
	return (uint8_t)(i * 13 + seed + (i >> 12));
}

#endif /* P2PBUF_PATTERN_H */

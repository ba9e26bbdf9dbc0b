/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The stand-in verbs provider (standin_provider.c): a verbs context made the way a provider's
 * alloc_context makes one, whose reg_mr and reg_dmabuf_mr record what reaches them. Used by
 * cuda-peermem-check (linked in) and, as libstandin-provider.so, by
 * userspace/scripts/peermem-torch-check.py (ctypes: keep its Record in step with the struct).
 * Built against the infiniband/driver.h of the rdma-core whose libibverbs it runs with: the
 * provider interface is rdma-core's private ABI (IBVERBS_PRIVATE_<version>).
 */
#ifndef P2PBUF_STANDIN_PROVIDER_H
#define P2PBUF_STANDIN_PROVIDER_H

#include <stdint.h>

struct ibv_context;

/* What the registrations since standin_reset() reached; all 64-bit fields but the name. */
struct standin_record {
	uint64_t reg_mr_calls, dmabuf_calls; /* since standin_reset() */
	uint64_t addr;                       /* reg_mr: the address */
	uint64_t offset;                     /* reg_dmabuf_mr: the offset in the dma-buf */
	uint64_t iova, length;
	int64_t fd;           /* reg_dmabuf_mr: the fd, -1 otherwise */
	uint64_t is_dmabuf;   /* the fd is on the dma-buf filesystem */
	uint64_t dmabuf_size; /* its size, from /proc/self/fdinfo */
	char exp_name[64];    /* its exporter */
	uint64_t access;      /* the access flags that reached the provider */
};

/* A context of the stand-in device "standin0"; NULL with errno on failure. */
struct ibv_context *standin_open(void);
/* Releases a context of standin_open(). */
void standin_close(struct ibv_context *ctx);
/* The record, live (C clients), or a copy of it. */
const struct standin_record *standin_rec(void);
void standin_last(struct standin_record *out);
void standin_reset(void);
/* 0: reg_dmabuf_mr records and accepts (the default); else it records and fails with this
 * errno, as a provider without the device would (ENODEV). */
void standin_dmabuf_errno(int err);

#endif

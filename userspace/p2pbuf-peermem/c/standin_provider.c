// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The stand-in verbs provider: linked into cuda-peermem-check (cuda_peermem_check*.c), and
 * built as libstandin-provider.so for clients that are not C programs
 * (userspace/scripts/peermem-torch-check.py). The interface: standin_provider.h.
 *
 * There is no RDMA device on the GPU machine, so ibv_get_device_list() finds none; this library
 * makes a verbs context the way a provider's alloc_context does (verbs_init_and_alloc_context,
 * verbs_set_ops), whose reg_mr and reg_dmabuf_mr record what reaches them and return a memory
 * region. The client then calls the real libibverbs entry points on it (ibv_alloc_pd,
 * ibv_reg_mr, ibv_dereg_mr), with libp2pbuf_peermem.so preloaded or not.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>

#include <infiniband/driver.h>
#include <infiniband/verbs.h>

#include "standin_provider.h"

#define DMA_BUF_MAGIC 0x444d4142

static struct standin_record st;
static int dmabuf_errno; /* 0: accept */
static uint32_t next_key = 0x100;

void standin_reset(void)
{
	memset(&st, 0, sizeof(st));
	st.fd = -1;
}

void standin_last(struct standin_record *out)
{
	*out = st;
}

const struct standin_record *standin_rec(void)
{
	return &st;
}

void standin_dmabuf_errno(int err)
{
	dmabuf_errno = err;
}

static struct ibv_pd *s_alloc_pd(struct ibv_context *ctx)
{
	(void)ctx;
	return calloc(1, sizeof(struct ibv_pd));
}

static int s_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

static struct ibv_mr *new_mr(enum ibv_mr_type type, int access)
{
	struct verbs_mr *vmr = calloc(1, sizeof(*vmr));

	if (!vmr) {
		errno = ENOMEM;
		return NULL;
	}
	vmr->mr_type = type;
	vmr->access = access;
	vmr->ibv_mr.lkey = next_key;
	vmr->ibv_mr.rkey = next_key++;
	return &vmr->ibv_mr;
}

static struct ibv_mr *s_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va,
			       int access)
{
	(void)pd;
	st.reg_mr_calls++;
	st.addr = (uintptr_t)addr;
	st.length = length;
	st.iova = hca_va;
	st.access = access;
	return new_mr(IBV_MR_TYPE_MR, access);
}

static void note_dmabuf(int fd)
{
	struct statfs sf;
	char path[64], line[256];
	FILE *f;

	st.is_dmabuf = fstatfs(fd, &sf) == 0 && (unsigned long)sf.f_type == DMA_BUF_MAGIC;
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f)) {
		sscanf(line, "exp_name: %63s", st.exp_name);
		sscanf(line, "size: %" SCNu64, &st.dmabuf_size);
	}
	if (f)
		fclose(f);
}

static struct ibv_mr *s_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				      uint64_t iova, int fd, int access)
{
	(void)pd;
	st.dmabuf_calls++;
	st.offset = offset;
	st.length = length;
	st.iova = iova;
	st.fd = fd;
	st.access = access;
	note_dmabuf(fd);
	if (dmabuf_errno) {
		errno = dmabuf_errno;
		return NULL;
	}
	return new_mr(IBV_MR_TYPE_DMABUF_MR, access);
}

static int s_dereg_mr(struct verbs_mr *vmr)
{
	free(vmr);
	return 0;
}

static const struct verbs_context_ops standin_ops = {
	.alloc_pd = s_alloc_pd,
	.dealloc_pd = s_dealloc_pd,
	.reg_mr = s_reg_mr,
	.reg_dmabuf_mr = s_reg_dmabuf_mr,
	.dereg_mr = s_dereg_mr,
};

struct standin_context {
	struct verbs_context ibv_ctx;
};

struct ibv_context *standin_open(void)
{
	struct verbs_device *vdev = calloc(1, sizeof(*vdev));
	struct standin_context *sctx;

	if (!vdev) {
		errno = ENOMEM;
		return NULL;
	}
	atomic_init(&vdev->refcount, 1); /* never released to a provider's uninit */
	snprintf(vdev->device.name, sizeof(vdev->device.name), "standin0");
	sctx = verbs_init_and_alloc_context(&vdev->device, -1, sctx, ibv_ctx, 0);
	if (!sctx)
		return NULL;
	verbs_set_ops(&sctx->ibv_ctx, &standin_ops);
	standin_reset();
	return &sctx->ibv_ctx.context;
}

void standin_close(struct ibv_context *ctx)
{
	struct verbs_context *vctx = verbs_get_ctx(ctx);
	struct verbs_device *vdev = verbs_get_device(ctx->device);

	verbs_uninit_context(vctx);
	free(container_of(vctx, struct standin_context, ibv_ctx));
	free(vdev);
}

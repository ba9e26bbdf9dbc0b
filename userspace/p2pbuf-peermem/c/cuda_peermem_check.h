/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * What the files of cuda-peermem-check share (cuda_peermem_check.c has main and says what the
 * program does): TAP, the capture of the library's messages, the stand-in provider's record,
 * the CUDA driver entry points (loaded at run time), the pass-through check, and each group of
 * checks:
 *   cuda_peermem_check_common.c    TAP, capture, CUDA loading, the pass-through check
 *   cuda_peermem_check_host.c      host memory: --host-only, pinned and managed memory in a
 *                                  CUDA process, the cost of host registrations (--time-host)
 *   cuda_peermem_check_device.c    cuMemAlloc memory: sizes, another thread, a reused address,
 *                                  run-time access flags, a 100-byte allocation
 *   cuda_peermem_check_vmm.c       CUDA VMM and pool memory
 *   cuda_peermem_check_fastpath.c  what the host-memory fast path rests on
 * Everything declared here is hidden: with one program in several files the globals are not
 * static, and a name such as cuInit must stay out of the executable's dynamic symbols (where a
 * preloaded library's dlsym(RTLD_DEFAULT, ...) would find the checker's pointer).
 */
#ifndef P2PBUF_CUDA_PEERMEM_CHECK_H
#define P2PBUF_CUDA_PEERMEM_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>

#include <infiniband/verbs.h>
#include "standin_provider.h"

#pragma GCC visibility push(hidden)

/* struct procmap_query (include/uapi/linux/fs.h, Linux 6.11). */
struct pmq {
	uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size,
		vma_offset, inode;
	uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
	uint64_t vma_name_addr, build_id_addr;
};
#define PMQ_IOCTL _IOWR('f', 17, struct pmq)

/* ---- TAP (cuda_peermem_check_common.c) ---- */
extern int tests, failures;
bool check(bool cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- stderr capture: the library's messages ---- */
void capture_begin(void);
/* What was captured (its first 16 KiB), not shown. */
const char *capture_end_quiet(void);
/* The same, shown as TAP comments. */
const char *capture_end(void);

/* ---- the stand-in provider (standin_provider.c): what reached its reg_mr/reg_dmabuf_mr ---- */
extern const struct standin_record *st;

/* ---- CUDA, loaded at run time ---- */
typedef int CUresult;
typedef uint64_t CUdeviceptr; /* unsigned long long in cuda.h: the same 64 bits */
extern CUresult (*cuInit)(unsigned int);
extern CUresult (*cuDeviceGet)(int *, int);
extern CUresult (*cuDeviceGetName)(char *, int, int);
extern CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
extern CUresult (*cuCtxSetCurrent)(void *);
extern CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
extern CUresult (*cuMemFree)(CUdeviceptr);
extern CUresult (*cuMemAllocHost)(void **, size_t);
extern CUresult (*cuMemFreeHost)(void *);
extern CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
extern CUresult (*cuMemGetInfo)(size_t *, size_t *);
extern CUresult (*cuDriverGetVersion)(int *);
bool load_cuda(void);

/* In a loader returning bool, with the library's handle h: v = dlsym(h, n), or return false. */
#define CUDA_SYM(v, n)                          \
	do {                                    \
		*(void **)&(v) = dlsym(h, (n)); \
		if (!(v))                       \
			return false;           \
	} while (0)

#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
extern volatile int runtime_access;
/* false with --no-preload */
extern bool preload;

/* A registration of host-side memory reaches the provider's reg_mr untouched. */
void check_pass_through_iova(struct ibv_pd *pd, void *p, size_t len, uint64_t iova,
			     const char *what);
void check_pass_through(struct ibv_pd *pd, void *p, size_t len, const char *what);

/* ---- host memory (cuda_peermem_check_host.c) ---- */
void check_host_memory(struct ibv_pd *pd, void *heap);
void check_cuda_host_memory(struct ibv_pd *pd, void *host);
void time_host_memory(struct ibv_pd *pd, void *host, int reps);

/* ---- cuMemAlloc memory (cuda_peermem_check_device.c) ---- */
void check_device_size(struct ibv_pd *pd, size_t size);
void check_other_thread(struct ibv_pd *pd);
void check_reused_address(struct ibv_pd *pd);
void check_access_flags_and_small(struct ibv_pd *pd);

/* ---- CUDA VMM and pool memory (cuda_peermem_check_vmm.c) ---- */
extern CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
extern CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
extern CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, void *);
extern CUresult (*cuMemFreeAsync)(CUdeviceptr, void *);
extern CUresult (*cuStreamSynchronize)(void *);
extern size_t gran; /* cuMemGetAllocationGranularity(MINIMUM) */
bool vmm_map(CUdeviceptr va, size_t len, uint64_t *h);
void vmm_unmap(CUdeviceptr va, size_t len, uint64_t h);
struct ibv_mr *vmm_reg(struct ibv_pd *pd, CUdeviceptr p, size_t len, const char *what);
void dereg(struct ibv_mr *mr);
void check_vmm(struct ibv_pd *pd, int dev);

/* ---- the host-memory fast path (cuda_peermem_check_fastpath.c) ---- */
void vmm_after_host(struct ibv_pd *pd);
void fast_path_assumptions(void);

#pragma GCC visibility pop

#endif

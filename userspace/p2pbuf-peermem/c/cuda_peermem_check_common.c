// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * cuda-peermem-check (cuda_peermem_check.c): TAP, the capture of the library's messages, the
 * stand-in provider's record, the CUDA driver entry points, the pass-through check.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_peermem_check.h"

/* ---- TAP ---- */
int tests, failures;

bool check(bool cond, const char *fmt, ...)
{
	va_list ap;

	tests++;
	printf("%sok %d - ", cond ? "" : "not ", tests);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	if (!cond)
		failures++;
	fflush(stdout);
	return cond;
}

/* ---- stderr capture: the library's messages ---- */
static int saved_stderr = -1;
static FILE *cap;
static char captured[16384];

void capture_begin(void)
{
	fflush(stderr);
	cap = tmpfile();
	saved_stderr = dup(2);
	dup2(fileno(cap), 2);
}

/* What was captured (its first 16 KiB), not shown. */
const char *capture_end_quiet(void)
{
	size_t n;

	fflush(stderr);
	dup2(saved_stderr, 2);
	close(saved_stderr);
	rewind(cap);
	n = fread(captured, 1, sizeof(captured) - 1, cap);
	captured[n] = 0;
	fclose(cap);
	return captured;
}

const char *capture_end(void)
{
	capture_end_quiet();
	/* Show it, as a TAP comment per line. */
	for (char *l = captured, *nl; *l; l = nl + 1) {
		nl = strchr(l, '\n');
		printf("#   %.*s\n", nl ? (int)(nl - l) : (int)strlen(l), l);
		if (!nl)
			break;
	}
	return captured;
}

/* ---- the stand-in provider (standin_provider.c): what reached its reg_mr/reg_dmabuf_mr ---- */
const struct standin_record *st;

/* ---- CUDA, loaded at run time ---- */
CUresult (*cuInit)(unsigned int);
CUresult (*cuDeviceGet)(int *, int);
CUresult (*cuDeviceGetName)(char *, int, int);
CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
CUresult (*cuCtxSetCurrent)(void *);
CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
CUresult (*cuMemFree)(CUdeviceptr);
CUresult (*cuMemAllocHost)(void **, size_t);
CUresult (*cuMemFreeHost)(void *);
CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
CUresult (*cuMemGetInfo)(size_t *, size_t *);
CUresult (*cuDriverGetVersion)(int *);

bool load_cuda(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);

	if (!h)
		return false;
	CUDA_SYM(cuInit, "cuInit");
	CUDA_SYM(cuDeviceGet, "cuDeviceGet");
	CUDA_SYM(cuDeviceGetName, "cuDeviceGetName");
	CUDA_SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	CUDA_SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
	CUDA_SYM(cuMemAlloc, "cuMemAlloc_v2");
	CUDA_SYM(cuMemFree, "cuMemFree_v2");
	CUDA_SYM(cuMemAllocHost, "cuMemAllocHost_v2");
	CUDA_SYM(cuMemFreeHost, "cuMemFreeHost");
	CUDA_SYM(cuMemAllocManaged, "cuMemAllocManaged");
	CUDA_SYM(cuMemGetInfo, "cuMemGetInfo_v2");
	CUDA_SYM(cuDriverGetVersion, "cuDriverGetVersion");
	return true;
}

volatile int runtime_access = RW | IBV_ACCESS_RELAXED_ORDERING | (1 << 21);
bool preload = true;

/* With P2PBUF_PEERMEM_DEBUG set, the library says what it did with each call. */
static bool library_talks(void)
{
	const char *d = getenv("P2PBUF_PEERMEM_DEBUG");

	return preload && d && *d && strcmp(d, "0");
}

/* A registration of host-side memory must reach the provider's reg_mr untouched: the address,
 * length, iova (the address, or the caller's) and access flags as the caller gave them. */
void check_pass_through_iova(struct ibv_pd *pd, void *p, size_t len, uint64_t iova,
			     const char *what)
{
	struct ibv_mr *mr;
	const char *msg;

	standin_reset();
	capture_begin();
	mr = iova == (uintptr_t)p ? ibv_reg_mr(pd, p, len, RW) : ibv_reg_mr_iova(pd, p, len, iova, RW);
	msg = capture_end();
	check(mr && st->reg_mr_calls == 1 && st->dmabuf_calls == 0 && st->addr == (uintptr_t)p &&
		      st->length == len && st->iova == iova && st->access == RW && mr->addr == p &&
		      (!library_talks() || strstr(msg, "passing to the real function")),
	      "%s: %s(%p, %zu) passes through to the provider's reg_mr unchanged (reg_mr %" PRIu64 ", reg_dmabuf_mr %" PRIu64 "; it got addr %#" PRIx64 ", length %" PRIu64 ", iova %#" PRIx64 ", access %#" PRIx64 ")",
	      what, iova == (uintptr_t)p ? "ibv_reg_mr" : "ibv_reg_mr_iova", p, len, st->reg_mr_calls,
	      st->dmabuf_calls, st->addr, st->length, st->iova, st->access);
	if (mr)
		check(ibv_dereg_mr(mr) == 0, "%s: ibv_dereg_mr", what);
}

void check_pass_through(struct ibv_pd *pd, void *p, size_t len, const char *what)
{
	check_pass_through_iova(pd, p, len, (uintptr_t)p, what);
}

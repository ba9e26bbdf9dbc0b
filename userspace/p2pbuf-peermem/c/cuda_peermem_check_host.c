// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * cuda-peermem-check (cuda_peermem_check.c): host memory. With --host-only, host memory of
 * every kind in a process without CUDA; in a CUDA process, pinned and managed memory; and
 * with --time-host, the cost of host registrations.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check_util.h"
#include "cuda_peermem_check.h"

/* The instrument itself: ibv_reg_dmabuf_mr called directly (the library does not interpose
 * it) reaches the stand-in's reg_dmabuf_mr, which records its arguments, and in "no device"
 * mode fails with that errno. */
static void check_standin(struct ibv_pd *pd, int fd)
{
	struct ibv_mr *mr;
	int e;

	standin_reset();
	mr = ibv_reg_dmabuf_mr(pd, 4096, 8192, 0x2000, fd, RW);
	check(mr && st->dmabuf_calls == 1 && st->reg_mr_calls == 0 && st->offset == 4096 &&
		      st->length == 8192 && st->iova == 0x2000 && st->fd == fd && st->access == RW &&
		      !st->is_dmabuf,
	      "the stand-in: ibv_reg_dmabuf_mr(offset 4096, length 8192, iova 0x2000, fd %d) reaches its reg_dmabuf_mr (offset %" PRIu64 ", length %" PRIu64 ", iova %#" PRIx64 ", fd %" PRId64 ", access %#" PRIx64 ", a memfd: not a dma-buf)",
	      fd, st->offset, st->length, st->iova, st->fd, st->access);
	if (mr)
		ibv_dereg_mr(mr);
	standin_dmabuf_errno(ENODEV);
	standin_reset();
	errno = 0;
	mr = ibv_reg_dmabuf_mr(pd, 0, 4096, 0, fd, RW);
	e = errno;
	standin_dmabuf_errno(0);
	check(!mr && e == ENODEV && st->dmabuf_calls == 1,
	      "the stand-in without a device: ibv_reg_dmabuf_mr fails with errno %d (ENODEV)", e);
}

/* --host-only: host memory of every kind a program registers, in a process without CUDA and
 * without p2pbuf: each reaches the provider's reg_mr as the caller made it, and the library
 * holds nothing for it. */
void check_host_memory(struct ibv_pd *pd, void *heap)
{
	char stack[8192];
	size_t big = 4 << 20;
	void *anon = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *shared = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int mfd = memfd_create("p2pbuf-host-check", MFD_CLOEXEC);
	void *file = MAP_FAILED;
	struct ibv_mr *mr;
	int base, e;

	printf("# --- host memory (no CUDA, no p2pbuf)\n");
	memset(stack, 1, sizeof(stack));
	if (mfd >= 0 && ftruncate(mfd, big) == 0)
		file = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (!check(anon != MAP_FAILED && shared != MAP_FAILED && file != MAP_FAILED,
		   "anonymous private, anonymous shared and memfd mappings of %zu bytes", big))
		return;
	check_standin(pd, mfd);
	check_pass_through_iova(pd, (char *)heap + 100, 5000, (uintptr_t)heap + 100,
				"malloc'd memory at an odd offset");
	check_pass_through_iova(pd, heap, 1 << 20, 0x100000000000ULL, "malloc'd memory, another iova");
	check_pass_through(pd, stack, sizeof(stack), "the stack");
	check_pass_through(pd, anon, big, "an anonymous private mapping");
	check_pass_through(pd, (char *)anon + 4096, 8192, "the same mapping again (the library's fast path)");
	check_pass_through(pd, shared, big, "an anonymous shared mapping");
	check_pass_through(pd, file, big, "a memfd mapping (a file, MAP_SHARED)");
	check_pass_through(pd, (char *)anon + big - 4096, 4096, "the last page of a mapping");

	/* Run-time access flags compile to ibv_reg_mr_iova2; libibverbs drops the optional ones
	 * for a device that does not claim optional-access support (the stand-in does not). */
	standin_reset();
	capture_begin();
	mr = ibv_reg_mr(pd, anon, 4096, runtime_access);
	capture_end();
	check(mr && st->reg_mr_calls == 1 && st->dmabuf_calls == 0 && st->addr == (uintptr_t)anon &&
		      st->access == RW,
	      "ibv_reg_mr with run-time access flags (ibv_reg_mr_iova2): reg_mr with access %#" PRIx64,
	      st->access);
	if (mr)
		ibv_dereg_mr(mr);

	/* A read-only mapping with writable access: the provider decides (a real one says
	 * EFAULT); the library must not. */
	mprotect(anon, 4096, PROT_READ);
	check_pass_through(pd, anon, 4096, "a read-only page, writable access");
	mprotect(anon, 4096, PROT_READ | PROT_WRITE);

	/* No fd or memory held per registration: 1000 registrations and deregistrations. */
	base = count_fds();
	e = 0;
	standin_reset();
	capture_begin();
	for (int i = 0; i < 1000 && !e; i++) {
		mr = ibv_reg_mr(pd, (char *)anon + (i % 512) * 4096, 4096, RW);
		e = !mr || ibv_dereg_mr(mr);
	}
	capture_end_quiet();
	e = e || st->reg_mr_calls != 1000 || st->dmabuf_calls;
	check(!e && count_fds() == base,
	      "1000 ibv_reg_mr + ibv_dereg_mr of host pages: all passed through, open fds %d after, %d before",
	      count_fds(), base);
	munmap(anon, big);
	munmap(shared, big);
	munmap(file, big);
	close(mfd);
}

/* In a CUDA process: malloc'd memory, cuMemAllocHost (pinned) and cuMemAllocManaged memory. */
void check_cuda_host_memory(struct ibv_pd *pd, void *host)
{
	void *pinned;
	CUdeviceptr managed;

	check_pass_through(pd, host, 1 << 20, "malloc'd host memory in a CUDA process");
	if (cuMemAllocHost(&pinned, 2 << 20) == 0) {
		check_pass_through(pd, pinned, 2 << 20, "cuMemAllocHost (pinned host) memory");
		cuMemFreeHost(pinned);
	}
	if (cuMemAllocManaged(&managed, 2 << 20, 1) == 0) {
		check_pass_through(pd, (void *)(uintptr_t)managed, 2 << 20,
				   "cuMemAllocManaged memory");
		cuMemFree(managed);
	}
}

/* ---- cost of host-memory registrations ---- */
#define TIME_BATCH 1000

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median of n per-call times (sorts them). */
static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}


/* Median microseconds per call of what each step of the library's slow path costs here, for
 * host memory: the driver's pointer query with one attribute and with seven, and one
 * PROCMAP_QUERY. */
static void time_steps(void *host, int batches)
{
	CUresult (*pga)(unsigned, int *, void **, CUdeviceptr) = NULL;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	int attrs[7] = { 2, 1, 7, 8, 9, 11, 12 };
	uint64_t vals[7];
	void *ptrs[7];
	double *t = calloc(batches, sizeof(*t));
	int fd = open("/proc/self/maps", O_RDONLY);
	char name[512];

	for (int i = 0; i < 7; i++)
		ptrs[i] = &vals[i];
	if (h)
		*(void **)&pga = dlsym(h, "cuPointerGetAttributes");
	for (int n = 1; pga && t && n <= 7; n += 6) {
		for (int b = 0; b < batches; b++) {
			double t0 = now_us();

			for (int i = 0; i < TIME_BATCH; i++)
				pga(n, attrs, ptrs, (uintptr_t)host);
			t[b] = (now_us() - t0) / TIME_BATCH;
		}
		printf("# step: cuPointerGetAttributes, %d attribute%s, host memory: median %.3f us\n", n,
		       n > 1 ? "s" : "", median(t, batches));
	}
	for (int b = 0; fd >= 0 && t && b < batches; b++) {
		double t0 = now_us();

		for (int i = 0; i < TIME_BATCH; i++) {
			struct pmq q = { .size = sizeof(q), .query_addr = (uintptr_t)host,
					 .vma_name_size = sizeof(name), .vma_name_addr = (uintptr_t)name };

			ioctl(fd, PMQ_IOCTL, &q);
		}
		t[b] = (now_us() - t0) / TIME_BATCH;
	}
	if (fd >= 0 && t)
		printf("# step: PROCMAP_QUERY ioctl on /proc/self/maps: median %.3f us\n", median(t, batches));
	if (fd >= 0)
		close(fd);
	free(t);
}

void time_host_memory(struct ibv_pd *pd, void *host, int reps)
{
	int batches = reps / TIME_BATCH > 0 ? reps / TIME_BATCH : 1;
	double *t = calloc(batches, sizeof(*t));
	struct ibv_mr *mr;

	if (!t)
		return;
	for (int b = 0; b < batches; b++) {
		double t0 = now_us();

		for (int i = 0; i < TIME_BATCH; i++) {
			mr = ibv_reg_mr(pd, host, 4096, RW);
			if (!mr || ibv_dereg_mr(mr)) {
				printf("# host memory timing stopped: ibv_reg_mr/ibv_dereg_mr failed (errno %d)\n", errno);
				free(t);
				return;
			}
		}
		t[b] = (now_us() - t0) / TIME_BATCH;
	}
	printf("# host memory, 4 KiB: median %.3f us per ibv_reg_mr + ibv_dereg_mr, %d batches of %d (%s the library; the stand-in's own work is a calloc and a free)\n",
	       median(t, batches), batches, TIME_BATCH, preload ? "with" : "without");
	free(t);
	time_steps(host, batches);
}

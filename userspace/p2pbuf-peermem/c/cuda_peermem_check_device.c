// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * cuda-peermem-check (cuda_peermem_check.c): device memory of cuMemAlloc. Sizes from 4 KiB
 * up, a registration from another thread, an address freed and allocated again, run-time
 * access flags, an allocation smaller than a page.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check_util.h"
#include "cuda_peermem_check.h"

/*
 * The checks of one cuMemAlloc size.
 * Over 100 lines on purpose: one allocation's checks in the order their TAP lines come, each
 * reading the same allocation and the dma-buf range CUDA gives for it.
 */
void check_device_size(struct ibv_pd *pd, size_t size)
{
	CUdeviceptr d;
	CUresult r;
	struct ibv_mr *mr, *mr2;
	struct ibv_pd nopd = { .context = NULL };
	double t0, t_alloc, t_reg, t_reg2, t_dereg;
	int base = count_fds(), fd1, e;
	uint64_t exp_start, exp_len, sub, sublen;
	const char *msg;
	char want[256];

	printf("# --- %zu bytes (%.6g GiB)\n", size, size / 1073741824.0);
	t0 = now_us();
	r = cuMemAlloc(&d, size);
	t_alloc = now_us() - t0;
	if (!check(r == 0, "cuMemAlloc(%zu): %d, %.0f us", size, r, t_alloc))
		return;
	exp_start = d & ~4095ULL;
	exp_len = ((d + size + 4095) & ~4095ULL) - exp_start;
	printf("# device pointer %#" PRIx64 " (%s)\n", d,
	       d % (2 << 20) ? "not 2 MiB aligned" : "2 MiB aligned");

	/* 1. The whole allocation, accepted by the stand-in. */
	standin_dmabuf_errno(0);
	standin_reset();
	capture_begin();
	t0 = now_us();
	mr = ibv_reg_mr(pd, (void *)(uintptr_t)d, size, RW);
	t_reg = now_us() - t0;
	msg = capture_end();
	if (!preload) {
		check(mr && st->reg_mr_calls == 1 && st->dmabuf_calls == 0,
		      "without the library the device pointer goes to the provider's reg_mr as user memory (reg_mr %" PRIu64 ", reg_dmabuf_mr %" PRIu64 ")",
		      st->reg_mr_calls, st->dmabuf_calls);
		if (mr)
			ibv_dereg_mr(mr);
		cuMemFree(d);
		return;
	}
	fd1 = st->fd;
	check(mr != NULL, "ibv_reg_mr(device pointer, %zu) registered in %.0f us (pointer detection, export, registration)",
	      size, t_reg);
	check(st->dmabuf_calls == 1 && st->reg_mr_calls == 0,
	      "it reached ibv_reg_dmabuf_mr, not reg_mr (reg_dmabuf_mr %" PRIu64 ", reg_mr %" PRIu64 ")",
	      st->dmabuf_calls, st->reg_mr_calls);
	check(st->is_dmabuf && !strcmp(st->exp_name, "nv_dmabuf") && st->dmabuf_size == exp_len,
	      "the fd is a dma-buf (magic %s), exporter %s, %" PRIu64 " bytes (export of %" PRIu64 ")",
	      st->is_dmabuf ? "DMA_BUF_MAGIC" : "wrong", st->exp_name, st->dmabuf_size, exp_len);
	check(st->offset == d - exp_start && st->length == size && st->iova == d && st->access == RW,
	      "offset %#" PRIx64 " (want %#" PRIx64 "), length %zu, iova %#" PRIx64 " = the pointer, access %#" PRIx64,
	      st->offset, d - exp_start, st->length, st->iova, st->access);
	check(mr && mr->addr == (void *)(uintptr_t)d && mr->length == size,
	      "mr->addr is the device pointer and mr->length the size (as ibv_reg_mr reports)");
	check(count_fds() == base + 1, "one fd held for the allocation (%d open, %d before)",
	      count_fds(), base);

	/* 2. A second region inside the same allocation: the same fd, another offset. */
	if (size >= 8192) {
		sub = d + size / 2;
		sublen = size / 4;
	} else {
		sub = d + 259;
		sublen = 1000;
	}
	standin_reset();
	capture_begin();
	t0 = now_us();
	mr2 = ibv_reg_mr_iova(pd, (void *)(uintptr_t)sub, sublen,
			      0x100000000000ULL + (sub & 4095), RW);
	t_reg2 = now_us() - t0;
	msg = capture_end();
	check(mr2 && st->dmabuf_calls == 1 && st->fd == fd1 && st->offset == sub - exp_start &&
		      st->length == sublen && st->iova == 0x100000000000ULL + (sub & 4095),
	      "ibv_reg_mr_iova of [+%#" PRIx64 ", %" PRIu64 ") with another iova: the cached fd %d (got %" PRId64 "), offset %#" PRIx64 ", iova %#" PRIx64 ", %.0f us",
	      sub - d, sublen, fd1, st->fd, st->offset, st->iova, t_reg2);
	check(strstr(msg, "cached fd") != NULL, "the library says it used the cached fd");
	check(count_fds() == base + 1, "still one fd for two regions (%d open)", count_fds());

	/* 3. Deregistration: the fd goes with the last region. */
	t0 = now_us();
	check(mr2 && ibv_dereg_mr(mr2) == 0 && count_fds() == base + 1,
	      "first ibv_dereg_mr: the fd stays for the other region");
	capture_begin();
	e = mr ? ibv_dereg_mr(mr) : -1;
	t_dereg = now_us() - t0;
	msg = capture_end();
	check(e == 0 && count_fds() == base && strstr(msg, "closed fd") &&
		      strstr(msg, "holds 0 fd(s) for 0 memory region(s)"),
	      "second ibv_dereg_mr: fd closed, nothing held (%d open, %d before)", count_fds(),
	      base);

	/* 4. The stand-in without a device: ibv_reg_dmabuf_mr fails with ENODEV, passed on. */
	standin_dmabuf_errno(ENODEV);
	standin_reset();
	capture_begin();
	errno = 0;
	mr = ibv_reg_mr(pd, (void *)(uintptr_t)d, size, RW);
	e = errno;
	msg = capture_end();
	snprintf(want, sizeof(want),
		 "offset 0x%" PRIx64 ", length %zu, iova 0x%" PRIx64 ", fd %" PRId64 ", access LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ) failed: No such device (errno 19); closed fd",
		 d - exp_start, size, d, st->fd);
	check(!mr && e == ENODEV && st->dmabuf_calls == 1 && strstr(msg, want) &&
		      count_fds() == base,
	      "provider without a device: NULL, errno %d (ENODEV), the message has \"%s\", the export closed",
	      e, want);
	standin_dmabuf_errno(0);

	/* 5. No device context at all: the library stops before ibv_reg_dmabuf_mr. */
	standin_reset();
	capture_begin();
	errno = 0;
	mr = ibv_reg_mr(&nopd, (void *)(uintptr_t)d, size, RW);
	e = errno;
	msg = capture_end();
	check(!mr && e == EINVAL && st->dmabuf_calls == 0 &&
		      strstr(msg, "not calling ibv_reg_dmabuf_mr: the protection domain has no device context (pd->context is NULL): Invalid argument (errno 22)") &&
		      strstr(msg, "nv_dmabuf dma-buf of") && count_fds() == base,
	      "a protection domain without a context: NULL, errno %d (EINVAL) after the export, the exact message, the export closed",
	      e);

	/* 6. A range that runs past the allocation is not one dma-buf: passed through. */
	standin_reset();
	capture_begin();
	mr = ibv_reg_mr(pd, (void *)(uintptr_t)(d + size - 4096), 8192, RW);
	msg = capture_end();
	check(mr && st->reg_mr_calls == 1 && st->dmabuf_calls == 0 &&
		      strstr(msg, "runs past its allocation"),
	      "a range past the allocation's end goes to the real ibv_reg_mr");
	if (mr)
		ibv_dereg_mr(mr);

	check(cuMemFree(d) == 0, "cuMemFree");
	printf("# size %zu: cuMemAlloc %.0f us, first ibv_reg_mr %.0f us, cached %.0f us, two deregs %.0f us\n",
	       size, t_alloc, t_reg, t_reg2, t_dereg);
}

/* A registration from a thread that has no current CUDA context (a verbs progress thread). */
struct thread_reg {
	struct ibv_pd *pd;
	CUdeviceptr d;
	size_t size;
	struct ibv_mr *mr;
	int err, dmabuf_calls;
};

static void *thread_reg(void *arg)
{
	struct thread_reg *t = arg;

	standin_reset();
	capture_begin();
	t->mr = ibv_reg_mr(t->pd, (void *)(uintptr_t)t->d, t->size, RW);
	t->err = errno;
	capture_end();
	t->dmabuf_calls = st->dmabuf_calls;
	if (t->mr)
		ibv_dereg_mr(t->mr);
	return NULL;
}

void check_other_thread(struct ibv_pd *pd)
{
	struct thread_reg t = { .pd = pd, .size = 2 << 20 };
	pthread_t th;

	printf("# --- from a thread without a current CUDA context\n");
	if (!check(cuMemAlloc(&t.d, t.size) == 0, "cuMemAlloc(2 MiB)"))
		return;
	pthread_create(&th, NULL, thread_reg, &t);
	pthread_join(th, NULL);
	check(t.mr && t.dmabuf_calls == 1,
	      "ibv_reg_mr of device memory from a thread with no current context: exported (the library makes the allocation's context current) and registered (errno %d)",
	      t.mr ? 0 : t.err);
	cuMemFree(t.d);
}

/* An allocation freed while registered and a new one at the same address: another buffer id,
 * so another export, not the first one's cached fd. */
void check_reused_address(struct ibv_pd *pd)
{
	CUdeviceptr a, b;
	struct ibv_mr *ma, *mb;
	int fa, base = count_fds();

	printf("# --- an address freed and allocated again while the first region is registered\n");
	if (!check(cuMemAlloc(&a, 2 << 20) == 0, "cuMemAlloc(2 MiB)"))
		return;
	standin_reset();
	ma = ibv_reg_mr(pd, (void *)(uintptr_t)a, 2 << 20, RW);
	fa = st->fd;
	cuMemFree(a);
	if (!check(cuMemAlloc(&b, 2 << 20) == 0, "cuMemAlloc(2 MiB) again"))
		return;
	printf("# first allocation %#" PRIx64 ", second %#" PRIx64 " (%s)\n", a, b,
	       a == b ? "the same address" : "another address");
	standin_reset();
	capture_begin();
	mb = ibv_reg_mr(pd, (void *)(uintptr_t)b, 2 << 20, RW);
	capture_end();
	check(ma && mb && st->dmabuf_calls == 1 && st->fd != fa && count_fds() == base + 2,
	      "the new allocation gets its own export (fd %" PRId64 ", the freed one's is %d), not the cached fd",
	      st->fd, fa);
	if (ma)
		ibv_dereg_mr(ma);
	if (mb)
		ibv_dereg_mr(mb);
	check(count_fds() == base, "both exports closed with their regions");
	cuMemFree(b);
}

/* Run-time access flags compile to ibv_reg_mr_iova2; optional flags. Then an allocation
 * smaller than a page. */
void check_access_flags_and_small(struct ibv_pd *pd)
{
	CUdeviceptr small;
	struct ibv_mr *mr;
	int n;

	if (cuMemAlloc(&small, 2 << 20) != 0)
		return;
	standin_reset();
	capture_begin();
	mr = ibv_reg_mr(pd, (void *)(uintptr_t)small, 2 << 20, runtime_access);
	capture_end();
	check(mr && st->dmabuf_calls == 1 &&
		      st->access == (RW | IBV_ACCESS_RELAXED_ORDERING) &&
		      st->iova == small,
	      "ibv_reg_mr with run-time access flags (ibv_reg_mr_iova2): access %#x reaches ibv_reg_dmabuf_mr as %#" PRIx64 " (RELAXED_ORDERING kept, unknown optional bit dropped)",
	      runtime_access, st->access);
	if (mr)
		ibv_dereg_mr(mr);
	/* An allocation smaller than a page, maybe not page aligned. */
	cuMemFree(small);
	if (cuMemAlloc(&small, 100) == 0) {
		standin_reset();
		capture_begin();
		errno = 0;
		mr = ibv_reg_mr(pd, (void *)(uintptr_t)small, 100, RW);
		n = errno;
		capture_end();
		printf("# cuMemAlloc(100) gave %#" PRIx64 " (page offset %" PRIu64 ")\n", small,
		       small & 4095);
		check((mr && st->dmabuf_calls == 1 && st->offset == (small & 4095)) ||
			      (!mr && n != 0 && st->dmabuf_calls == 0),
		      "a 100-byte allocation: %s (offset %#" PRIx64 ", errno %d)",
		      mr ? "registered through a page-wide export" : "refused with an errno",
		      st->offset, n);
		if (mr)
			ibv_dereg_mr(mr);
		cuMemFree(small);
	}
}

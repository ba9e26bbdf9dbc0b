// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * cuda-peermem-check (cuda_peermem_check.c): CUDA VMM memory (cuMemCreate +
 * cuMemAddressReserve + cuMemMap) and pool memory (cuMemAllocAsync).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "check_util.h"
#include "cuda_peermem_check.h"

/* ---- CUDA VMM memory (cuMemCreate + cuMemAddressReserve + cuMemMap), as PyTorch's
 * expandable_segments and NCCL's cuMem buffers use it. Each check compares what reaches the
 * stand-in's reg_dmabuf_mr (the fd's size from /proc/self/fdinfo, the offset) with the mapping
 * that cuMemGetAddressRange reports for the address. ---- */
typedef struct {
	int type; /* CUmemLocationType: CU_MEM_LOCATION_TYPE_DEVICE = 1 */
	int id;
} CUmemLocation;
typedef struct {
	int type; /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
	int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_NONE = 0 */
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;
typedef struct {
	CUmemLocation location;
	int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} CUmemAccessDesc;

static CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
static CUresult (*cuMemCreate)(uint64_t *, size_t, const CUmemAllocationProp *, unsigned long long);
static CUresult (*cuMemRelease)(uint64_t);
CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
static CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, uint64_t, unsigned long long);
static CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
static CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
static CUresult (*cuMemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
static CUresult (*cuCtxGetCurrent)(void **);
static CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, void *);
CUresult (*cuMemFreeAsync)(CUdeviceptr, void *);
CUresult (*cuStreamSynchronize)(void *);

static bool load_vmm(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

	if (!h)
		return false;
	CUDA_SYM(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
	CUDA_SYM(cuMemCreate, "cuMemCreate");
	CUDA_SYM(cuMemRelease, "cuMemRelease");
	CUDA_SYM(cuMemAddressReserve, "cuMemAddressReserve");
	CUDA_SYM(cuMemAddressFree, "cuMemAddressFree");
	CUDA_SYM(cuMemMap, "cuMemMap");
	CUDA_SYM(cuMemUnmap, "cuMemUnmap");
	CUDA_SYM(cuMemSetAccess, "cuMemSetAccess");
	CUDA_SYM(cuMemGetAddressRange, "cuMemGetAddressRange_v2");
	CUDA_SYM(cuCtxGetCurrent, "cuCtxGetCurrent");
	CUDA_SYM(cuPointerGetAttribute, "cuPointerGetAttribute");
	CUDA_SYM(cuMemAllocAsync, "cuMemAllocAsync");
	CUDA_SYM(cuMemFreeAsync, "cuMemFreeAsync");
	CUDA_SYM(cuStreamSynchronize, "cuStreamSynchronize");
	return true;
}

static int vmm_dev;
size_t gran; /* cuMemGetAllocationGranularity(MINIMUM) */

static CUmemAllocationProp vmm_prop(void)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	p.type = 1;
	p.location.type = 1;
	p.location.id = vmm_dev;
	p.allocFlags.gpuDirectRDMACapable = 1; /* as NCCL asks where GPUDirect RDMA is there */
	return p;
}

/* One physical allocation of len bytes mapped at va, read-write for the device. */
bool vmm_map(CUdeviceptr va, size_t len, uint64_t *h)
{
	CUmemAllocationProp p = vmm_prop();
	CUmemAccessDesc a = { { 1, vmm_dev }, 3 };
	CUresult r = cuMemCreate(h, len, &p, 0);

	if (r == 0 && (r = cuMemMap(va, len, 0, *h, 0)) == 0 &&
	    (r = cuMemSetAccess(va, len, &a, 1)) == 0)
		return true;
	printf("# cuMemCreate/cuMemMap/cuMemSetAccess(%#" PRIx64 ", %zu) failed: %d\n", va, len, r);
	return false;
}

void vmm_unmap(CUdeviceptr va, size_t len, uint64_t h)
{
	cuMemUnmap(va, len);
	cuMemRelease(h);
}

static uint64_t ptr_attr(int attr, CUdeviceptr p)
{
	uint64_t v = 0;

	return cuPointerGetAttribute(&v, attr, p) == 0 ? v : (uint64_t)-1;
}

/* What CUDA says about p: the pointer's range (RANGE_START_ADDR 11, RANGE_SIZE 12), buffer id
 * (7), memory block id (20), and cuMemGetAddressRange's mapping. */
static void vmm_describe(CUdeviceptr p, const char *what)
{
	CUdeviceptr mb = 0;
	size_t ms = 0;
	CUresult r = cuMemGetAddressRange(&mb, &ms, p);

	printf("# %s %#" PRIx64 ": RANGE %#" PRIx64 "+%" PRIu64 ", buffer id %" PRIu64
	       ", memory block id %" PRIu64 ", cuMemGetAddressRange %d: %#" PRIx64 "+%zu\n",
	       what, p, ptr_attr(11, p), ptr_attr(12, p), ptr_attr(7, p), ptr_attr(20, p), r, mb,
	       ms);
}

/* Registers [p, p + len) and checks that ibv_reg_dmabuf_mr got an export of exactly the mapping
 * mb+ms (what cuMemGetAddressRange said), at p's offset in it, and that the thread's current
 * context is what it was. */
static struct ibv_mr *vmm_reg_in(struct ibv_pd *pd, CUdeviceptr p, size_t len, CUdeviceptr mb,
				 size_t ms, const char *what)
{
	struct ibv_mr *mr;
	void *before = (void *)1, *after = (void *)2;
	double t0, t;
	int e;

	cuCtxGetCurrent(&before);
	standin_reset();
	capture_begin();
	errno = 0;
	t0 = now_us();
	mr = ibv_reg_mr(pd, (void *)(uintptr_t)p, len, RW);
	t = now_us() - t0;
	e = errno;
	capture_end();
	cuCtxGetCurrent(&after);
	check(mr && st->dmabuf_calls == 1 && st->reg_mr_calls == 0 && st->is_dmabuf &&
		      st->dmabuf_size == ms && st->offset == p - mb && st->length == len &&
		      st->iova == p && mr->addr == (void *)(uintptr_t)p && before == after,
	      "%s: [%#" PRIx64 ", +%zu) reached ibv_reg_dmabuf_mr with fd %" PRId64 " of %" PRIu64 " bytes at offset %#" PRIx64
	      "; the mapping (cuMemGetAddressRange) is %#" PRIx64 "+%zu, offset %#" PRIx64
	      "; current context %s (errno %d, %.0f us)",
	      what, p, len, st->fd, st->dmabuf_size, st->offset, mb, ms, p - mb,
	      before == after ? "unchanged" : "CHANGED", mr ? 0 : e, t);
	return mr;
}

struct ibv_mr *vmm_reg(struct ibv_pd *pd, CUdeviceptr p, size_t len, const char *what)
{
	CUdeviceptr mb = 0;
	size_t ms = 0;

	if (cuMemGetAddressRange(&mb, &ms, p))
		printf("# cuMemGetAddressRange(%#" PRIx64 ") failed\n", p);
	return vmm_reg_in(pd, p, len, mb, ms, what);
}

void dereg(struct ibv_mr *mr)
{
	if (mr)
		ibv_dereg_mr(mr);
}

/* 2 of 8 chunks mapped; inside them registration works, in the unmapped part it fails. */
static void vmm_partly_mapped(struct ibv_pd *pd)
{
	CUdeviceptr res, p = 0;
	uint64_t h0, h1;
	struct ibv_mr *m0, *m1, *mr;
	int base = count_fds(), e;
	const char *msg;

	printf("# --- VMM: a reservation of 8 chunks of %zu bytes, 2 mapped\n", gran);
	if (!check(cuMemAddressReserve(&res, 8 * gran, 0, 0, 0) == 0 && vmm_map(res, gran, &h0) &&
			   vmm_map(res + gran, gran, &h1),
		   "reserve 8 chunks, map chunks 0 and 1 (two allocations)"))
		return;
	vmm_describe(res + gran + 8192, "chunk 1");
	m0 = vmm_reg(pd, res + 4096, gran - 8192, "partly mapped, most of chunk 0");
	m1 = vmm_reg(pd, res + gran + 8192, 4096, "partly mapped, 4 KiB in chunk 1");
	check(count_fds() == base + 2, "one export per mapping (%d fds open, %d before)",
	      count_fds(), base);
	p = res + 5 * gran + 4096;
	vmm_describe(p, "unmapped chunk 5");
	standin_reset();
	capture_begin();
	errno = 0;
	mr = ibv_reg_mr(pd, (void *)(uintptr_t)p, 4096, RW);
	e = errno;
	msg = capture_end();
	check(st->dmabuf_calls == 0 &&
		      ((!mr && e == EFAULT && strstr(msg, "not in a mapping")) ||
		       (mr && st->reg_mr_calls == 1)),
	      "4 KiB in the unmapped chunk 5: no export; %s (errno %d)",
	      mr ? "passed to the provider's reg_mr as memory CUDA does not report (a kernel fails it: nothing is mapped there)" :
		   "refused with EFAULT by the library", mr ? 0 : e);
	dereg(mr);
	dereg(m0);
	dereg(m1);
	check(count_fds() == base, "exports closed with their regions (%d fds)", count_fds());
	vmm_unmap(res, gran, h0);
	vmm_unmap(res + gran, gran, h1);
	cuMemAddressFree(res, 8 * gran);
}

/* A pool that grows a chunk at a time, registered in each new chunk while the others stay. */
static void vmm_growing(struct ibv_pd *pd)
{
	enum { N = 8 };
	CUdeviceptr res;
	uint64_t h[N];
	struct ibv_mr *mr[N] = { 0 }, *again;
	int fds[N], base = count_fds(), i, mapped = 0;
	char what[96];

	printf("# --- VMM: a growing pool, %d chunks mapped one after another\n", N);
	if (!check(cuMemAddressReserve(&res, N * gran, 0, 0, 0) == 0, "reserve %d chunks", N))
		return;
	for (i = 0; i < N && vmm_map(res + i * gran, gran, &h[i]); i++, mapped++) {
		snprintf(what, sizeof(what), "growing pool, chunk %d of %d just mapped", i + 1, N);
		mr[i] = vmm_reg(pd, res + i * gran + gran / 2, 65536, what);
		fds[i] = st->fd;
	}
	check(mapped == N && count_fds() == base + N, "%d chunks mapped, %d exports held (%d fds, %d before)",
	      mapped, N, count_fds(), base);
	again = vmm_reg(pd, res + 8192, 4096, "growing pool, chunk 1 again");
	check(again && st->fd == fds[0], "the second region in chunk 1 uses its cached export (fd %" PRId64 ", first %d)",
	      st->fd, fds[0]);
	dereg(again);
	for (i = 0; i < mapped; i++) {
		dereg(mr[i]);
		vmm_unmap(res + i * gran, gran, h[i]);
	}
	check(count_fds() == base, "all exports closed (%d fds)", count_fds());
	cuMemAddressFree(res, N * gran);
}

/* Unmapped while registered, another allocation mapped at the same address: a new export. */
static void vmm_remapped(struct ibv_pd *pd)
{
	CUdeviceptr res;
	uint64_t h1, h2;
	struct ibv_mr *m1, *m2;
	int base = count_fds(), f1;

	printf("# --- VMM: a mapping unmapped and released while registered, a new allocation mapped at the same address\n");
	if (!check(cuMemAddressReserve(&res, 4 * gran, 0, 0, 0) == 0 && vmm_map(res, gran, &h1),
		   "reserve 4 chunks, map chunk 0"))
		return;
	vmm_describe(res, "first allocation");
	m1 = vmm_reg(pd, res + 4096, 4096, "remap, before");
	f1 = st->fd;
	vmm_unmap(res, gran, h1);
	if (!check(vmm_map(res, 2 * gran, &h2), "unmap and release chunk 0; map a new allocation of 2 chunks at the same address"))
		return;
	vmm_describe(res, "second allocation");
	m2 = vmm_reg(pd, res + 4096, 4096, "remap, after");
	check(m2 && st->fd != f1 && st->dmabuf_size == 2 * gran && count_fds() == base + 2,
	      "the new allocation gets its own export (fd %" PRId64 " of %" PRIu64 " bytes; the old one's is fd %d), not the cached fd",
	      st->fd, st->dmabuf_size, f1);
	dereg(m1);
	dereg(m2);
	check(count_fds() == base, "both exports closed (%d fds)", count_fds());
	vmm_unmap(res, 2 * gran, h2);
	cuMemAddressFree(res, 4 * gran);
}

struct vmm_thread {
	struct ibv_pd *pd;
	CUdeviceptr p, mb;
	size_t ms;
};

static void *vmm_thread_reg(void *arg)
{
	struct vmm_thread *t = arg;
	void *cur = (void *)1;

	check(cuCtxGetCurrent(&cur) == 0 && cur == NULL, "the new thread has no current context");
	dereg(vmm_reg_in(t->pd, t->p, 4096, t->mb, t->ms,
			 "VMM memory from a thread without a current context"));
	return NULL;
}

static void vmm_other_thread(struct ibv_pd *pd)
{
	struct vmm_thread t = { .pd = pd };
	CUdeviceptr res;
	uint64_t h;
	pthread_t th;

	printf("# --- VMM: registered from a thread without a current CUDA context\n");
	if (!check(cuMemAddressReserve(&res, 4 * gran, 0, 0, 0) == 0 && vmm_map(res + gran, gran, &h),
		   "reserve 4 chunks, map chunk 1"))
		return;
	t.p = res + gran + 3 * 4096;
	check(cuMemGetAddressRange(&t.mb, &t.ms, t.p) == 0, "cuMemGetAddressRange");
	pthread_create(&th, NULL, vmm_thread_reg, &t);
	pthread_join(th, NULL);
	vmm_unmap(res + gran, gran, h);
	cuMemAddressFree(res, 4 * gran);
}

/* A range over two mappings is refused; over one mapping of two chunks it is one export. */
static void vmm_spanning(struct ibv_pd *pd)
{
	CUdeviceptr res;
	uint64_t ha, hb, hc;
	struct ibv_mr *mr;
	const char *msg;
	int e;

	printf("# --- VMM: a range over two mappings\n");
	if (!check(cuMemAddressReserve(&res, 4 * gran, 0, 0, 0) == 0 && vmm_map(res, gran, &ha) &&
			   vmm_map(res + gran, gran, &hb) && vmm_map(res + 2 * gran, 2 * gran, &hc),
		   "reserve 4 chunks; chunks 0 and 1 two allocations, chunks 2-3 one"))
		return;
	standin_reset();
	capture_begin();
	errno = 0;
	mr = ibv_reg_mr(pd, (void *)(uintptr_t)(res + gran - 4096), 8192, RW);
	e = errno;
	msg = capture_end();
	check(!mr && e == EINVAL && st->dmabuf_calls == 0 && st->reg_mr_calls == 0 &&
		      strstr(msg, "register each mapping separately"),
	      "8 KiB over the end of chunk 0 into chunk 1: refused, errno %d (EINVAL), the message says to register each mapping separately",
	      mr ? 0 : e);
	dereg(mr);
	dereg(vmm_reg(pd, res + 3 * gran - 4096, 8192, "8 KiB over the chunk boundary inside one mapping of 2 chunks"));
	vmm_unmap(res, gran, ha);
	vmm_unmap(res + gran, gran, hb);
	vmm_unmap(res + 2 * gran, 2 * gran, hc);
	cuMemAddressFree(res, 4 * gran);
}

/* 4 KiB registered in mapping A; B, in the same reservation, unmapped and released: the export
 * is A's mapping only, and B's memory goes back to the device. */
static void vmm_neighbour(struct ibv_pd *pd)
{
	size_t a = 32 * gran, b = 256 * gran, free0 = 0, free1 = 0, total;
	CUdeviceptr res;
	uint64_t ha, hb;
	struct ibv_mr *mr;

	printf("# --- VMM: a neighbour released while a registration lives\n");
	if (!check(cuMemAddressReserve(&res, a + b, 0, 0, 0) == 0 && vmm_map(res, a, &ha) &&
			   vmm_map(res + a, b, &hb),
		   "reserve %zu MiB: A = %zu MiB, B = %zu MiB, both mapped", (a + b) >> 20, a >> 20,
		   b >> 20))
		return;
	mr = vmm_reg(pd, res + a - 4096, 4096, "4 KiB at the end of A");
	check(mr && st->dmabuf_size == a, "the export is A's mapping (%" PRIu64 " bytes), not the reservation (%zu)",
	      st->dmabuf_size, a + b);
	cuMemGetInfo(&free0, &total);
	vmm_unmap(res + a, b, hb);
	cuMemGetInfo(&free1, &total);
	check(free1 >= free0 + b, "B unmapped and released while A's region lives: %zd MiB more free device memory (B is %zu MiB)",
	      ((ssize_t)free1 - (ssize_t)free0) >> 20, b >> 20);
	dereg(mr);
	vmm_unmap(res, a, ha);
	cuMemAddressFree(res, a + b);
}

/* Pool memory (cuMemAllocAsync): exported as before, the pointer's range. */
static void pool_memory(struct ibv_pd *pd)
{
	CUdeviceptr p, rs, start;
	uint64_t rsz;
	struct ibv_mr *mr;

	printf("# --- pool memory (cuMemAllocAsync): exported as before, the pointer's range\n");
	if (!check(cuMemAllocAsync(&p, 1 << 20, NULL) == 0 && cuStreamSynchronize(NULL) == 0,
		   "cuMemAllocAsync(1 MiB)"))
		return;
	vmm_describe(p, "pool allocation");
	rs = ptr_attr(11, p);
	rsz = ptr_attr(12, p);
	start = rs & ~4095ULL;
	standin_reset();
	capture_begin();
	mr = ibv_reg_mr(pd, (void *)(uintptr_t)(p + 4096), 8192, RW);
	capture_end();
	check(mr && st->dmabuf_calls == 1 &&
		      st->dmabuf_size == ((rs + rsz + 4095) & ~4095ULL) - start &&
		      st->offset == p + 4096 - start,
	      "pool memory: an export of RANGE_START/RANGE_SIZE widened to pages (%" PRIu64 " bytes, offset %#" PRIx64 ")",
	      st->dmabuf_size, st->offset);
	dereg(mr);
	cuMemFreeAsync(p, NULL);
	cuStreamSynchronize(NULL);
}

/* The VMM and pool memory checks, then the host-memory fast path's
 * (cuda_peermem_check_fastpath.c), which use the VMM entry points. */
void check_vmm(struct ibv_pd *pd, int dev)
{
	CUmemAllocationProp p;
	bool ok;

	vmm_dev = dev;
	p = vmm_prop();
	/* Asked before check()'s arguments are read: their order of evaluation is unspecified. */
	ok = load_vmm() && cuMemGetAllocationGranularity(&gran, &p, 0) == 0 && gran;
	if (!check(ok, "CUDA VMM entry points, granularity %zu bytes", gran))
		return;
	vmm_partly_mapped(pd);
	vmm_growing(pd);
	vmm_remapped(pd);
	vmm_other_thread(pd);
	vmm_spanning(pd);
	vmm_neighbour(pd);
	pool_memory(pd);
	vmm_after_host(pd);
	fast_path_assumptions();
}


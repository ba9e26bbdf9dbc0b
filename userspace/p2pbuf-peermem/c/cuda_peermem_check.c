// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * cuda-peermem-check: the CUDA half of libp2pbuf_peermem.so, on a machine with an NVIDIA GPU
 * and no RDMA device.
 *
 * The program does what programs written for nvidia-peermem do: it allocates device memory
 * with cuMemAlloc and calls plain ibv_reg_mr() (ibv_reg_mr_iova, ibv_reg_mr_iova2) on the
 * device pointer. There is no RDMA device here, so no real verbs context: the context is a
 * stand-in provider made with libibverbs' provider interface (verbs_init_context() and
 * verbs_set_ops() from rdma-core's infiniband/driver.h, the calls a provider such as mlx5 or
 * rxe makes when a device is opened). The program's calls go through the real libibverbs
 * entry points (ibv_alloc_pd, ibv_reg_mr, ibv_reg_dmabuf_mr, ibv_dereg_mr) and reach the
 * stand-in's operations where a real provider would issue the kernel command. The stand-in
 * records what reaches it and checks the fd (a dma-buf: the filesystem magic, and the
 * exporter and size from /proc/self/fdinfo). In "accept" mode it returns a memory region, so
 * that the library's cache and deregistration run; in "no device" mode it fails with ENODEV,
 * which is what is left to fail on this machine: registration reaches ibv_reg_dmabuf_mr, and
 * only the device is missing.
 *
 *   LD_PRELOAD=libp2pbuf_peermem.so P2PBUF_PEERMEM_DEBUG=1 cuda-peermem-check [--max-gib N]
 *   cuda-peermem-check --no-preload       (the same calls without the library)
 *   ... --time-host N                     (and the cost of N host registrations)
 *   ... --vmm-only                        (only the CUDA VMM and pool memory checks)
 *   ... --host-only                       (host memory only, CUDA not loaded even if present:
 *                                          what CI runs on the build host, without a GPU)
 *
 * Output is TAP; exit status 0 if every check passed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/driver.h>
#include <infiniband/verbs.h>
#include "check_util.h"
#include "standin_provider.h"

/* struct procmap_query (include/uapi/linux/fs.h, Linux 6.11). */
struct pmq {
	uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size,
		vma_offset, inode;
	uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
	uint64_t vma_name_addr, build_id_addr;
};
#define PMQ_IOCTL _IOWR('f', 17, struct pmq)

/* ---- TAP ---- */
static int tests, failures;

static bool check(bool cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool check(bool cond, const char *fmt, ...)
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

static void capture_begin(void)
{
	fflush(stderr);
	cap = tmpfile();
	saved_stderr = dup(2);
	dup2(fileno(cap), 2);
}

/* What was captured (its first 16 KiB), not shown. */
static const char *capture_end_quiet(void)
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

static const char *capture_end(void)
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
static const struct standin_record *st;

/* ---- CUDA, loaded at run time ---- */
typedef int CUresult;
typedef uint64_t CUdeviceptr; /* unsigned long long in cuda.h: the same 64 bits */
static CUresult (*cuInit)(unsigned int);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDeviceGetName)(char *, int, int);
static CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
static CUresult (*cuCtxSetCurrent)(void *);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemAllocHost)(void **, size_t);
static CUresult (*cuMemFreeHost)(void *);
static CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
static CUresult (*cuMemGetInfo)(size_t *, size_t *);
static CUresult (*cuDriverGetVersion)(int *);

static bool load_cuda(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);

	if (!h)
		return false;
#define SYM(v, n) *(void **)&v = dlsym(h, n); if (!v) return false;
	SYM(cuInit, "cuInit");
	SYM(cuDeviceGet, "cuDeviceGet");
	SYM(cuDeviceGetName, "cuDeviceGetName");
	SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
	SYM(cuMemAlloc, "cuMemAlloc_v2");
	SYM(cuMemFree, "cuMemFree_v2");
	SYM(cuMemAllocHost, "cuMemAllocHost_v2");
	SYM(cuMemFreeHost, "cuMemFreeHost");
	SYM(cuMemAllocManaged, "cuMemAllocManaged");
	SYM(cuMemGetInfo, "cuMemGetInfo_v2");
	SYM(cuDriverGetVersion, "cuDriverGetVersion");
#undef SYM
	return true;
}

#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
static volatile int runtime_access = RW | IBV_ACCESS_RELAXED_ORDERING | (1 << 21);
static bool preload = true;

/* With P2PBUF_PEERMEM_DEBUG set, the library says what it did with each call. */
static bool library_talks(void)
{
	const char *d = getenv("P2PBUF_PEERMEM_DEBUG");

	return preload && d && *d && strcmp(d, "0");
}

/* A registration of host-side memory must reach the provider's reg_mr untouched: the address,
 * length, iova (the address, or the caller's) and access flags as the caller gave them. */
static void check_pass_through_iova(struct ibv_pd *pd, void *p, size_t len, uint64_t iova,
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

static void check_pass_through(struct ibv_pd *pd, void *p, size_t len, const char *what)
{
	check_pass_through_iova(pd, p, len, (uintptr_t)p, what);
}

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
static void check_host_memory(struct ibv_pd *pd, void *heap)
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

static void check_device_size(struct ibv_pd *pd, size_t size)
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

static void check_other_thread(struct ibv_pd *pd)
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
static void check_reused_address(struct ibv_pd *pd)
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
static CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
static CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, uint64_t, unsigned long long);
static CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
static CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
static CUresult (*cuMemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
static CUresult (*cuCtxGetCurrent)(void **);
static CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
static CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, void *);
static CUresult (*cuMemFreeAsync)(CUdeviceptr, void *);
static CUresult (*cuStreamSynchronize)(void *);

static bool load_vmm(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

	if (!h)
		return false;
#define SYM(v, n) *(void **)&v = dlsym(h, n); if (!v) return false;
	SYM(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
	SYM(cuMemCreate, "cuMemCreate");
	SYM(cuMemRelease, "cuMemRelease");
	SYM(cuMemAddressReserve, "cuMemAddressReserve");
	SYM(cuMemAddressFree, "cuMemAddressFree");
	SYM(cuMemMap, "cuMemMap");
	SYM(cuMemUnmap, "cuMemUnmap");
	SYM(cuMemSetAccess, "cuMemSetAccess");
	SYM(cuMemGetAddressRange, "cuMemGetAddressRange_v2");
	SYM(cuCtxGetCurrent, "cuCtxGetCurrent");
	SYM(cuPointerGetAttribute, "cuPointerGetAttribute");
	SYM(cuMemAllocAsync, "cuMemAllocAsync");
	SYM(cuMemFreeAsync, "cuMemFreeAsync");
	SYM(cuStreamSynchronize, "cuStreamSynchronize");
#undef SYM
	return true;
}

static int vmm_dev;
static size_t gran; /* cuMemGetAllocationGranularity(MINIMUM) */

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
static bool vmm_map(CUdeviceptr va, size_t len, uint64_t *h)
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

static void vmm_unmap(CUdeviceptr va, size_t len, uint64_t h)
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

static struct ibv_mr *vmm_reg(struct ibv_pd *pd, CUdeviceptr p, size_t len, const char *what)
{
	CUdeviceptr mb = 0;
	size_t ms = 0;

	if (cuMemGetAddressRange(&mb, &ms, p))
		printf("# cuMemGetAddressRange(%#" PRIx64 ") failed\n", p);
	return vmm_reg_in(pd, p, len, mb, ms, what);
}

static void dereg(struct ibv_mr *mr)
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

/* The host-memory fast path must not outlive the host memory: a host mapping is registered
 * twice (the second time the library knows the mapping), unmapped, and CUDA reserves and maps
 * device memory at the same address (cuMemAddressReserve with the address as its hint); a
 * registration there must be exported. Where the driver does not honour the hint, the device
 * memory is registered where it is, and the line says so. */
static void vmm_after_host(struct ibv_pd *pd)
{
	size_t span = 4 * gran;
	char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CUdeviceptr want, res = 0;
	struct ibv_mr *mr;
	uint64_t h;
	bool ok;

	printf("# --- host memory registered, unmapped, then CUDA VMM memory at the same address\n");
	if (!check(m != MAP_FAILED, "mmap %zu bytes of host memory", span))
		return;
	want = ((uintptr_t)m + gran - 1) & ~(uintptr_t)(gran - 1);
	memset((void *)(uintptr_t)want, 1, gran);
	check_pass_through(pd, (void *)(uintptr_t)want, 4096, "host memory, first registration");
	check_pass_through(pd, (void *)(uintptr_t)want, 4096,
			   "host memory, second registration (the fast path)");
	munmap(m, span);
	/* Asked before check()'s arguments are read: their order of evaluation is unspecified. */
	ok = cuMemAddressReserve(&res, gran, 0, want, 0) == 0 && vmm_map(res, gran, &h);
	if (!check(ok, "reserve and map %zu bytes of device memory with the hint %#" PRIx64
		       ": at %#" PRIx64 " (%s)",
		   gran, want, res, res == want ? "the host memory's address" : "elsewhere: the driver did not take the hint"))
		return;
	mr = vmm_reg(pd, res, 4096, res == want ? "device memory where host memory was" :
						     "device memory (the hint was not honoured)");
	dereg(mr);
	vmm_unmap(res, gran, h);
	cuMemAddressFree(res, gran);
}

/* The mapping that holds addr (PROCMAP_QUERY): "start-end perms name", and whether it is what
 * the library's fast path caches as plain host memory (private, readable or writable, not a
 * /dev file or a dma-buf). */
static bool vma_of(uint64_t addr, char *out, size_t n)
{
	char name[256] = "";
	struct pmq q = { .size = sizeof(q), .query_addr = addr, .vma_name_size = sizeof(name),
			 .vma_name_addr = (uintptr_t)name };
	int fd = open("/proc/self/maps", O_RDONLY), r = fd < 0 ? -1 : ioctl(fd, PMQ_IOCTL, &q);
	char perms[5] = { q.vma_flags & 1 ? 'r' : '-', q.vma_flags & 2 ? 'w' : '-',
			  q.vma_flags & 4 ? 'x' : '-', q.vma_flags & 8 ? 's' : 'p', 0 };

	if (fd >= 0)
		close(fd);
	if (r) {
		snprintf(out, n, "no mapping (PROCMAP_QUERY: %s)", strerror(errno));
		return false;
	}
	snprintf(out, n, "%" PRIx64 "-%" PRIx64 " %s %s", q.vma_start, q.vma_end, perms,
		 name[0] ? name : "[anonymous]");
	return (perms[0] == 'r' || perms[1] == 'w') && perms[3] == 'p' && strncmp(name, "/dev/", 5) &&
	       strncmp(name, "/dmabuf:", 8);
}

/* What the host-memory fast path rests on (docs/cuda.md): device memory is never in a plain
 * host mapping, and a new CUDA reservation goes through the library's mmap (a new
 * generation, which empties the fast path's cache). */
static void fast_path_assumptions(void)
{
	uint64_t (*gen)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "p2pbuf_peermem_generation");
	CUdeviceptr dev = 0, big = 0, vmm = 0, pool = 0;
	size_t big_len = (size_t)256 << 30;
	uint64_t g0, g1, h = 0;
	char line[512];
	bool plain, vmm_ok;

	printf("# --- what the host-memory fast path rests on\n");
	if (!gen) {
		printf("# this library has no host-memory fast path (no p2pbuf_peermem_generation)\n");
		return;
	}
	g0 = gen();
	/* Asked before check()'s arguments are read. */
	vmm_ok = cuMemAddressReserve(&big, big_len, 0, 0, 0) == 0;
	g1 = gen();
	check(vmm_ok && g1 > g0,
	      "a new CUDA reservation of 256 GiB reached the library's mmap: generation %" PRIu64 " -> %" PRIu64,
	      g0, g1);
	if (vmm_ok) {
		plain = vma_of(big + big_len / 2, line, sizeof(line));
		check(!plain, "the middle of the reservation %#" PRIx64 " is not plain host memory: %s", big, line);
	}
	if (cuMemAlloc(&dev, 2 << 20) == 0) {
		plain = vma_of(dev, line, sizeof(line));
		check(!plain, "cuMemAlloc memory %#" PRIx64 " is not in plain host memory: %s", dev, line);
		cuMemFree(dev);
	}
	if (cuMemAddressReserve(&vmm, gran, 0, 0, 0) == 0 && vmm_map(vmm, gran, &h)) {
		plain = vma_of(vmm, line, sizeof(line));
		check(!plain, "CUDA VMM memory (mapped) %#" PRIx64 " is not in plain host memory: %s", vmm, line);
		vmm_unmap(vmm, gran, h);
		cuMemAddressFree(vmm, gran);
	}
	if (cuMemAllocAsync(&pool, 1 << 20, NULL) == 0 && cuStreamSynchronize(NULL) == 0) {
		plain = vma_of(pool, line, sizeof(line));
		check(!plain, "pool memory %#" PRIx64 " is not in plain host memory: %s", pool, line);
		cuMemFreeAsync(pool, NULL);
		cuStreamSynchronize(NULL);
	}
	if (vmm_ok)
		cuMemAddressFree(big, big_len);
}

static void check_vmm(struct ibv_pd *pd, int dev)
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

static void time_host_memory(struct ibv_pd *pd, void *host, int reps)
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

int main(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_device **list;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	Dl_info info;
	double max_gib = 64;
	int n, devs, time_host = 0;
	bool vmm_only = false, host_only = false;
	void *host;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--no-preload"))
			preload = false;
		else if (!strcmp(argv[i], "--max-gib") && i + 1 < argc)
			max_gib = atof(argv[++i]);
		else if (!strcmp(argv[i], "--vmm-only"))
			vmm_only = true;
		else if (!strcmp(argv[i], "--host-only"))
			host_only = true;
		else if (!strcmp(argv[i], "--time-host") && i + 1 < argc)
			time_host = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: cuda-peermem-check [--no-preload] [--max-gib N] [--time-host N] [--vmm-only | --host-only]\n");
			return 2;
		}
	}
	printf("TAP version 13\n");
	if (dladdr(dlsym(RTLD_DEFAULT, "ibv_reg_mr"), &info))
		printf("# ibv_reg_mr comes from %s\n", info.dli_fname);
	check(preload == (dladdr(dlsym(RTLD_DEFAULT, "ibv_reg_mr"), &info) &&
			  strstr(info.dli_fname, "libp2pbuf_peermem")),
	      preload ? "the library is preloaded (ibv_reg_mr is its)" :
			"the library is not preloaded (ibv_reg_mr is libibverbs')");
	list = ibv_get_device_list(&devs);
	printf("# RDMA devices on this machine: %d\n", list ? devs : -1);
	if (list)
		ibv_free_device_list(list);

	/* The stand-in provider's context, as a provider's alloc_context makes one. */
	ctx = standin_open();
	if (!ctx)
		return 2;
	st = standin_rec();
	pd = ibv_alloc_pd(ctx);
	check(pd && pd->context == ctx, "ibv_alloc_pd on the stand-in context");
	if (!pd)
		return 1;

	/* Host memory, in a process without CUDA yet. */
	host = malloc(1 << 20);
	check_pass_through(pd, host, 1 << 20, "malloc'd host memory");

	if (host_only) {
		check_host_memory(pd, host);
		check(!dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD),
		      "libcuda.so.1 was never loaded (the library does not load it)");
	} else if (!load_cuda()) {
		printf("# no libcuda.so.1 here: the CUDA checks are not run\n");
	} else {
		char name[128] = "";
		int dev, ver = 0;
		void *cctx, *pinned;
		CUdeviceptr managed, small;
		size_t free_b = 0, total_b = 0;

		check(cuInit(0) == 0 && cuDeviceGet(&dev, 0) == 0 &&
			      cuDevicePrimaryCtxRetain(&cctx, dev) == 0 && cuCtxSetCurrent(cctx) == 0,
		      "CUDA initialised");
		cuDeviceGetName(name, sizeof(name), dev);
		cuDriverGetVersion(&ver);
		cuMemGetInfo(&free_b, &total_b);
		printf("# %s, driver API %d.%d, %.1f GiB free of %.1f GiB\n", name, ver / 1000,
		       ver % 1000 / 10, free_b / 1073741824.0, total_b / 1073741824.0);

		if (vmm_only) {
			if (preload)
				check_vmm(pd, dev);
			goto done;
		}
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

		/* 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB, 4 GiB, 64 GiB. */
		for (size_t size = 4096; size <= (size_t)(max_gib * 1073741824.0); size *= 16)
			check_device_size(pd, size);

		if (preload) {
			check_other_thread(pd);
			check_reused_address(pd);
			check_vmm(pd, dev);
		}

		/* Run-time access flags compile to ibv_reg_mr_iova2; optional flags. */
		if (preload && cuMemAlloc(&small, 2 << 20) == 0) {
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
	}

done:
	/* Cost for host memory: registrations and deregistrations of 4 KiB, in batches of
	 * TIME_BATCH; the median of the batches (run it without P2PBUF_PEERMEM_DEBUG, which
	 * prints a line per call). */
	if (time_host > 0)
		time_host_memory(pd, host, time_host);

	free(host);
	ibv_dealloc_pd(pd);
	standin_close(ctx);
	printf("1..%d\n# %d passed, %d failed\n", tests, tests - failures, failures);
	return failures ? 1 : 0;
}

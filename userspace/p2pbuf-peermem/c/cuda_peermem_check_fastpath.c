// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * cuda-peermem-check (cuda_peermem_check.c): the library's host-memory fast path. Host memory
 * registered, unmapped and replaced by device memory at the same address; and what the fast
 * path rests on (docs/cuda.md).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_peermem_check.h"

/* The host-memory fast path must not outlive the host memory: a host mapping is registered
 * twice (the second time the library knows the mapping), unmapped, and CUDA reserves and maps
 * device memory at the same address (cuMemAddressReserve with the address as its hint); a
 * registration there must be exported. Where the driver does not honour the hint, the device
 * memory is registered where it is, and the line says so. */
void vmm_after_host(struct ibv_pd *pd)
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
void fast_path_assumptions(void)
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


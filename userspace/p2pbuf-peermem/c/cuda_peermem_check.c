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
 *
 * This file has main; the checks are in cuda_peermem_check_{common,host,device,vmm,fastpath}.c
 * (cuda_peermem_check.h says what each holds). Build all of them with standin_provider.c.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_peermem_check.h"

/*
 * The checker: options, the stand-in provider's context, then each family of checks.
 * Over 100 lines on purpose: it is the table of contents of the TAP output, each family of
 * checks called in the order its lines come (the families live in the other files).
 */
int main(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_device **list;
	struct ibv_pd *pd;
	Dl_info info;
	double max_gib = 64;
	int devs, time_host = 0;
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
		void *cctx;
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
		check_cuda_host_memory(pd, host);

		/* 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB, 4 GiB, 64 GiB. */
		for (size_t size = 4096; size <= (size_t)(max_gib * 1073741824.0); size *= 16)
			check_device_size(pd, size);

		if (preload) {
			check_other_thread(pd);
			check_reused_address(pd);
			check_vmm(pd, dev);
			check_access_flags_and_small(pd);
		}
	}

done:
	/* Cost for host memory: registrations and deregistrations of 4 KiB, in batches of
	 * TIME_BATCH (cuda_peermem_check_host.c); the median of the batches (run it without
	 * P2PBUF_PEERMEM_DEBUG, which prints a line per call). */
	if (time_host > 0)
		time_host_memory(pd, host, time_host);

	free(host);
	ibv_dealloc_pd(pd);
	standin_close(ctx);
	printf("1..%d\n# %d passed, %d failed\n", tests, tests - failures, failures);
	return failures ? 1 : 0;
}

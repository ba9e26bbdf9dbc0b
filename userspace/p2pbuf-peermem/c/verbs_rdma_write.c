// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * verbs-rdma-write: one RDMA WRITE over an RDMA device's loopback into memory this program
 * maps itself, checked by reading that memory back. Written against libibverbs alone: it knows
 * nothing of dma-bufs, CUDA or p2pbuf, as the programs that libp2pbuf_peermem.so is for.
 *
 *   verbs-rdma-write --dev rxe0 --gid-index 1 (--fd PID:FD | --anon) --size N
 *                    [--offset O] [--length L] [--seed S] [--api reg_mr|iova2|iova]
 *                    [--iova V] [--close-fd] [--read-only] [--second-mr] [--reg-reps N]
 *
 * The target: --fd takes file descriptor FD of process PID (pidfd_getfd) and maps SIZE bytes
 * of it MAP_SHARED, as a program maps any file it is handed; --anon maps anonymous memory
 * (host memory). The range [O, O + L) of it is registered with a plain ibv_reg_mr() call whose
 * access flags are a constant, which verbs.h compiles to a call of the symbol ibv_reg_mr
 * (--api reg_mr, the default); or with ibv_reg_mr() whose access flags are known only at run
 * time, which verbs.h compiles to ibv_reg_mr_iova2 (--api iova2); or with ibv_reg_mr_iova()
 * and an iova (--api iova, --iova; default the address). A host buffer with the lab pattern
 * (byte i = (i*13 + seed + (i>>12)) & 0xff) is RDMA-written into the range from a second QP
 * on the same port, addressed as programs do: mr->addr (or the iova) and mr->rkey. Then the
 * range is read through the mapping and compared.
 *
 * --close-fd closes the fd right after mmap (before registering). --read-only maps it PROT_READ
 * (so registering it for writes must fail, as for any read-only memory). --second-mr registers a
 * second memory region over the first half of the range and writes seed + 1 through it first.
 * --reg-reps N times N more registrations and deregistrations of the range (median printed).
 * The number of open fds is printed before registering and after deregistering.
 *
 * Exit status: 0 written and verified; 2 usage or set-up; 3 registering the target failed
 * (stdout: "REG_FAILED errno=N"); 4 the RDMA WRITE failed; 5 the data is not the pattern;
 * 6 the memory region does not describe what was registered.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check_util.h"
#include "../../../tests/selftests/p2pbuf_pattern.h"
#include "../../../tests/selftests/verbs_qp.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

static const char *dev_name;
static int gid_index = -1;
static pid_t fd_pid = -1;
static int fd_num = -1;
static int anon;
static size_t size, offset, length;
static unsigned int seed = 1;
static const char *api = "reg_mr";
static uint64_t iova;
static int have_iova, close_fd, read_only, second_mr, reg_reps;

static void die(const char *what)
{
	fprintf(stderr, "verbs-rdma-write: %s: %s (errno %d)\n", what, strerror(errno), errno);
	exit(2);
}

static size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 0);

	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	if (*end) {
		fprintf(stderr, "verbs-rdma-write: bad size %s\n", s);
		exit(2);
	}
	return (size_t)v;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Run-time access flags: the compiler cannot see their value. */
static volatile int runtime_access =
	IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

static struct ibv_mr *reg_target(struct ibv_pd *pd, void *addr, size_t len, const char **how)
{
	if (!strcmp(api, "reg_mr")) {
		*how = "ibv_reg_mr";
		return ibv_reg_mr(pd, addr, len,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					  IBV_ACCESS_REMOTE_READ);
	}
	if (!strcmp(api, "iova2")) {
		*how = "ibv_reg_mr (access flags known at run time: ibv_reg_mr_iova2)";
		return ibv_reg_mr(pd, addr, len, runtime_access);
	}
	*how = "ibv_reg_mr_iova";
	return ibv_reg_mr_iova(pd, addr, len, have_iova ? iova : (uint64_t)(uintptr_t)addr,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_REMOTE_READ);
}

/* One signaled RDMA WRITE of len bytes from src into (raddr, rkey); 0 on success. */
static int rdma_write(struct ibv_qp *qp, struct ibv_cq *cq, void *src, uint32_t lkey,
		      size_t len, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = (uint32_t)len, .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	struct ibv_wc wc;
	double t0 = now_us();
	int n;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad)) {
		fprintf(stderr, "verbs-rdma-write: ibv_post_send: %s\n", strerror(errno));
		return -1;
	}
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
		if (now_us() - t0 > 300e6) {
			fprintf(stderr, "verbs-rdma-write: no completion after 300 s\n");
			return -1;
		}
		usleep(1000);
	}
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "verbs-rdma-write: RDMA WRITE completed with %s\n",
			n < 0 ? "a polling error" : ibv_wc_status_str(wc.status));
		return -1;
	}
	printf("RDMA WRITE of %zu bytes to %#" PRIx64 " rkey %#x: done in %.0f ms\n", len, raddr,
	       rkey, (now_us() - t0) / 1e3);
	return 0;
}

/* Index of the first byte of [p, p + len) that is not p2pbuf_pattern(seed), or -1. */
static long long mismatch(const volatile uint8_t *p, size_t len, unsigned int s)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != p2pbuf_pattern(i, s))
			return (long long)i;
	return -1;
}

/*
 * verbs-rdma-write: one RDMA WRITE with plain verbs.
 * Over 100 lines on purpose: the program is the example docs/rdma.md points to, every verbs
 * call in the order an application makes them (device, PD, memory, MR, CQ and QP, the
 * exchange over TCP, the QP transitions, the WRITE and its check), with nothing to look up.
 */
int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qa, *qb;
	struct ibv_mr *smr, *tmr, *tmr2 = NULL;
	struct ibv_qp_init_attr qia = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	const char *how;
	uint8_t *map, *target, *src;
	long long bad;
	int n, fd = -1, fds_before, fds_after;
	double t0, treg;

	for (int i = 1; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(o, "--anon")) { anon = 1; continue; }
		if (!strcmp(o, "--close-fd")) { close_fd = 1; continue; }
		if (!strcmp(o, "--read-only")) { read_only = 1; continue; }
		if (!strcmp(o, "--second-mr")) { second_mr = 1; continue; }
		if (!v) {
			fprintf(stderr, "verbs-rdma-write: %s needs a value (see the source's head)\n", o);
			return 2;
		}
		i++;
		if (!strcmp(o, "--dev")) dev_name = v;
		else if (!strcmp(o, "--gid-index")) gid_index = atoi(v);
		else if (!strcmp(o, "--fd")) {
			if (sscanf(v, "%d:%d", &fd_pid, &fd_num) != 2) {
				fprintf(stderr, "verbs-rdma-write: --fd wants PID:FD\n");
				return 2;
			}
		} else if (!strcmp(o, "--size")) size = parse_size(v);
		else if (!strcmp(o, "--offset")) offset = parse_size(v);
		else if (!strcmp(o, "--length")) length = parse_size(v);
		else if (!strcmp(o, "--seed")) seed = (unsigned int)atoi(v);
		else if (!strcmp(o, "--api")) api = v;
		else if (!strcmp(o, "--iova")) { iova = strtoull(v, NULL, 0); have_iova = 1; }
		else if (!strcmp(o, "--reg-reps")) reg_reps = atoi(v);
		else {
			fprintf(stderr, "verbs-rdma-write: unknown option %s\n", o);
			return 2;
		}
	}
	if (!length)
		length = size - offset;
	if (gid_index < 0 || !size || offset + length > size || (anon == (fd_pid >= 0)) ||
	    (strcmp(api, "reg_mr") && strcmp(api, "iova2") && strcmp(api, "iova"))) {
		fprintf(stderr, "verbs-rdma-write: usage: see the head of verbs_rdma_write.c\n");
		return 2;
	}

	if (anon) {
		map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (map == MAP_FAILED)
			die("mmap of anonymous memory");
		memset(map, 0, size);
		printf("target: %zu bytes of anonymous memory at %p\n", size, (void *)map);
	} else {
		int pfd = (int)syscall(SYS_pidfd_open, fd_pid, 0);

		if (pfd < 0)
			die("pidfd_open");
		fd = (int)syscall(SYS_pidfd_getfd, pfd, fd_num, 0);
		if (fd < 0)
			die("pidfd_getfd");
		close(pfd);
		map = mmap(NULL, size, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			   0);
		if (map == MAP_FAILED)
			die("mmap of the fd");
		printf("target: fd %d (fd %d of pid %d) mapped MAP_SHARED%s at %p, %zu bytes\n", fd,
		       fd_num, (int)fd_pid, read_only ? " read-only" : "", (void *)map, size);
		if (close_fd) {
			close(fd);
			printf("closed fd %d; the mapping stays\n", fd);
		}
	}
	target = map + offset;
	/* Something that is not the pattern, so that a write that lands nowhere shows. */
	if (!read_only)
		memset(target, 0xee, length);

	list = ibv_get_device_list(&n);
	if (!list)
		die("ibv_get_device_list");
	for (int i = 0; i < n && !ctx; i++)
		if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name))
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		fprintf(stderr, "verbs-rdma-write: no RDMA device %s (of %d)\n",
			dev_name ? dev_name : "", n);
		return 2;
	}
	if (ibv_query_port(ctx, 1, &pa) || ibv_query_gid(ctx, 1, gid_index, &gid))
		die("ibv_query_port/gid");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !cq)
		die("ibv_alloc_pd/create_cq");
	qia.send_cq = qia.recv_cq = cq;
	qa = ibv_create_qp(pd, &qia);
	qb = ibv_create_qp(pd, &qia);
	if (!qa || !qb)
		die("ibv_create_qp");

	if (posix_memalign((void **)&src, 4096, length))
		die("posix_memalign");
	for (size_t i = 0; i < length; i++)
		src[i] = p2pbuf_pattern(i, seed);
	smr = ibv_reg_mr(pd, src, length, IBV_ACCESS_LOCAL_WRITE);
	if (!smr)
		die("ibv_reg_mr of the source (host memory)");

	fds_before = count_fds();
	printf("open fds before registering the target: %d\n", fds_before);
	t0 = now_us();
	tmr = reg_target(pd, target, length, &how);
	treg = now_us() - t0;
	if (!tmr) {
		int e = errno;

		fprintf(stderr, "verbs-rdma-write: %s(%p, %zu) failed: %s (errno %d)\n", how,
			(void *)target, length, strerror(e), e);
		printf("REG_FAILED errno=%d\n", e);
		return 3;
	}
	printf("registered %p+%zu with %s in %.0f us: lkey %#x rkey %#x, mr->addr %p mr->length %zu\n",
	       (void *)target, length, how, treg, tmr->lkey, tmr->rkey, tmr->addr, tmr->length);
	if (tmr->addr != (void *)target || tmr->length != length) {
		fprintf(stderr, "verbs-rdma-write: the memory region says %p+%zu, not %p+%zu\n",
			tmr->addr, tmr->length, (void *)target, length);
		return 6;
	}
	if (reg_reps > 0) {
		double *t = calloc((size_t)reg_reps, sizeof(*t));

		for (int r = 0; r < reg_reps; r++) {
			struct ibv_mr *m;
			const char *h;

			t0 = now_us();
			m = reg_target(pd, target, length, &h);
			t[r] = now_us() - t0;
			if (!m || ibv_dereg_mr(m))
				die("repeated registration");
		}
		qsort(t, (size_t)reg_reps, sizeof(*t), cmp_double);
		printf("%d more registrations with %s: median %.0f us (min %.0f, max %.0f)\n",
		       reg_reps, how, t[reg_reps / 2], t[0], t[reg_reps - 1]);
		free(t);
	}

	if (verbs_qp_connect(qa, qb->qp_num, &gid, (uint8_t)gid_index, 1, pa.active_mtu, 14) ||
	    verbs_qp_connect(qb, qa->qp_num, &gid, (uint8_t)gid_index, 1, pa.active_mtu, 14))
		die("ibv_modify_qp (INIT, RTR, RTS)");

	if (second_mr) {
		size_t half = length / 2;
		uint8_t *s2 = malloc(half);
		struct ibv_mr *s2mr;

		tmr2 = reg_target(pd, target, half, &how);
		if (!tmr2) {
			printf("REG_FAILED errno=%d\n", errno);
			fprintf(stderr, "verbs-rdma-write: second %s failed: %s\n", how, strerror(errno));
			return 3;
		}
		printf("second memory region %p+%zu: lkey %#x rkey %#x\n", (void *)target, half,
		       tmr2->lkey, tmr2->rkey);
		for (size_t i = 0; i < half; i++)
			s2[i] = p2pbuf_pattern(i, seed + 1);
		s2mr = ibv_reg_mr(pd, s2, half, IBV_ACCESS_LOCAL_WRITE);
		if (!s2mr)
			die("ibv_reg_mr of the second source");
		if (rdma_write(qa, cq, s2, s2mr->lkey, half,
			       !strcmp(api, "iova") && have_iova ? iova : (uintptr_t)tmr2->addr,
			       tmr2->rkey))
			return 4;
		bad = mismatch(target, half, seed + 1);
		if (bad >= 0) {
			printf("MISMATCH at byte %lld of the second region's write\n", bad);
			return 5;
		}
		printf("verified %zu bytes of seed %u through the mapping (second region)\n", half,
		       seed + 1);
		ibv_dereg_mr(s2mr);
		free(s2);
	}

	if (rdma_write(qa, cq, src, smr->lkey, length,
		       !strcmp(api, "iova") && have_iova ? iova : (uintptr_t)tmr->addr, tmr->rkey))
		return 4;
	bad = mismatch(target, length, seed);
	if (bad >= 0) {
		printf("MISMATCH at byte %lld: %#x, the pattern has %#x\n", bad, target[bad],
		       p2pbuf_pattern((size_t)bad, seed));
		return 5;
	}
	printf("verified %zu bytes of seed %u through the mapping at offset %zu\n", length, seed,
	       offset);

	if (tmr2 && ibv_dereg_mr(tmr2))
		die("ibv_dereg_mr (second)");
	if (ibv_dereg_mr(tmr))
		die("ibv_dereg_mr");
	fds_after = count_fds();
	printf("open fds after deregistering: %d (before: %d)\n", fds_after, fds_before);
	ibv_dereg_mr(smr);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	munmap(map, size);
	return 0;
}

/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Two RC QPs on one port connected to each other (rxe loops back), RDMA WRITEs between them,
 * and the device they run on: the selftests' verbs helpers (verbs_dmabuf_mr.c,
 * dma_buf_sample.c).
 */
#ifndef P2PBUF_VERBS_PAIR_H
#define P2PBUF_VERBS_PAIR_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "p2pbuf_test.h"
#include "verbs_qp.h"

/* The first RDMA device, opened; after adding rxe0 on eth0 when there is none. */
static inline struct ibv_context *verbs_first_device(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	int n = 0;

	list = ibv_get_device_list(&n);
	if ((!list || !n) &&
	    !system("ip link set eth0 up && rdma link add rxe0 type rxe netdev eth0 2>/dev/null")) {
		ibv_free_device_list(list);
		list = ibv_get_device_list(&n);
	}
	if (list && n)
		ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	return ctx;
}

/*
 * A RoCE v2 GID of port 1, the IPv4-mapped one if there is one, once the port is active;
 * its index, or -1.
 */
static inline int verbs_roce_gid(struct ibv_context *ctx, union ibv_gid *gid)
{
	static const uint8_t v4[12] = { [10] = 0xff, [11] = 0xff };
	struct ibv_port_attr pa = {};
	struct ibv_gid_entry e;
	double t0 = now();
	int i, found = -1;

	while (!ibv_query_port(ctx, 1, &pa) && pa.state != IBV_PORT_ACTIVE && now() - t0 < 10)
		usleep(100000);
	for (i = 0; i < pa.gid_tbl_len; i++) {
		if (ibv_query_gid_ex(ctx, 1, i, &e, 0) || e.gid_type != IBV_GID_TYPE_ROCE_V2)
			continue;
		if (found < 0 || !memcmp(e.gid.raw, v4, sizeof(v4))) {
			found = i;
			*gid = e.gid;
		}
	}
	return found;
}

/* Two RC QPs on one CQ, connected to each other through port 1 (rxe loops back). */
struct verbs_qp_pair {
	struct ibv_cq *cq;
	struct ibv_qp *qp[2];
};

static inline void verbs_qp_pair_destroy(struct verbs_qp_pair *p)
{
	for (int i = 0; i < 2; i++)
		if (p->qp[i])
			ibv_destroy_qp(p->qp[i]);
	if (p->cq)
		ibv_destroy_cq(p->cq);
	memset(p, 0, sizeof(*p));
}

/* The pair on pd's device: 0, or -1 (no RoCE v2 GID, or a verbs call failed: errno). */
static inline int verbs_qp_pair_create(struct ibv_pd *pd, struct verbs_qp_pair *p)
{
	struct ibv_qp_init_attr ia = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	union ibv_gid gid;
	int gi = verbs_roce_gid(pd->context, &gid);

	memset(p, 0, sizeof(*p));
	if (gi < 0)
		return -1;
	p->cq = ibv_create_cq(pd->context, 8, NULL, NULL, 0);
	if (!p->cq)
		return -1;
	ia.send_cq = ia.recv_cq = p->cq;
	p->qp[0] = ibv_create_qp(pd, &ia);
	p->qp[1] = ibv_create_qp(pd, &ia);
	/* 4.096 us << 19 = 2.1 s: the requester does not give up before rxe's 1 s fence bound. */
	if (!p->qp[0] || !p->qp[1] ||
	    verbs_qp_connect(p->qp[0], p->qp[1]->qp_num, &gid, gi, 1, IBV_MTU_1024, 19) ||
	    verbs_qp_connect(p->qp[1], p->qp[0]->qp_num, &gid, gi, 1, IBV_MTU_1024, 19)) {
		verbs_qp_pair_destroy(p);
		return -1;
	}
	return 0;
}

/* Posts an RDMA WRITE of the first len bytes of src into (0, rkey) from the pair's first QP. */
static inline int verbs_post_write(struct verbs_qp_pair *p, struct ibv_mr *src, uint32_t len,
				   uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src->addr, .length = len, .lkey = src->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = 0, .rkey = rkey },
	}, *bad;

	return ibv_post_send(p->qp[0], &wr, &bad);
}

/* The status of the next completion, or -1 if none came within secs. */
static inline int verbs_poll_status(struct verbs_qp_pair *p, double secs)
{
	struct ibv_wc wc;
	double t0 = now();

	do {
		if (ibv_poll_cq(p->cq, 1, &wc) == 1)
			return wc.status;
		usleep(1000);
	} while (now() - t0 < secs);
	return -1;
}

static inline const char *verbs_wc_str(int st)
{
	return st < 0 ? "no completion" : ibv_wc_status_str(st);
}

#endif /* P2PBUF_VERBS_PAIR_H */

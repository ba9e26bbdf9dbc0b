/* SPDX-License-Identifier: GPL-2.0 */
/*
 * RC QPs brought to RTS towards a peer QP on the same port (rxe loops back), for the verbs
 * tests of the lab: tests/selftests/verbs_dmabuf_mr.c, tests/selftests/dma_buf_sample.c and
 * the peermem checker (userspace/p2pbuf-peermem/c/verbs_rdma_write.c, which uses
 * verbs_qp_connect() only).
 */
#ifndef P2PBUF_VERBS_QP_H
#define P2PBUF_VERBS_QP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

/*
 * INIT, RTR towards (gid, dest), RTS; remote write and read allowed. @timeout is the local ACK
 * timeout exponent (4.096 us << timeout), with 7 retries. Returns 0 or the failing
 * ibv_modify_qp()'s result.
 */
static inline int verbs_qp_connect(struct ibv_qp *qp, uint32_t dest, const union ibv_gid *gid,
				   uint8_t gid_index, uint8_t port, enum ibv_mtu mtu,
				   uint8_t timeout)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = port,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	int ret;

	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS);
	if (ret)
		return ret;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = port;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			    IBV_QP_MIN_RNR_TIMER);
	if (ret)
		return ret;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* CLOCK_MONOTONIC in seconds. */
static inline double verbs_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

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
	double t0 = verbs_now();
	int i, found = -1;

	while (!ibv_query_port(ctx, 1, &pa) && pa.state != IBV_PORT_ACTIVE && verbs_now() - t0 < 10)
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
	double t0 = verbs_now();

	do {
		if (ibv_poll_cq(p->cq, 1, &wc) == 1)
			return wc.status;
		usleep(1000);
	} while (verbs_now() - t0 < secs);
	return -1;
}

static inline const char *verbs_wc_str(int st)
{
	return st < 0 ? "no completion" : ibv_wc_status_str(st);
}

#endif /* P2PBUF_VERBS_QP_H */

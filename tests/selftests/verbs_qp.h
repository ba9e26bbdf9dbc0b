/* SPDX-License-Identifier: GPL-2.0 */
/*
 * An RC QP brought to RTS towards a peer QP on the same port (rxe loops back), for the verbs
 * programs of the lab: the selftests (through verbs_pair.h) and the peermem checker
 * (userspace/p2pbuf-peermem/c/verbs_rdma_write.c).
 */
#ifndef P2PBUF_VERBS_QP_H
#define P2PBUF_VERBS_QP_H

#include <stddef.h>
#include <stdint.h>
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
	struct {
		struct ibv_qp_attr attr;
		int mask;
	} steps[] = {
		{
			{
				.qp_state = IBV_QPS_INIT,
				.port_num = port,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
			},
			IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
		},
		{
			{
				.qp_state = IBV_QPS_RTR,
				.path_mtu = mtu,
				.dest_qp_num = dest,
				.max_dest_rd_atomic = 1,
				.min_rnr_timer = 12,
				.ah_attr = {
					.is_global = 1,
					.grh = { .dgid = *gid, .sgid_index = gid_index, .hop_limit = 1 },
					.port_num = port,
				},
			},
			IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
		},
		{
			{
				.qp_state = IBV_QPS_RTS,
				.timeout = timeout,
				.retry_cnt = 7,
				.rnr_retry = 7,
				.max_rd_atomic = 1,
			},
			IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
		},
	};
	size_t i;
	int ret;

	for (i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		ret = ibv_modify_qp(qp, &steps[i].attr, steps[i].mask);
		if (ret)
			return ret;
	}
	return 0;
}

#endif /* P2PBUF_VERBS_QP_H */

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# p2pbuf rdma serve/write/read with a host-memory MR (ibv_reg_mr): the comparison point of the
# dma-buf path. Several MiB at several offsets, verified by the server's CPU, read back by
# RDMA READ; then the HCA's refusals (past the end of the MR, a read-only MR) and
# registration errors.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 11
rxe_test

SIZE=16M
PORT=7471
# 5 clients: 3 writes, 2 reads.
if ! serve_bg /tmp/serve.txt 30 --port $PORT --mem host --size $SIZE --clients 5 --timeout 120; then
	comment /tmp/serve.txt
	ktap_fail "p2pbuf rdma serve --mem host: registered and listening"
	kill $srv 2>/dev/null
	ktap_exit
fi
comment /tmp/serve.txt
ktap_check "p2pbuf rdma serve --mem host: ibv_reg_mr of 16 MiB, listening" \
	grep -q "registered on rxe0 with ibv_reg_mr" /tmp/serve.txt

# write SIZE OFFSET SEED: an RDMA WRITE the server verifies.
write() {
	rdma_op_check write "$1" "$2" "$3" "server: verified the pattern" \
		"RDMA WRITE of $1 at offset $2 (seed $3), verified by the server" "RDMA WRITE of $1 at offset $2 (seed $3)"
}
# read SIZE OFFSET SEED: an RDMA READ that must return the pattern written before.
read_back() {
	rdma_op_check read "$1" "$2" "$3" "(equal)" \
		"RDMA READ of $1 at offset $2 returns seed $3's pattern" "RDMA READ of $1 at offset $2 (seed $3)"
}
write 4M 0 1
write 5M 4M 2
write 3M 13M 3
read_back 4M 0 1
# 8 MiB from 4 MiB: seed 2's pattern up to 9 MiB, then other bytes. The client must report
# the first byte that is not the pattern (at 9 MiB) and fail; the server agrees on checksums.
rdma_client 120 /tmp/r.txt read --size 8M --offset 4M --pattern 2
if [ $rc -eq 1 ] && grep -q "read data is not the pattern from offset 9437184" /tmp/r.txt &&
	grep -q "(equal)" /tmp/r.txt; then
	ktap_ok "RDMA READ past a write's end: first non-pattern byte at 9 MiB, checksums equal"
else
	ktap_fail "RDMA READ past a write's end: exit $rc, no mismatch reported at 9 MiB"
fi
serve_wait /tmp/serve.txt
ktap_check "server: 3 writes and a read verified, the read past the write reported (exit $src)" \
	grep -q "done: 4 client(s) verified, 1 failed" /tmp/serve.txt

# The HCA refuses an RDMA WRITE past the end of the MR, and one into a read-only MR.
serve_bg /tmp/serve.txt 30 --port $PORT --mem host --size 1M --access lw,rr --clients 2 --timeout 60
rdma_client 60 /tmp/w.txt write --size 64k --offset 1M --pattern 5 --unchecked
ktap_check "RDMA WRITE past the end of the MR: IBV_WC_REM_ACCESS_ERR (exit $rc)" \
	sh -c "[ $rc -eq 1 ] && grep -q IBV_WC_REM_ACCESS_ERR /tmp/w.txt"
rdma_client 60 /tmp/w.txt write --size 64k --offset 0 --pattern 5
ktap_check "RDMA WRITE into a read-only MR (lw,rr): IBV_WC_REM_ACCESS_ERR (exit $rc)" \
	sh -c "[ $rc -eq 1 ] && grep -q IBV_WC_REM_ACCESS_ERR /tmp/w.txt"
serve_wait /tmp/serve.txt

# Registration of host memory with REMOTE_WRITE but no LOCAL_WRITE: the kernel's EINVAL.
reg_errno 22 "ibv_reg_mr of host memory with access rw (no LOCAL_WRITE)" --mem host --size 64k --access rw
ktap_exit

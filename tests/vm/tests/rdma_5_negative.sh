#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# dma-buf MRs on rxe0: the registrations that must be refused, and the RDMA operations that
# the responder must refuse, beyond rdma_3's (a regular file's fd, offset or length past the
# end of the buffer, REMOTE_WRITE without LOCAL_WRITE, iova and offset at different page
# offsets). Each refusal must come with the errno or work completion status of
# docs/rdma.md's table, never a crash; the boundary cases next to each refusal must work, so
# that the refusal is about the case and not about something else.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 18
rxe_test

# reg_ok NAME ARGS...: `p2pbuf rdma reg ARGS` registers with ibv_reg_dmabuf_mr.
reg_ok() {
	_name=$1
	shift
	p2pbuf rdma reg "$@" >/tmp/reg.txt 2>&1
	_rc=$?
	comment /tmp/reg.txt
	ktap_check "$_name: registered (exit $_rc)" grep -q "with ibv_reg_dmabuf_mr" /tmp/reg.txt
}

# iova + length must not wrap (rxe_reg_user_mr_dmabuf: check_add_overflow): EINVAL. The
# highest range that does not wrap registers.
reg_ok "iova 0xffffffffffffe000 + 4 KiB (ends at 2^64 - 4 KiB)" \
	--mem udmabuf --size 1M --iova 0xffffffffffffe000 --length 4k
reg_errno 22 "iova 0xfffffffffffff000 + 4 KiB wraps to 0" \
	--mem udmabuf --size 1M --iova 0xfffffffffffff000 --length 4k
reg_errno 22 "iova 0xffffffffffff0000 + 1 MiB wraps" \
	--mem udmabuf --size 1M --iova 0xffffffffffff0000 --length 1M
# offset + length must not wrap either (ib_umem_dmabuf_get: check_add_overflow): EINVAL.
reg_errno 22 "offset 2^64 - 4 KiB + 8 KiB wraps (iova 0)" \
	--mem udmabuf --size 1M --offset 18446744073709547520 --iova 0 --length 8k
# The same on device memory.
if [ -e /dev/p2pbuf ]; then
	reg_errno 22 "p2pbuf device memory: iova 0xfffffffffffff000 + 8 KiB wraps" \
		--mem p2pbuf --size 64k --iova 0xfffffffffffff000 --length 8k
else
	ktap_skip "p2pbuf device memory: iova wrap" "no /dev/p2pbuf"
fi
# Length 0 (rxe_reg_user_mr_dmabuf): EINVAL.
reg_errno 22 "length 0" --mem udmabuf --size 1M --length 0
# Access flags: REMOTE_ATOMIC without LOCAL_WRITE (ib_check_mr_access): EINVAL; ON_DEMAND
# (0x40) is not a dma-buf MR flag (uverbs_get_flags32's mask for REG_DMABUF_MR): EINVAL; a
# read-only MR (no access bits at all) registers.
reg_errno 22 "REMOTE_ATOMIC without LOCAL_WRITE" --mem udmabuf --size 1M --access ra,rr
reg_errno 22 "IBV_ACCESS_ON_DEMAND on a dma-buf MR" --mem udmabuf --size 1M --access lw,0x40
reg_ok "no access flags (local read only)" --mem udmabuf --size 1M --access none
# A non-dma-buf fd of another kind than rdma_3's regular file: /dev/null (dma_buf_get): EINVAL.
reg_errno 22 "the fd of the null character device (not a dma-buf)" --mem file:/dev/null --length 4k

# The responder refuses RDMA into a dma-buf MR of device memory without the access for it:
# IBV_WC_REM_ACCESS_ERR at the requester (rxe: RESPST_ERR_RKEY_VIOLATION), and the bytes
# are not touched.
if [ -e /dev/p2pbuf ]; then
	PORT=7475
	# Read-only to peers (lw,rr): a WRITE is refused, a READ works.
	if serve_bg /tmp/neg_serve.txt 30 --port $PORT --mem p2pbuf --size 1M --access lw,rr --clients 3 --timeout 60; then
		rdma_client 60 /tmp/w.txt write --size 64k --pattern 5
		ktap_check "RDMA WRITE into a read-only (lw,rr) dma-buf MR of device memory: IBV_WC_REM_ACCESS_ERR (exit $rc)" \
			sh -c "[ $rc -eq 1 ] && grep -q IBV_WC_REM_ACCESS_ERR /tmp/w.txt"
		rdma_client 60 /tmp/w.txt write --size 64k --offset 1M --pattern 5 --unchecked
		ktap_check "RDMA WRITE past the end of a dma-buf MR: IBV_WC_REM_ACCESS_ERR (exit $rc)" \
			sh -c "[ $rc -eq 1 ] && grep -q IBV_WC_REM_ACCESS_ERR /tmp/w.txt"
		# The memory is still all zeroes (the exporter zeroes new buffers): nothing was written.
		rdma_client 60 /tmp/r.txt read --size 64k
		# 0xeb05052ea5b62325: FNV-1a (the session's checksum) of 65536 zero bytes.
		ktap_check "RDMA READ from the read-only MR works, and the refused writes left it untouched (exit $rc)" \
			sh -c "[ $rc -eq 0 ] && grep -q '(equal)' /tmp/r.txt && grep -q 'checksum: here 0xeb05052ea5b62325' /tmp/r.txt"
	else
		comment /tmp/neg_serve.txt
		for t in "WRITE into read-only" "WRITE past the end" "READ from read-only"; do ktap_fail "$t: no server"; done
	fi
	wait $srv
	comment /tmp/neg_serve.txt
	# Write-only to peers (lw,rw): a READ is refused.
	if serve_bg /tmp/neg_serve.txt 30 --port $PORT --mem p2pbuf --size 1M --access lw,rw --clients 1 --timeout 60; then
		rdma_client 60 /tmp/r.txt read --size 64k
		ktap_check "RDMA READ from a dma-buf MR without REMOTE_READ (lw,rw): IBV_WC_REM_ACCESS_ERR (exit $rc)" \
			sh -c "[ $rc -eq 1 ] && grep -q IBV_WC_REM_ACCESS_ERR /tmp/r.txt"
	else
		comment /tmp/neg_serve.txt
		ktap_fail "READ from write-only: no server"
	fi
	wait $srv
	comment /tmp/neg_serve.txt
else
	for t in "WRITE into read-only" "WRITE past the end" "READ from read-only" "READ from write-only"; do
		ktap_skip "dma-buf MR of device memory: $t" "no /dev/p2pbuf"
	done
fi

# An exporter that offers no CPU access: the system dma-buf heap has a vmap but does not
# accept attachments for CPU access (dma_buf_ops.cpu_attach), which is all rxe, a CPU
# importer, can use: EOPNOTSUPP, and p2pbuf says why. A refusal any user can cause is not
# worth a kernel log line (review L5: rxe_dbg, as rxe does for its other refusals): 20 of them
# in a row leave the log as it was.
if [ -e /dev/dma_heap/system ]; then
	REG_TEXT="attaches dma-bufs for CPU access"
	reg_errno 95 "a system heap dma-buf (no CPU attachments): EOPNOTSUPP" --mem heap --size 64k
	REG_TEXT=
	log0=$(dmesg | wc -l)
	bad=0
	i=0
	while [ $i -lt 20 ]; do
		p2pbuf --json rdma reg --mem heap --size 64k >/tmp/reg.json 2>/tmp/reg.err
		rc=$?
		got=$(json_num errno </tmp/reg.json)
		[ $rc -eq 1 ] && [ "$got" = 95 ] || bad=$((bad + 1))
		i=$((i + 1))
	done
	dmesg | tail -n +$((log0 + 1)) | sed 's/^/# new log line: /'
	new=$(dmesg | tail -n +$((log0 + 1)) | grep -c "rxe\|dma-buf\|dmabuf")
	ktap_check "20 more refused: $bad not with errno 95, $new kernel log line(s) about them (want 0 and 0)" \
		sh -c "[ $bad -eq 0 ] && [ $new -eq 0 ]"
else
	ktap_skip "a system heap dma-buf: EOPNOTSUPP" "no /dev/dma_heap/system"
	ktap_skip "20 more refused, silently" "no /dev/dma_heap/system"
fi

# rxe on a net device without any device below it (lo): a CPU importer needs none, the
# dma-buf is attached for CPU access (before, rxe attached with the net device's PCI parent,
# and lo has none).
if rdma link add rxe_lo type rxe netdev lo >/tmp/lo.txt 2>&1; then
	p2pbuf rdma reg --mem udmabuf --size 1M --device rxe_lo >/tmp/reg.txt 2>&1
	rc=$?
	comment /tmp/reg.txt
	ktap_check "rxe on lo, which has no PCI device: a udmabuf registers with ibv_reg_dmabuf_mr (exit $rc)" \
		sh -c "[ $rc -eq 0 ] && grep -q 'with ibv_reg_dmabuf_mr' /tmp/reg.txt"
	rdma link delete rxe_lo
else
	comment /tmp/lo.txt
	ktap_skip "rxe on lo: ibv_reg_dmabuf_mr" "rdma link add rxe_lo failed"
fi
ktap_exit

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The large-bar boot (64 GiB of emulated GPU memory): ibv_reg_dmabuf_mr on soft-RoCE (rxe0)
# of device-memory buffers larger than 4 GiB (rxe attaches for CPU access and vmaps the whole
# buffer; for DMA importers their tables have several entries, 5 GiB: 2, 64 GiB: 17, which
# tests/selftests/large_bar.c checks): each registration must succeed,
# and its time is printed (`p2pbuf rdma bench --what reg`, buffers allocated without zeroing:
# P2PBUF_ALLOC_UNINITIALIZED; no host memory: the guest has 3.3 GiB).
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 3
if ! rxe_setup; then
	ktap_fail "rxe0 on $RXE_NETDEV"
	ktap_skip "ibv_reg_dmabuf_mr of 5 GiB" "no rxe0"
	ktap_skip "ibv_reg_dmabuf_mr of 64 GiB" "no rxe0"
	ktap_exit
fi
ktap_ok "rxe0 on $RXE_NETDEV"
bar=$(stat -c %s "$(pci_find $GPU_ID)/resource2")
for s in 5G 64G; do
	case $s in 5G) bytes=5368709120 ;; 64G) bytes=68719476736 ;; esac
	if [ "$bar" -lt "$bytes" ]; then
		ktap_skip "ibv_reg_dmabuf_mr of $s" "BAR of $bar bytes (the large-bar boot has 64 GiB)"
		continue
	fi
	out=/tmp/large_rdma_$s.txt
	p2pbuf rdma bench --what reg --reg-sizes "$s" --reps 2 --uninitialized --host-max 0 \
		--addr "$RXE_IP" >"$out" 2>&1
	rc=$?
	sed 's/^/# /' "$out"
	n=$(grep -c "^BENCH rdma_reg kind=dmabuf size=$bytes " "$out")
	if [ $rc -eq 0 ] && [ "$n" -eq 2 ]; then
		ktap_ok "ibv_reg_dmabuf_mr of $s of device memory, twice"
	else
		ktap_fail "ibv_reg_dmabuf_mr of $s of device memory, twice (exit $rc, $n registrations)"
	fi
done
ktap_exit

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The large-bar boot (256 GiB of emulated GPU memory, an H200's BAR): ibv_reg_dmabuf_mr on
# soft-RoCE (rxe0) of device-memory buffers larger than 4 GiB: 5 GiB, and one of almost the whole
# BAR (the BAR less 1 GiB: 255 GiB on that boot). rxe attaches for CPU access and maps the whole
# buffer through its attachment; for DMA importers the tables have several entries (5 GiB: 2,
# 256 GiB: 65, which tests/selftests/large_bar.c checks). Each registration must succeed, twice,
# and its time is printed (`p2pbuf rdma bench --what reg`, buffers allocated without zeroing:
# P2PBUF_ALLOC_UNINITIALIZED; no host memory: the guest's RAM is mostly the BAR's struct pages).
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 3
bar=$(stat -c %s "$(pci_find $GPU_ID)/resource2")
gib=$((1 << 30))
almost=$((bar / gib - 1))G
if ! rxe_setup; then
	ktap_fail "rxe0 on $RXE_NETDEV"
	ktap_skip "ibv_reg_dmabuf_mr of 5G" "no rxe0"
	ktap_skip "ibv_reg_dmabuf_mr of $almost (the BAR less 1 GiB)" "no rxe0"
	ktap_exit
fi
ktap_ok "rxe0 on $RXE_NETDEV"
for s in 5G "$almost"; do
	bytes=$((${s%G} * gib))
	what="ibv_reg_dmabuf_mr of $s of device memory, twice"
	[ "$s" = "$almost" ] && what="$what (the BAR less 1 GiB)"
	if [ "$bar" -lt $((bytes + gib)) ] || [ "${s%G}" -le 0 ]; then
		ktap_skip "$what" "BAR of $bar bytes (the large-bar boot has 256 GiB)"
		continue
	fi
	out=/tmp/large_rdma_$s.txt
	p2pbuf rdma bench --what reg --reg-sizes "$s" --reps 2 --uninitialized --host-max 0 \
		--addr "$RXE_IP" >"$out" 2>&1
	rc=$?
	sed 's/^/# /' "$out"
	n=$(grep -c "^BENCH rdma_reg kind=dmabuf size=$bytes " "$out")
	if [ $rc -eq 0 ] && [ "$n" -eq 2 ]; then
		ktap_ok "$what"
	else
		ktap_fail "$what (exit $rc, $n registrations)"
	fi
done
ktap_exit

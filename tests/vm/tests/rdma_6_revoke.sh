#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Revoke while in use: a server holds a dma-buf MR of p2pbuf device memory, a client
# RDMA-WRITEs into it in a loop (several writes in flight), and the exporter's device is
# unbound under it (sysfs). The exporter revokes the buffer; rxe's revoke callback marks the
# MR invalid and drops its kernel mapping. Expected (docs/rdma.md):
# - the unbind returns promptly (it does not wait for the MR to be deregistered);
# - the looping client's next write completes with IBV_WC_REM_ACCESS_ERR, and so does a
#   write from a new client: no write reaches the memory after the revoke;
# - the server still deregisters the MR (ibv_dereg_mr succeeds) and closes the dma-buf;
# - no Oops/WARN (checked on the console by xtask), no new kmemleak report;
# - the driver binds again, and a new buffer of the same device takes RDMA again.
# Then the same with the exporter's revoke ioctl on one buffer (`p2pbuf revoke PID:FD`, the
# server's fd taken with pidfd_getfd): that MR fails the same way, another buffer's MR keeps
# working.
# Last, revokes racing registrations (review L3): 300 buffers, each revoked from another thread
# at a random moment while ibv_reg_dmabuf_mr registers it. Each registration must succeed or
# fail with ENODEV/EINVAL, and nothing may appear on the console: before the fix, a revoke
# landing between rxe's dma_buf_map_attachment() and dma_buf_vmap() made the exporter's vmap
# fail and the dma-buf core WARN (xtask's console scan fails the run on it).
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 15
rxe_test
DRV=/sys/bus/pci/drivers/p2pbuf_exporter
GPU=$(pci_find $GPU_ID)
PCI=$(basename "$GPU")
if [ ! -e /dev/p2pbuf ] || [ ! -e "$DRV/$PCI" ]; then
	for i in 2 3 4 5 6 7 8 9 10; do ktap_skip "revoke test $i" "the exporter is not bound to $PCI"; done
	ktap_exit
fi
KML=/sys/kernel/debug/kmemleak
# leak_count: unreferenced objects kmemleak reports now (after a scan).
leak_count() {
	if [ -w $KML ]; then
		echo scan >$KML
		grep -c "^unreferenced object" $KML
	else
		echo 0
	fi
}
leaks0=$(leak_count)
uptime_s() { cut -d' ' -f1 /proc/uptime; }
revoked0=$(dmesg | grep -c "$PCI: unbound: .* buffer(s) revoked")

PORT=7476
if ! serve_bg /tmp/rv_serve.txt 60 --port $PORT --mem p2pbuf --size 4M --clients 2 --timeout 120; then
	comment /tmp/rv_serve.txt
	ktap_fail "serve --mem p2pbuf: device memory registered"
	kill $srv 2>/dev/null
	ktap_exit
fi
comment /tmp/rv_serve.txt
ktap_ok "serve --mem p2pbuf: 4 MiB of device memory registered with ibv_reg_dmabuf_mr"

# The client: 256 KiB writes, 4 in flight, until one fails (or 100000 are done).
timeout 300 p2pbuf rdma write --server "$RXE_IP:$PORT" --size 256k --pattern 41 --repeat 100000 --depth 4 >/tmp/rv_w.txt 2>&1 &
cli=$!
if wait_for /tmp/rv_w.txt "^completed 8$" 60; then
	ktap_ok "client: RDMA WRITEs into the MR in a loop ($(grep -c '^completed' /tmp/rv_w.txt) progress lines so far)"
else
	comment /tmp/rv_w.txt
	ktap_fail "client: RDMA WRITEs into the MR in a loop"
fi

# Unbind the exporter's device while the writes go on.
t0=$(uptime_s)
echo "$PCI" >$DRV/unbind
urc=$?
t1=$(uptime_s)
secs=$(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }")
ktap_check "unbind of $PCI while the MR is registered and in use: returned in $secs s (at most 10)" \
	sh -c "[ $urc -eq 0 ] && awk 'BEGIN { exit !($secs <= 10) }' && [ ! -e $DRV/$PCI ]"
dmesg | grep "$PCI: unbound: .* buffer(s) revoked" | tail -1 | sed 's/^/# /'
revoked1=$(dmesg | grep -c "$PCI: unbound: .* buffer(s) revoked")

wait $cli
crc=$?
comment /tmp/rv_w.txt
done_n=$(sed -n 's/.*; \([0-9]*\) completed before it.*/\1/p' /tmp/rv_w.txt | head -1)
ktap_check "client: a write in the loop completed with IBV_WC_REM_ACCESS_ERR after ${done_n:-?} completed writes (exit $crc)" \
	sh -c "[ $crc -eq 1 ] && grep -q IBV_WC_REM_ACCESS_ERR /tmp/rv_w.txt && [ ${done_n:-0} -ge 8 ]"

# A new client, after the revoke: refused the same way.
rdma_client 60 /tmp/rv_w2.txt write --size 64k --pattern 42
ktap_check "a new client's RDMA WRITE into the revoked MR: IBV_WC_REM_ACCESS_ERR (exit $rc)" \
	sh -c "[ $rc -eq 1 ] && grep -q IBV_WC_REM_ACCESS_ERR /tmp/rv_w2.txt"

serve_wait /tmp/rv_serve.txt
ktap_check "server: the region is gone, ibv_dereg_mr of the revoked MR succeeds, the fd is closed (exit $src)" \
	sh -c "[ $src -eq 1 ] && grep -q 'done: 0 client(s) verified, 2 failed; the region cannot be read' /tmp/rv_serve.txt &&
		grep -q 'deregistered the MR' /tmp/rv_serve.txt && [ $revoked1 -gt $revoked0 ]"

# Bind again: the provider comes back and its memory takes RDMA again.
echo "$PCI" >$DRV/bind
brc=$?
ktap_check "the exporter binds to $PCI again (exit $brc)" sh -c "[ $brc -eq 0 ] && [ -e $DRV/$PCI ]"
if serve_bg /tmp/rv_serve.txt 60 --port $PORT --mem p2pbuf --size 1M --clients 1 --timeout 60; then
	timeout 60 p2pbuf rdma write --server "$RXE_IP:$PORT" --size 1M --pattern 43 >/tmp/rv_w.txt 2>&1
	comment /tmp/rv_w.txt
fi
serve_wait /tmp/rv_serve.txt
ktap_check "after the rebind: a new dma-buf MR of device memory takes an RDMA WRITE, verified (exit $src)" \
	sh -c "[ $src -eq 0 ] && grep -q 'server: verified the pattern' /tmp/rv_w.txt"

# P2PBUF_IOCTL_REVOKE of one buffer while it is written in a loop; a second buffer is left alone.
p2pbuf rdma serve --port $PORT --mem p2pbuf --size 1M --clients 1 --timeout 120 >/tmp/rv_a.txt 2>&1 &
srva=$!
p2pbuf rdma serve --port $((PORT + 1)) --mem p2pbuf --size 1M --clients 1 --timeout 120 >/tmp/rv_b.txt 2>&1 &
srvb=$!
wait_for /tmp/rv_a.txt "listening on" 60
wait_for /tmp/rv_b.txt "listening on" 60
comment /tmp/rv_a.txt
timeout 300 p2pbuf rdma write --server "$RXE_IP:$PORT" --size 64k --pattern 44 --repeat 100000 --depth 4 >/tmp/rv_w.txt 2>&1 &
cli=$!
wait_for /tmp/rv_w.txt "^completed 8$" 60
fd=$(sed -n 's/.*dma-buf of .*(fd \([0-9]*\), inode.*/\1/p' /tmp/rv_a.txt | head -1)
t0=$(uptime_s)
p2pbuf revoke "$srva:${fd:-none}" >/tmp/rv_rev.txt 2>&1
rrc=$?
t1=$(uptime_s)
secs=$(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }")
comment /tmp/rv_rev.txt
ktap_check "p2pbuf revoke $srva:${fd:-?} (the server's dma-buf, P2PBUF_IOCTL_REVOKE) while it is written: exit $rrc in $secs s" \
	sh -c "[ $rrc -eq 0 ] && grep -q '^revoked' /tmp/rv_rev.txt && awk 'BEGIN { exit !($secs <= 10) }'"
wait $cli
crc=$?
comment /tmp/rv_w.txt
ktap_check "client: the write loop into the revoked buffer's MR ends with IBV_WC_REM_ACCESS_ERR (exit $crc)" \
	sh -c "[ $crc -eq 1 ] && grep -q IBV_WC_REM_ACCESS_ERR /tmp/rv_w.txt"
logged /tmp/rv_w2.txt timeout 60 p2pbuf rdma write --server "$RXE_IP:$((PORT + 1))" --size 1M --pattern 45
ktap_check "another buffer's MR, not revoked, still takes an RDMA WRITE, verified (exit $rc)" \
	sh -c "[ $rc -eq 0 ] && grep -q 'server: verified the pattern' /tmp/rv_w2.txt"
wait $srva
wait $srvb
comment /tmp/rv_a.txt
ktap_check "server of the revoked buffer: ibv_dereg_mr succeeds, the fd is closed" \
	grep -q 'deregistered the MR' /tmp/rv_a.txt

logged /tmp/rv_race.txt p2pbuf rdma reg --mem p2pbuf --size 64k --revoke-race 300
ktap_check "300 registrations racing a revoke of their buffer: each registered or refused with ENODEV or EINVAL (exit $rc)" \
	sh -c "[ $rc -eq 0 ] && grep -q '^revoke race on' /tmp/rv_race.txt"

# kmemleak reports objects unreferenced for 5 s or more: wait, then compare with the start.
sleep 6
leaks1=$(leak_count)
if [ "$leaks1" -le "$leaks0" ]; then
	ktap_ok "kmemleak: no new unreferenced object ($leaks1 reported in all)"
else
	sed 's/^/# /' $KML | head -60
	ktap_fail "kmemleak: $((leaks1 - leaks0)) new unreferenced object(s)"
fi
ktap_exit

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Soft-RoCE on the lab's NIC, and real rdma-core clients on it (the project's build of
# rdma-core, Debian's perftest) with host memory: the baseline for the dma-buf tests.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 6
if ! rxe_setup; then
	ktap_fail "rxe0 on $RXE_NETDEV ($RXE_IP) with an active port"
	for t in "rdma link show" ibv_devinfo ibv_rc_pingpong ib_write_bw "p2pbuf rdma info"; do
		ktap_skip "$t" "no rxe0"
	done
	ktap_exit
fi
gid=$(rxe_gid_index)
ktap_ok "rxe0 on $RXE_NETDEV ($RXE_IP) with an active port, RoCE v2 GID index $gid"

rdma link show >/tmp/link.txt 2>&1
comment /tmp/link.txt
ktap_check "rdma link show: rxe0 on $RXE_NETDEV, ACTIVE" \
	grep -q "link $RXE_DEV/1 state ACTIVE.*netdev $RXE_NETDEV" /tmp/link.txt

ibv_devinfo -d "$RXE_DEV" >/tmp/devinfo.txt 2>&1
grep -E "hca_id|transport|fw_ver|state|link_layer" /tmp/devinfo.txt | sed 's/^[[:space:]]*/# /'
ktap_check "ibv_devinfo: rxe0, PORT_ACTIVE, Ethernet" \
	sh -c 'grep -q "hca_id:[[:space:]]*rxe0" /tmp/devinfo.txt &&
		grep -q PORT_ACTIVE /tmp/devinfo.txt && grep -q "link_layer:[[:space:]]*Ethernet" /tmp/devinfo.txt'

# ibv_rc_pingpong: TCP to exchange QP numbers, then RC SEND/RECV over rxe0.
ibv_rc_pingpong -d "$RXE_DEV" -g "$gid" -p 18600 -n 100 >/tmp/pp-server.txt 2>&1 &
srv=$!
sleep 1
timeout 120 ibv_rc_pingpong -d "$RXE_DEV" -g "$gid" -p 18600 -n 100 127.0.0.1 >/tmp/pp-client.txt 2>&1
rc=$?
wait $srv
src=$?
comment /tmp/pp-client.txt
if [ $rc -eq 0 ] && [ $src -eq 0 ] && grep -q "iters in" /tmp/pp-client.txt; then
	ktap_ok "ibv_rc_pingpong over rxe0 (server and client)"
else
	comment /tmp/pp-server.txt
	ktap_fail "ibv_rc_pingpong over rxe0: client exit $rc, server exit $src"
fi

# perftest on host memory, connection through rdma_cm (-R).
ib_write_bw -R -F -d "$RXE_DEV" -p 18601 -s 65536 -n 200 >/tmp/bw-server.txt 2>&1 &
srv=$!
sleep 1
timeout 180 ib_write_bw -R -F -d "$RXE_DEV" -p 18601 -s 65536 -n 200 "$RXE_IP" >/tmp/bw-client.txt 2>&1
rc=$?
wait $srv
src=$?
grep -E "^ *#bytes|^ *65536" /tmp/bw-client.txt | sed 's/^ */# /'
if [ $rc -eq 0 ] && [ $src -eq 0 ] && grep -q "^ *65536 *200" /tmp/bw-client.txt; then
	ktap_ok "ib_write_bw -R (host memory, 200 x 64 KiB): $(awk '/^ *65536 *200/ {print $4 " MB per s average"}' /tmp/bw-client.txt)"
else
	comment /tmp/bw-client.txt
	comment /tmp/bw-server.txt
	ktap_fail "ib_write_bw -R: client exit $rc, server exit $src"
fi

logged /tmp/info.txt p2pbuf rdma info
ktap_check "p2pbuf rdma info lists rxe0 (exit $rc)" grep -q "^rxe0: " /tmp/info.txt
ktap_exit

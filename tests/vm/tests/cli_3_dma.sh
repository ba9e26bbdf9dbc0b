#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# p2pbuf dma copy: the DMA engine (QEMU's edu, the FPGA stand-in) copies device memory to
# device memory and device memory to system memory and back, at unaligned offsets, verified
# through the CPU mappings, with the map type of each import; then the failure modes (a zero
# length, no /dev/p2pbuf-dma). On the root-port topology the exporter refuses the engine
# (EOPNOTSUPP) and p2pbuf must say why. edu moves 10-20 KiB/s: the copies are small.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 6

# copy NAME WANT_SRC_MAP WANT_DST_MAP ARGS...: a copy that must verify.
copy() {
	_name=$1 _sm=$2 _dm=$3
	shift 3
	timeout 120 p2pbuf dma copy "$@" >/tmp/c.txt 2>&1
	_rc=$?
	comment /tmp/c.txt
	if [ "$(p2p_fabric)" = refused ] && [ $_rc -eq 1 ] && grep -q "errno 95" /tmp/c.txt &&
		grep -q "no peer-to-peer path between the engine and the memory" /tmp/c.txt; then
		ktap_ok "$_name: device memory refused on the root-port topology (EOPNOTSUPP), explained"
	elif [ $_rc -eq 0 ] && grep -q '^OK' /tmp/c.txt && grep -q "src: .*map type $_sm" /tmp/c.txt &&
		grep -q "dst: .*map type $_dm" /tmp/c.txt; then
		ktap_ok "$_name: verified, src $_sm, dst $_dm, $(sed -n 's/.*(\([0-9.]* KiB\)\/s).*/\1 per s/p' /tmp/c.txt)"
	else
		ktap_fail "$_name: exit $_rc (want OK, src $_sm, dst $_dm)"
	fi
}
if [ ! -e /dev/p2pbuf-dma ]; then
	for t in d2d d2s s2d json zero-len absent; do ktap_skip "$t" "no /dev/p2pbuf-dma (no edu device?)"; done
	ktap_exit
fi
# The map type the CLI prints is the engine's view of its DMA addresses: an IOVA when its IOMMU
# translates device memory (through the host bridge), else the memory's bus address (the route,
# switch or host bridge, stays inside the kernel's dma-buf and PCI cores).
case "$(p2p_fabric)/${P2PBUF_IOMMU:-0}" in
hostbridge/1) DEVMAP=THRU_HOST_BRIDGE ;;
*) DEVMAP=BUS_ADDR ;;
esac
copy "dma copy device -> device memory, 12345 bytes, offsets 7 -> 4093" "$DEVMAP" "$DEVMAP" \
	--src-mem p2pbuf --dst-mem p2pbuf --len 12345 --src-offset 7 --dst-offset 4093
copy "dma copy device -> system memory (udmabuf), 8 KiB" "$DEVMAP" HOST_MEMORY \
	--src-mem p2pbuf --dst-mem udmabuf --len 8k
copy "dma copy system -> device memory, 5000 bytes at offset 1" HOST_MEMORY "$DEVMAP" \
	--src-mem udmabuf --dst-mem p2pbuf --len 5000 --dst-offset 1

if [ "$(p2p_fabric)" = refused ]; then
	# No P2P path to device memory here: system memory to system memory instead.
	logged /tmp/c.json timeout 120 p2pbuf --json dma copy --src-mem udmabuf --dst-mem udmabuf --len 4k
	ktap_check "p2pbuf --json dma copy udmabuf to udmabuf: verified, copied 4096 (exit $rc)" \
		sh -c "[ $rc -eq 0 ] && grep -q '\"verified\":true' /tmp/c.json && grep -q '\"copied\":4096' /tmp/c.json"
else
	logged /tmp/c.json timeout 120 p2pbuf --json dma copy --src-mem p2pbuf --dst-mem p2pbuf --len 4k
	ktap_check "p2pbuf --json dma copy: verified, copied 4096, peer_to_peer (exit $rc)" \
		sh -c "[ $rc -eq 0 ] && grep -q '\"verified\":true' /tmp/c.json && grep -q '\"copied\":4096' /tmp/c.json &&
			grep -q '\"peer_to_peer\":true' /tmp/c.json"
fi

logged /tmp/c.txt p2pbuf dma copy --len 0
ktap_check "dma copy --len 0: refused with a message (exit $rc)" \
	sh -c "[ $rc -eq 1 ] && grep -q 'at least 1 byte' /tmp/c.txt"

# Without the p2pbuf_dma module: a clear message and EX_UNAVAILABLE, then load it again.
if rmmod p2pbuf_dma; then
	logged /tmp/c.txt p2pbuf dma copy --len 4k
	insmod /lib/modules/p2pbuf/p2pbuf_dma.ko
	ktap_check "dma copy without /dev/p2pbuf-dma: does not exist, says to load p2pbuf_dma (exit $rc)" \
		sh -c "[ $rc -eq 69 ] && grep -q '/dev/p2pbuf-dma does not exist' /tmp/c.txt && grep -q 'insmod p2pbuf_dma' /tmp/c.txt"
else
	ktap_fail "rmmod p2pbuf_dma (to test its absence)"
fi
ktap_exit

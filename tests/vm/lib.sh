# SPDX-License-Identifier: GPL-2.0
# Helpers shared by the in-VM tests and the scenario (sourced, not run).

cmdline_arg() { sed -n "s/.*p2pbuf\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }

# pci_find VENDOR DEVICE: prints the sysfs path of the first matching PCI function.
pci_find() {
	for d in /sys/bus/pci/devices/*; do
		if [ "$(cat "$d/vendor")" = "$1" ] && [ "$(cat "$d/device")" = "$2" ]; then
			readlink -f "$d"
			return 0
		fi
	done
	return 1
}

# The devices of the lab, by vendor:device.
GPU_ID="0x1af4 0x1110"   # ivshmem-plain: the emulated GPU memory (BAR2)
NVME_ID="0x1b36 0x0010"  # QEMU NVMe with a CMB
EDU_ID="0x1234 0x11e8"   # edu DMA engine: the FPGA stand-in
NIC_ID="0x1af4 0x1041"   # virtio-net (modern)

# load_modules: insmod the project's modules (idempotent).
load_modules() {
	for m in p2pbuf_exporter p2pbuf_dma; do
		[ -d /sys/module/$m ] || insmod /lib/modules/p2pbuf/$m.ko || return 1
	done
}

# kmemleak_clear: scan once and forget what kmemleak found so far (leaks from boot are not
# ours).
kmemleak_clear() {
	if [ -w /sys/kernel/debug/kmemleak ]; then
		echo scan >/sys/kernel/debug/kmemleak
		echo clear >/sys/kernel/debug/kmemleak
	fi
}

# kmemleak_leaks: scan (twice, as kmemleak's documentation advises) and print the objects it
# reports as KTAP diagnostics. Status 0: no leaks; 1: leaks, $KMEMLEAK_COUNT unreferenced
# objects; 2: no /sys/kernel/debug/kmemleak.
kmemleak_leaks() {
	[ -w /sys/kernel/debug/kmemleak ] || return 2
	echo scan >/sys/kernel/debug/kmemleak
	echo scan >/sys/kernel/debug/kmemleak
	_leaks=$(cat /sys/kernel/debug/kmemleak)
	[ -z "$_leaks" ] && return 0
	echo "$_leaks" | sed 's/^/    # /'
	KMEMLEAK_COUNT=$(echo "$_leaks" | grep -c unreferenced)
	return 1
}

# KTAP helpers for the tests: each test script is a KTAP document of its own. _n is the
# counter of the results: only the ktap_* helpers assign it (xtask's host test
# no_vm_script_assigns_the_ktap_counter fails on any other script under tests/vm that does).
_n=0
_failed=0
ktap_plan() { echo "KTAP version 1"; echo "1..$1"; }
ktap_ok() { _n=$((_n + 1)); echo "ok $_n $*"; }
ktap_fail() { _n=$((_n + 1)); _failed=1; echo "not ok $_n $*"; }
ktap_skip() { _n=$((_n + 1)); echo "ok $_n $1 # SKIP $2"; }
# ktap_check NAME CMD...: ok if CMD succeeds.
ktap_check() {
	_name=$1; shift
	if "$@"; then ktap_ok "$_name"; else ktap_fail "$_name"; fi
}
ktap_exit() { exit $_failed; }

# The exporter's debugfs list of buffers, for people (no ABI; its format is written down in
# docs/exporter.md, "debugfs"). The tests read it only through the helpers below.
P2PBUF_DEBUGFS_BUFFERS=/sys/kernel/debug/p2pbuf/buffers

# debugfs_buffer BYTES [last]: the line of the first buffer of BYTES bytes (with `last`: the
# last one) followed by its attachment lines; nothing when there is none.
debugfs_buffer() {
	awk -v want=": $1 bytes at BAR offset " -v last="${2:+1}" '
		/^buffer / {
			keep = index($0, want) && (last || !found)
			if (keep) { blk = $0; found = 1 }
			next
		}
		keep && /^  / { blk = blk "\n" $0 }
		END { if (found) print blk }' "$P2PBUF_DEBUGFS_BUFFERS"
}

# debugfs_field BLOCK FIELD: from a debugfs_buffer block, the buffer's `offset` (its BAR offset,
# 0x...), `cpu_begin` or `cpu_end` (its CPU-access brackets), or `attached` (each attachment:
# "DEVICE[, mapped: ...]", one per line).
debugfs_field() {
	case $2 in
	offset) echo "$1" | sed -n '1s/.* at BAR offset \(0x[0-9a-f]*\).*/\1/p' ;;
	cpu_begin) echo "$1" | sed -n '1s/.*cpu access \([0-9]*\) begin \/ \([0-9]*\) end.*/\1/p' ;;
	cpu_end) echo "$1" | sed -n '1s/.*cpu access \([0-9]*\) begin \/ \([0-9]*\) end.*/\2/p' ;;
	attached) echo "$1" | sed -n 's/^  attached: \(.*\)/\1/p' ;;
	esac
}

# cpu_is_zen: an AMD CPU of family 0x17 or later, which the p2pdma host-bridge whitelist
# (cpu_supports_p2pdma() in drivers/pci/p2pdma.c) trusts with peer-to-peer through the host bridge.
cpu_is_zen() {
	grep -q '^vendor_id.*AuthenticAMD' /proc/cpuinfo &&
		[ "$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1)" -ge 23 ]
}

# p2p_fabric: what the kernel's p2pdma policy must answer on this boot's fabric (see
# xtask/src/judge/boots.rs): "switch" (one PCIe switch: BUS_ADDR), "hostbridge" (root ports and a
# Zen CPU: THRU_HOST_BRIDGE, through the IOMMU when there is one), "refused" (root ports and
# any other CPU: no peer-to-peer path).
p2p_fabric() {
	if [ "$P2PBUF_TOPOLOGY" != rootports ]; then
		echo switch
	elif cpu_is_zen; then
		echo hostbridge
	else
		echo refused
	fi
}

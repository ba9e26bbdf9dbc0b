#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The VM has the devices of the lab, where the topology says they are: behind one PCIe switch
# (P2P through the switch), or each on its own root port.
. /p2pbuf/lib.sh
ktap_plan 9
paths=""
for dev in GPU NVME EDU NIC; do
	eval id=\$${dev}_ID
	# shellcheck disable=SC2086
	p=$(pci_find $id)
	if [ -n "$p" ]; then
		ktap_ok "$dev present ($id) at ${p##*/}"
		paths="$paths $p"
	else
		ktap_fail "$dev present ($id)"
	fi
done
# The upstream bridge of each device's port: the same one for all in the switch topology.
ups=""
for p in $paths; do
	port=$(dirname "$p")
	ups="$ups $(basename "$(dirname "$port")")"
done
distinct=$(echo $ups | tr ' ' '\n' | sort -u | wc -l)
case "$P2PBUF_TOPOLOGY" in
rootports)
	ktap_check "each device on its own root port (upstream: $ups)" test "$(echo $paths | wc -w)" -eq 4 -a "$(for p in $paths; do basename "$(dirname "$p")"; done | sort -u | wc -l)" -eq 4
	;;
*)
	ktap_check "all four devices behind one switch (upstream: $ups)" test "$distinct" -eq 1 -a "$(echo $paths | wc -w)" -eq 4
	;;
esac
bar2=$(sed -n 3p "$(echo $paths | cut -d' ' -f1)/resource" 2>/dev/null)
start=$(echo "$bar2" | cut -d' ' -f1)
end=$(echo "$bar2" | cut -d' ' -f2)
size=$(( (end - start + 1) >> 20 ))
ktap_check "GPU memory BAR2 is ${size} MiB" test "$size" -ge 16
# The CPU the p2pdma host-bridge whitelist looks at, and the IOMMU: with one, every device has
# an IOMMU group and peer-to-peer through the host bridge is mapped by it.
cpu="$(sed -n 's/^vendor_id[[:space:]]*: //p' /proc/cpuinfo | head -1) family $(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1)"
case "$P2PBUF_SUITE" in
rootports-zen-iommu) want_zen=yes want_iommu=1 ;;
*) want_zen=no want_iommu=0 ;;
esac
if cpu_is_zen; then zen=yes; else zen=no; fi
ktap_check "CPU $cpu: Zen for the host-bridge whitelist: $zen (boot ${P2PBUF_SUITE:-main} wants $want_zen)" test "$zen" = "$want_zen"
grp=0
for p in $paths; do [ -e "$p/iommu_group" ] && grp=$((grp + 1)); done
if [ "$want_iommu" = 1 ]; then
	ktap_check "IOMMU on: $grp of 4 devices have an IOMMU group" test "$grp" -eq 4
else
	ktap_check "no IOMMU: $grp devices have an IOMMU group" test "$grp" -eq 0
fi
# 4-level paging: the lab boots with no5lvl (xtask/src/vm/qemu.rs says why: with LA57, KASAN
# can flood from each timer tick and wedge the boot in identify_cpu()). The kernel drops la57
# from the CPU flags when it runs with 4 levels.
if grep -qw la57 /proc/cpuinfo; then levels=5; else levels=4; fi
ktap_check "the kernel runs with $levels-level page tables (no5lvl on its command line)" test "$levels" -eq 4
ktap_exit

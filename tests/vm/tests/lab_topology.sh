#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The VM has the devices of the lab, where the topology says they are: behind one PCIe switch
# (P2P through the switch), or each on its own root port.
. /p2pbuf/lib.sh
ktap_plan 6
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
ktap_exit

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The CLI under a dmem cgroup limit (issue 31): a process in a cgroup with dmem.max set on the
# provider's region sees that cgroup, its use and its limit in `p2pbuf info` (text and --json),
# the use grows by what it holds, and an allocation over the limit fails with ENOSPC and a
# message that names the region and says what to do (docs/guide.md, section 15).
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 5
CG=/sys/fs/cgroup
T=$CG/p2pbuf-cli
LIMIT=1048576
[ -e $CG/cgroup.controllers ] || mount -t cgroup2 none $CG
echo +dmem >$CG/cgroup.subtree_control 2>/dev/null
region=$(p2pbuf --json info 2>/dev/null | jq -r '.providers[0].dmem_region // empty')
if [ ! -e /dev/p2pbuf ] || [ -z "$region" ] || ! mkdir -p $T ||
	! echo "$region $LIMIT" >$T/dmem.max; then
	for i in 1 2 3 4 5; do ktap_skip "dmem cli $i" "no provider, no dmem controller or no cgroup2"; done
	ktap_exit
fi
# in_cg CMD...: CMD run in the tenant cgroup (the shell joins it, then becomes CMD).
IN_CG="echo \$\$ >$T/cgroup.procs && exec \"\$@\""
in_cg() { sh -c "$IN_CG" in_cg "$@"; }

logged /tmp/dm1.json in_cg p2pbuf --json info
jq_check "info --json in a cgroup with dmem.max 1 MiB on $region: the cgroup, 0 used, the limit" \
	/tmp/dm1.json '.providers[0].dmem.cgroup == "/p2pbuf-cli" and .providers[0].dmem.current == 0 and
	 .providers[0].dmem.max == 1048576 and .providers[0].dmem.effective_max == 1048576 and
	 .providers[0].dmem.limited_by == "/p2pbuf-cli"'

logged /tmp/dm2.txt in_cg p2pbuf info
ktap_check "info (text): a dmem cgroup line with the cgroup and the region" \
	grep -q "dmem cgroup: /p2pbuf-cli (region $region)" /tmp/dm2.txt

# 512 KiB held in the cgroup: its use, seen by another process of the cgroup.
# sh itself in the background (not a function's subshell): $! is the holder's pid.
sh -c "$IN_CG" in_cg p2pbuf alloc --mem p2pbuf --size 512k --hold 60 >/tmp/dm_hold.txt 2>&1 &
holder=$!
wait_for /tmp/dm_hold.txt "fd" 20
logged /tmp/dm3.json in_cg p2pbuf --json info
jq_check "info --json while 512 KiB is held: current 524288" /tmp/dm3.json \
	'.providers[0].dmem.current == 524288'

expect_fail "alloc of 1 MiB more: ENOSPC, names the region's dmem.max and what to do" 1 \
	"ENOSPC: the dmem.max for $region" in_cg p2pbuf alloc --mem p2pbuf --size 1M

kill $holder 2>/dev/null
wait $holder 2>/dev/null
ktap_check "dmem.current back to 0 after the holder exits" \
	sh -c "grep -q '^$region 0\$' $T/dmem.current"
rmdir $T 2>/dev/null
ktap_exit

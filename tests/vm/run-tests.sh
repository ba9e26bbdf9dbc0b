#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The in-VM suite: every program in /p2pbuf/tests (kselftests and shell tests), then the KUnit
# suites (from debugfs) and a final kmemleak scan, as one KTAP document. Each test's own
# KTAP/TAP output is nested four spaces deep. Exit codes: 0 pass, 4 skip, other fail.
. /p2pbuf/lib.sh
filter=$(cmdline_arg filter)
inject=$(cmdline_arg inject)
# Per-test limit in guest seconds; a boot whose guest clock runs ahead of the wall clock
# (QEMU -icount with sleep=off: the p2pbuf-dma-icount boot) raises it.
test_timeout=$(cmdline_arg test_timeout)
test_timeout=${test_timeout:-600}
export P2PBUF_TOPOLOGY=$(cmdline_arg topology)
# Which boot of `cargo xtask test` this is (xtask/src/judge/boots.rs): the main boot runs every test
# but those named in p2pbuf.skip (prefixes) plus the KUnit suites; a topology boot runs only
# the tests whose names contain one of p2pbuf.only (comma-separated).
export P2PBUF_SUITE=$(cmdline_arg suite)
only=$(cmdline_arg only | tr , ' ')
skip=$(cmdline_arg skip | tr , ' ')
export P2PBUF_CPU_VENDOR=$(sed -n 's/^vendor_id[[:space:]]*: //p' /proc/cpuinfo | head -1)
if [ -d /sys/class/iommu ] && [ -n "$(ls /sys/class/iommu 2>/dev/null)" ]; then
	export P2PBUF_IOMMU=1
else
	export P2PBUF_IOMMU=0
fi

# selected NAME: whether this boot runs the test NAME (before --filter).
selected() {
	if [ -n "$only" ]; then
		for o in $only; do case "$1" in *"$o"*) return 0 ;; esac; done
		return 1
	fi
	for x in $skip; do case "$1" in "$x"*) return 1 ;; esac; done
	return 0
}

# Leaks from boot are not ours: scan once and forget them before the suite starts.
kmemleak_clear

# The project's modules are loaded for every test (lab_modules checks unload and reload).
load_modules || echo "# could not load the p2pbuf modules (see dmesg)" >/dev/kmsg

# Tests that inject allocation failures (fail_nth, udmabuf_sync_race's failslab half) run
# last: dma-debug switches itself off when one of its own allocations fails under them ("DMA-API:
# cacheline tracking ENOMEM, dma-debug disabled"), and no test may run unchecked after that.
tests=""
last=""
for t in /p2pbuf/tests/*; do
	[ -x "$t" ] || continue
	selected "$(basename "$t")" || continue
	case "$(basename "$t")" in
	*"$filter"*)
		case "$(basename "$t")" in
		fail_nth* | udmabuf_sync_race*) last="$last $t" ;;
		*) tests="$tests $t" ;;
		esac
		;;
	esac
done
tests="$tests$last"
suites=""
[ -n "$only" ] || for s in /sys/kernel/debug/kunit/*; do
	[ -f "$s/results" ] || continue
	case "kunit:$(basename "$s")" in *"$filter"*) suites="$suites $s" ;; esac
done
n=1
for t in $tests $suites; do n=$((n + 1)); done
[ -n "$inject" ] && n=$((n + 1))

echo "KTAP version 1"
echo "1..$n"
i=0
for t in $tests; do
	i=$((i + 1))
	name=$(basename "$t")
	echo "# running $name" >/dev/kmsg
	# pipefail keeps the test's exit code through sed.
	set -o pipefail
	timeout "$test_timeout" "$t" 2>&1 | sed 's/^/    /'
	rc=$?
	set +o pipefail
	case $rc in
	0) echo "ok $i $name" ;;
	4) echo "ok $i $name # SKIP" ;;
	143) echo "not ok $i $name # timed out after ${test_timeout}s" ;;
	*) echo "not ok $i $name # exit code $rc" ;;
	esac
done
for s in $suites; do
	i=$((i + 1))
	name="kunit:$(basename "$s")"
	sed 's/^/    /' "$s/results"
	# The suite's own verdict is its last unindented result line.
	if grep -q '^not ok' "$s/results"; then
		echo "not ok $i $name"
	elif grep -q '^ok .*# SKIP' "$s/results"; then
		echo "ok $i $name # SKIP"
	else
		echo "ok $i $name"
	fi
done
case "$inject" in
fail) i=$((i + 1)); echo "not ok $i injected-failure # asked for with --inject fail" ;;
warn)
	i=$((i + 1))
	echo "WARNING: CPU: 0 PID: 1 at injected by cargo xtask test --inject warn" >/dev/kmsg
	echo "ok $i injected-warn # the console scanner must fail the run"
	;;
esac
i=$((i + 1))
kmemleak_leaks
case $? in
0) echo "ok $i kmemleak" ;;
1) echo "not ok $i kmemleak # $KMEMLEAK_COUNT unreferenced object(s)" ;;
*) echo "ok $i kmemleak # SKIP no /sys/kernel/debug/kmemleak" ;;
esac

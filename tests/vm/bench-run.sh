#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# `cargo xtask bench` in the guest: load the modules, run every program in /p2pbuf/bench
# (compiled from tests/bench/*.c, or shell scripts copied from tests/bench/*.sh) with the
# repetition count as argv[1]. Their BENCHINFO/BENCHMETRIC/BENCH lines (docs/bench.md) go to
# ttyS1, where xtask collects them; "# bench NAME" and "# bench NAME exit STATUS" frame each.
# p2pbuf.bench=WORD on the kernel command line runs only the programs whose name contains WORD.
# Programs named trace-* (call graphs of a path under ftrace, not benchmarks) run only when WORD
# names them, e.g. p2pbuf.bench=trace-small.
. /p2pbuf/lib.sh
reps=$(cmdline_arg reps)
only=$(cmdline_arg bench)
load_modules || echo "# could not load the p2pbuf modules" >/dev/kmsg
# A program that runs the guest out of memory is the one the OOM killer takes, not this runner
# (which would end the whole run): the runner is exempt, each program gets the default back.
echo -1000 >/proc/self/oom_score_adj
for b in /p2pbuf/bench/*; do
	[ -x "$b" ] || continue
	name=$(basename "$b")
	case "$name" in
	*"$only"*) ;;
	*) continue ;;
	esac
	case "$name" in
	trace-*) case "$only" in trace*) ;; *) continue ;; esac ;;
	esac
	echo "# bench $name"
	cd /tmp || exit 1
	(echo 0 >/proc/self/oom_score_adj && exec timeout 2400 "$b" "${reps:-5}") 2>&1
	echo "# bench $name exit $?"
done

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# `cargo xtask bench` in the guest: load the modules, run every program in /p2pbuf/bench; their
# "BENCH ..." lines go to ttyS1, where xtask collects them.
. /p2pbuf/lib.sh
reps=$(cmdline_arg reps)
load_modules || echo "# could not load the p2pbuf modules" >/dev/kmsg
for b in /p2pbuf/bench/*; do
	[ -x "$b" ] || continue
	echo "# bench $(basename "$b")"
	timeout 1200 "$b" "${reps:-5}" 2>&1
	echo "# bench $(basename "$b") exit $?"
done

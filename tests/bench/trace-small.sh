#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Where the time of the small-size paths goes (issue 16, item 6), with ftrace's function_graph
# tracer (the bench kernel has the function tracer, xtask/src/build/kernel/config.rs BENCH_TRACING):
# - export_map at 4 KiB: the importer's IMPORT ioctl (dma_buf_dynamic_attach + map) of a p2pbuf
#   buffer and of a udmabuf one, and its RELEASE;
# - `p2pbuf rdma bench --what reg` at 4 KiB: ibv_reg_dmabuf_mr / ibv_reg_mr and their
#   deregistration on rxe.
# Not part of a plain `cargo xtask bench` (tests/vm/bench-run.sh runs trace-* programs only when
# named): `cargo xtask bench --filter trace-small`. Prints, first, untraced samples of both (the
# line protocol, as benchmarks trace_export_map and trace_rdma_reg), then the call graphs as
# "# trace <what>: ..." lines (cargo xtask bench keeps the program's whole output in serial.txt),
# then the untraced samples again with kmemleak switched off (trace_*_nokmemleak).
# docs/bench.md, "Where the time goes", reads them.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
reps=${1:-5}
T=/sys/kernel/tracing
[ -e $T/trace ] || mount -t tracefs nodev $T || {
	echo "# trace: no tracefs"
	exit 1
}
if ! grep -qw function_graph $T/available_tracers; then
	echo "# trace: no function_graph tracer in this kernel (not the bench kernel?)"
	exit 1
fi
rxe_setup || {
	echo "# trace: no rxe0"
	exit 1
}
em=/p2pbuf/bench/export_map
# Switching a tracer on or off patches every traced call site with int3-guarded live patching;
# under QEMU TCG with two vCPUs the other vCPU has been seen to execute a stale int3 (an "Oops:
# int3" in _raw_spin_unlock_irqrestore, then a panic, 1 run of 3). The call graphs are therefore
# taken with CPU 1 offline (the untraced measurements run on both CPUs).
cpu1=/sys/devices/system/cpu/cpu1/online

# The same measurements untraced, as benchmarks of their own (names prefixed with trace_).
$em "$reps" 4096 | sed -e 's/ export_map / trace_export_map /'
p2pbuf rdma bench --what reg --reps "$reps" --addr "$RXE_IP" --reg-sizes 4k --uninitialized |
	sed -e 's/ rdma_reg / trace_rdma_reg /'

# trace NAME DEPTH MIN "GRAPH FUNCTIONS" COMMAND...: COMMAND (and its threads) under
# function_graph, from the graph functions that exist, max_graph_depth DEPTH (0: all); the lines
# printed: all when MIN is 0, else those with a duration marker of MIN or more (function_graph:
# + over 10 us, ! over 100 us, # over 1 ms, * over 10 ms, @ over 100 ms, $ over 1 s).
trace() {
	name=$1 depth=$2 min=$3 funcs=$4
	shift 4
	echo 0 >$T/tracing_on
	echo nop >$T/current_tracer
	: >$T/set_graph_function
	for f in $funcs; do
		grep -qx "$f" $T/available_filter_functions &&
			echo "$f" >>$T/set_graph_function
	done
	echo "# trace $name: graph functions: $(tr '\n' ' ' <$T/set_graph_function)depth $depth"
	echo 16384 >$T/buffer_size_kb
	echo "$depth" >$T/max_graph_depth
	echo 1 >$T/options/funcgraph-tail
	echo 1 >$T/options/funcgraph-proc
	echo 1 >$T/options/function-fork
	echo function_graph >$T/current_tracer
	: >$T/trace
	# shellcheck disable=SC2016
	sh -c 'echo $$ >'$T'/set_ftrace_pid; echo 1 >'$T'/tracing_on; exec "$@"' sh "$@" >/dev/null
	echo 0 >$T/tracing_on
	case $min in
	0) pat='.' ;;
	10) pat='[-+!#*@$] *[0-9][0-9.]* us|[-+!#*@$] *[0-9][0-9.]* ms' ;;
	100) pat='[!#*@$] *[0-9]' ;;
	esac
	grep -E "$pat" $T/trace | sed -e "s/^/# trace $name: /"
	echo "# trace $name: $(grep -c . $T/trace) lines in the buffer, entries lost: $(grep -h overrun $T/per_cpu/cpu*/stats | tr -s ' ' | tr '\n' ' ')"
	echo nop >$T/current_tracer
	: >$T/set_ftrace_pid
	: >$T/set_graph_function
}

if [ -w $cpu1 ] && echo 0 >$cpu1; then
	echo "# trace: CPU 1 offline while tracing"
else
	echo "# trace: cannot take CPU 1 offline: not tracing (live patching with 2 vCPUs under TCG can panic)"
	exit 1
fi
# The ioctls of one 4 KiB round (export, import, release, close of both kinds), 4 levels deep.
trace export_map_ioctls 4 0 "__x64_sys_ioctl __x64_sys_close" $em 1 4096
# Attach and map themselves, every level, of both kinds.
trace export_map_attach_map 0 0 "dma_buf_dynamic_attach dma_buf_map_attachment dma_buf_map_attachment_unlocked dma_buf_unmap_attachment dma_buf_unmap_attachment_unlocked dma_buf_detach" $em 1 4096
# The verbs commands of registration and deregistration, 5 levels deep, lines over 10 us.
trace rdma_verbs 5 10 "ib_uverbs_ioctl ib_uverbs_write" p2pbuf rdma bench --what reg --reps 1 --addr "$RXE_IP" --reg-sizes 4k --uninitialized
# Deregistration itself, every level, lines over 10 us.
trace rdma_dereg 0 10 "ib_dereg_mr_user rxe_dereg_mr" p2pbuf rdma bench --what reg --reps 1 --addr "$RXE_IP" --reg-sizes 4k --uninitialized
echo 1 >$cpu1

# The same untraced measurements once more with kmemleak switched off (for the rest of the boot:
# it cannot be switched on again), as benchmarks trace_*_nokmemleak: what the stack trace that
# kmemleak saves for every allocation costs each path.
K=/sys/kernel/debug/kmemleak
[ -e $K ] || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
if [ -e $K ] && echo off >$K; then
	$em "$reps" 4096 | sed -e 's/ export_map / trace_export_map_nokmemleak /'
	p2pbuf rdma bench --what reg --reps "$reps" --addr "$RXE_IP" --reg-sizes 4k --uninitialized |
		sed -e 's/ rdma_reg / trace_rdma_reg_nokmemleak /'
else
	echo "# trace: kmemleak could not be switched off; no trace_*_nokmemleak benchmarks"
fi
exit 0

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# rdma-core's own test suite (tests/run_tests.py, with pyverbs built by xtask against the
# project's patched rdma-core) on rxe0: once in full with dma-bufs from /dev/p2pbuf (device
# memory), once the dma-buf MR tests with dma-bufs from /dev/udmabuf (system memory). The
# pyverbs boot only (its initramfs carries Python and pyverbs); the results as KTAP by
# /p2pbuf/pyverbs_ktap.py, which lists rxe's known failures with their reasons.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
if [ ! -x /usr/bin/python3 ] || [ ! -f /p2pbuf/pyverbs_ktap.py ]; then
	ktap_plan 1
	ktap_skip "rdma-core tests" "no Python/pyverbs in this initramfs (the pyverbs boot has them)"
	exit 4
fi
if ! rxe_setup; then
	ktap_plan 1
	ktap_fail "rxe0 on $RXE_NETDEV ($RXE_IP) with an active port"
	ktap_exit
fi
# rdma-core's tests pick the GID themselves (RoCE v2 of an IPv4 address); the p2pbuf
# allocator needs /dev/p2pbuf (the exporter, loaded by run-tests.sh).
echo "# python: $(python3 --version 2>&1); rxe0 RoCE v2 GID index $(rxe_gid_index)"
[ -c /dev/p2pbuf ] || echo "# /dev/p2pbuf is missing: the p2pbuf allocator will fail"
# p2pbuf.pyverbs=dmabuf (`--append`): only the dma-buf MR tests (minutes, not half an hour).
which=$(cmdline_arg pyverbs)
exec python3 /p2pbuf/pyverbs_ktap.py suite "$RXE_DEV" "${which:-all}"

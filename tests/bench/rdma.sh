#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# RDMA benchmarks on soft-RoCE (rxe0 on the lab's NIC), `p2pbuf rdma bench`:
# - rdma_reg: time of ibv_reg_dmabuf_mr on p2pbuf device memory vs ibv_reg_mr on anonymous
#   host memory whose pages were touched first (host_cold: not touched), device memory from
#   4 KiB to the BAR's size (64 GiB), host memory up to what the guest's RAM holds;
# - rdma_write: RDMA WRITE bandwidth and latency into a dma-buf MR of device memory vs a
#   host MR, over rxe0's loopback.
# Method and results: docs/rdma.md. argv[1]: repetitions per point.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
reps=${1:-5}
if ! rxe_setup; then
	echo "# rdma: no rxe0 on $RXE_NETDEV; nothing measured"
	exit 1
fi
if [ ! -e /dev/p2pbuf ]; then
	echo "# rdma: no /dev/p2pbuf (exporter not bound); nothing measured"
	exit 1
fi
# Root pins without RLIMIT_MEMLOCK; say what the registrations run under anyway.
echo "# rdma: $(grep MemTotal /proc/meminfo | tr -s ' '), RLIMIT_MEMLOCK $(ulimit -l), $(nproc) CPU(s)"
# Device memory up to the BAR (cargo xtask bench --gpu-mem-mib 65536: up to 64 GiB), allocated
# without zeroing (not timed; zeroing 64 GiB is minutes under TCG); host memory up to what the
# guest's RAM holds: kinds host (pinned, kept) and host_cold (allocated beside it) take twice
# the size, so the largest of 1 GiB, 2 GiB, 4 GiB whose double leaves 512 MiB of MemAvailable.
sizes=4k,64k,1M,16M,128M,1G
bar=$(stat -c %s "$(pci_find $GPU_ID)/resource2" 2>/dev/null || echo 0)
for s in 2 4 16 64; do
	[ "$bar" -ge $((s << 30)) ] && sizes="$sizes,${s}G"
done
avail=$(awk '/^MemAvailable:/ { print $2 * 1024 }' /proc/meminfo)
host_max=1G
for s in 2 4; do
	[ "${avail:-0}" -ge $(((2 * s << 30) + (512 << 20))) ] && host_max=${s}G
done
echo "# rdma: BAR of $bar bytes, MemAvailable $avail bytes: registration sizes $sizes, host memory up to $host_max"
p2pbuf rdma bench --reps "$reps" --cold --addr "$RXE_IP" --reg-sizes "$sizes" --host-max "$host_max" --uninitialized

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# RDMA benchmarks on soft-RoCE (rxe0 on the lab's NIC), `p2pbuf rdma bench`:
# - rdma_reg: time of ibv_reg_dmabuf_mr on p2pbuf device memory vs ibv_reg_mr on anonymous
#   host memory whose pages were touched first (host_cold: not touched), 4 KiB to 1 GiB;
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
# without zeroing (not timed; zeroing 64 GiB is minutes under TCG); host memory up to 1 GiB,
# what the guest's RAM holds.
sizes=4k,64k,1M,16M,128M,1G
bar=$(stat -c %s "$(pci_find $GPU_ID)/resource2" 2>/dev/null || echo 0)
for s in 4 16 64; do
	[ "$bar" -ge $((s << 30)) ] && sizes="$sizes,${s}G"
done
echo "# rdma: BAR of $bar bytes: registration sizes $sizes"
p2pbuf rdma bench --reps "$reps" --cold --addr "$RXE_IP" --reg-sizes "$sizes" --host-max 1G --uninitialized

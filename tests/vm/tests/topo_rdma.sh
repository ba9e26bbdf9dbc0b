#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# ibv_reg_dmabuf_mr of the exporter's device memory on rxe, on the topology boots of
# `cargo xtask test` (xtask/src/judge/boots.rs). rxe copies with the CPU and attaches dma-bufs for
# CPU access, without a device (dma_buf_cpu_attach()): the PCI path between the NIC and the
# memory does not matter to it, and the exporter makes no DMA mapping. On both root-port
# fabrics, the one where p2pdma has no path between the NIC and the memory (non-Zen CPU: a
# DMA importer in the NIC's slot is refused, tests/selftests/topo_refusal.c) and the one
# through the host bridge (Zen CPU, intel-iommu), the registration works, an RDMA WRITE into
# the device memory is verified through its mmap and, from the host, in the ivshmem backing
# file, and an RDMA READ returns it. (Before rxe attached for CPU access, it attached with
# the NIC's PCI function, and the first fabric refused it with EOPNOTSUPP.)
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
FABRIC=$(p2p_fabric)
echo "# fabric: $FABRIC (topology $P2PBUF_TOPOLOGY, CPU $P2PBUF_CPU_VENDOR, iommu $P2PBUF_IOMMU)"
if [ "$FABRIC" = switch ]; then
	ktap_plan 1
	ktap_skip "topo_rdma" "only on the root-port boots (--boot rootports, rootports-zen-iommu)"
	exit 4
fi
ktap_plan 6
if ! rxe_setup; then
	ktap_fail "rxe0 on $RXE_NETDEV"
	ktap_exit
fi
NIC=$(pci_find $NIC_ID)
GPU=$(pci_find $GPU_ID)
NIC_ADDR=${NIC##*/}
GPU_ADDR=${GPU##*/}
NIC_RP=$(basename "$(dirname "$NIC")")
GPU_RP=$(basename "$(dirname "$GPU")")
ktap_ok "rxe0 on $RXE_NETDEV, the PCI device $NIC_ADDR under $NIC_RP; memory $GPU_ADDR under $GPU_RP"
DEBUGFS=/sys/kernel/debug/p2pbuf

# Whatever the fabric: it must work, without any DMA mapping.
PORT=7481
SIZE=8M
WOFF=1048576
WLEN=3145728
SEED=41
if ! serve_bg /tmp/serve.txt 60 --port $PORT --mem p2pbuf --size $SIZE --clients 2 --timeout 120; then
	serve_failed /tmp/serve.txt "serve --mem p2pbuf: device memory registered with ibv_reg_dmabuf_mr" \
		attach write read verdict
	ktap_exit
fi
comment /tmp/serve.txt
ktap_check "serve --mem p2pbuf: $SIZE of device memory registered with ibv_reg_dmabuf_mr" \
	grep -q "registered on rxe0 with ibv_reg_dmabuf_mr" /tmp/serve.txt
sed 's/^/# debugfs: /' $DEBUGFS/buffers
# The buffer's BAR offset, for the host check (the only live 8 MiB buffer).
BAR_OFF=$(sed -n 's/^buffer .*: 8388608 bytes at BAR offset \(0x[0-9a-f]*\), maps.*/\1/p' $DEBUGFS/buffers | tail -1)
if [ -n "$BAR_OFF" ] && grep "^buffer .*: 8388608 bytes" $DEBUGFS/buffers | tail -1 |
	grep -q "maps 0 active (0 map / 0 unmap calls), vmaps 1"; then
	ktap_ok "rxe attached for CPU access: the buffer at BAR offset $BAR_OFF is vmapped, not mapped for $NIC_ADDR or any device"
else
	ktap_fail "want the buffer (BAR offset ${BAR_OFF:-not found}) vmapped and never mapped for DMA"
fi
rdma_client 120 /tmp/w.txt write --size $WLEN --offset $WOFF --pattern $SEED --lab-pattern
if [ $rc -eq 0 ] && grep -q "server: verified the pattern" /tmp/w.txt; then
	ktap_ok "RDMA WRITE of 3 MiB at 1 MiB into device memory ($FABRIC fabric), verified through its mmap, $(rate /tmp/w.txt)"
	[ -n "$BAR_OFF" ] && echo "# hostcheck target=gpu offset=$((BAR_OFF + WOFF)) len=$WLEN seed=$SEED"
else
	ktap_fail "RDMA WRITE of 3 MiB at 1 MiB into device memory ($FABRIC fabric): exit $rc"
fi
rdma_client 120 /tmp/r.txt read --size $WLEN --offset $WOFF --pattern $SEED --lab-pattern
ktap_check "RDMA READ of the 3 MiB back returns the pattern (exit $rc)" grep -q "^OK" /tmp/r.txt
wait $srv
comment /tmp/serve.txt
ktap_check "server: 2 clients verified" grep -q "done: 2 client(s) verified, 0 failed" /tmp/serve.txt
ktap_exit

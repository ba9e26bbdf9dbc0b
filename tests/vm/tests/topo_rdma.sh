#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# ibv_reg_dmabuf_mr of the exporter's device memory on rxe, on the topology boots of
# `cargo xtask test` (xtask/src/boots.rs). rxe attaches a dma-buf with the PCI device of its
# net device (virtio-net), so the p2pbuf exporter decides as for a hardware NIC in that slot:
# - refused (each device on its own root port, non-Zen CPU): p2pdma has no path between the
#   NIC and the memory, the exporter refuses the attachment, ibv_reg_dmabuf_mr fails with
#   EOPNOTSUPP (95), and p2pbuf says why: map type NOT_SUPPORTED, the NIC's and the memory's
#   root ports, the host bridge, the CPU. A udmabuf (system memory) and a host MR still
#   register on the same rxe0: the refusal is the path's, not rxe's.
# - hostbridge (root ports, Zen CPU, intel-iommu): the exporter attaches the NIC with map
#   type THRU_HOST_BRIDGE, an RDMA WRITE into the device memory is verified through its mmap
#   and, from the host, in the ivshmem backing file; an RDMA READ returns it.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
FABRIC=$(p2p_fabric)
echo "# fabric: $FABRIC (topology $P2PBUF_TOPOLOGY, CPU $P2PBUF_CPU_VENDOR, iommu $P2PBUF_IOMMU)"
if [ "$FABRIC" = switch ]; then
	ktap_plan 1
	ktap_skip "topo_rdma" "only on the root-port boots (--boot rootports, rootports-zen-iommu)"
	exit 4
fi
if [ "$FABRIC" = refused ]; then ktap_plan 5; else ktap_plan 6; fi
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

if [ "$FABRIC" = refused ]; then
	p2pbuf --json rdma reg --buf p2pbuf --size 4M >/tmp/reg.json 2>&1
	rc=$?
	comment /tmp/reg.json
	errno=$(json_num errno </tmp/reg.json)
	ktap_check "ibv_reg_dmabuf_mr of p2pbuf device memory refused: exit $rc, errno ${errno:-none} (want 1, 95 EOPNOTSUPP)" \
		test "$rc" = 1 -a "$errno" = 95
	p2pbuf rdma reg --buf p2pbuf --size 4M >/tmp/reg.txt 2>&1
	comment /tmp/reg.txt
	# The message must say why: the map type, both devices with their root ports, the host
	# bridge and the CPU, and the exporter's own reason.
	ok=1
	for want in "map type NOT_SUPPORTED" "$NIC_ADDR (under root port $NIC_RP)" \
		"$GPU_ADDR (under root port $GPU_RP)" "only the host bridge pci0000" \
		"this CPU: $P2PBUF_CPU_VENDOR" "exporter refused it" "no peer-to-peer path"; do
		grep -qF "$want" /tmp/reg.txt || { echo "# missing from the message: $want"; ok=0; }
	done
	ktap_check "the error says why: NOT_SUPPORTED, $NIC_ADDR under $NIC_RP and $GPU_ADDR under $GPU_RP meet only at the host bridge" \
		test $ok = 1
	echo "# kernel log about the NIC:"
	dmesg >/tmp/dmesg.txt
	grep "$NIC_ADDR" /tmp/dmesg.txt | sed 's/^/#   /'
	# p2pdma names the two devices; the exporter records its reason for the buffer, which
	# p2pbuf reads with P2PBUF_IOCTL_REFUSAL (only the refused device's record is quoted: it
	# names $NIC_ADDR); p2pbuf repeats both.
	klog="$NIC_ADDR: cannot be used for peer-to-peer DMA as the client and provider ($GPU_ADDR) do not share an upstream bridge"
	if grep -q "exporter refused it; its reason (P2PBUF_IOCTL_REFUSAL, [0-9]* refusal(s) of this buffer): no peer-to-peer path" /tmp/reg.txt &&
		grep -qF "$klog" /tmp/dmesg.txt && grep -qF "the kernel logged: virtio-pci $klog" /tmp/reg.txt; then
		ktap_ok "the exporter recorded the refusal of $NIC_ADDR (P2PBUF_IOCTL_REFUSAL), the kernel logged the devices without a shared bridge, and p2pbuf quotes both"
	else
		ktap_fail "refusal of $NIC_ADDR: want the exporter's reason (P2PBUF_IOCTL_REFUSAL) and dmesg (p2pdma) quoted by p2pbuf"
	fi
	# The same rxe0 registers system memory: a udmabuf (dma-buf MR) and a host MR.
	p2pbuf rdma reg --buf udmabuf --size 4M >/tmp/u.txt 2>&1
	urc=$?
	p2pbuf rdma reg --buf host --size 4M >/tmp/h.txt 2>&1
	hrc=$?
	comment /tmp/u.txt
	comment /tmp/h.txt
	if [ $urc -eq 0 ] && grep -q "with ibv_reg_dmabuf_mr" /tmp/u.txt &&
		[ $hrc -eq 0 ] && grep -q "with ibv_reg_mr" /tmp/h.txt; then
		ktap_ok "control: a udmabuf (dma-buf MR) and host memory register on the same rxe0"
	else
		ktap_fail "control: udmabuf exit $urc, host exit $hrc (want both registered)"
	fi
	ktap_exit
fi

# hostbridge: it must work, through the host bridge.
PORT=7481
SIZE=8M
WOFF=1048576
WLEN=3145728
SEED=41
if ! serve_bg /tmp/serve.txt 60 --port $PORT --buf p2pbuf --size $SIZE --clients 2 --timeout 120; then
	serve_failed /tmp/serve.txt "serve --buf p2pbuf: device memory registered with ibv_reg_dmabuf_mr" \
		attach write read verdict
	ktap_exit
fi
comment /tmp/serve.txt
ktap_check "serve --buf p2pbuf: $SIZE of device memory registered with ibv_reg_dmabuf_mr" \
	grep -q "registered on rxe0 with ibv_reg_dmabuf_mr" /tmp/serve.txt
sed 's/^/# debugfs: /' $DEBUGFS/buffers
# The buffer's BAR offset, for the host check (the only live 8 MiB buffer).
BAR_OFF=$(sed -n 's/^buffer .*: 8388608 bytes at BAR offset \(0x[0-9a-f]*\), maps.*/\1/p' $DEBUGFS/buffers | tail -1)
if [ -n "$BAR_OFF" ] && grep -q "attached: $NIC_ADDR (THRU_HOST_BRIDGE)" $DEBUGFS/buffers; then
	ktap_ok "the exporter attached $NIC_ADDR with map type THRU_HOST_BRIDGE (buffer at BAR offset $BAR_OFF)"
else
	ktap_fail "the exporter attached $NIC_ADDR with map type THRU_HOST_BRIDGE (BAR offset ${BAR_OFF:-not found})"
fi
rdma_client 120 /tmp/w.txt write --size $WLEN --offset $WOFF --pattern $SEED --lab-pattern
if [ $rc -eq 0 ] && grep -q "server: verified the pattern" /tmp/w.txt; then
	ktap_ok "RDMA WRITE of 3 MiB at 1 MiB into device memory through the host bridge, verified through its mmap, $(rate /tmp/w.txt)"
	[ -n "$BAR_OFF" ] && echo "# hostcheck target=gpu offset=$((BAR_OFF + WOFF)) len=$WLEN seed=$SEED"
else
	ktap_fail "RDMA WRITE of 3 MiB at 1 MiB into device memory through the host bridge: exit $rc"
fi
rdma_client 120 /tmp/r.txt read --size $WLEN --offset $WOFF --pattern $SEED --lab-pattern
ktap_check "RDMA READ of the 3 MiB back returns the pattern (exit $rc)" grep -q "^OK" /tmp/r.txt
wait $srv
comment /tmp/serve.txt
ktap_check "server: 2 clients verified" grep -q "done: 2 client(s) verified, 0 failed" /tmp/serve.txt
ktap_exit

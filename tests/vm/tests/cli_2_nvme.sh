#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# p2pbuf nvme write/read: a pattern from device memory to the drive with O_DIRECT (the drive
# reads the BAR peer-to-peer), read back into other device memory and checked, also into host
# memory (a udmabuf mapping is VM_PFNMAP: O_DIRECT gets EFAULT, explained); the host checks
# the NVMe backing file. On the root-port topology the block layer refuses the P2P pages
# (EREMOTEIO, or EINVAL from NVMe's DMA mapping) and p2pbuf must say that the drive and the
# memory have no peer-to-peer path. With a Zen CPU the kernel allows the root-port path
# through the host bridge (and the IOMMU): there it must work as on the switch.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
DEV=/dev/nvme0n1
OFF=64M
OFF_BYTES=67108864
LEN=1M
SEED=$(($$ % 200 + 1))
ktap_plan 6
if [ ! -b $DEV ]; then
	for t in write read-p2pbuf read-udmabuf read-host wrong-seed unaligned; do ktap_skip "$t" "no $DEV"; done
	ktap_exit
fi

timeout 60 p2pbuf --json nvme write --dev $DEV --offset $OFF --len $LEN --mem p2pbuf --pattern-seed $SEED >/tmp/w.json 2>/tmp/w.err
rc=$?
comment /tmp/w.json
comment /tmp/w.err
if [ "$(p2p_fabric)" = refused ]; then
	# No P2P path: refused, not bounced, and said so.
	# EREMOTEIO where the queue takes no P2P pages; EINVAL (BLK_STS_INVAL) where NVMe takes
	# them but its DMA mapping finds no path, as in Linux 7.2 and 7.3 (block/blk-mq-dma.c).
	if [ $rc -eq 1 ] && grep -q '"errno":\(121\|22\)' /tmp/w.json && grep -q "no peer-to-peer path" /tmp/w.err; then
		ktap_ok "nvme write from device memory: refused on the root-port topology (errno $(json_num errno </tmp/w.json)), reported as no P2P path"
	else
		ktap_fail "nvme write from device memory on rootports: exit $rc, want 1 with the refusal explained"
	fi
	for t in "read into device memory" "read into udmabuf" "read into host memory" "wrong seed" "unaligned"; do
		ktap_skip "$t" "no P2P path on the root-port topology"
	done
	ktap_exit
fi
if [ $rc -eq 0 ] && grep -q '"device_memory":true' /tmp/w.json && grep -q '"bytes":1048576' /tmp/w.json; then
	ktap_ok "nvme write of 1 MiB from device memory (seed $SEED), O_DIRECT peer-to-peer"
	echo "# hostcheck target=nvme offset=$OFF_BYTES len=1048576 seed=$SEED"
else
	ktap_fail "nvme write of 1 MiB from device memory: exit $rc"
fi

# read_check KIND NAME: read back into KIND and verify the pattern.
read_check() {
	logged /tmp/r.txt timeout 60 p2pbuf nvme read --dev $DEV --offset $OFF --len $LEN --mem "$1" --verify-seed $SEED
	ktap_check "nvme read of 1 MiB into $2, verified (exit $rc)" \
		sh -c "[ $rc -eq 0 ] && grep -q \"all 1048576 bytes are seed $SEED's pattern\" /tmp/r.txt && grep -q '^OK' /tmp/r.txt"
}
read_check p2pbuf "device memory (peer-to-peer)"
# udmabuf maps its dma-buf with vmf_insert_pfn (VM_PFNMAP): O_DIRECT cannot pin those pages
# and the kernel answers EFAULT, which p2pbuf must explain.
logged /tmp/r.txt timeout 60 p2pbuf nvme read --dev $DEV --offset $OFF --len $LEN --mem udmabuf --verify-seed $SEED
ktap_check "nvme read into a udmabuf mapping (VM_PFNMAP): EFAULT, explained (exit $rc)" \
	sh -c "[ $rc -eq 1 ] && grep -q 'errno 14' /tmp/r.txt && grep -q 'VM_PFNMAP' /tmp/r.txt"
read_check host "host memory"

logged /tmp/r.txt timeout 60 p2pbuf nvme read --dev $DEV --offset $OFF --len 64k --mem p2pbuf --verify-seed $((SEED + 1))
ktap_check "nvme read with the wrong seed: the mismatch is found (exit $rc)" \
	sh -c "[ $rc -eq 1 ] && grep -q 'differ from seed' /tmp/r.txt"

logged /tmp/r.txt timeout 60 p2pbuf nvme read --dev $DEV --offset 100 --len 4096 --mem p2pbuf
ktap_check "nvme read at an unaligned offset: EINVAL, says O_DIRECT needs alignment (exit $rc)" \
	sh -c "[ $rc -eq 1 ] && grep -q 'errno 22' /tmp/r.txt && grep -q 'aligned' /tmp/r.txt"
ktap_exit

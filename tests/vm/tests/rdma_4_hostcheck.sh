#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# RDMA WRITEs into a dma-buf MR of p2pbuf device memory, checked from the host: several MiB
# at several offsets (unaligned ones too) carry the lab pattern (byte i of a write is
# (i*13 + seed + (i>>12)) & 0xff, `p2pbuf rdma write --lab-pattern`); the server verifies them
# through its mmap of the dma-buf, an RDMA READ returns them, and each write prints a
# "# hostcheck target=gpu offset=<BAR offset> ..." line, so that `cargo xtask test` finds
# the same bytes in the ivshmem backing file on the host (xtask/src/judge/hostcheck.rs): the rxe
# data path wrote into the device's BAR, not into some copy. The BAR offset of the buffer
# comes from the exporter's debugfs, which also shows rxe's kernel mapping (vmaps) and no DMA
# mapping (rxe attaches for CPU access, without a device: the dma-buf core's bufinfo lists
# the attachment as "(CPU access)"), and counts the CPU-access brackets
# (begin/end_cpu_access): rxe brackets every packet's copy into the MR (review M6).
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 10
rxe_test
DBG=$P2PBUF_DEBUGFS_BUFFERS
if [ ! -e /dev/p2pbuf ] || [ ! -r $DBG ]; then
	for i in 2 3 4 5 6 7 8 9 10; do ktap_skip "RDMA into device memory, host check $i" "no /dev/p2pbuf or no $DBG"; done
	ktap_exit
fi

PORT=7474
SIZE=12582912 # 12 MiB: a size no other buffer of this test has, to find it in debugfs
# The host looks at the bytes after the whole suite: a spacer held while the server allocates
# puts the buffer 384 MiB into the BAR, where later tests' allocations (first fit from the
# start, zeroed) do not overwrite it (exporter_3_mmap.c's host check uses 3/4 of the BAR).
p2pbuf alloc --mem p2pbuf --size 384M --hold 300 >/tmp/hc_spacer.txt 2>&1 &
spacer=$!
wait_for /tmp/hc_spacer.txt "allocated" 60 || comment /tmp/hc_spacer.txt
if ! serve_bg /tmp/hc_serve.txt 60 --port $PORT --mem p2pbuf --size $SIZE --clients 4 --timeout 120; then
	comment /tmp/hc_serve.txt
	ktap_fail "serve --mem p2pbuf: 12 MiB of device memory registered with ibv_reg_dmabuf_mr"
	kill $srv $spacer 2>/dev/null
	ktap_exit
fi
kill $spacer 2>/dev/null
wait $spacer 2>/dev/null
comment /tmp/hc_serve.txt
ktap_check "serve --mem p2pbuf: 12 MiB of device memory registered with ibv_reg_dmabuf_mr" \
	grep -q "with ibv_reg_dmabuf_mr" /tmp/hc_serve.txt

# The buffer in the exporter's debugfs: its BAR offset, rxe's vmap and no DMA mapping; rxe's
# attachment for CPU access in the dma-buf core's list (bufinfo: the buffer's line, its size
# first, then its attached devices up to "Total").
comment $DBG
line=$(debugfs_buffer $SIZE)
BAR=$(debugfs_field "$line" offset)
BUFINFO=/sys/kernel/debug/dma_buf/bufinfo
attached=$(awk -v size=$SIZE '$1 + 0 == size { on = 1; next } on && /^Total/ { exit } on' $BUFINFO)
echo "$attached" | sed 's/^/# bufinfo: /'
if [ -n "$BAR" ] && echo "$line" | grep -q "maps 0 active (0 map / 0 unmap calls), vmaps 1" &&
	! echo "$line" | grep -q "attached:" && echo "$attached" | grep -q "(CPU access)"; then
	ktap_ok "debugfs: the buffer at BAR offset $BAR, attached by rxe for CPU access (no device, no DMA mapping), vmapped (vmaps 1)"
else
	ktap_fail "debugfs: want the 12 MiB buffer with a BAR offset, no DMA mapping, vmaps 1, and a (CPU access) attachment in $BUFINFO"
fi
BARHEX=$BAR
BAR=$((${BAR:-0}))

# hc_write LEN OFFSET SEED: an RDMA WRITE of the lab pattern that the server verifies, and
# the host check of the same bytes.
hc_write() {
	rdma_client 120 /tmp/hc_w.txt write --size "$1" --offset "$2" --pattern "$3" --lab-pattern
	if [ $rc -eq 0 ] && grep -q "server: verified the pattern" /tmp/hc_w.txt; then
		ktap_ok "RDMA WRITE of $1 bytes at offset $2 (lab pattern, seed $3) into device memory, verified through the mmap, $(rate /tmp/hc_w.txt)"
		# The host reads the ivshmem backing file at the same BAR offset.
		[ -n "$BARHEX" ] && echo "# hostcheck target=gpu offset=$((BAR + $2)) len=$1 seed=$3"
	else
		ktap_fail "RDMA WRITE of $1 bytes at offset $2 (lab pattern, seed $3): exit $rc"
	fi
}
# At the start, at a page-aligned offset, and at an odd offset with an odd length (8 MiB in all).
hc_write 4194304 0 31
hc_write 3145728 5246976 32
hc_write 1048581 9437307 33

# CPU access: rxe copied the 8 MiB into the BAR inside dma_buf_begin_cpu_access() /
# dma_buf_end_cpu_access() brackets, one per packet (at most 4 KiB each), so the exporter saw
# at least 2048 of each, as many ends as begins. (The server's 3 checks through its mmap add a
# DMA_BUF_IOCTL_SYNC bracket each; without rxe's there would be only those.)
line=$(debugfs_buffer $SIZE)
begins=$(debugfs_field "$line" cpu_begin)
ends=$(debugfs_field "$line" cpu_end)
ktap_check "CPU access brackets around rxe's copies into the MR: ${begins:-?} begin_cpu_access, ${ends:-?} end_cpu_access (want >= 2048, equal)" \
	sh -c "[ ${begins:-0} -ge 2048 ] && [ ${begins:-0} -eq ${ends:--1} ]"

# RDMA READ of the second write back: the client checks the lab pattern.
rdma_client 120 /tmp/hc_r.txt read --size 3145728 --offset 5246976 --pattern 32 --lab-pattern
ktap_check "RDMA READ of 3 MiB from device memory returns the lab pattern of seed 32 (exit $rc)" \
	sh -c "[ $rc -eq 0 ] && grep -q '(equal)' /tmp/hc_r.txt && ! grep -q 'not the pattern' /tmp/hc_r.txt"

serve_wait /tmp/hc_serve.txt
ktap_check "server: 4 clients verified, MR deregistered (exit $src)" \
	sh -c "[ $src -eq 0 ] && grep -q 'done: 4 client(s) verified, 0 failed' /tmp/hc_serve.txt &&
		grep -q 'deregistered the MR' /tmp/hc_serve.txt"
# Deregistration vunmapped and detached, and closing the fd released the buffer (the exporter forgets released buffers lazily: it may still list
# it, marked released).
comment $DBG
line=$(debugfs_buffer $SIZE)
if [ -z "$line" ] || { echo "$line" | grep -q "released, maps 0 active (0 map / 0 unmap calls), vmaps 0" &&
	! echo "$line" | grep -q "attached:"; }; then
	ktap_ok "debugfs: after deregistration and close the buffer is released, never mapped for DMA, no vmap, no attachment"
else
	ktap_fail "debugfs: after deregistration and close, want the buffer released with no mapping, no vmap and no attachment"
fi
ktap_exit

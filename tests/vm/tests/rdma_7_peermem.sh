#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Plain ibv_reg_mr() on device memory, with no kernel hook: libp2pbuf_peermem.so.
#
# verbs-rdma-write (userspace/p2pbuf-peermem/c/verbs_rdma_write.c) is a verbs program that
# knows nothing of dma-bufs: it maps a file descriptor it is given (here the fd of a p2pbuf
# buffer of device memory, taken from the process that holds it with pidfd_getfd), registers
# an address range of the mapping with ibv_reg_mr() (or ibv_reg_mr_iova2, ibv_reg_mr_iova),
# RDMA-WRITEs the lab pattern into it over rxe0's loopback, addressed with mr->addr (or the
# iova) and mr->rkey, and reads the range back through the mapping.
#
# Without the library the registration fails (the kernel will not pin p2pdma pages for
# ib_umem_get: the errno is checked and printed). With LD_PRELOAD=libp2pbuf_peermem.so the same
# program registers, the write lands in device memory (verified through the mapping here and,
# from the "# hostcheck" lines, in the ivshmem backing file by the host), and the library's
# messages (P2PBUF_PEERMEM_DEBUG=1) show that ibv_reg_dmabuf_mr was called with the right
# offset and iova on a duplicate of the program's fd, that a second region of the same buffer
# used the cached fd, and that the fd was closed with the last deregistration. Host memory goes
# through untouched with and without the library. A program that closed its fd after mmap
# cannot be helped (the library says why and the real ibv_reg_mr answers).
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
LIB=/p2pbuf/lib/libp2pbuf_peermem.so
PROG=verbs-rdma-write
# What plain ibv_reg_mr on a p2pbuf mmap answers on this kernel (measured; docs/rdma.md):
# EREMOTEIO, from GUP refusing to pin a p2pdma page without FOLL_PCI_P2PDMA.
PLAIN_ERRNO=121
SIZE=5242880 # 5 MiB: a size no other buffer of this test has, to find it in debugfs
DBG=$P2PBUF_DEBUGFS_BUFFERS
ktap_plan 13
if ! rxe_setup; then
	ktap_fail "rxe0 on $RXE_NETDEV"
	ktap_exit
fi
GID=$(rxe_gid_index)
ktap_ok "rxe0 on $RXE_NETDEV, RoCE v2 GID index $GID"
if [ ! -e /dev/p2pbuf ] || ! command -v $PROG >/dev/null || [ ! -e $LIB ]; then
	for i in 2 3 4 5 6 7 8 9 10 11 12 13; do
		ktap_skip "peermem $i" "no /dev/p2pbuf, $PROG or $LIB"
	done
	ktap_exit
fi

# The device memory: a p2pbuf buffer held by another process. Allocation is first fit from
# the start of the BAR and zeroes what it takes, so no spacer: a spacer would zero the bytes
# that earlier tests left for the host check (rdma_4's at 384-396 MiB, exporter_3_mmap.c's at 1/2,
# 5/8, 3/4 of the BAR and its end). Every earlier buffer is gone, so the buffer lands below
# 384 MiB, where nobody else's checked bytes are; the tests after this one allocate
# uninitialized buffers, or zeroed ones above a guard (fail_nth.c), and leave these bytes be.
p2pbuf --json alloc --mem p2pbuf --size $SIZE --hold 900 >/tmp/pm_buf.json 2>&1 &
holder=$!
wait_for /tmp/pm_buf.json '"fd"' 60
comment /tmp/pm_buf.json
PID=$(jq -r .pid /tmp/pm_buf.json 2>/dev/null)
FD=$(jq -r .fd /tmp/pm_buf.json 2>/dev/null)
BAR=$(jq -r .bar_offset /tmp/pm_buf.json 2>/dev/null)
case "$PID:$FD:$BAR" in
*[!0-9:]* | :* | *::* | *:)
	ktap_fail "p2pbuf alloc: $SIZE bytes of device memory held by a process (pid, fd, BAR offset)"
	kill $holder 2>/dev/null
	ktap_exit
	;;
esac
if [ $((BAR + SIZE)) -gt 402653184 ]; then
	# Above 384 MiB the writes below could land on bytes that other tests left for the host check.
	ktap_fail "the buffer is at BAR offset $BAR, not below 384 MiB: not writing into it"
	kill $holder 2>/dev/null
	ktap_exit
fi
ktap_ok "$SIZE bytes of device memory at BAR offset $BAR (below 384 MiB), fd $FD of pid $PID"

# run NAME ENV... -- ARGS...: verbs-rdma-write with the environment ENV (VAR=VALUE words) and
# the common arguments; stdout in /tmp/pm_out.txt, stderr in /tmp/pm_err.txt, exit in $rc.
run() {
	_env=""
	while [ "$1" != "--" ]; do
		_env="$_env $1"
		shift
	done
	shift
	# shellcheck disable=SC2086
	env $_env timeout 300 $PROG --dev $RXE_DEV --gid-index "$GID" "$@" >/tmp/pm_out.txt 2>/tmp/pm_err.txt
	rc=$?
	comment /tmp/pm_out.txt
	comment /tmp/pm_err.txt
}
out_has() { grep -q "$1" /tmp/pm_out.txt; }
err_has() { grep -q "$1" /tmp/pm_err.txt; }
reg_errno() { sed -n 's/^REG_FAILED errno=//p' /tmp/pm_out.txt; }
# fds_balanced: the program's count of open fds after deregistering equals the one before.
fds_balanced() {
	sed -n 's/^open fds after deregistering: \([0-9]*\) (before: \([0-9]*\))$/\1 \2/p' /tmp/pm_out.txt |
		{ read -r a b && [ -n "$a" ] && [ "$a" = "$b" ]; }
}
hostcheck() { echo "# hostcheck target=gpu offset=$((BAR + $1)) len=$2 seed=$3"; }
PRE="LD_PRELOAD=$LIB P2PBUF_PEERMEM_DEBUG=1"

# 1. Without the library: what plain ibv_reg_mr on a p2pbuf mmap does today.
run -- --fd "$PID:$FD" --size $SIZE --length 1M --seed 41
e=$(reg_errno)
if [ $rc -eq 3 ] && [ "$e" = "$PLAIN_ERRNO" ] && err_has "ibv_reg_mr(.*) failed: .*(errno $PLAIN_ERRNO)"; then
	# (No strerror text in the name: "Remote I/O error" has a '/', which the harness reads as a path.)
	ktap_ok "without the library: ibv_reg_mr on the mmap of device memory fails with errno $e (EREMOTEIO)"
else
	ktap_fail "without the library: exit $rc errno ${e:-none}, want exit 3 and errno $PLAIN_ERRNO"
fi

# 2. With the library: ibv_reg_mr (the symbol), a second region of the same buffer.
run $PRE -- --fd "$PID:$FD" --size $SIZE --length 1M --seed 42 --second-mr --reg-reps 10
if [ $rc -eq 0 ] && out_has "registered .* with ibv_reg_mr in" &&
	out_has "verified 1048576 bytes of seed 42 through the mapping at offset 0" &&
	out_has "verified 524288 bytes of seed 43 through the mapping (second region)" &&
	err_has "ibv_reg_mr(pd .*): in the mapping of dma-buf /dmabuf:.*fd [0-9]* (a duplicate of the program's fd [0-9]*), p2pbuf dma-buf of $SIZE bytes" &&
	err_has "ibv_reg_dmabuf_mr(pd .*, offset 0x0, length 1048576, iova 0x[0-9a-f]*, fd [0-9]*, access LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ): registered"; then
	ktap_ok "with LD_PRELOAD: ibv_reg_mr registers the mapping through ibv_reg_dmabuf_mr (offset 0, iova = the address), the RDMA WRITE of 1 MiB lands in device memory, verified through the mapping"
	hostcheck 0 1048576 42
else
	ktap_fail "with LD_PRELOAD: ibv_reg_mr + RDMA WRITE into device memory: exit $rc"
fi
if [ $rc -eq 0 ] && err_has "ibv_reg_mr(pd .*, length 524288, .*cached fd" &&
	err_has "deregistered; fd [0-9]* stays open for 1 other memory region" &&
	err_has "deregistered; closed fd [0-9]* (.*); the library now holds 0 fd(s) for 0 memory region(s)" &&
	fds_balanced; then
	ktap_ok "a second region of the same buffer uses the cached fd; the fd is closed with the last deregistration (open fds before and after: $(sed -n 's/^open fds after deregistering: //p' /tmp/pm_out.txt))"
else
	ktap_fail "fd cache: want the second region on the cached fd, the fd closed with the last region, open fds balanced"
fi

# 3. An unaligned range, with access flags known only at run time: ibv_reg_mr_iova2.
run $PRE -- --fd "$PID:$FD" --size $SIZE --offset 1048699 --length 1048581 --seed 44 --api iova2
if [ $rc -eq 0 ] && out_has "verified 1048581 bytes of seed 44 through the mapping at offset 1048699" &&
	err_has "ibv_reg_mr_iova2(pd .*): in the mapping of dma-buf" &&
	err_has "ibv_reg_dmabuf_mr(pd .*, offset 0x10007b, length 1048581, iova 0x[0-9a-f]*07b, fd" &&
	fds_balanced; then
	ktap_ok "ibv_reg_mr_iova2 of 1 MiB + 5 bytes at offset 1 MiB + 123: dma-buf offset 0x10007b, RDMA WRITE verified"
	hostcheck 1048699 1048581 44
else
	ktap_fail "ibv_reg_mr_iova2 of an unaligned range of device memory: exit $rc"
fi

# 4. ibv_reg_mr_iova with an iova of the program's choosing, which the RDMA WRITE then uses.
run $PRE -- --fd "$PID:$FD" --size $SIZE --offset 2621440 --length 524288 --seed 45 --api iova --iova 0x100000000000
if [ $rc -eq 0 ] && out_has "verified 524288 bytes of seed 45 through the mapping at offset 2621440" &&
	out_has "RDMA WRITE of 524288 bytes to 0x100000000000 " &&
	err_has "ibv_reg_dmabuf_mr(pd .*, offset 0x280000, length 524288, iova 0x100000000000, fd"; then
	ktap_ok "ibv_reg_mr_iova at iova 0x100000000000: offset 0x280000, RDMA WRITE to that iova verified"
	hostcheck 2621440 524288 45
else
	ktap_fail "ibv_reg_mr_iova with its own iova: exit $rc"
fi

# 5. Host memory, with and without the library: the same answer, untouched.
run $PRE -- --anon --size 2M --length 1M --seed 46
if [ $rc -eq 0 ] && out_has "verified 1048576 bytes of seed 46" &&
	err_has "ibv_reg_mr(pd .*): host memory (mapping .* rw-p \[anonymous\]): passing to the real function" &&
	! err_has "ibv_reg_dmabuf_mr"; then
	ktap_ok "host memory with the library: passed to the real ibv_reg_mr, RDMA WRITE verified"
else
	ktap_fail "host memory with the library: exit $rc, want the real ibv_reg_mr and the write verified"
fi
run -- --anon --size 2M --length 1M --seed 46
if [ $rc -eq 0 ] && out_has "verified 1048576 bytes of seed 46" && [ ! -s /tmp/pm_err.txt ]; then
	ktap_ok "host memory without the library: RDMA WRITE verified, not a word on stderr"
else
	ktap_fail "host memory without the library: exit $rc"
fi

# 6. What the library costs a registration (no messages): 4 KiB of host memory without and
# with it, and of device memory with it (the fd cached by the first registration).
median() { sed -n 's/^50 more registrations with ibv_reg_mr: median \([0-9]*\) us.*/\1/p' /tmp/pm_out.txt; }
run -- --anon --size 64k --length 4k --seed 48 --reg-reps 50
r1=$rc HOST_PLAIN=$(median)
run LD_PRELOAD=$LIB -- --anon --size 64k --length 4k --seed 48 --reg-reps 50
r2=$rc HOST_PRE=$(median)
run LD_PRELOAD=$LIB -- --fd "$PID:$FD" --size $SIZE --offset 4259840 --length 4k --seed 48 --reg-reps 50
r3=$rc DEV_PRE=$(median)
if [ "$r1$r2$r3" = 000 ] && [ -n "$HOST_PLAIN" ] && [ -n "$HOST_PRE" ] && [ -n "$DEV_PRE" ]; then
	ktap_ok "registration of 4 KiB, median of 50: host memory ${HOST_PLAIN} us without the library, ${HOST_PRE} us with it; device memory ${DEV_PRE} us through it"
else
	ktap_fail "registration cost runs: exit $r1 $r2 $r3"
fi

# 7. A program that closed the dma-buf's fd after mmap: nothing to register with. (At 4 MiB: the
# program fills its range with 0xee before registering, which must not touch the bytes above
# that the host checks.)
run $PRE -- --fd "$PID:$FD" --size $SIZE --offset 4194304 --length 64k --seed 47 --close-fd
e=$(reg_errno)
if [ $rc -eq 3 ] && [ "$e" = "$PLAIN_ERRNO" ] &&
	err_has "no fd of this process refers to that dma-buf .* and /proc/self/map_files/[0-9a-f]*-[0-9a-f]* cannot be opened: .*(errno [0-9]*); keep the dma-buf's fd open while registering; passing to the real function"; then
	ktap_ok "fd closed after mmap: the library says why it cannot help ($(sed -n 's/.*cannot be opened: \(.*(errno [0-9]*)\).*/\1/p' /tmp/pm_err.txt | head -1)), the real ibv_reg_mr answers errno $e"
else
	ktap_fail "fd closed after mmap: exit $rc errno ${e:-none}, want exit 3, errno $PLAIN_ERRNO and the library's reason"
fi

# 8. A read-only mapping registered for writes: the library grants no write access the
# program's own mapping lacks; the real ibv_reg_mr refuses (EFAULT, as for read-only memory).
run $PRE -- --fd "$PID:$FD" --size $SIZE --offset 4194304 --length 64k --seed 49 --read-only
e=$(reg_errno)
if [ $rc -eq 3 ] && [ "$e" = 14 ] &&
	err_has "the mapping of dma-buf /dmabuf: is not writable (r--s) and the access flags ask for writes: passing to the real function"; then
	ktap_ok "a read-only mapping registered for writes: passed to the real ibv_reg_mr, errno $e (EFAULT)"
else
	ktap_fail "a read-only mapping registered for writes: exit $rc errno ${e:-none}, want exit 3 and errno 14"
fi

# 9. After all that, the exporter has no attachment and no map left of the buffer.
comment $DBG
line=$(debugfs_buffer $SIZE)
if echo "$line" | grep -q "maps 0 active (\([0-9]*\) map / \1 unmap calls), vmaps 0" &&
	! echo "$line" | grep -q "attached:"; then
	ktap_ok "debugfs: every registration's attachment, map and vmap undone (the buffer is still held)"
else
	ktap_fail "debugfs: want maps 0 active with as many unmaps as maps, vmaps 0, no attachment"
fi
kill $holder 2>/dev/null
wait $holder 2>/dev/null
ktap_exit

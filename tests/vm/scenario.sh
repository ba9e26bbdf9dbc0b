#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The guided scenario of `cargo xtask run`: what the lab is, step by step, with the kernel's
# own answers, then the whole story: export device memory, pass the fd to another process,
# register it for RDMA and write into memory from a peer, read NVMe into device memory, copy
# through the FPGA stand-in; every step verified, and a summary table. Each step runs under
# `timeout`, so the scenario never hangs.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say() { echo "   $*"; }
# show CMD...: print the command, run it (output indented), return its exit status.
show() {
	echo "   \$ $*"
	set -o pipefail
	"$@" 2>&1 | sed 's/^/     /'
	_rc=$?
	set +o pipefail
	return $_rc
}
# run_to FILE CMD...: as show, keeping the output in FILE too.
run_to() {
	_f=$1
	shift
	echo "   \$ $*"
	"$@" >"$_f" 2>&1
	_rc=$?
	sed 's/^/     /' "$_f"
	return $_rc
}
# record STEP RESULT DETAIL: a row of the summary table.
SUMMARY=/tmp/scenario-summary.txt
: >$SUMMARY
record() {
	printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>$SUMMARY
	say "=> $2: $3"
}

step "1. The machine"
say "kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB RAM; topology: $(cmdline_arg topology)"

step "2. The PCI fabric (lspci -tv)"
lspci -tv 2>/dev/null | sed 's/^/   /' || say "lspci missing"
for dev in GPU NVME EDU NIC; do
	eval id=\$${dev}_ID
	# shellcheck disable=SC2086
	p=$(pci_find $id)
	# Walk up to the root port: the chain of bridges a P2P transfer crosses.
	chain=""
	q=$p
	while [ "$(basename "$(dirname "$q")")" != "${q%%/pci0000*}" ] && [ "$(dirname "$q")" != "/sys/devices" ]; do
		q=$(dirname "$q")
		case "$(basename "$q")" in pci0000*) break ;; esac
		chain="$chain <- $(basename "$q")"
	done
	say "$(printf '%-5s' $dev) ${p##*/} ($id)$chain"
done

step "3. Loading the p2pbuf modules"
if load_modules; then
	dmesg | grep -E 'p2pbuf_(exporter|importer)' | tail -n 4 | sed 's/^/   /'
else
	say "FAILED to load the modules (see dmesg)"
fi

step "4. p2pdma providers (memory a peer can DMA into)"
found=0
for d in /sys/bus/pci/devices/*; do
	[ -d "$d/p2pmem" ] || continue
	found=1
	say "$(basename "$d"): $(( $(cat "$d/p2pmem/size") >> 20 )) MiB, $(( $(cat "$d/p2pmem/available") >> 20 )) MiB free, published=$(cat "$d/p2pmem/published")"
done
[ $found = 1 ] || say "none registered"
if [ -d /sys/kernel/debug/p2pbuf ]; then
	step "5. Distances and map types (from the exporter's debugfs)"
	for f in /sys/kernel/debug/p2pbuf/*; do
		[ -f "$f" ] && { say "--- $(basename "$f")"; sed 's/^/   /' "$f"; }
	done
else
	step "5. Distances and map types"
	say "the exporter's debugfs (/sys/kernel/debug/p2pbuf) is not there yet: it lands with the"
	say "dma-buf/p2pdma abstractions (issue 3) and the exporter (issue 4)."
fi

T=/tmp/scenario
mkdir -p $T

step "6. Export device memory (p2pbuf alloc --mem p2pbuf)"
say "The exporter hands out 2 MiB of the GPU-memory BAR as a dma-buf fd; we fill it through"
say "its mmap (DMA_BUF_IOCTL_SYNC around the access) and read fdinfo back."
run_to $T/alloc.txt timeout 30 p2pbuf alloc --mem p2pbuf --size 2M --fill 0x5a
if grep -q "exporter: p2pbuf" $T/alloc.txt; then
	record "6. export device memory" PASS "$(sed -n 's/^\$ *//; s/^ *allocated \(.*\)/\1/p' $T/alloc.txt | head -1)"
else
	record "6. export device memory" FAIL "p2pbuf alloc --mem p2pbuf failed (see above)"
fi

step "7. Pass the fd to another process (p2pbuf recv + p2pbuf alloc --send)"
say "Process B listens on a Unix socket; process A allocates device memory, fills it with 0xa5"
say "and sends the fd (SCM_RIGHTS). B maps what it received and reads the first bytes."
rm -f $T/fd.sock
timeout 30 p2pbuf recv $T/fd.sock --mmap >$T/recv.txt 2>&1 &
rpid=$!
show timeout 30 p2pbuf alloc --mem p2pbuf --size 2M --fill 0xa5 --send $T/fd.sock --wait 20
wait $rpid
rrc=$?
say "receiver (pid $rpid) said:"
sed 's/^/     /' $T/recv.txt
if [ $rrc -eq 0 ] && grep -q "exporter: p2pbuf" $T/recv.txt && grep -q "first bytes a5 a5 a5 a5" $T/recv.txt; then
	record "7. pass the fd" PASS "pid $rpid received the p2pbuf dma-buf and read a5 through its own mmap"
else
	record "7. pass the fd" FAIL "receiver exit $rrc (see above)"
fi

step "8. Register device memory for RDMA (soft-RoCE rxe0, ibv_reg_dmabuf_mr)"
if rxe_setup; then
	say "rxe0 on $RXE_NETDEV ($RXE_IP) is ACTIVE"
	run_to $T/reg.txt timeout 30 p2pbuf rdma reg --mem p2pbuf --size 4M
	rc=$?
	if [ $rc -eq 0 ] && grep -q "ibv_reg_dmabuf_mr" $T/reg.txt; then
		REG=ok
		record "8. RDMA registration" PASS "device memory registered with ibv_reg_dmabuf_mr on rxe0"
	elif grep -q "errno 95" $T/reg.txt; then
		REG=eopnotsupp
		say "The kernel's rxe driver has no dma-buf memory regions (no reg_user_mr_dmabuf):"
		say "the kernel refuses with EOPNOTSUPP before looking at the buffer. A NIC with"
		say "dma-buf MR support (mlx5, efa, irdma...) registers the same fd."
		record "8. RDMA registration" "REFUSED (expected)" "rxe has no dma-buf MRs in this kernel: EOPNOTSUPP (errno 95)"
	else
		REG=fail
		record "8. RDMA registration" FAIL "p2pbuf rdma reg exit $rc (see above)"
	fi
else
	REG=norxe
	record "8. RDMA registration" FAIL "could not set up rxe0 on $RXE_NETDEV"
fi

step "9. An RDMA WRITE from a peer (rdma serve + rdma write)"
if [ "$REG" = ok ]; then BUF=p2pbuf; WHAT="device memory (dma-buf MR)"; else BUF=host; WHAT="a host-memory MR (ibv_reg_mr)"; fi
if [ "$REG" = norxe ]; then
	record "9. RDMA WRITE from a peer" SKIP "no rxe0"
else
	say "The server registers $WHAT and waits; the client connects with rdma_cm, RDMA WRITEs"
	say "1 MiB of a pattern, and the server checks every byte through the CPU."
	PORT=7480
	timeout 60 p2pbuf rdma serve --port $PORT --mem $BUF --size 4M --clients 1 --timeout 45 >$T/serve.txt 2>&1 &
	spid=$!
	if wait_for $T/serve.txt "listening on" 20; then
		run_to $T/w.txt timeout 45 p2pbuf rdma write --server "$RXE_IP:$PORT" --size 1M --offset 0 --pattern 9
		rc=$?
	else
		rc=124
	fi
	wait $spid
	say "server said:"
	sed 's/^/     /' $T/serve.txt
	if [ $rc -eq 0 ] && grep -q "server: verified the pattern" $T/w.txt; then
		record "9. RDMA WRITE from a peer" PASS "1 MiB into $WHAT, verified by the server, $(rate $T/w.txt)"
	else
		record "9. RDMA WRITE from a peer" FAIL "rdma write exit $rc (see above)"
	fi
fi

step "10. Read NVMe into device memory (O_DIRECT, peer-to-peer)"
if [ -b /dev/nvme0n1 ]; then
	say "Write 1 MiB of a pattern from device memory to the drive, then read it back into other"
	say "device memory: the drive DMAs to and from the BAR, the CPU never touches the data."
	run_to $T/nw.txt timeout 60 p2pbuf nvme write --dev /dev/nvme0n1 --offset 128M --len 1M --mem p2pbuf --pattern-seed 42
	wrc=$?
	run_to $T/nr.txt timeout 60 p2pbuf nvme read --dev /dev/nvme0n1 --offset 128M --len 1M --mem p2pbuf --verify-seed 42
	rrc=$?
	if [ $wrc -eq 0 ] && [ $rrc -eq 0 ] && grep -q "all 1048576 bytes are seed 42" $T/nr.txt; then
		record "10. NVMe into device memory" PASS "1 MiB written from and read into device memory peer-to-peer, verified; $(sed -n 's/.*moved: *//p' $T/nr.txt)"
	elif grep -q "no peer-to-peer path" $T/nw.txt $T/nr.txt; then
		record "10. NVMe into device memory" "REFUSED (topology)" "the block layer refused the P2P pages: no peer-to-peer path between the drive and the memory"
	else
		record "10. NVMe into device memory" FAIL "write exit $wrc, read exit $rrc (see above)"
	fi
else
	record "10. NVMe into device memory" SKIP "no /dev/nvme0n1"
fi

step "11. Copy through the FPGA stand-in (the edu DMA engine, p2pbuf dma copy)"
if [ -e /dev/p2pbuf-dma ]; then
	say "Two dma-bufs imported into the engine (dynamic attachments, peer-to-peer allowed); the"
	say "engine copies 16 KiB device -> device, then 8 KiB device -> system memory; the"
	say "destination is checked through its mmap. (QEMU's edu moves 10-20 KiB/s.)"
	run_to $T/f1.txt timeout 120 p2pbuf dma copy --src-mem p2pbuf --dst-mem p2pbuf --len 16k --src-offset 3 --dst-offset 5
	rc1=$?
	run_to $T/f2.txt timeout 120 p2pbuf dma copy --src-mem p2pbuf --dst-mem udmabuf --len 8k
	rc2=$?
	m1=$(sed -n 's/.*src: .*map type \([A-Z_]*\).*/\1/p' $T/f1.txt)
	m2=$(sed -n 's/.*dst: .*map type \([A-Z_]*\).*/\1/p' $T/f2.txt)
	if grep -q "no peer-to-peer path between the engine" $T/f1.txt $T/f2.txt; then
		record "11. DMA copy" "REFUSED (topology)" "the exporter refused the engine (EOPNOTSUPP): no peer-to-peer path to device memory"
	elif [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]; then
		record "11. DMA copy" PASS "device->device ($m1) and device->system ($m2) verified; $(sed -n 's/.*(\([0-9.]* KiB\/s\)).*/\1/p' $T/f1.txt)"
	else
		record "11. DMA copy" FAIL "device->device exit $rc1, device->system exit $rc2 (see above)"
	fi
else
	record "11. DMA copy" SKIP "no /dev/p2pbuf-dma (no edu device?)"
fi

step "12. Summary"
printf '   %-28s %-20s %s\n' STEP RESULT DETAIL
printf '   %-28s %-20s %s\n' "----------------------------" "--------------------" "------"
while IFS='	' read -r a b c; do
	printf '   %-28s %-20s %s\n' "$a" "$b" "$c"
done <$SUMMARY
fails=$(grep -c '	FAIL	' $SUMMARY)
say ""
say "$(wc -l <$SUMMARY) steps, $fails failed"

step "Done"
say "unloading modules"
rdma link delete rxe0 2>/dev/null
rmmod p2pbuf_dma p2pbuf_exporter 2>/dev/null

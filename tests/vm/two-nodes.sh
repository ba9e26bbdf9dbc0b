#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# One node of the two-node run (`cargo xtask run --nodes 2`, and the two-nodes stage of
# `cargo xtask test`; xtask/src/vm/nodes.rs). /init runs it for p2pbuf.mode=node with its
# stdout on ttyS1: a KTAP document the host parses. What it does is also told on the
# console, on lines starting with "p2pbuf-node: " (the host shows them for `run`).
#
# The two VMs share one Ethernet link (QEMU -netdev dgram on the host's loopback); rxe runs
# on each NIC.
# - node A (p2pbuf.node=a): exports 64 MiB of device memory (p2pbuf, the ivshmem BAR),
#   registers it with ibv_reg_dmabuf_mr and serves RDMA clients; its server verifies every
#   write through the dma-buf's mmap, and the host checks the ivshmem backing file ("#
#   hostcheck" lines).
# - node B (p2pbuf.node=b): RDMA-WRITEs the lab pattern at several offsets into A's device
#   memory, then RDMA-READs two of the ranges back and checks them, and one range with the
#   wrong seed, which both ends must report as a mismatch.
# - libfabric (the verbs provider over rxe): both nodes list the provider (fi_info -p verbs);
#   A checks fi_mr_regattr(FI_MR_DMABUF) refusals (exact errnos), then registers a second
#   buffer of device memory with it (p2pbuf-fabric serve) while the rdma_cm server still holds
#   its own (so neither allocation zeroes bytes the host checks); B fi_writes and fi_reads
#   through it like the rdma_cm client; then fabtests (fi_rma_bw, fi_msg_pingpong) on host
#   memory, A serving, B the client.
# - UCX (Debian bookworm's 1.13.1, unmodified, over rc_verbs on rxe0): both nodes list rxe0's
#   transports (ucx_info -d). A runs ucp-put-get (userspace/p2pbuf-peermem/c/ucp_put_get.c,
#   a program written against UCP alone) on device memory: without libp2pbuf_peermem.so,
#   ucp_mem_map of the p2pbuf mmap must fail (UCX's ibv_reg_mr; its errno is recorded); with
#   LD_PRELOAD=libp2pbuf_peermem.so UCX's ibv_reg_mr becomes ibv_reg_dmabuf_mr, and A serves
#   its worker address and rkey over TCP; B ucp_put_nbx()es the lab pattern into A's memory,
#   which A verifies through its mmap (and the host in the backing file), and ucp_get_nbx()es
#   it back; a check against the wrong seed must fail on both ends.
# The nodes wait for each other over TCP on the link (busybox nc), each wait with a timeout:
# A tells B its memory is registered (port 7491), B tells A it is done (port 7492).
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ROLE=$(cmdline_arg node)
RXE_IP=$(cmdline_arg ip)
PEER=$(cmdline_arg peer)
PORT=7490       # rdma_cm (A's server)
READY_PORT=7491 # A -> B: the memory is registered
DONE_PORT=7492  # B -> A: B's results
SIZE=64M
WAIT=300 # seconds a node waits for the other (each wait)
# The RDMA WRITEs B makes: size, offset into A's region, pattern seed. Reads: the same
# format; each must read back what a write put there.
WRITES="4M:0:51 5M:9M:52 3M:61M:53"
READS="4M:0:51 3M:61M:53"
# Last, a read that expects the wrong seed: both ends must say the data is not that pattern
# (the checks are live).
WRONG="4M:0:52"
# libfabric: p2pbuf-fabric's server (port, device memory), B's fi_writes and fi_reads (same
# format), the read with the wrong seed; fabtests' port and their size and iterations.
FPORT=7500
FSIZE=16M
FWRITES="4M:0:61 3M:13M:62"
FREADS="4M:0:61 3M:13M:62"
FWRONG="1M:0:62"
FT_ARGS="-p verbs -e msg -S 65536 -I 20 -w 2"
# UCX: ucp-put-get's port (A's server), its device memory and where it lands (UAT bytes of
# the BAR are taken uninitialized first: past the rdma_cm and libfabric buffers, 64M + 16M
# from 0, whose written bytes the host checks and a zeroing allocation would wipe), B's
# puts (SIZE:OFFSET:SEED; each is read back, the first against seed + 1 too), the transports.
UPORT=7510
USIZE=8M
UAT=96M
UPUTS="1M:0:81 2M:5M:82"
# rc_verbs needs ud_verbs for its wire-up (with tcp instead, B's ucp_ep_create fails: "no
# auxiliary transport ...: Unsupported operation"). UCX_UD_VERBS_ETH_DGID_CHECK=n: UCX 1.13's
# verbs UD transport takes a RoCE packet's IP version from the work completion's sl (mlx5's
# convention: 2 for IPv4); rxe reports sl 0, so UCX reads an IPv4 packet's destination GID
# from the wrong 16 bytes of the GRH area and drops every UD packet (UCX >= 1.18 reads the
# version from the header itself, openucx/ucx#10209). Shown by p2pbuf.ucx=probe: with the
# check, A's rxe0 counts B's packets (rcvd_pkts) and UCX creates no endpoint; without it, the
# put and get pass (docs/rdma.md, "UCX").
UCX_ENV="UCX_TLS=rc_verbs,ud_verbs,self UCX_NET_DEVICES=rxe0:1 UCX_UD_VERBS_ETH_DGID_CHECK=n"
# The UCX put/get between the nodes runs by default; p2pbuf.ucx=0 skips it (ucx_info and the
# refusal without the preload library run always), p2pbuf.ucx=probe runs only the probe
# below (a diagnostic run: everything else is skipped).
UCX_ON=$(cmdline_arg ucx)
[ -n "$UCX_ON" ] || UCX_ON=1
UCX_OFF="p2pbuf.ucx=$UCX_ON on the kernel command line"
# ucx_skip N: N skipped UCX results.
ucx_skip() {
	_i=0
	while [ $_i -lt "$1" ]; do
		_i=$((_i + 1))
		ktap_skip "UCX put/get step $_i" "$UCX_OFF"
	done
}
PEERMEM=/p2pbuf/lib/libp2pbuf_peermem.so

# say TEXT: tell the person (console) and the log (a KTAP diagnostic).
say() {
	echo "p2pbuf-node: $*" >/dev/console
	echo "# $*"
}
ok() {
	ktap_ok "$*"
	say "ok: $*"
}
fail() {
	ktap_fail "$*"
	say "FAILED: $*"
}
# check NAME CMD...: ok if CMD succeeds.
check() {
	_name=$1
	shift
	if "$@"; then ok "$_name"; else fail "$_name"; fi
}
# skip_rest WHY: the remaining planned steps are skipped (an earlier one failed).
skip_rest() {
	while [ $_n -lt $PLAN ]; do ktap_skip "step $((_n + 1))" "$1"; done
	say "skipped the remaining steps: $1"
}
bytes() {
	case $1 in
	*M) echo $((${1%M} << 20)) ;;
	*k) echo $((${1%k} << 10)) ;;
	*) echo "$1" ;;
	esac
}
# wait_peer: until the peer answers a ping (it boots at the same time as this node).
wait_peer() {
	_t0=$(date +%s)
	while [ $(($(date +%s) - _t0)) -lt $WAIT ]; do
		ping -c 1 -W 1 "$PEER" >/dev/null 2>&1 && return 0
		sleep 1
	done
	return 1
}
# served_steps KIND LOG BAR WRITES READS: B's operations as A's server (KIND rdma: `p2pbuf rdma
# serve`; fabric: `p2pbuf-fabric serve`) logged them in LOG, in the order it served them
# (WRITES, then READS: SIZE:OFFSET:SEED each): each must be verified; a write's range goes to
# the host check (at BAR, the buffer's offset in the device memory).
served_steps() {
	_kind=$1 _log=$2 _bar=$3 _writes=$4 _reads=$5
	_i=0
	for _w in $_writes $_reads; do
		_i=$((_i + 1))
		# shellcheck disable=SC2046
		set -- $(echo "$_w" | tr : ' ')
		if [ $_kind = rdma ]; then
			_label="" _op="RDMA WRITE" _sz=".*"
			[ $_i -gt $(echo $_writes | wc -w) ] && _op="RDMA READ"
			_l=$(grep "^client $_i " "$_log")
		else
			_label="libfabric " _op=fi_write _sz="$(bytes $1) bytes"
			[ $_i -gt $(echo $_writes | wc -w) ] && _op=fi_read
			_l=$(grep "^client $_i: " "$_log")
		fi
		if echo "$_l" | grep -q "$_op of $_sz at offset $(bytes $2) (seed $3): verified"; then
			case $_op in
			*WRITE | *write)
				ok "B's $_op of $1 at offset $2 (seed $3) verified through the dma-buf's mmap"
				[ -n "$_bar" ] && echo "# hostcheck target=gpu offset=$((_bar + $(bytes $2))) len=$(bytes $1) seed=$3"
				;;
			*) ok "B's $_op of $1 at offset $2 served from device memory holding seed $3's pattern" ;;
			esac
		else
			fail "${_label}client $_i: want B's $_op of $1 at offset $2 (seed $3) verified; got: ${_l:-nothing}"
		fi
	done
}
# served_wrong_read KIND LOG RC N SIZE:OFFSET:SEED: B's read expecting SEED where another
# seed's pattern is, client N of A's server (KIND and LOG as served_steps; RC its exit status):
# the server must report a mismatch at its first byte, count the N-1 clients before it verified
# and this one failed, and exit 1.
served_wrong_read() {
	_kind=$1 _log=$2 _rc=$3 _nc=$4
	# shellcheck disable=SC2046
	set -- $(echo "$5" | tr : ' ')
	if [ $_kind = rdma ]; then
		_server=server _op="RDMA READ" _sz=".*" _z=""
		_l=$(grep "^client $_nc " "$_log")
	else
		_server="libfabric server" _op=fi_read _sz="$(bytes $1) bytes" _z='$'
		_l=$(grep "^client $_nc: " "$_log")
	fi
	if echo "$_l" | grep -q "$_op of $_sz at offset $(bytes $2) (seed $3): MISMATCH at offset $(bytes $2)$_z"; then
		ok "B's $_op of $1 at offset $2 expecting seed $3 (another seed is there): the server reports a mismatch at its first byte"
	else
		fail "B's $_op expecting the wrong seed $3: want the server to report a mismatch at $(bytes $2); got: ${_l:-nothing}"
	fi
	if [ "$_rc" -eq 1 ] && grep -q "^done: $((_nc - 1)) client(s) verified, 1 failed" "$_log"; then
		ok "$_server: $((_nc - 1)) clients verified, the wrong-seed read failed (exit 1, as it must)"
	else
		fail "$_server: want $((_nc - 1)) verified and 1 failed (exit 1); got: $(grep '^done:' "$_log") (exit $_rc)"
	fi
}
# remote_op KIND OP SIZE OFFSET SEED: B's RDMA OP (write, read) of SIZE at OFFSET of A's
# memory with the lab pattern of SEED, through KIND (rdma: p2pbuf's rdma_cm client; fabric:
# p2pbuf-fabric); its output in /tmp/op.txt (as comments too); the client's exit status.
remote_op() {
	case $1 in
	rdma) timeout 300 p2pbuf rdma "$2" --server "$PEER:$PORT" --size "$3" --offset "$4" --pattern "$5" --lab-pattern --timeout 60 ;;
	fabric) timeout 300 p2pbuf-fabric "$2" --server "$PEER" --port $FPORT --size "$3" --offset "$4" --seed "$5" --timeout 120 ;;
	esac >/tmp/op.txt 2>&1
	_rc=$?
	comment /tmp/op.txt
	return $_rc
}
# remote_ops KIND OP LIST: remote_op of each SIZE:OFFSET:SEED of LIST; a write must be verified
# by A, a read must read the pattern back. Counts them in $passed and $total.
remote_ops() {
	_kind=$1 _op=$2 _list=$3 _mr=""
	case $_kind.$_op in
	rdma.write) _name="RDMA WRITE" ;;
	rdma.read) _name="RDMA READ" ;;
	fabric.write) _name=fi_write _mr=" (FI_MR_DMABUF)" ;;
	*) _name=fi_read ;;
	esac
	for _w in $_list; do
		# shellcheck disable=SC2046
		set -- $(echo "$_w" | tr : ' ')
		total=$((total + 1))
		remote_op "$_kind" "$_op" "$1" "$2" "$3"
		rc=$?
		if [ "$_op" = write ]; then
			if [ $rc -eq 0 ] && grep -q "^server: verified the pattern" /tmp/op.txt && grep -q "^OK" /tmp/op.txt; then
				ok "$_name of $1 at offset $2 (seed $3) into A's device memory$_mr, verified by A: $(rate /tmp/op.txt)"
				passed=$((passed + 1))
			else
				fail "$_name of $1 at offset $2 (seed $3) into A's device memory: exit $rc"
			fi
		elif [ $rc -eq 0 ] && grep -q "^OK" /tmp/op.txt && ! grep -q "^read data is not" /tmp/op.txt; then
			ok "$_name of $1 at offset $2 from A's device memory is seed $3's pattern: $(rate /tmp/op.txt)"
			passed=$((passed + 1))
		else
			fail "$_name of $1 at offset $2 (seed $3) from A's device memory: exit $rc"
		fi
	done
}
# remote_wrong_read KIND SIZE:OFFSET:SEED: B's read (remote_op) expecting SEED where another
# seed's pattern is: the client must exit 1, and both it and A's server report a mismatch
# from its first byte. Its status: 0 when they did.
remote_wrong_read() {
	_kind=$1
	# shellcheck disable=SC2046
	set -- $(echo "$2" | tr : ' ')
	_name="RDMA READ" _a="" _z=""
	[ "$_kind" = fabric ] && _name=fi_read _a="^" _z='$'
	remote_op "$_kind" read "$1" "$2" "$3"
	rc=$?
	if [ $rc -eq 1 ] && grep -q "${_a}read data is not the pattern from offset $(bytes $2)$_z" /tmp/op.txt &&
		grep -q "${_a}server: not the pattern from offset $(bytes $2)$_z" /tmp/op.txt; then
		ok "$_name of $1 at offset $2 expecting seed $3: not that pattern from its first byte, here and on A (exit 1)"
		return 0
	fi
	fail "$_name of $1 at offset $2 expecting the wrong seed $3: exit $rc, want 1 and a mismatch at $(bytes $2) on both ends"
	return 1
}
# fi_info_step: libfabric's own listing of the verbs provider must show rxe0.
fi_info_step() {
	fi_info -p verbs >/tmp/fi_info.txt 2>&1
	_rc=$?
	sed -n '1,12p' /tmp/fi_info.txt | sed 's/^/# /'
	if [ $_rc -eq 0 ] && grep -q "domain: rxe0" /tmp/fi_info.txt && grep -q "type: FI_EP_MSG" /tmp/fi_info.txt; then
		ok "fi_info -p verbs lists rxe0: $(grep -c '^provider: verbs' /tmp/fi_info.txt) entries, $(grep -m1 'protocol:' /tmp/fi_info.txt | sed 's/^ *//')"
	else
		fail "fi_info -p verbs: exit $_rc, want rxe0 with FI_EP_MSG"
	fi
}
# fabric_reg NAME WANT_ERRNO TEXT ARGS...: `p2pbuf-fabric reg ARGS` (fi_mr_regattr with
# FI_MR_DMABUF on rxe0) must fail with errno WANT_ERRNO (exit 1) and say TEXT on stderr.
fabric_reg() {
	_name=$1 _want=$2 _text=$3
	shift 3
	p2pbuf-fabric reg --addr "$RXE_IP" "$@" >/tmp/freg.out 2>/tmp/freg.err
	_rc=$?
	comment /tmp/freg.out
	comment /tmp/freg.err
	_got=$(sed -n 's/^errno //p' /tmp/freg.out)
	if [ $_rc -eq 1 ] && [ "$_got" = "$_want" ] && grep -q "$_text" /tmp/freg.err; then
		ok "$_name: errno $_got"
	else
		fail "$_name: exit $_rc errno ${_got:-none}, want exit 1, errno $_want and \"$_text\""
	fi
}
# ucx_info_step: UCX's own listing of its devices must show rc_verbs and ud_verbs on rxe0:1.
ucx_info_step() {
	timeout 120 ucx_info -d >/tmp/ucx_info.txt 2>&1
	_rc=$?
	grep -E "Memory domain|Transport|Device" /tmp/ucx_info.txt | sed 's/^# */# /'
	# The GIDs UCX may pick from (it logs the index it uses: "using gid_index N").
	for _g in 0 1 2 3; do
		echo "# rxe0 GID $_g: $(cat /sys/class/infiniband/rxe0/ports/1/gids/$_g 2>/dev/null) $(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$_g 2>/dev/null)"
	done
	if [ $_rc -eq 0 ] && grep -q "Device: rxe0:1" /tmp/ucx_info.txt &&
		grep -q "Transport: rc_verbs" /tmp/ucx_info.txt && grep -q "Transport: ud_verbs" /tmp/ucx_info.txt; then
		ok "ucx_info -d lists rxe0:1 with rc_verbs and ud_verbs ($(timeout 60 ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -1))"
	else
		comment /tmp/ucx_info.txt
		fail "ucx_info -d: exit $_rc, want rxe0:1 with rc_verbs and ud_verbs"
	fi
}
# ucx_try_serve: A's server with the preload library, in the background ($_srv); status 0 once
# it listens (or says ucp_mem_map failed). If it does neither within 60 s: where each of its
# threads waits (state, wchan, system call, kernel stack) and what it printed, as comments;
# then it is killed. It runs at nice 19: a server that spins (UCX retrying a failed
# registration of its own pool did, 2026-12-07) would starve this script on the node's one CPU.
ucx_try_serve() {
	say "UCX: serve with the library"
	# shellcheck disable=SC2086
	sh -c 'renice -n 19 -p $$ >/dev/null; exec "$@"' sh env $UCX_ENV LD_PRELOAD=$PEERMEM P2PBUF_PEERMEM_DEBUG=1 timeout 600 ucp-put-get serve --port $UPORT --size $USIZE --p2pbuf --at $UAT --timeout $WAIT >/tmp/ucx.out 2>/tmp/ucx.err &
	_srv=$!
	wait_for /tmp/ucx.out "^listening on\|^MEM_MAP_FAILED" 60 && return 0
	echo "# UCX: not listening after 60 s; its threads:"
	for _p in $(pidof ucp-put-get); do
		for _t in /proc/$_p/task/*; do
			echo "# task ${_t##*/}: state $(cut -d' ' -f3 "$_t/stat"), utime/stime $(cut -d' ' -f14,15 "$_t/stat"), wchan $(cat "$_t/wchan"), syscall $(cat "$_t/syscall")"
			sed 's/^/#   /' "$_t/stack"
		done
	done
	# What it printed (UCX logs to stdout), the first and the last lines: a loop repeats them
	# (the first runs: 7 MB of UCX's failed ibv_reg_mr of its own pool).
	for _f in /tmp/ucx.out /tmp/ucx.err; do
		echo "# $_f: $(wc -l <$_f) lines; the first and the last 15:"
		head -15 $_f | sed 's/^/#   /'
		tail -15 $_f | sed 's/^/#   /'
	done
	kill $(pidof ucp-put-get) 2>/dev/null
	wait $_srv
	return 1
}
# ucx_probe ROLE: what lay under B's UD wire-up timeout (p2pbuf.ucx=probe only; comments, not
# results): plain UD between the two rxe devices (ibv_ud_pingpong on the IPv4 GID, A serving),
# then UCX over the same transports on host memory without the preload library, once per
# variant of UCX's settings in UCX_PROBES, with UCX's debug log of its UD endpoints (A's at
# trace_data: its receive path), and the UDP and rxe counters after each.
UDPP="ibv_ud_pingpong -d rxe0 -g 1 -s 512 -n 20"
UCX_PROBES="UCX_UD_VERBS_ETH_DGID_CHECK=y,UCX_UD_VERBS_TIMEOUT=30s UCX_UD_VERBS_ETH_DGID_CHECK=n,UCX_UD_VERBS_TIMEOUT=30s"
ucx_counters() {
	echo "# probe: $(grep '^Udp:' /proc/net/snmp | tail -1)"
	for _c in rcvd_pkts sent_pkts send_err rcvd_seq_err duplicate_request out_of_seq_request; do
		printf '%s=%s ' $_c "$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/$_c 2>/dev/null)"
	done | sed 's/^/# probe: rxe0 /'
	echo
}
ucx_probe() {
	if [ "$1" = a ]; then
		say "UCX probe: $UDPP (server)"
		timeout 150 $UDPP >/tmp/udpp.txt 2>&1
		echo "# probe: ud_pingpong server exit $?"
	else
		_t0=$(date +%s)
		while [ $(($(date +%s) - _t0)) -lt 120 ]; do
			timeout 60 $UDPP "$PEER" >/tmp/udpp.txt 2>&1 && break
			sleep 3
		done
		echo "# probe: ud_pingpong client exit after $(($(date +%s) - _t0)) s"
	fi
	comment /tmp/udpp.txt
	ucx_counters
	_port=$((UPORT + 1))
	for _v in $UCX_PROBES; do
		_venv="$UCX_ENV $(echo "$_v" | tr , ' ')"
		if [ "$1" = a ]; then
			say "UCX probe: host memory, no preload library, $_v (server, port $_port)"
			# shellcheck disable=SC2086
			env $_venv UCX_LOG_LEVEL=trace_data timeout 150 ucp-put-get serve --port $_port --size 4M --host-mem --timeout 120 >/tmp/uprobe.out 2>&1
			echo "# probe: $_v: host-memory server exit $?"
		else
			say "UCX probe: host memory, no preload library, $_v (client, port $_port)"
			# shellcheck disable=SC2086
			env $_venv UCX_LOG_LEVEL=debug timeout 150 ucp-put-get client --server "$PEER:$_port" --timeout 120 1M:0:71 >/tmp/uprobe.out 2>&1
			echo "# probe: $_v: host-memory client exit $?"
		fi
		echo "# probe: UCX log, $(wc -l </tmp/uprobe.out) lines; its UD, address and wire-up lines:"
		grep -E "ud_ep|ud_iface|ah_attr|gid|wireup|connected|[Dd]rop|RX|CREQ|CREP|Fatal|ERROR|put_nbx|get_nbx|verified|MISMATCH|^done|^OK" /tmp/uprobe.out | grep -v "resending\|ca drop@" | head -60 | cut -c1-300 | sed 's/^/#   /'
		echo "# probe: the last 12 lines:"
		tail -12 /tmp/uprobe.out | cut -c1-300 | sed 's/^/#   /'
		ucx_counters
		_port=$((_port + 1))
	done
}
# ucx_serve_steps: A's UCX part (see the top).
ucx_serve_steps() {
	say "UCX: ucp-put-get on device memory without the preload library ($UCX_ENV)"
	# shellcheck disable=SC2086
	env $UCX_ENV timeout 120 ucp-put-get serve --port $UPORT --size $USIZE --p2pbuf --at $UAT --timeout 60 >/tmp/ucx0.out 2>/tmp/ucx0.err
	_rc=$?
	comment /tmp/ucx0.out
	comment /tmp/ucx0.err
	_st=$(sed -n 's/^MEM_MAP_FAILED status=\(-*[0-9]*\).*/\1/p' /tmp/ucx0.out)
	_e=$(sed -n 's/^MEM_MAP_FAILED .* errno=\([0-9]*\).*/\1/p' /tmp/ucx0.out)
	# UCX's own message has the errno of the failed registration (%m): its text, without
	# the '/' of "Remote I/O error", which the harness would read as a path.
	_why=$(cat /tmp/ucx0.err /tmp/ucx0.out | grep -m1 "ibv_reg_mr.* failed" | sed 's/.*failed: *//; s|[/#]| |g')
	if [ $_rc -eq 3 ] && [ -n "$_st" ]; then
		ok "without the library: ucp_mem_map of $USIZE of A's device memory (its mmap) fails: UCS status $_st, errno ${_e:-none} on return, UCX says: ${_why:-nothing}"
	else
		fail "without the library: ucp-put-get serve exit $_rc, want 3 (ucp_mem_map failed)"
	fi
	if [ "$UCX_ON" != 1 ]; then
		ucx_skip $(($(echo $UPUTS | wc -w) + 2))
		return
	fi
	say "UCX: ucp-put-get serve with LD_PRELOAD=$PEERMEM; B puts and gets"
	ucx_try_serve
	_bar=$(sed -n 's/^memory: .* at BAR offset \(0x[0-9a-f]*\),.*/\1/p' /tmp/ucx.out)
	if grep -q "^listening on" /tmp/ucx.out && grep -q "ibv_reg_dmabuf_mr(.*): registered" /tmp/ucx.err; then
		ok "with LD_PRELOAD: ucp_mem_map of $USIZE of device memory at BAR offset $_bar: UCX's ibv_reg_mr became ibv_reg_dmabuf_mr ($(sed -n "s/.*UCP's memory type: \(.*\)/UCP's memory type \1/p" /tmp/ucx.out))"
	else
		comment /tmp/ucx.out
		comment /tmp/ucx.err
		fail "with LD_PRELOAD: ucp_mem_map of device memory through ibv_reg_dmabuf_mr, listening"
	fi
	wait $_srv
	_rc=$?
	comment /tmp/ucx.out
	grep -i "ibv_reg\|ucx\|error\|warn" /tmp/ucx.err | head -40 | sed 's/^/# /'
	_first=""
	for _w in $UPUTS; do
		# shellcheck disable=SC2046
		set -- $(echo "$_w" | tr : ' ')
		[ -n "$_first" ] || _first="$1 $2 $3"
		if grep -q "^client: $(bytes $1) bytes at offset $(bytes $2) (seed $3): verified through the mapping" /tmp/ucx.out; then
			ok "B's ucp_put_nbx of $1 at offset $2 (seed $3) verified through A's mmap of device memory"
			[ -n "$_bar" ] && echo "# hostcheck target=gpu offset=$((_bar + $(bytes $2))) len=$(bytes $1) seed=$3"
		else
			fail "B's ucp_put_nbx of $1 at offset $2 (seed $3): not verified through the mmap (server exit $_rc)"
		fi
	done
	# shellcheck disable=SC2086
	set -- $_first
	if grep -q "^client: $(bytes $1) bytes at offset $(bytes $2) (seed $(($3 + 1))): MISMATCH at offset $(bytes $2)$" /tmp/ucx.out &&
		grep -q "^done: $(echo $UPUTS | wc -w) verified, 1 not" /tmp/ucx.out && [ $_rc -eq 0 ]; then
		ok "UCX: the check of $1 at offset $2 against seed $(($3 + 1)) fails at its first byte, as it must; server exit 0"
	else
		fail "UCX: want the wrong-seed check to fail at $(bytes $2) and $(echo $UPUTS | wc -w) verified; got: $(grep '^done:' /tmp/ucx.out) (exit $_rc)"
	fi
}
# ucx_client_steps: B's UCX part; sets $ucx for the report.
ucx_client_steps() {
	if [ "$UCX_ON" != 1 ]; then
		ucx="UCX: skipped ($UCX_OFF)"
		ucx_skip $(($(echo $UPUTS | wc -w) + 2))
		return
	fi
	say "UCX: ucp-put-get client to $PEER:$UPORT ($UCX_ENV): $UPUTS"
	# shellcheck disable=SC2086
	env $UCX_ENV timeout 600 ucp-put-get client --server "$PEER:$UPORT" --timeout $WAIT $UPUTS >/tmp/ucxc.out 2>&1
	_rc=$?
	comment /tmp/ucxc.out
	# ucp_ep_print_info() right after ucp_ep_create(): the endpoint's one lane is rc_verbs on
	# rxe0:1 (ud_verbs only for its wire-up), and put and get have a configuration (put[0],
	# get[0]: zero-copy RDMA from 16 KiB and 945 bytes in the runs so far) on that lane.
	if grep -q "^# ep: lane\[0\]: .*rc_verbs/rxe0:1[. ]" /tmp/ucxc.out && ! grep -q "^# ep: lane\[1\]" /tmp/ucxc.out &&
		grep -q "^# ep: put\[0\]: .*<zcopy>" /tmp/ucxc.out && grep -q "^# ep: get\[0\]: .*<zcopy>" /tmp/ucxc.out; then
		ok "UCX's endpoint: one lane, rc_verbs on rxe0:1, with zero-copy put and get (ucp_ep_print_info)"
	else
		fail "UCX: want one lane, rc_verbs on rxe0:1, with zero-copy put and get in ucp_ep_print_info (exit $_rc)"
	fi
	_puts=0
	for _w in $UPUTS; do
		# shellcheck disable=SC2046
		set -- $(echo "$_w" | tr : ' ')
		if grep -q "^ucp_put_nbx of $(bytes $1) bytes at offset $(bytes $2) (seed $3): done" /tmp/ucxc.out &&
			grep -q "^ucp_get_nbx of $(bytes $1) bytes at offset $(bytes $2): the pattern of seed $3" /tmp/ucxc.out; then
			ok "ucp_put_nbx of $1 at offset $2 (seed $3) into A's device memory, ucp_get_nbx back: the pattern ($(grep "^ucp_put_nbx of $(bytes $1) bytes at offset $(bytes $2)" /tmp/ucxc.out | sed 's/.*, //') put, $(grep "^ucp_get_nbx of $(bytes $1) bytes at offset $(bytes $2)" /tmp/ucxc.out | sed 's/.*, //') get)"
			_puts=$((_puts + 1))
		else
			fail "ucp_put_nbx and ucp_get_nbx of $1 at offset $2 (seed $3) with A's device memory (exit $_rc)"
		fi
	done
	if [ $_rc -eq 0 ] && grep -q "not the pattern from its first byte, here and on the server" /tmp/ucxc.out && grep -q "^OK" /tmp/ucxc.out; then
		ok "UCX: the wrong-seed check fails here and on A, as it must (exit 0)"
		ucx="UCX: $_puts of $(echo $UPUTS | wc -w) put and get back"
	else
		fail "UCX: ucp-put-get client exit $_rc, want 0 with the wrong-seed check failing on both ends"
		ucx="UCX: $_puts of $(echo $UPUTS | wc -w) put and get back, the client FAILED (exit $_rc)"
	fi
}
# kmemleak_step: as run-tests.sh's last test.
kmemleak_step() {
	kmemleak_leaks
	case $? in
	0) ok "no kernel memory leaks on node $ROLE (kmemleak scan)" ;;
	1) fail "kernel memory leaks on node $ROLE: $KMEMLEAK_COUNT unreferenced object(s)" ;;
	*) ktap_skip "kmemleak" "no /sys/kernel/debug/kmemleak" ;;
	esac
}

kmemleak_clear
load_modules || say "could not load the p2pbuf modules (see dmesg)"
echo "KTAP version 1"
case "$ROLE" in
a) PLAN=35 ;;
b) PLAN=24 ;;
*)
	echo "1..1"
	echo "not ok 1 two-nodes # p2pbuf.node=$ROLE: want a or b"
	exit 1
	;;
esac
echo "1..$PLAN"
say "node $(echo "$ROLE" | tr ab AB): $RXE_IP, peer $PEER, kernel $(uname -r)"
if rxe_setup; then
	ok "rxe0 on $RXE_NETDEV ($RXE_IP), port ACTIVE, RoCE v2 GID index $(rxe_gid_index)"
else
	fail "rxe0 on $RXE_NETDEV ($RXE_IP)"
	skip_rest "no rxe0"
	exit 1
fi
t0=$(date +%s)
say "waiting (up to ${WAIT}s) for $PEER to answer on the link"
if wait_peer; then
	ok "the peer $PEER answers on the link (after $(($(date +%s) - t0))s)"
else
	fail "the peer $PEER did not answer within ${WAIT}s"
	skip_rest "no peer"
	exit 1
fi
fi_info_step
ucx_info_step
# p2pbuf.ucx=probe: the UCX probe alone, a diagnostic run (the rest is skipped).
if [ "$UCX_ON" = probe ]; then
	ucx_probe "$ROLE"
	skip_rest "p2pbuf.ucx=probe: the UCX probe only"
	exit 0
fi

if [ "$ROLE" = a ]; then
	# Node A: device memory, registered, served.
	nclients=$(($(echo $WRITES | wc -w) + $(echo $READS | wc -w) + 1))
	# FI_MR_DMABUF refusals, before any buffer that the host checks is allocated (each
	# allocation zeroes its range).
	p2pbuf-fabric reg --addr "$RXE_IP" --size 1M >/tmp/freg.out 2>&1
	rc=$?
	comment /tmp/freg.out
	if [ $rc -eq 0 ] && grep -q "^registered: fd .*, offset 0, length 1048576: key" /tmp/freg.out; then
		ok "fi_mr_regattr(FI_MR_DMABUF) of 1M of device memory on rxe0, deregistered"
	else
		fail "fi_mr_regattr(FI_MR_DMABUF) of 1M of device memory: exit $rc"
	fi
	fabric_reg "FI_MR_DMABUF with an fd that is not open" 9 "fd 999, .*Bad file descriptor" --fd closed
	fabric_reg "FI_MR_DMABUF with an fd of /dev/null" 22 "Invalid argument" --fd devnull
	fabric_reg "FI_MR_DMABUF with the offset past the end (2M into 1M)" 22 "offset 0x200000, length 4096" --offset 2M --len 4k
	fabric_reg "FI_MR_DMABUF with the length past the end (1M + 4k of 1M)" 22 "offset 0x0, length 1052672" --len 1052672
	fabric_reg "FI_MR_DMABUF on a revoked buffer" 19 "No such device" --revoked
	rm -f /tmp/b-report
	timeout $((WAIT * 3)) nc -l -p $DONE_PORT >/tmp/b-report 2>/dev/null &
	done_nc=$!
	if serve_bg /tmp/serve.txt 60 --port $PORT --mem p2pbuf --size $SIZE --clients $nclients --timeout $WAIT && grep -q "with ibv_reg_dmabuf_mr" /tmp/serve.txt; then
		comment /tmp/serve.txt
		buf=$(debugfs_buffer "$(bytes $SIZE)" last)
		BAR_OFF=$(debugfs_field "$buf" offset)
		say "allocated $SIZE of device memory: ${buf%%, maps*}"
		say "rxe0 attached it for CPU access (no device, no DMA mapping): ${buf#*, maps}"
		say "$(grep 'mr:' /tmp/serve.txt | sed 's/^ *//')"
		if [ -n "$BAR_OFF" ]; then
			ok "$SIZE of device memory at BAR offset $BAR_OFF registered on rxe0 with ibv_reg_dmabuf_mr"
		else
			fail "registered, but the buffer is not in /sys/kernel/debug/p2pbuf/buffers"
		fi
	else
		comment /tmp/serve.txt
		fail "$SIZE of device memory registered on rxe0 with ibv_reg_dmabuf_mr"
		kill $srv $done_nc 2>/dev/null
		skip_rest "no registered memory"
		exit 1
	fi
	# The libfabric server, while the rdma_cm server holds its buffer.
	p2pbuf-fabric serve --addr "$RXE_IP" --port $FPORT --size $FSIZE --clients $(($(echo $FWRITES $FREADS | wc -w) + 1)) --timeout $WAIT >/tmp/fserve.txt 2>&1 &
	fsrv=$!
	if wait_for /tmp/fserve.txt "listening on" 60 && grep -q "^mr: fi_mr_regattr(FI_MR_DMABUF, " /tmp/fserve.txt; then
		comment /tmp/fserve.txt
		FBAR=$(sed -n 's/.*BAR offset \(0x[0-9a-f]*\),.*/\1/p' /tmp/fserve.txt | head -1)
		say "libfabric: $(grep '^mr:' /tmp/fserve.txt)"
		ok "$FSIZE of device memory at BAR offset $FBAR registered on rxe0 through libfabric: $(grep '^mr:' /tmp/fserve.txt | sed 's/^mr: //')"
	else
		comment /tmp/fserve.txt
		fail "$FSIZE of device memory registered through libfabric (fi_mr_regattr with FI_MR_DMABUF)"
		FBAR=""
	fi
	say "telling B (port $READY_PORT) that the memory is ready; waiting up to ${WAIT}s for it"
	t0=$(date +%s)
	if echo "ready $SIZE at BAR offset $BAR_OFF; libfabric: $FSIZE on port $FPORT" | timeout $WAIT nc -l -p $READY_PORT >/dev/null 2>&1; then
		ok "node B picked up the rendezvous after $(($(date +%s) - t0))s"
	else
		fail "node B never came for the rendezvous (${WAIT}s)"
		kill $srv $done_nc 2>/dev/null
		skip_rest "node B never came"
		exit 1
	fi
	# Follow the server: each client's verdict as it comes.
	shown=0
	while kill -0 $srv 2>/dev/null; do
		n=$(grep -c '^client ' /tmp/serve.txt)
		if [ "$n" -gt $shown ]; then
			grep '^client ' /tmp/serve.txt | sed -n "$((shown + 1)),${n}p" | while read -r l; do say "server: $l"; done
			shown=$n
		fi
		sleep 1
	done
	wait $srv
	src=$?
	comment /tmp/serve.txt
	served_steps rdma /tmp/serve.txt "$BAR_OFF" "$WRITES" "$READS"
	served_wrong_read rdma /tmp/serve.txt $src $nclients "$WRONG"
	# libfabric: B's fi_writes and fi_reads, as the server saw them.
	say "waiting for B's libfabric clients"
	wait $fsrv
	fsrc=$?
	comment /tmp/fserve.txt
	served_steps fabric /tmp/fserve.txt "$FBAR" "$FWRITES" "$FREADS"
	served_wrong_read fabric /tmp/fserve.txt $fsrc $(($(echo $FWRITES $FREADS | wc -w) + 1)) "$FWRONG"
	# fabtests on host memory: A serves, B connects (it retries until this one listens).
	for t in "fi_rma_bw -o write" "fi_msg_pingpong"; do
		say "fabtests: $t $FT_ARGS (server)"
		# shellcheck disable=SC2086
		timeout 240 $t $FT_ARGS -s "$RXE_IP" >/tmp/ft.txt 2>&1
		rc=$?
		comment /tmp/ft.txt
		if [ $rc -eq 0 ]; then
			ok "fabtests ${t%% *} (server, verbs, FI_EP_MSG, 64k x 20): exit 0$(grep '^64k ' /tmp/ft.txt | awk '{print ", " $5 " MB per s, " $6 " us per transfer"}')"
		else
			fail "fabtests ${t%% *} (server): exit $rc"
		fi
	done
	ucx_serve_steps
	say "waiting for B's report (port $DONE_PORT)"
	wait $done_nc
	if [ -s /tmp/b-report ]; then
		ok "node B reported: $(head -1 /tmp/b-report)"
	else
		fail "node B sent no report"
	fi
	kmemleak_step
	ktap_exit
fi

# Node B: wait for A's memory, write into it, read back.
say "waiting (up to ${WAIT}s) for A's rendezvous on $PEER:$READY_PORT"
t0=$(date +%s)
ready=""
while [ $(($(date +%s) - t0)) -lt $WAIT ]; do
	ready=$(timeout 5 nc "$PEER" $READY_PORT </dev/null 2>/dev/null)
	case "$ready" in ready*) break ;; esac
	sleep 2
done
case "$ready" in
ready*) ok "node A is ready after $(($(date +%s) - t0))s: ${ready#ready }" ;;
*)
	fail "node A did not get ready within ${WAIT}s"
	skip_rest "node A not ready"
	exit 1
	;;
esac
passed=0
total=0
remote_ops rdma write "$WRITES"
remote_ops rdma read "$READS"
if remote_wrong_read rdma "$WRONG"; then
	wrong="the wrong-seed read reported on both ends"
else
	wrong="the wrong-seed read NOT reported as it must be"
fi
# libfabric: fi_write and fi_read through p2pbuf-fabric into A's device memory.
remote_ops fabric write "$FWRITES"
remote_ops fabric read "$FREADS"
remote_wrong_read fabric "$FWRONG" || wrong="$wrong; the libfabric wrong-seed read NOT reported"
# fabtests: A's server starts once its libfabric clients are done; retry until it listens.
for t in "fi_rma_bw -o write" "fi_msg_pingpong"; do
	t0=$(date +%s)
	tries=0
	rc=1
	while [ $(($(date +%s) - t0)) -lt 180 ]; do
		tries=$((tries + 1))
		# shellcheck disable=SC2086
		timeout 240 $t $FT_ARGS -s "$RXE_IP" "$PEER" >/tmp/ft.txt 2>&1
		rc=$?
		[ $rc -eq 0 ] && break
		sleep 3
	done
	comment /tmp/ft.txt
	if [ $rc -eq 0 ] && grep -q "^64k " /tmp/ft.txt; then
		ok "fabtests ${t%% *} (client, verbs, FI_EP_MSG, 64k x 20, attempt $tries): $(grep '^64k ' /tmp/ft.txt | awk '{print $5 " MB per s, " $6 " us per transfer"}')"
	else
		fail "fabtests ${t%% *} (client): exit $rc after $tries attempt(s)"
	fi
done
ucx_client_steps
report="$passed of $total RDMA operations verified (rdma_cm and libfabric), $wrong; $ucx"
t0=$(date +%s)
sent=0
while [ $(($(date +%s) - t0)) -lt 60 ]; do
	if echo "$report" | timeout 5 nc "$PEER" $DONE_PORT >/dev/null 2>&1; then
		sent=1
		break
	fi
	sleep 2
done
check "told A: $report" test $sent = 1
kmemleak_step
ktap_exit

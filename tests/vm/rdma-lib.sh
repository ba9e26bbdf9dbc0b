# SPDX-License-Identifier: GPL-2.0
# Helpers of the rdma_* tests (sourced, after lib.sh): soft-RoCE (rxe) on the lab's NIC, and
# running p2pbuf's RDMA commands. One VM: server and client talk through rxe0's loopback.

RXE_DEV=rxe0
RXE_NETDEV=eth0
RXE_IP=10.0.2.15 # what QEMU's user networking gives the guest
GID_DIR=/sys/class/infiniband/$RXE_DEV/ports/1

# rxe_gid_index: index of the RoCE v2 GID of $RXE_IP in rxe0's GID table.
rxe_gid_index() {
	# shellcheck disable=SC2046
	want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' $(echo "$RXE_IP" | tr . ' '))
	for g in "$GID_DIR"/gids/*; do
		[ "$(cat "$g" 2>/dev/null)" = "$want" ] || continue
		[ "$(cat "$GID_DIR/gid_attrs/types/${g##*/}" 2>/dev/null)" = "RoCE v2" ] || continue
		echo "${g##*/}"
		return 0
	done
	return 1
}

# rxe_setup: eth0 up with $RXE_IP, rxe0 on it, port ACTIVE with the address's GID. Idempotent.
rxe_setup() {
	ip link set lo up
	ip link set "$RXE_NETDEV" up || return 1
	ip -4 addr show dev "$RXE_NETDEV" | grep -q "inet $RXE_IP/" ||
		ip addr add "$RXE_IP/24" dev "$RXE_NETDEV" || return 1
	[ -d "/sys/class/infiniband/$RXE_DEV" ] ||
		rdma link add "$RXE_DEV" type rxe netdev "$RXE_NETDEV" || return 1
	i=0
	while [ $i -lt 100 ]; do
		case "$(cat "$GID_DIR/state" 2>/dev/null)" in
		*ACTIVE*) rxe_gid_index >/dev/null && return 0 ;;
		esac
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}

# rxe_test: rxe_setup as a file's first test ("rxe0 on $RXE_NETDEV"); when rxe0 does not come
# up, that test fails and the file ends there.
rxe_test() {
	if ! rxe_setup; then
		ktap_fail "rxe0 on $RXE_NETDEV"
		ktap_exit
	fi
	ktap_ok "rxe0 on $RXE_NETDEV"
}

# wait_for FILE REGEX [SECONDS]: until a line of FILE matches (a server is ready), at most
# SECONDS (30) by the clock: under TCG each step's fork and exec can take longer than its sleep.
wait_for() {
	_wf_end=$(($(date +%s) + ${3:-30}))
	while :; do
		grep -q "$2" "$1" 2>/dev/null && return 0
		[ "$(date +%s)" -lt $_wf_end ] || return 1
		sleep 0.1
	done
}

# serve_bg OUT SECONDS ARGS...: `p2pbuf rdma serve ARGS` in the background, its output in OUT
# and its pid in $srv; waits up to SECONDS for it to listen (status 1 if it does not).
serve_bg() {
	_out=$1 _secs=$2
	shift 2
	p2pbuf rdma serve "$@" >"$_out" 2>&1 &
	srv=$!
	wait_for "$_out" "listening on" "$_secs"
}

# serve_wait OUT: waits for the server serve_bg started; its exit status in $src, its output
# (OUT) as comments.
serve_wait() {
	wait $srv
	src=$?
	comment "$1"
}

# serve_failed OUT NAME SKIPPED...: the server serve_bg started did not come up: its output
# (OUT) as comments, the test NAME failed, each SKIPPED test skipped ("no server"), the
# server killed.
serve_failed() {
	comment "$1"
	ktap_fail "$2"
	shift 2
	for _t in "$@"; do ktap_skip "$_t" "no server"; done
	kill $srv 2>/dev/null
}

# rdma_client SECONDS OUT OP ARGS...: `p2pbuf rdma OP --server $RXE_IP:$PORT ARGS` for at most
# SECONDS, its output in OUT (and as comments); its exit status in $rc (and as the status).
rdma_client() {
	_secs=$1 _out=$2 _op=$3
	shift 3
	timeout "$_secs" p2pbuf rdma "$_op" --server "$RXE_IP:$PORT" "$@" >"$_out" 2>&1
	rc=$?
	comment "$_out"
	return $rc
}

# rdma_op_check OP SIZE OFFSET SEED WANT OK_NAME FAIL_NAME: `p2pbuf rdma OP` (write, read) of
# SIZE at OFFSET of the server on $PORT, pattern SEED, must exit 0 and print WANT and "OK"
# (output in /tmp/op.txt); the KTAP result is OK_NAME with the rate, or FAIL_NAME.
rdma_op_check() {
	rdma_client 120 /tmp/op.txt "$1" --size "$2" --offset "$3" --pattern "$4"
	if [ $rc -eq 0 ] && grep -q "$5" /tmp/op.txt && grep -q "^OK" /tmp/op.txt; then
		ktap_ok "$6, $(rate /tmp/op.txt)"
	else
		ktap_fail "$7: exit $rc"
	fi
}

# json_num KEY: the first numeric "KEY":N of stdin (enough for p2pbuf's one-line JSON).
json_num() { sed -n "s/.*\"$1\":\([0-9-]*\).*/\1/p" | head -1; }

# rate FILE: "N MiB per s" from p2pbuf rdma write/read's output (no '/' in KTAP test names:
# the harness shows names as paths).
rate() { sed -n 's/.* s, \([0-9.]*\) MiB\/s$/\1 MiB per s/p' "$1"; }

# comment FILE: the file's lines as KTAP diagnostics.
comment() { sed 's/^/# /' "$1"; }

# logged FILE CMD...: runs CMD with its output (stdout and stderr) in FILE, shows FILE as
# comments; its exit code is left in $rc.
logged() {
	_log=$1
	shift
	"$@" >"$_log" 2>&1
	rc=$?
	comment "$_log"
}

# expect_fail NAME WANT_RC TEXT CMD...: CMD must exit WANT_RC, say TEXT on stderr, and not
# panic.
expect_fail() {
	_name=$1 _want=$2 _text=$3
	shift 3
	"$@" >/tmp/out.txt 2>/tmp/err.txt
	_rc=$?
	comment /tmp/err.txt
	if [ $_rc -eq "$_want" ] && grep -q "$_text" /tmp/err.txt && ! grep -q panicked /tmp/err.txt; then
		ktap_ok "$_name (exit $_rc)"
	else
		comment /tmp/out.txt
		ktap_fail "$_name: exit $_rc, want $_want and \"$_text\""
	fi
}

# jq_check NAME FILE FILTER: FILTER (a jq expression) must hold for the JSON in FILE.
jq_check() {
	if ! command -v jq >/dev/null; then
		ktap_fail "$1: jq is missing from the initramfs"
	elif jq -e "$3" "$2" >/dev/null 2>/tmp/jq.err; then
		ktap_ok "$1"
	else
		comment /tmp/jq.err
		ktap_fail "$1: jq -e '$3' is false"
	fi
}

# reg_errno EXPECTED NAME ARGS...: `p2pbuf --json rdma reg ARGS` must fail with errno EXPECTED
# (exit 1: an error, not a crash or a signal), and its message must contain $REG_TEXT if set;
# prints the error as a diagnostic.
reg_errno() {
	_want=$1 _name=$2
	shift 2
	p2pbuf --json rdma reg "$@" >/tmp/reg.json 2>/tmp/reg.err
	_rc=$?
	_got=$(json_num errno </tmp/reg.json)
	sed 's/^/# /' /tmp/reg.err
	if [ $_rc -eq 1 ] && [ "$_got" = "$_want" ] &&
		{ [ -z "${REG_TEXT:-}" ] || grep -q "$REG_TEXT" /tmp/reg.err; }; then
		ktap_ok "$_name: errno $_got"
	else
		ktap_fail "$_name: exit $_rc errno ${_got:-none}, want exit 1 errno $_want"
	fi
}

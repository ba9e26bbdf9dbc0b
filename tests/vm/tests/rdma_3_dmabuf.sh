#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# dma-buf memory regions (ibv_reg_dmabuf_mr) on rxe0: a udmabuf (a foreign exporter) passed
# from one process to another over a Unix socket, the p2pbuf exporter's device memory, and
# the registrations that must be refused.
#
# The kernel carries the series' "RDMA/rxe: Support dma-buf memory regions" and the VM's
# rdma-core the provider patch, so registrations must succeed, the RDMA writes into the
# dma-bufs are verified through their mmap, and the bad registrations get the kernel's EINVAL
# (22). A kernel without the rxe half answers EOPNOTSUPP (95) before looking at any argument:
# boot it with `--append p2pbuf.dmabuf_mr=eopnotsupp` to check that instead.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
DMABUF_MR=$(cmdline_arg dmabuf_mr)
DMABUF_MR=${DMABUF_MR:-supported}
if [ "$DMABUF_MR" = supported ]; then BAD=22; else BAD=95; fi
ktap_plan 14
echo "# expecting dma-buf MRs to be: $DMABUF_MR (bad registrations: errno $BAD)"
rxe_test

# reg_dmabuf NAME ARGS...: a registration that is right, so it is refused only for lack of
# support.
reg_dmabuf() {
	_name=$1
	shift
	if [ "$DMABUF_MR" = supported ]; then
		p2pbuf rdma reg "$@" >/tmp/reg.txt 2>&1
		_rc=$?
		comment /tmp/reg.txt
		ktap_check "$_name: registered (exit $_rc)" grep -q "with ibv_reg_dmabuf_mr" /tmp/reg.txt
	else
		REG_TEXT="lacks dma-buf MR support"
		reg_errno 95 "$_name: EOPNOTSUPP, no dma-buf MRs in this kernel's rxe" "$@"
		REG_TEXT=
	fi
}
reg_dmabuf "ibv_reg_dmabuf_mr of an 8 MiB udmabuf" --mem udmabuf --size 8M

# Two processes: one allocates a udmabuf and passes the fd over a Unix socket; the other
# registers it and serves RDMA clients.
PORT=7472
rm -f /tmp/fd.sock
p2pbuf rdma serve --port $PORT --mem fd-from:/tmp/fd.sock --clients 3 --timeout 60 >/tmp/serve.txt 2>&1 &
srv=$!
p2pbuf alloc --mem udmabuf --size 8M --send /tmp/fd.sock --wait 30 >/tmp/alloc.txt 2>&1
arc=$?
comment /tmp/alloc.txt
if [ "$DMABUF_MR" = supported ]; then
	if wait_for /tmp/serve.txt "listening on" 30; then
		comment /tmp/serve.txt
		ktap_ok "serve --mem fd-from: udmabuf from pid of p2pbuf alloc, registered, listening"
		for w in "2M 0 11" "3M 2M 12"; do
			# shellcheck disable=SC2086
			set -- $w
			rdma_client 120 /tmp/w.txt write --size "$1" --offset "$2" --pattern "$3"
			ktap_check "RDMA WRITE of $1 at $2 into the udmabuf MR, verified through its mmap (exit $rc)" \
				grep -q "server: verified the pattern" /tmp/w.txt
		done
		rdma_client 120 /tmp/r.txt read --size 2M --offset 0 --pattern 11
		ktap_check "RDMA READ of 2M from the udmabuf MR returns the pattern (exit $rc)" grep -q "^OK" /tmp/r.txt
		serve_wait /tmp/serve.txt
		ktap_check "server: 3 clients verified" grep -q "done: 3 client(s) verified, 0 failed" /tmp/serve.txt
	else
		serve_failed /tmp/serve.txt "serve --mem fd-from: registered, listening" \
			"udmabuf write" "udmabuf write" "udmabuf read" "udmabuf verdict"
	fi
else
	serve_wait /tmp/serve.txt
	if [ $arc -eq 0 ] && [ $src -eq 1 ] && grep -q "received\|will register" /tmp/alloc.txt &&
		grep -q "ibv_reg_dmabuf_mr(.*udmabuf dma-buf of 8388608 bytes.*(errno 95)" /tmp/serve.txt; then
		ktap_ok "serve --mem fd-from: the fd arrives from the other process; EOPNOTSUPP registering it"
	else
		ktap_fail "serve --mem fd-from: alloc exit $arc, serve exit $src, want the fd passed and EOPNOTSUPP"
	fi
	for t in "RDMA WRITE of 2M at 0" "RDMA WRITE of 3M at 2M" "RDMA READ of 2M" "server verdict"; do
		ktap_skip "udmabuf MR: $t" "dma-buf MRs unsupported by this kernel's rxe"
	done
fi

# Device memory from the p2pbuf exporter.
if [ -e /dev/p2pbuf ]; then
	if [ "$DMABUF_MR" = supported ]; then
		if serve_bg /tmp/serve.txt 30 --port $PORT --mem p2pbuf --size 4M --clients 1 --timeout 60; then
			ktap_ok "serve --mem p2pbuf: device memory registered"
			timeout 120 p2pbuf rdma write --server "$RXE_IP:$PORT" --size 4M --pattern 21 >/tmp/w.txt 2>&1
			comment /tmp/w.txt
			ktap_check "RDMA WRITE of 4M into device memory, verified through its mmap" \
				grep -q "server: verified the pattern" /tmp/w.txt
		else
			ktap_fail "serve --mem p2pbuf: device memory registered"
			ktap_skip "RDMA WRITE into device memory" "no server"
		fi
		serve_wait /tmp/serve.txt
	else
		reg_dmabuf "ibv_reg_dmabuf_mr of 4 MiB of p2pbuf device memory" --mem p2pbuf --size 4M
		ktap_skip "RDMA WRITE into device memory" "dma-buf MRs unsupported by this kernel's rxe"
	fi
else
	logged /tmp/reg.txt p2pbuf rdma reg --mem p2pbuf --size 4M
	if [ $rc -eq 69 ] && grep -q "/dev/p2pbuf does not exist" /tmp/reg.txt; then
		ktap_skip "ibv_reg_dmabuf_mr of p2pbuf device memory" "no /dev/p2pbuf (exporter not loaded); p2pbuf says so (exit 69)"
	else
		ktap_fail "p2pbuf rdma reg --mem p2pbuf without /dev/p2pbuf: exit $rc, want 69 and a clear message"
	fi
	ktap_skip "RDMA WRITE into device memory" "no /dev/p2pbuf"
fi

# Registrations that must be refused, whatever the support (documented errno, no crash).
dd if=/dev/zero of=/tmp/notdmabuf bs=4096 count=16 2>/dev/null
reg_errno $BAD "ibv_reg_dmabuf_mr of a regular file's fd" --mem file:/tmp/notdmabuf --size 64k
reg_errno $BAD "ibv_reg_dmabuf_mr at offset 2M of a 1M udmabuf" --mem udmabuf --size 1M --offset 2M --length 4k
reg_errno $BAD "ibv_reg_dmabuf_mr of 2M of a 1M udmabuf" --mem udmabuf --size 1M --length 2M
reg_errno $BAD "ibv_reg_dmabuf_mr with REMOTE_WRITE but no LOCAL_WRITE" --mem udmabuf --size 1M --access rw,rr
reg_errno $BAD "ibv_reg_dmabuf_mr with iova and offset at different page offsets" --mem udmabuf --size 1M --iova 0x10
ktap_exit

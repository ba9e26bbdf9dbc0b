#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The p2pbuf CLI end to end: alloc (text and --json) of device memory, info of the buffer from
# another process (PID:FD with pidfd_getfd, and its fdinfo file), and the failure modes a user
# meets first: a device path that does not exist, a bad size, no /dev/p2pbuf. --pfnmap (a buffer
# whose mmap is I/O memory without struct pages, P2PBUF_ALLOC_PFNMAP): the fill goes through such
# a mapping (debugfs counts its pages), and other memory is refused with a message.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 10

logged /tmp/alloc.txt p2pbuf alloc --mem p2pbuf --size 64k --fill 0x5a
ktap_check "p2pbuf alloc --mem p2pbuf: 64 KiB of device memory from a provider (exit $rc)" \
	sh -c "[ $rc -eq 0 ] && grep -q 'allocated 65536 (64 KiB) from provider' /tmp/alloc.txt &&
		grep -q 'exporter: p2pbuf' /tmp/alloc.txt"

# --json, held for a few seconds so that another process can look at the fd.
p2pbuf --json alloc --mem p2pbuf --size 2M --fill 0xa5 --hold 20 >/tmp/alloc.json 2>/tmp/alloc.err &
holder=$!
wait_for /tmp/alloc.json '"fd":' 10
comment /tmp/alloc.json
pid=$(json_num pid </tmp/alloc.json)
fd=$(json_num fd </tmp/alloc.json)
size=$(json_num size </tmp/alloc.json)
if [ -n "$pid" ] && [ -n "$fd" ] && [ "$size" = 2097152 ] && grep -q '"exporter":"p2pbuf"' /tmp/alloc.json; then
	ktap_ok "p2pbuf --json alloc: pid $pid fd $fd, size 2097152, exporter p2pbuf"
else
	ktap_fail "p2pbuf --json alloc: pid '$pid' fd '$fd' size '$size'"
fi

logged /tmp/info.txt p2pbuf info "$pid:$fd"
ktap_check "p2pbuf info $pid:$fd (pidfd_getfd): exporter p2pbuf, 2 MiB (exit $rc)" \
	sh -c "[ $rc -eq 0 ] && grep -q 'exporter: p2pbuf' /tmp/info.txt && grep -q 'size:     2097152' /tmp/info.txt"
logged /tmp/info.json p2pbuf --json info "/proc/$pid/fdinfo/$fd"
ktap_check "p2pbuf --json info of the fdinfo file of pid $pid fd $fd: size 2097152 (exit $rc)" \
	sh -c "[ $rc -eq 0 ] && grep -q '\"size\":2097152' /tmp/info.json"
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

p2pbuf --json alloc --mem p2pbuf --size 64k --pfnmap --fill 0x3c --hold 20 >/tmp/pfn.json 2>/tmp/pfn.err &
holder=$!
wait_for /tmp/pfn.json '"fd":' 10
comment /tmp/pfn.json
comment /tmp/pfn.err
blk=$(debugfs_buffer 65536 last)
echo "$blk" | sed 's/^/# /'
if grep -q '"pfnmap":true' /tmp/pfn.json && echo "$blk" | grep -q 'cpu mapping pfn (16 pages faulted in)'; then
	ktap_ok "p2pbuf --json alloc --pfnmap: filled through a PFN mapping (debugfs: cpu mapping pfn, 16 pages)"
else
	ktap_fail "p2pbuf --json alloc --pfnmap: no '\"pfnmap\":true' or no 'cpu mapping pfn (16 pages faulted in)'"
fi
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
expect_fail "p2pbuf alloc --mem udmabuf --pfnmap: refused as a usage error, says which memory can be" 2 "only p2pbuf device memory can be PFN-mapped" \
	p2pbuf alloc --mem udmabuf --size 64k --pfnmap

expect_fail "p2pbuf info of a nonexistent path: ENOENT, says so" 1 "No such file" \
	p2pbuf info /nonexistent/buf
expect_fail "p2pbuf nvme read from a nonexistent device: unavailable, says what to check" 69 "does not exist" \
	p2pbuf nvme read --dev /dev/nonexistent0n1 --len 4096
expect_fail "p2pbuf alloc with a bad size (12X): usage error" 2 "unknown unit" \
	p2pbuf alloc --mem p2pbuf --size 12X
expect_fail "p2pbuf alloc of more device memory than a provider has: ENOMEM or unavailable, says so" 69 "no provider has that much free" \
	p2pbuf alloc --mem p2pbuf --size 64G
ktap_exit

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# p2pbuf send / recv (SCM_RIGHTS over a Unix socket, and pidfd_getfd for PID:FD targets) end
# to end, with --json parsed by jq, their failure modes, and `p2pbuf cuda` in a guest that has
# no GPU and no NVIDIA driver: a clear "unavailable" (exit 69), not a crash.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 11

# 1-3: alloc device memory as a surface, fill it, send it; the receiver maps it and reads.
rm -f /tmp/fp1.sock
p2pbuf --json recv /tmp/fp1.sock --mmap >/tmp/recv1.json 2>/tmp/recv1.err &
receiver=$!
p2pbuf alloc --mem p2pbuf --surface 512x512 --format XR24 --fill 0x3c --send /tmp/fp1.sock \
	>/tmp/send1.txt 2>&1
rc=$?
wait "$receiver"
rrc=$?
comment /tmp/send1.txt
comment /tmp/recv1.json
comment /tmp/recv1.err
ktap_check "alloc --send: the receiver answered the sender (exit $rc, receiver exit $rrc)" \
	sh -c "[ $rc -eq 0 ] && [ $rrc -eq 0 ] && grep -q 'receiver: pid [0-9]* got fd [0-9]*: exp_name p2pbuf size 1048576' /tmp/send1.txt &&
		grep -q 'mmap ok, first bytes 3c 3c' /tmp/send1.txt"
jq_check "--json recv: exporter p2pbuf, 1 MiB, from the sender's pid, surface 512x512 XR24" /tmp/recv1.json \
	'.info.exporter == "p2pbuf" and .info.size == 1048576 and .header.size == 1048576 and
	 (.peer_pid | type) == "number" and .peer_pid != .pid and
	 .surface.width == 512 and .surface.fourcc == "XR24" and .surface.size == 1048576'
jq_check "--json recv --mmap: mapped with DMA_BUF_IOCTL_SYNC, the sender's fill (3c) read back" /tmp/recv1.json \
	'.mmap.ok == true and (.mmap.first_bytes | startswith("3c 3c 3c 3c"))'

# 4-5: send PID:FD of a buffer another process holds (pidfd_getfd), text output.
p2pbuf --json alloc --mem udmabuf --size 64k --fill 0x77 --hold 30 >/tmp/hold.json 2>/tmp/hold.err &
holder=$!
wait_for /tmp/hold.json '"fd":' 15
pid=$(jq -r .pid /tmp/hold.json 2>/dev/null)
fd=$(jq -r .fd /tmp/hold.json 2>/dev/null)
rm -f /tmp/fp2.sock
p2pbuf recv /tmp/fp2.sock --mmap >/tmp/recv2.txt 2>&1 &
receiver=$!
p2pbuf send /tmp/fp2.sock "$pid:$fd" >/tmp/send2.txt 2>&1
rc=$?
wait "$receiver"
comment /tmp/send2.txt
comment /tmp/recv2.txt
ktap_check "send PID:FD (pidfd_getfd from pid $pid): udmabuf 64 KiB delivered (exit $rc)" \
	sh -c "[ $rc -eq 0 ] && grep -q 'sent udmabuf dma-buf of 65536 (64 KiB) to /tmp/fp2.sock' /tmp/send2.txt"
ktap_check "recv (text): received from the sender, exporter udmabuf, the holder's fill (77) mapped" \
	sh -c "grep -q 'received dma-buf from pid [0-9]* (sender said: 65536 bytes, exporter udmabuf)' /tmp/recv2.txt &&
		grep -q 'mmap:     ok, first bytes 77 77' /tmp/recv2.txt"

# 6-9: failure modes.
expect_fail "send to a socket nobody listens on: says to start p2pbuf recv" 1 "is .p2pbuf recv SOCKET. running" \
	p2pbuf send /tmp/nobody.sock "$pid:$fd" --wait 1
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
expect_fail "send of a device node: not a dma-buf, says what to pass" 1 "not a dma-buf" \
	p2pbuf send /tmp/fp3.sock /dev/null --wait 1
expect_fail "send PID:FD of a process that does not exist: ESRCH" 1 "errno 3" \
	p2pbuf send /tmp/fp3.sock 999999:3 --wait 1
: >/tmp/notasocket
expect_fail "recv on a path that is a regular file: refused, not removed" 69 "is not a stale socket" \
	p2pbuf recv /tmp/notasocket

# 10-11: CUDA in a guest without a GPU or driver.
expect_fail "cuda probe without an NVIDIA driver: unavailable, says what to check" 69 "nvidia-smi" \
	p2pbuf cuda probe
p2pbuf --json cuda export --size 2M >/tmp/cuda.json 2>/tmp/cuda.err
rc=$?
comment /tmp/cuda.json
if [ $rc -eq 69 ] && ! grep -q panicked /tmp/cuda.err; then
	jq_check "--json cuda export without a driver: exit 69, unavailable, the error names the CUDA driver" /tmp/cuda.json \
		'.unavailable == true and (.error | test("CUDA driver"))'
else
	comment /tmp/cuda.err
	ktap_fail "--json cuda export without a driver: exit $rc, want 69"
fi
ktap_exit

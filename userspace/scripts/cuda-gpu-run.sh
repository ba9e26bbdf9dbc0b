#!/bin/bash
# Runs the CUDA path of p2pbuf on a machine with an NVIDIA GPU and prints
# everything docs/cuda.md reports. Needs the binaries built elsewhere:
#   cargo build --release -p p2pbuf-cli --features cuda
#   cargo test --release -p p2pbuf --features cuda --no-run  (copied to $TESTS)
# Usage: userspace/scripts/cuda-gpu-run.sh [P2PBUF_BIN] [TEST_BIN]
set -u
B=${1:-target/release/p2pbuf}
TESTS=${2:-}
S=/tmp/p2pbuf-cuda-$$.sock
RECV_LOG=/tmp/p2pbuf-recv-$$.txt

section() { printf '\n=== %s\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; printf '[exit %s]\n' "$?"; }
# Wait up to 15 s for a background receiver, then stop it (the export may
# have failed, leaving it waiting for a connection).
reap() {
    for _ in $(seq 150); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill "$1" 2>/dev/null && echo "(receiver stopped: nobody connected)"
    wait "$1"
    echo "[receiver exit $?]"
}

section "machine"
uname -r
grep -E '^(PRETTY_NAME)=' /etc/os-release
nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total --format=csv 2>&1
head -1 /proc/driver/nvidia/version 2>&1
echo "modules_disabled: $(cat /proc/sys/kernel/modules_disabled 2>&1)"
echo "cargo: $(command -v cargo || echo none)"
echo "/sys/class/infiniband: $(ls -A /sys/class/infiniband 2>&1 | tr '\n' ' ')"
ls /sys/class/infiniband >/dev/null 2>&1 && [ -z "$(ls -A /sys/class/infiniband)" ] && echo "(exists, empty)"

section "device attributes"
run "$B" cuda probe

section "export in one process: mmap and RDMA tried by the exporter"
run "$B" cuda export --mmap --rdma

section "export in one process, pass the fd to a second process"
"$B" recv "$S" --mmap --rdma --hold 4 >"$RECV_LOG" 2>&1 &
RPID=$!
run "$B" cuda export --send "$S" --fill 0x5a
sleep 1
FD=$(sed -n 's/^holding fd \([0-9]*\).*/\1/p' "$RECV_LOG")
echo "receiver pid $RPID, fd $FD"
if [ -n "$FD" ]; then
    section "third process: raw fdinfo of the receiver's fd, then p2pbuf info on it"
    run cat "/proc/$RPID/fdinfo/$FD"
    run "$B" info "/proc/$RPID/fdinfo/$FD"
    run "$B" info "$RPID:$FD"
    run ls -l "/proc/$RPID/fd/$FD"
fi
reap "$RPID"
section "receiver's own output"
cat "$RECV_LOG"

section "the same with --json"
"$B" --json recv "$S" --mmap --rdma >"$RECV_LOG" 2>&1 &
RPID=$!
run "$B" --json cuda export --send "$S"
reap "$RPID"
cat "$RECV_LOG"

section "variants and error paths"
run "$B" cuda export --size 1G --fill 0
run "$B" cuda export --pcie-mapping
run "$B" cuda export --device 7
run env CUDA_VISIBLE_DEVICES= "$B" cuda probe
run "$B" send "$S" 0 --wait 1

if [ -n "$TESTS" ]; then
    section "library tests (release build, feature cuda)"
    run "$TESTS" --test-threads=1 --nocapture cuda::
    run "$TESTS" --test-threads=4 -q
fi
rm -f "$S" "$RECV_LOG"

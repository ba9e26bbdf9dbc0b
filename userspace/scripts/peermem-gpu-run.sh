#!/bin/bash
# The CUDA half of libp2pbuf_peermem.so, on a machine with an NVIDIA GPU and no RDMA device:
# pointer detection and dma-buf export from 4 KiB to 64 GiB, and registration reaching
# ibv_reg_dmabuf_mr (through the real libibverbs, into a stand-in provider: see
# userspace/p2pbuf-peermem/c/cuda_peermem_check.c). Prints what docs/rdma.md reports; the log of
# a run is docs/cuda-h200-peermem-run.txt.
# Usage: peermem-gpu-run.sh BUNDLE_DIR   (made by userspace/scripts/peermem-gpu-bundle.sh)
set -u
D=$(cd "${1:-$(dirname "$0")}" && pwd)
export LD_LIBRARY_PATH=$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
CHECK=$D/cuda-peermem-check
LIB=$D/libp2pbuf_peermem.so
MAX_GIB=${MAX_GIB:-64}

section() { printf '\n=== %s\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; printf '[exit %s]\n' "$?"; }

section "machine"
date -u
uname -r
grep -E '^PRETTY_NAME=' /etc/os-release
nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total,memory.used --format=csv 2>&1
echo "/sys/class/infiniband: $(ls -A /sys/class/infiniband 2>&1 | tr '\n' ' ')"
echo "rdma-core installed: $(ls /usr/lib/x86_64-linux-gnu/libibverbs.so.1 2>/dev/null || echo no)"
run ldd "$CHECK"
run ldd "$LIB"

section "with the library: LD_PRELOAD=libp2pbuf_peermem.so P2PBUF_PEERMEM_DEBUG=1, sizes 4 KiB to $MAX_GIB GiB"
run env LD_PRELOAD="$LIB" P2PBUF_PEERMEM_DEBUG=1 "$CHECK" --max-gib "$MAX_GIB"

section "CUDA VMM and pool memory only, without P2PBUF_PEERMEM_DEBUG (a refusal's message is printed in any case)"
run env LD_PRELOAD="$LIB" "$CHECK" --vmm-only

if [ -e "$D/before/libp2pbuf_peermem.so" ]; then
	section "CUDA VMM and pool memory with the library as it was before (before/libp2pbuf_peermem.so): the checks must be able to fail"
	run env LD_PRELOAD="$D/before/libp2pbuf_peermem.so" P2PBUF_PEERMEM_DEBUG=1 "$CHECK" --vmm-only
fi

section "the CUDA driver's imports of the calls that the fast path interposes"
CUDALIB=$(ldconfig -p | awk '/libcuda\.so\.1 / {print $NF; exit}')
echo "$CUDALIB: $( (nm -D --undefined-only "$CUDALIB" 2>/dev/null || echo '(no nm here)') | grep -wE 'mmap|mmap64|mprotect|mremap|munmap|syscall|\(no nm here\)' | tr -s ' \n' ' ')"

section "without the library (sizes up to 1 GiB)"
run "$CHECK" --no-preload --max-gib 1

section "cost for host memory in a CUDA process: 4 KiB registrations, the median of 200 batches of 1000, without and with the library (no messages)"
# The library may add at most LIMIT_US per registration of host memory (docs/cuda.md).
LIMIT_US=${LIMIT_US:-0.2}
# One checker run's median (printed as it comes, then parsed).
median_of() {
	local out
	out=$("$@" --max-gib 0 --time-host 200000)
	printf '%s\n' "$out" >&2
	awk '/^# host memory, 4 KiB: median/ {print $7}' <<<"$out"
}
added=()
for i in 1 2 3; do
	echo "--- round $i"
	without=$(median_of "$CHECK" --no-preload)
	if [ -e "$D/before/libp2pbuf_peermem.so" ]; then
		before=$(median_of env LD_PRELOAD="$D/before/libp2pbuf_peermem.so" "$CHECK")
		echo "# round $i: the library as it was before (before/) adds $(awk -v a="$before" -v b="$without" 'BEGIN {printf "%.3f", a - b}') us per host registration ($before with, $without without)"
	fi
	with=$(median_of env LD_PRELOAD="$LIB" "$CHECK")
	d=$(awk -v a="$with" -v b="$without" 'BEGIN {printf "%.3f", a - b}')
	echo "# round $i: the library adds $d us per host registration ($with with, $without without)"
	added+=("$d")
done 2>&1
worst=$(printf '%s\n' "${added[@]}" | sort -g | tail -1)
if awk -v w="$worst" -v l="$LIMIT_US" 'BEGIN {exit !(w != "" && w <= l)}'; then
	echo "PASS: the library adds at most $worst us per host-memory registration (limit $LIMIT_US us; rounds: ${added[*]})"
else
	echo "FAIL: the library adds up to ${worst:-?} us per host-memory registration (limit $LIMIT_US us; rounds: ${added[*]})"
fi

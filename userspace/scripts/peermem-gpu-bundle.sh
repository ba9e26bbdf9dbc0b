#!/bin/bash
# Builds what userspace/scripts/peermem-gpu-run.sh needs on a GPU machine that has neither a
# Rust toolchain nor rdma-core, into one directory:
#   libp2pbuf_peermem.so     the preload library (cargo build --release -p p2pbuf-peermem)
#   cuda-peermem-check       userspace/p2pbuf-peermem/c/cuda_peermem_check*.c (main in
#                            cuda_peermem_check.c) with the stand-in provider
#                            standin_provider.c linked in, built against the rdma-core
#                            of `cargo xtask rdma-core` (its provider interface,
#                            infiniband/driver.h, from the build tree)
#   lib/                     that rdma-core's libibverbs.so.1 and the libnl it needs
#   peermem-gpu-run.sh       the run script
#   libstandin-provider.so   the checker's stand-in verbs provider as a library, and
#   peermem-torch-check.py   PyTorch as the client (userspace/p2pbuf-peermem/c/standin_provider.c)
#   before/                  with BEFORE_LIB=PATH, that build of the library (an older one), whose
#                            CUDA VMM checks the run script also shows
# Usage: userspace/scripts/peermem-gpu-bundle.sh OUT_DIR   (from the checkout's root)
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR}
CACHE=${P2PBUF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/p2pbuf}
STAGE=$CACHE/build/rdma-root
BUILD=$CACHE/build/rdma-core
LIBS=$STAGE/usr/lib/x86_64-linux-gnu
[ -e "$LIBS/libibverbs.so.1" ] && [ -e "$BUILD/include/infiniband/driver.h" ] ||
	{ echo "no rdma-core build in $CACHE: run cargo xtask rdma-core" >&2; exit 1; }
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release -p p2pbuf-peermem
mkdir -p "$OUT/lib"
cp "$TARGET/release/libp2pbuf_peermem.so" "$OUT/"
gcc -O2 -g0 -Wall -Wextra -Werror -isystem "$BUILD/include" -I"$STAGE/usr/include" \
	-o "$OUT/cuda-peermem-check" userspace/p2pbuf-peermem/c/cuda_peermem_check*.c \
	userspace/p2pbuf-peermem/c/standin_provider.c \
	-L"$LIBS" -Wl,-rpath-link,"$LIBS" -libverbs -ldl -pthread
gcc -O2 -g0 -Wall -Wextra -Werror -shared -fPIC -isystem "$BUILD/include" -I"$STAGE/usr/include" \
	-o "$OUT/libstandin-provider.so" userspace/p2pbuf-peermem/c/standin_provider.c \
	-L"$LIBS" -Wl,-rpath-link,"$LIBS" -libverbs
cp userspace/scripts/peermem-torch-check.py "$OUT/"
cp -L "$LIBS/libibverbs.so.1" "$OUT/lib/"
for l in $(LD_LIBRARY_PATH=$LIBS ldd "$LIBS/libibverbs.so.1" | awk '/libnl/ {print $3}'); do
	cp -L "$l" "$OUT/lib/"
done
cp userspace/scripts/peermem-gpu-run.sh "$OUT/"
if [ -n "${BEFORE_LIB:-}" ]; then
	mkdir -p "$OUT/before"
	cp "$BEFORE_LIB" "$OUT/before/libp2pbuf_peermem.so"
fi
ls -l "$OUT" "$OUT/lib"

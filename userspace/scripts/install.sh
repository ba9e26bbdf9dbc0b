#!/bin/bash
# Builds and installs, on a cluster node or any Linux machine, without the lab (`cargo xtask`)
# and without its cache:
#   PREFIX/lib/libp2pbuf_peermem.so   the LD_PRELOAD library: plain ibv_reg_mr() on CUDA device
#                                     memory (or a dma-buf's mapping) registered through
#                                     ibv_reg_dmabuf_mr(), in place of nvidia-peermem
#   PREFIX/bin/p2pbuf                 the CLI, with CUDA (`p2pbuf cuda probe` checks a node)
# The RDMA bindings are generated from the system's rdma-core headers (Debian/Ubuntu:
# libibverbs-dev, librdmacm-dev) or the build fails: no pregenerated fallback. See
# docs/cluster.md.
#
# Usage: userspace/scripts/install.sh [--prefix DIR] [--no-cli] [--check]
#   --prefix DIR  where to install (default /usr/local)
#   --no-cli      only the library
#   --check       only check the prerequisites
# Environment: CARGO_TARGET_DIR (where cargo builds), P2PBUF_RDMA_ROOT (a root whose usr/include
# has the rdma-core headers; default /), LIBCLANG_PATH (a directory with libclang.so).
# Exit status: 0 done; 64 bad arguments; 69 (EX_UNAVAILABLE, as the CLI's) a prerequisite is
# missing, the message says which and what to install; 77 PREFIX is not writable; 1 the build
# failed.
set -euo pipefail

PREFIX=/usr/local
CLI=1
CHECK_ONLY=0
usage() { echo "usage: $0 [--prefix DIR] [--no-cli] [--check]" >&2; exit 64; }
while [ $# -gt 0 ]; do
	case $1 in
	--prefix) [ $# -ge 2 ] || usage; PREFIX=$2; shift 2 ;;
	--prefix=*) PREFIX=${1#--prefix=}; shift ;;
	--no-cli) CLI=0; shift ;;
	--check) CHECK_ONLY=1; shift ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) usage ;;
	esac
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export P2PBUF_RDMA_ROOT=${P2PBUF_RDMA_ROOT:-/}
INC=${P2PBUF_RDMA_ROOT%/}/usr/include

# ---- prerequisites: every missing one is listed, with its package, before exiting 69 ----
missing=() pkgs=()
need() { missing+=("$1"); [ -z "${2:-}" ] || pkgs+=("$2"); }

RUST_MIN=1.85
if ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
	need "cargo and rustc $RUST_MIN or later (rustup: https://rustup.rs; Debian 12's and Ubuntu 24.04's rustc are older)"
else
	v=$(rustc --version | awk '{print $2}')
	if [ "$(printf '%s\n%s\n' "$RUST_MIN" "${v%%-*}" | sort -V | head -1)" != "$RUST_MIN" ]; then
		need "rustc $RUST_MIN or later (this one is $v: rustup update)"
	fi
fi
command -v cc >/dev/null || need "a C compiler and linker, cc (the Rust linker driver)" gcc
if [ ! -e "$INC/infiniband/verbs.h" ]; then
	need "$INC/infiniband/verbs.h (rdma-core's libibverbs headers)" libibverbs-dev
elif ! grep -q ibv_reg_dmabuf_mr "$INC/infiniband/verbs.h"; then
	need "ibv_reg_dmabuf_mr in $INC/infiniband/verbs.h: this rdma-core is older than 34, which has dma-buf memory regions (upgrade rdma-core: Debian 12 has 44, Ubuntu 22.04 has 39)"
fi
[ -e "$INC/rdma/rdma_cma.h" ] || need "$INC/rdma/rdma_cma.h (rdma-core's librdmacm headers)" librdmacm-dev
has_libclang() {
	local d
	for d in ${LIBCLANG_PATH:-} /usr/lib/llvm-*/lib /usr/lib64 /usr/lib/x86_64-linux-gnu; do
		compgen -G "$d/libclang.so*" >/dev/null || compgen -G "$d/libclang-[0-9]*.so*" >/dev/null && return 0
	done
	ldconfig -p 2>/dev/null | grep -Eq 'libclang(-[0-9.]+)?\.so'
}
has_libclang || need "libclang (bindgen generates the verbs bindings with it; or set LIBCLANG_PATH)" libclang-dev

if [ ${#missing[@]} -gt 0 ]; then
	echo "install.sh: cannot build, missing:" >&2
	printf '  - %s\n' "${missing[@]}" >&2
	if [ ${#pkgs[@]} -gt 0 ]; then
		echo "on Debian/Ubuntu: sudo apt-get install ${pkgs[*]}" >&2
		echo "(Fedora/RHEL: rdma-core-devel clang-devel gcc)" >&2
	fi
	exit 69
fi
echo "install.sh: prerequisites found: $(rustc --version), rdma-core headers in $INC"
[ "$CHECK_ONLY" = 0 ] || exit 0

if ! mkdir -p "$PREFIX/lib" "$PREFIX/bin" 2>/dev/null || [ ! -w "$PREFIX/lib" ] || [ ! -w "$PREFIX/bin" ]; then
	echo "install.sh: cannot write $PREFIX/lib and $PREFIX/bin: run it as root (sudo) or choose --prefix, e.g. --prefix \$HOME/.local" >&2
	exit 77
fi

# ---- build: bindings from $INC only (P2PBUF_RDMA_REQUIRE_HEADERS: no pregenerated copy) ----
export P2PBUF_RDMA_REQUIRE_HEADERS=1
args=(build --release --locked -p p2pbuf-peermem)
[ "$CLI" = 0 ] || args+=(-p p2pbuf-cli --features p2pbuf-cli/cuda)
cd "$ROOT"
echo "install.sh: cargo ${args[*]}"
if ! cargo "${args[@]}"; then
	echo "install.sh: the build failed (above)" >&2
	exit 1
fi
TARGET=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
install -m 0755 "$TARGET/release/libp2pbuf_peermem.so" "$PREFIX/lib/libp2pbuf_peermem.so"
echo "installed $PREFIX/lib/libp2pbuf_peermem.so"
if [ "$CLI" = 1 ]; then
	install -m 0755 "$TARGET/release/p2pbuf" "$PREFIX/bin/p2pbuf"
	echo "installed $PREFIX/bin/p2pbuf"
fi
LIB=$PREFIX/lib/libp2pbuf_peermem.so
[ "$CLI" = 0 ] || cat <<EOF

Check this node (GPU, driver, dma-buf support, RDMA devices; docs/cluster.md says what each
failure means):
    $PREFIX/bin/p2pbuf cuda probe
EOF
cat <<EOF

Enable the library for one job (unmodified programs that link libibverbs):
    LD_PRELOAD=$LIB your-program
    LD_PRELOAD=$LIB P2PBUF_PEERMEM_DEBUG=1 your-program   # says what it did with each call
Or for every process on the node, as root (docs/cluster.md first: every process then carries
the library's mmap, mprotect and mremap wrappers; all but device memory is passed on untouched):
    echo $LIB >> /etc/ld.so.preload
EOF

#!/bin/bash
# The host check of issue 29 item 5 (`cargo xtask test` runs it after `cargo test --workspace`):
# userspace/scripts/install.sh builds and installs the preload library and the CLI as on a
# cluster node, against the system's rdma-core headers (Debian's libibverbs-dev,
# librdmacm-dev) with the system's libclang, with no lab cache (P2PBUF_CACHE is an empty
# directory, LIBCLANG_PATH unset) into a temporary prefix; Debian's ibv_devices runs with it
# preloaded (it loads beside bookworm's libibverbs and changes nothing); then the stand-in
# provider checker (cuda_peermem_check*.c --host-only) runs with the installed library preloaded:
# no CUDA, no p2pbuf, host memory of many kinds must reach the provider's reg_mr as the program
# passed it.
#
# The stand-in provider is built against the lab's rdma-core (`cargo xtask rdma-core`, 65.0):
# it needs infiniband/driver.h, rdma-core's provider interface, which no Debian package
# ships, and that interface is private ABI tied to one rdma-core release
# (IBVERBS_PRIVATE_<N>), so it runs with that rdma-core's libibverbs. The library, built from
# the system's (bookworm's 44.0) headers, uses only the public verbs ABI and runs on it.
#
# Usage: userspace/scripts/install-check.sh   (from anywhere; exit 0 when every check passed)
# Cargo builds in $CARGO_TARGET_DIR/system-install (default target/system-install): apart from
# the normal build, whose environment differs.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${P2PBUF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/p2pbuf}
STAGE=$CACHE/build/rdma-root
BUILD=$CACHE/build/rdma-core
LIBS=$STAGE/usr/lib/x86_64-linux-gnu
if [ ! -e "$LIBS/libibverbs.so.1" ] || [ ! -e "$BUILD/include/infiniband/driver.h" ]; then
	echo "install-check: no rdma-core build in $CACHE (the stand-in provider needs its infiniband/driver.h): run cargo xtask rdma-core" >&2
	exit 69
fi
BASE=${CARGO_TARGET_DIR:-$ROOT/target}/system-install
NOCACHE=$BASE/no-cache # stays empty; a fixed path keeps the build warm
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PREFIX=$WORK/prefix
mkdir -p "$NOCACHE"

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
notok() { failed=$((failed + 1)); echo "not ok - $*"; }
check() { # check DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@"; then ok "$what"; else notok "$what"; fi
}

# 1. The prerequisite check says what to install (a root without rdma-core headers).
out=$(P2PBUF_RDMA_ROOT=$WORK/none "$ROOT/userspace/scripts/install.sh" --check 2>&1)
rc=$?
check "install.sh --check without rdma-core headers: exit 69 and 'apt-get install libibverbs-dev librdmacm-dev' (got exit $rc)" \
	eval '[ $rc = 69 ] && [[ $out == *"apt-get install libibverbs-dev librdmacm-dev"* ]]'
[ $rc = 69 ] || printf '%s\n' "$out" | sed 's/^/#   /'

# 2. The install, as on a cluster node.
[ -z "$(ls -A "$NOCACHE")" ] || { notok "$NOCACHE is not empty"; exit 1; }
t0=$(date +%s)
env -u LIBCLANG_PATH -u P2PBUF_RDMA_ROOT P2PBUF_CACHE="$NOCACHE" CARGO_TARGET_DIR="$BASE" \
	"$ROOT/userspace/scripts/install.sh" --prefix "$PREFIX" > "$WORK/install.log" 2>&1
rc=$?
check "install.sh --prefix $PREFIX: exit $rc in $(($(date +%s) - t0)) s, PREFIX/lib/libp2pbuf_peermem.so and PREFIX/bin/p2pbuf installed" \
	eval '[ $rc = 0 ] && [ -x "$PREFIX/lib/libp2pbuf_peermem.so" ] && [ -x "$PREFIX/bin/p2pbuf" ]'
if [ $rc != 0 ]; then
	tail -30 "$WORK/install.log" | sed 's/^/#   /'
	echo "install-check: $passed passed, $failed failed"
	exit 1
fi
grep -E '^(install.sh:|installed)' "$WORK/install.log" | sed 's/^/#   /'
check "the RDMA bindings came from the system's headers (the CLI says 'headers in /usr/include')" \
	grep -aq 'headers in /usr/include' "$PREFIX/bin/p2pbuf"
check "libp2pbuf_peermem.so needs nothing but libc (libibverbs is found at run time)" \
	eval '! ldd "$PREFIX/lib/libp2pbuf_peermem.so" | grep -Ev "linux-vdso|libc\.so|libgcc_s|ld-linux" | grep -q .'

# 3. The CLI has CUDA: on this GPU-less host `cuda probe` exits 69 (EX_UNAVAILABLE) naming the
# missing driver; a CLI built without the feature says so instead.
out=$("$PREFIX/bin/p2pbuf" cuda probe 2>&1)
rc=$?
check "p2pbuf cuda probe: exit $rc, $(printf '%s' "$out" | head -1 | cut -c1-120)" \
	eval '[ $rc = 0 ] || { [ $rc = 69 ] && [[ $out == *"CUDA driver"* ]] && [[ $out != *"without the \`cuda\` feature"* ]]; }'

# 4. Debian's own verbs program (ibv_devices, libibverbs 44) with the library preloaded: it
# loads beside that libibverbs (no ld.so error) and changes nothing (this host has no RDMA
# device, so both runs say why with the same words and exit status).
if command -v ibv_devices >/dev/null; then
	trace=$(LD_PRELOAD="$PREFIX/lib/libp2pbuf_peermem.so" LD_TRACE_LOADED_OBJECTS=1 ibv_devices 2>&1)
	plain=$(ibv_devices 2>&1; echo "exit $?")
	pre=$(LD_PRELOAD="$PREFIX/lib/libp2pbuf_peermem.so" ibv_devices 2>&1; echo "exit $?")
	check "Debian's ibv_devices with the library preloaded: loaded with $(printf '%s\n' "$trace" | awk '/libibverbs/ {print $3}'), the same output and ${plain##*$'\n'} as without" \
		eval 'grep -Eq "libp2pbuf_peermem\.so \(0x" <<<"$trace" && [[ $trace != *"ERROR: ld.so"* ]] && [ "$pre" = "$plain" ]'
	[ "$pre" = "$plain" ] || printf '#   without: %s\n#   with:    %s\n' "$plain" "$pre"
else
	notok "ibv_devices (ibverbs-utils) is not installed"
fi

# 5. The stand-in provider checker, host memory only, with the installed library and without.
# build_checker OUT [GCC FLAGS...]: the checker and the stand-in provider, against the lab's
# rdma-core.
build_checker() {
	local out=$1
	shift
	gcc -O2 -g0 -Wall -Wextra -Werror "$@" -isystem "$BUILD/include" -I"$STAGE/usr/include" \
		-o "$out" "$ROOT"/userspace/p2pbuf-peermem/c/cuda_peermem_check*.c \
		"$ROOT/userspace/p2pbuf-peermem/c/standin_provider.c" \
		-L"$LIBS" -Wl,-rpath-link,"$LIBS" -libverbs -ldl -pthread
}
CHECKER=$WORK/cuda-peermem-check
build_checker "$CHECKER"
check "the checker and the stand-in provider build (gcc -Wall -Wextra -Werror)" test -x "$CHECKER"
run_checker() { # run_checker NAME ENV... -- ARGS...
	local name=$1 envs=()
	shift
	while [ "$1" != -- ]; do envs+=("$1"); shift; done
	shift
	env LD_LIBRARY_PATH="$LIBS" "${envs[@]}" "$CHECKER" --host-only "$@" > "$WORK/$name.tap" 2> "$WORK/$name.err"
	local rc=$?
	local sum
	sum=$(grep -E '^# [0-9]+ passed, [0-9]+ failed' "$WORK/$name.tap")
	check "cuda-peermem-check --host-only${*:+ $*}, $name: exit $rc, ${sum#\# }" \
		eval "[ $rc = 0 ] && [[ '$sum' == *' 0 failed' ]] && ! grep -q '^not ok' '$WORK/$name.tap'"
	grep -E '^not ok' "$WORK/$name.tap" | sed 's/^/#   /'
	[ ! -s "$WORK/$name.err" ] || sed 's/^/#   stderr: /' "$WORK/$name.err" | head -20
}
[ ! -x "$CHECKER" ] || {
	run_checker "with the installed library" LD_PRELOAD="$PREFIX/lib/libp2pbuf_peermem.so" P2PBUF_PEERMEM_DEBUG=1 --
	run_checker "without it" -- --no-preload
}

# 6. The same checker as a library that a program dlopen()s without RTLD_GLOBAL, as UCX loads
# its IB transport: libibverbs comes in with it outside the global scope, where the library's
# dlvsym(RTLD_NEXT) cannot see it; the library must still pass host memory through (it once
# answered ENOSYS, and UCX retried its receive pool for ever: docs/rdma.md, "UCX").
LOCAL=$WORK/libcuda-peermem-check-local.so
build_checker "$LOCAL" -fPIC -shared
cat > "$WORK/local-launcher.c" <<'LAUNCHER'
/* Runs the main() of the library argv[1], loaded with RTLD_LOCAL. */
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv)
{
	void *h = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
	int (*entry)(int, char **) = h ? (int (*)(int, char **))dlsym(h, "main") : NULL;

	if (!entry) {
		fprintf(stderr, "local-launcher: %s\n", dlerror());
		return 2;
	}
	return entry(argc - 1, argv + 1);
}
LAUNCHER
gcc -O2 -Wall -Wextra -Werror -o "$WORK/local-launcher" "$WORK/local-launcher.c" -ldl
check "the checker as a library (-shared) and its RTLD_LOCAL launcher build" test -x "$WORK/local-launcher" -a -e "$LOCAL"
if [ -x "$WORK/local-launcher" ] && [ -e "$LOCAL" ]; then
	env LD_LIBRARY_PATH="$LIBS" LD_PRELOAD="$PREFIX/lib/libp2pbuf_peermem.so" \
		"$WORK/local-launcher" "$LOCAL" --host-only > "$WORK/local.tap" 2> "$WORK/local.err"
	rc=$?
	sum=$(grep -E '^# [0-9]+ passed, [0-9]+ failed' "$WORK/local.tap")
	check "cuda-peermem-check --host-only loaded with RTLD_LOCAL (libibverbs outside the global scope), with the library: exit $rc, ${sum#\# }" \
		eval "[ $rc = 0 ] && [[ '$sum' == *' 0 failed' ]] && ! grep -q '^not ok' '$WORK/local.tap'"
	grep -E '^not ok' "$WORK/local.tap" | head -10 | sed 's/^/#   /'
	[ ! -s "$WORK/local.err" ] || sed 's/^/#   stderr: /' "$WORK/local.err" | head -10
fi

echo "install-check: $passed passed, $failed failed"
[ "$failed" = 0 ]

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The guided scenario of `cargo xtask run`: what the lab is, step by step, with the kernel's
# own answers. Later parts of the project extend it (export, RDMA, NVMe, FPGA copy).
. /p2pbuf/lib.sh
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say() { echo "   $*"; }

step "1. The machine"
say "kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB RAM; topology: $(cmdline_arg topology)"

step "2. The PCI fabric (lspci -tv)"
lspci -tv 2>/dev/null | sed 's/^/   /' || say "lspci missing"
for dev in GPU NVME EDU NIC; do
	eval id=\$${dev}_ID
	# shellcheck disable=SC2086
	p=$(pci_find $id)
	# Walk up to the root port: the chain of bridges a P2P transfer crosses.
	chain=""
	q=$p
	while [ "$(basename "$(dirname "$q")")" != "${q%%/pci0000*}" ] && [ "$(dirname "$q")" != "/sys/devices" ]; do
		q=$(dirname "$q")
		case "$(basename "$q")" in pci0000*) break ;; esac
		chain="$chain <- $(basename "$q")"
	done
	say "$(printf '%-5s' $dev) ${p##*/} ($id)$chain"
done

step "3. Loading the p2pbuf modules"
if load_modules; then
	dmesg | grep -E 'p2pbuf_(exporter|importer)' | tail -n 4 | sed 's/^/   /'
else
	say "FAILED to load the modules (see dmesg)"
fi

step "4. p2pdma providers (memory a peer can DMA into)"
found=0
for d in /sys/bus/pci/devices/*; do
	[ -d "$d/p2pmem" ] || continue
	found=1
	say "$(basename "$d"): $(( $(cat "$d/p2pmem/size") >> 20 )) MiB, $(( $(cat "$d/p2pmem/available") >> 20 )) MiB free, published=$(cat "$d/p2pmem/published")"
done
[ $found = 1 ] || say "none registered"
if [ -d /sys/kernel/debug/p2pbuf ]; then
	step "5. Distances and map types (from the exporter's debugfs)"
	for f in /sys/kernel/debug/p2pbuf/*; do
		[ -f "$f" ] && { say "--- $(basename "$f")"; sed 's/^/   /' "$f"; }
	done
else
	step "5. Distances and map types"
	say "the exporter's debugfs (/sys/kernel/debug/p2pbuf) is not there yet: it lands with the"
	say "dma-buf/p2pdma abstractions (issue 3) and the exporter (issue 4)."
fi

step "Done"
say "unloading modules"
rmmod p2pbuf_importer p2pbuf_exporter 2>/dev/null

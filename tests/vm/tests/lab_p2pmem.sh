#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The NVMe driver registered its controller memory buffer as p2pdma memory: the kernel's own
# provider, before any p2pbuf module is loaded.
. /p2pbuf/lib.sh
ktap_plan 3
# shellcheck disable=SC2086
nvme=$(pci_find $NVME_ID)
if [ -z "$nvme" ] || [ ! -d "$nvme/p2pmem" ]; then
	ktap_fail "NVMe CMB registered as p2pmem (${nvme:-no NVMe device})"
	ktap_skip "p2pmem size" "no p2pmem"
	ktap_skip "p2pmem published" "no p2pmem"
	ktap_exit
fi
ktap_ok "NVMe CMB registered as p2pmem (${nvme##*/})"
size=$(cat "$nvme/p2pmem/size")
ktap_check "p2pmem size $size bytes is at least 1 MiB" test "$size" -ge 1048576
ktap_check "p2pmem published ($(cat "$nvme/p2pmem/published"))" test "$(cat "$nvme/p2pmem/published")" = 1
ktap_exit

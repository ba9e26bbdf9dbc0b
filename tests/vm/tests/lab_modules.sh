#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The project's modules unload and load cleanly (twice, to catch state that survives an
# unload), and are left loaded for the tests that follow.
. /p2pbuf/lib.sh
ktap_plan 6
for m in p2pbuf_dma p2pbuf_exporter; do
	[ -d /sys/module/$m ] && rmmod $m
	ktap_check "$m: insmod" insmod /lib/modules/p2pbuf/$m.ko
	ktap_check "$m: in /sys/module" test -d /sys/module/$m
	ktap_check "$m: rmmod and reload" sh -c "rmmod $m && insmod /lib/modules/p2pbuf/$m.ko"
done
ktap_exit

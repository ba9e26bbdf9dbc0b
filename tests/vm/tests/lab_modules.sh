#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The project's modules load, show up in sysfs, and unload cleanly (twice, to catch state
# that survives an unload).
. /p2pbuf/lib.sh
ktap_plan 6
for m in p2pbuf_exporter p2pbuf_importer; do
	ktap_check "$m: insmod" insmod /lib/modules/p2pbuf/$m.ko
	ktap_check "$m: in /sys/module" test -d /sys/module/$m
	ktap_check "$m: rmmod and reload" sh -c "rmmod $m && insmod /lib/modules/p2pbuf/$m.ko && rmmod $m"
done
ktap_exit

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# p2pbuf alloc --surface: a 2D surface's layout (DRM fourcc + modifier, stride) is computed,
# stored as the dma-buf's name (DMA_BUF_SET_NAME) and read back by another process from the
# kernel's fdinfo; --json output is parsed with jq; invalid descriptions are refused with
# exit 2 before any device is touched.
. /p2pbuf/lib.sh
. /p2pbuf/rdma-lib.sh
ktap_plan 12

# 1: device memory as a full-HD XRGB8888 surface.
logged /tmp/s1.txt p2pbuf alloc --mem p2pbuf --surface 1920x1080 --format XR24
ktap_check "alloc --mem p2pbuf --surface 1920x1080 --format XR24: layout printed, name set (exit $rc)" \
	sh -c "[ $rc -eq 0 ] &&
		grep -q 'surface:  1920x1080 XR24 (XRGB8888) LINEAR, stride 7680, 8294400 bytes' /tmp/s1.txt &&
		grep -q 'name:     s:1920x1080.XR24.7680.L' /tmp/s1.txt &&
		grep -q 'exporter: p2pbuf' /tmp/s1.txt"

# 2-5: an NV12 surface in udmabuf memory, held; another process reads it back.
p2pbuf --json alloc --mem udmabuf --surface 640x480 --format NV12 --fill 0x10 --hold 30 \
	>/tmp/s2.json 2>/tmp/s2.err &
holder=$!
wait_for /tmp/s2.json '"fd":' 15
comment /tmp/s2.json
comment /tmp/s2.err
jq_check "--json alloc NV12 640x480: two planes, chroma at 307200 with stride 640, 460800 bytes" /tmp/s2.json \
	'.surface.fourcc == "NV12" and .surface.format == "NV12" and .surface.size == 460800 and
	 (.surface.planes | length) == 2 and .surface.planes[1].offset == 307200 and
	 .surface.planes[1].stride == 640 and .surface.planes[1].rows == 240 and
	 .info.name == "s:640x480.NV12.640.L" and .info.exporter == "udmabuf" and .info.size >= 460800'
pid=$(jq -r .pid /tmp/s2.json 2>/dev/null)
fd=$(jq -r .fd /tmp/s2.json 2>/dev/null)
grep '^name:' "/proc/$pid/fdinfo/$fd" >/tmp/fdinfo.txt 2>&1
comment /tmp/fdinfo.txt
ktap_check "the kernel shows the description in the holder's fdinfo (name: s:640x480.NV12.640.L)" \
	grep -q 's:640x480.NV12.640.L' /tmp/fdinfo.txt
logged /tmp/s2info.txt p2pbuf info "$pid:$fd"
ktap_check "info PID:FD from another process parses the surface back (exit $rc)" \
	sh -c "[ $rc -eq 0 ] && grep -q 'surface:  640x480 NV12 (NV12) LINEAR, stride 640, 460800 bytes; planes +0 stride 640 x 480 rows, +307200 stride 640 x 240 rows' /tmp/s2info.txt"
p2pbuf --json info "/proc/$pid/fdinfo/$fd" >/tmp/s2info.json 2>&1
comment /tmp/s2info.json
jq_check "--json info of the holder's fdinfo file: surface 640x480 NV12, modifier LINEAR (0)" /tmp/s2info.json \
	'.surface.width == 640 and .surface.height == 480 and .surface.fourcc == "NV12" and
	 .surface.modifier == "LINEAR" and .surface.modifier_value == 0 and .fd == null'
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

# 6: a tiled layout: rows padded to whole tiles.
p2pbuf --json alloc --mem udmabuf --surface 1920x1080 --modifier I915_Y_TILED >/tmp/s3.json 2>/tmp/s3.err
comment /tmp/s3.json
comment /tmp/s3.err
jq_check "--json alloc 1920x1080 I915_Y_TILED: 1088 rows (tiles of 32), 8355840 bytes" /tmp/s3.json \
	'.surface.planes[0].rows == 1088 and .surface.size == 8355840 and .surface.modifier == "I915_Y_TILED" and
	 .info.name == "s:1920x1080.XR24.7680.Y"'

# 7-12: what is refused, and how.
expect_fail "a stride below a row's bytes: usage error" 2 "stride 100 is less than a row's 7680 bytes" \
	p2pbuf alloc --mem p2pbuf --surface 1920x1080 --stride 100
expect_fail "a --size below the surface's: usage error" 2 "the surface needs 8294400 bytes" \
	p2pbuf alloc --mem udmabuf --surface 1920x1080 --size 1M
expect_fail "an unknown fourcc: usage error listing the known ones" 2 "not a DRM fourcc code" \
	p2pbuf alloc --mem udmabuf --surface 64x64 --format ZZZZ
expect_fail "a vendor-private modifier: usage error" 2 "vendor-private" \
	p2pbuf alloc --mem udmabuf --surface 64x64 --modifier 0x0300000000000001
expect_fail "an odd width for NV12: usage error" 2 "width divisible by 2" \
	p2pbuf alloc --mem udmabuf --surface 641x480 --format NV12
p2pbuf --json alloc --mem udmabuf --surface 0x10 >/tmp/s4.json 2>/tmp/s4.err
rc=$?
comment /tmp/s4.json
if [ $rc -eq 2 ]; then
	jq_check "--json alloc of a 0-pixel-wide surface: exit 2, the JSON error says why" /tmp/s4.json \
		'(.error | test("width 0 is out of range")) and .unavailable == false'
else
	ktap_fail "--json alloc of a 0-pixel-wide surface: exit $rc, want 2"
fi
ktap_exit

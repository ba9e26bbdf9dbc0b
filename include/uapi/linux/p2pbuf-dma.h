/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * p2pbuf-dma: a PCI DMA engine that imports dma-bufs. /dev/p2pbuf-dma (root-only), from the
 * p2pbuf_dma module.
 *
 * A PCI DMA engine (in the lab: QEMU's edu device standing in for an FPGA) imports dma-buf
 * fds, from any exporter (p2pbuf device memory, udmabuf system memory, ...), and copies
 * between them. The argument rules are those of linux/p2pbuf.h, whose ioctl magic this
 * header shares (numbers 0x10-0x1F): a leading __u32 @size, flags that reject
 * unknown bits with -EINVAL, reserved fields that must be 0.
 *
 * Handles belong to the open file that imported them and are released when it is closed.
 * Errors shared by the ioctls: -EFAULT for a bad argument pointer, -ENOTTY for an unknown
 * ioctl, -ENODEV once the engine's device is unbound.
 */

#ifndef _UAPI_LINUX_P2PBUF_DMA_H
#define _UAPI_LINUX_P2PBUF_DMA_H

#include <linux/ioctl.h>
#include <linux/types.h>

#include "p2pbuf.h"

/*
 * What the engine's DMA addresses for an imported buffer are (struct
 * p2pbuf_dma_import.map_type), as the importer sees them: from its own mapping, never from
 * the exporter's pages or a search of the PCI devices. The route that a peer's memory takes
 * (through a switch or the host bridge) is the exporter's decision: for p2pbuf buffers,
 * P2PBUF_IOCTL_ATTACHMENT reports it with the same values.
 */
/* Nothing mapped (a zero-length table). */
#define P2PBUF_DMA_MAP_UNKNOWN			0U
/* System memory, mapped with the DMA API. */
#define P2PBUF_DMA_MAP_HOST_MEMORY		1U
/*
 * Device memory at its PCI bus address, not translated by an IOMMU: a peer behind the same
 * switch (PCI_P2PDMA_MAP_BUS_ADDR), or any peer when the engine has no IOMMU.
 */
#define P2PBUF_DMA_MAP_BUS_ADDR			2U
/* Device memory at an IOVA of the engine's IOMMU (PCI_P2PDMA_MAP_THRU_HOST_BRIDGE). */
#define P2PBUF_DMA_MAP_THRU_HOST_BRIDGE		3U

/**
 * struct p2pbuf_dma_import - import a dma-buf into the engine
 * @size: in: sizeof(struct p2pbuf_dma_import)
 * @fd: in: the dma-buf; -EBADF if not an open fd, -EINVAL if not a dma-buf, -EEXIST if this
 *	file already imported the same buffer (through any fd); the exporter may refuse the
 *	engine (e.g. -EOPNOTSUPP when peer-to-peer DMA is not possible between them)
 * @flags: in: must be 0
 * @handle: out: the handle for P2PBUF_DMA_IOCTL_COPY and P2PBUF_DMA_IOCTL_RELEASE (never 0)
 * @length: out: size of the buffer in bytes
 * @map_type: out: P2PBUF_DMA_MAP_*, what the engine's DMA addresses for the buffer are
 * @nr_ranges: out: DMA-contiguous ranges of the engine's mapping
 *
 * The attachment is dynamic and allows peer-to-peer mappings: when the exporter moves the
 * buffer the engine remaps it before its next transfer, and when the exporter revokes it
 * the handle stays but every copy with it fails with -ENODEV.
 */
struct p2pbuf_dma_import {
	__u32 size;
	__s32 fd;
	__u32 flags;
	__u32 handle;
	__u64 length;
	__u32 map_type;
	__u32 nr_ranges;
};

/**
 * struct p2pbuf_dma_release - release a handle (detach from the buffer)
 * @size: in: sizeof(struct p2pbuf_dma_release)
 * @handle: in: a handle of this file; -ENOENT otherwise (-ENODEV once the engine's device is
 *	unbound: the unbind released every handle)
 * @flags: in: must be 0
 * @reserved: in: must be 0
 *
 * A copy in flight with the handle completes first (it holds its own reference).
 */
struct p2pbuf_dma_release {
	__u32 size;
	__u32 handle;
	__u32 flags;
	__u32 reserved;
};

/* Longest copy one P2PBUF_DMA_IOCTL_COPY does; longer requests are cut short, like read(2). */
#define P2PBUF_DMA_COPY_MAX	(1U << 30)

/**
 * struct p2pbuf_dma_copy - copy bytes between two imported buffers with the engine
 * @size: in: sizeof(struct p2pbuf_dma_copy)
 * @flags: in: must be 0
 * @src_handle: in: source buffer (-ENOENT if not a handle of this file)
 * @dst_handle: in: destination buffer; may equal @src_handle if the ranges do not overlap
 * @src_offset: in: first byte to read
 * @dst_offset: in: first byte to write
 * @len: in: bytes, at least 1; both ranges must lie inside their buffers and, within one
 *	buffer, must not overlap (-EINVAL otherwise, also on arithmetic overflow)
 * @copied: out: bytes copied, also written when the copy fails part way
 * @timeout_ms: in: how long to wait for each transfer's completion interrupt; 0: the
 *	default (1000 ms). The copy fails with -ETIMEDOUT when one does not come in time: the
 *	engine's bus mastering is turned off at once and the copy returns once the transfer
 *	has ended (mastering is then on again). An engine whose transfer never ends stays
 *	disabled, and every copy fails with -EIO, until its device is bound again.
 * @nr_transfers: out: engine transfers (DMA commands) the copy issued
 *
 * The engine copies through its internal window (4095 bytes on the lab's device), one window at
 * a time: source to window, window to destination. Returns the number of bytes copied
 * (at most P2PBUF_DMA_COPY_MAX), and also stores it in @copied. A buffer revoked by its
 * exporter makes the copy stop with -ENODEV before the engine touches it again. A signal
 * stops the copy between windows: it returns the bytes copied so far (a short count, as
 * read(2) does), or -EINTR if there are none.
 */
struct p2pbuf_dma_copy {
	__u32 size;
	__u32 flags;
	__u32 src_handle;
	__u32 dst_handle;
	__u64 src_offset;
	__u64 dst_offset;
	__u64 len;
	__u64 copied;
	__u32 timeout_ms;
	__u32 nr_transfers;
};

#define P2PBUF_DMA_IOCTL_IMPORT		_IOWR(P2PBUF_IOCTL_MAGIC, 0x10, struct p2pbuf_dma_import)
#define P2PBUF_DMA_IOCTL_RELEASE	_IOW(P2PBUF_IOCTL_MAGIC, 0x11, struct p2pbuf_dma_release)
#define P2PBUF_DMA_IOCTL_COPY		_IOWR(P2PBUF_IOCTL_MAGIC, 0x12, struct p2pbuf_dma_copy)

#endif /* _UAPI_LINUX_P2PBUF_DMA_H */

/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * p2pbuf: PCI device memory (a BAR registered as p2pdma memory) exported as dma-buf.
 *
 * The misc device /dev/p2pbuf (root-only by default) lists the providers the exporter
 * manages and allocates buffers from them; each buffer is a dma-buf fd that any importer
 * (RDMA NICs through ibv_reg_dmabuf_mr, DMA engines, the CPU through mmap) can use.
 *
 * Every ioctl argument starts with a __u32 @size: the caller sets it to sizeof() of the
 * struct it was compiled with. The kernel accepts any size from the first published version
 * of the struct up to the page size (4096 on x86-64; -E2BIG above it, before anything past
 * @size is read, as openat2() and clone3() do); bytes past the end of the kernel's own struct
 * must be zero (-E2BIG otherwise), so the structs can grow at the end, never past a page. The
 * kernel reads @size once: the value it checked is the one it uses. Flags fields reject
 * unknown bits with -EINVAL.
 *
 * The ioctl numbers are _IOWR()/_IOW() of the struct each one passes, so that strace and
 * other decoders know the argument. The size encoded in a number is that of the struct's
 * first version and stays so when the struct grows (the @size field, not the number, says
 * which version a caller has); the kernel matches the whole number, so an ioctl number of
 * any other direction or size gets -ENOTTY.
 *
 * Errors every ioctl of both devices (this one and /dev/p2pbuf-dma, whose uAPI is
 * linux/p2pbuf-dma.h) can return: -EFAULT for a bad argument pointer,
 * -EINVAL for a @size below the first version's, -E2BIG for a @size above the page size or a
 * non-zero tail past the kernel's struct, -ENOTTY for an unknown ioctl number.
 *
 * Ioctl magic 0xBB: numbers 0x00-0x0F here, 0x10-0x1F in linux/p2pbuf-dma.h. The modules are
 * out of tree; the lines they would add to Documentation/userspace-api/ioctl/ioctl-number.rst
 * (between 0xBA and 0xC0) are:
 *
 *   0xBB  00-0F  uapi/linux/p2pbuf.h                                       p2pbuf dma-buf exporter
 *   0xBB  10-1F  uapi/linux/p2pbuf-dma.h                                   p2pbuf-dma DMA engine
 */
#ifndef _UAPI_LINUX_P2PBUF_H
#define _UAPI_LINUX_P2PBUF_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* 3: P2PBUF_ALLOC_PFNMAP (a module of version 2 refuses the flag with -EINVAL). */
#define P2PBUF_API_VERSION 3
#define P2PBUF_IOCTL_MAGIC 0xBB
#define P2PBUF_PCI_NAME_LEN 32

/**
 * struct p2pbuf_info - what the exporter offers
 * @size: in: sizeof(struct p2pbuf_info)
 * @api_version: out: P2PBUF_API_VERSION
 * @nr_providers: out: number of bound providers; list them with P2PBUF_IOCTL_PROVIDER_INFO
 *	and P2PBUF_PROVIDER_INFO_NEXT
 * @flags: in: must be 0 (-EINVAL otherwise)
 */
struct p2pbuf_info {
	__u32 size;
	__u32 api_version;
	__u32 nr_providers;
	__u32 flags;
};

/*
 * Providers are named by an id that the exporter gives each one when its device is bound:
 * ids start at 1, only grow, and are never reused while the module is loaded. An id kept by
 * userspace therefore names the same device or none: once that device is unbound, ALLOC with
 * the id fails with -ENODEV (it never reaches a device bound later) and PROVIDER_INFO
 * answers P2PBUF_PROVIDER_GONE. An id that was never given out (0 included) is -ENOENT.
 * Rebinding a device gives it a new id; its PCI name (@pci_name) stays.
 */

/* State bits (struct p2pbuf_provider_info.state). */
/* The provider's memory is published for other p2pdma users too (pci_p2pmem_publish). */
#define P2PBUF_PROVIDER_PUBLISHED (1U << 0)
/*
 * The provider's device was unbound: it allocates nothing (-ENODEV) and its buffers are
 * revoked. Answered for the id of an unbound provider (with every other out field 0), and
 * for a provider in the middle of its unbind.
 */
#define P2PBUF_PROVIDER_GONE (1U << 1)

/* Flags of P2PBUF_IOCTL_PROVIDER_INFO (struct p2pbuf_provider_info.flags). */
/* Answer for the bound provider with the smallest id >= @id instead (-ENOENT if none). */
#define P2PBUF_PROVIDER_INFO_NEXT (1U << 0)

/**
 * struct p2pbuf_provider_info - one p2pdma provider (a PCI BAR)
 * @size: in: sizeof(struct p2pbuf_provider_info)
 * @id: in: the provider's id (-ENOENT for an id never given out); with
 *	P2PBUF_PROVIDER_INFO_NEXT, where to start looking (1, then the last id + 1, lists
 *	every bound provider). out: the id answered for
 * @flags: in: 0 or P2PBUF_PROVIDER_INFO_NEXT (-EINVAL for other bits)
 * @state: out: P2PBUF_PROVIDER_* bits
 * @bar: out: the BAR number of the device
 * @reserved: in: must be 0 (-EINVAL otherwise); out: 0
 * @bar_size: out: size of the BAR in bytes
 * @total: out: bytes of the BAR registered as p2pdma memory
 * @free: out: bytes of @total not allocated now
 * @pci_name: out: NUL-terminated PCI name of the device, e.g. "0000:03:00.0" (empty for
 *	the id of an unbound provider)
 */
struct p2pbuf_provider_info {
	__u32 size;
	__u32 id;
	__u32 flags;
	__u32 state;
	__u32 bar;
	__u32 reserved;
	__u64 bar_size;
	__u64 total;
	__u64 free;
	char pci_name[P2PBUF_PCI_NAME_LEN];
};

/*
 * Do not zero the memory before handing it out (struct p2pbuf_alloc.flags). The buffer holds
 * whatever its previous users left in the BAR, so the caller needs CAP_SYS_RAWIO (-EPERM
 * otherwise), as for reading the BAR through /dev/mem. For tests and benchmarks of large
 * buffers: zeroing is a CPU memset_io() of the whole buffer, which grows with its size (on the
 * lab's emulated GPU memory about 130 MiB/s under TCG, and every byte written fills the
 * backing file).
 */
#define P2PBUF_ALLOC_UNINITIALIZED (1U << 0)

/*
 * Map the buffer into userspace as I/O memory without struct pages (struct p2pbuf_alloc.flags):
 * mmap() of the dma-buf makes a VM_IO | VM_PFNMAP mapping (VmFlags "io pf" in smaps), filled at
 * fault time, as vfio-pci maps BARs. Nothing can pin such a mapping: O_DIRECT I/O and
 * ibv_reg_mr() on it fail with -EFAULT, and REVOKE takes the memory away at once (the next access
 * gets SIGBUS) instead of waiting for I/O in flight. Drivers that resolve I/O memory by PFN
 * accept it: cudaHostRegister(ptr, size, cudaHostRegisterIoMemory) maps the buffer for a GPU
 * (a GPU reaching an FPGA's BAR, without /dev/mem). Without this flag the mapping holds the
 * memory's struct pages (VM_MIXEDMAP): O_DIRECT and ibv_reg_mr() on it are peer-to-peer
 * transfers, and REVOKE waits (up to 10 s) for I/O that pinned them. A private mapping
 * (MAP_PRIVATE) is refused with -EINVAL either way.
 */
#define P2PBUF_ALLOC_PFNMAP (1U << 1)

/**
 * struct p2pbuf_alloc - allocate device memory and export it as a dma-buf
 * @size: in: sizeof(struct p2pbuf_alloc)
 * @flags: in: P2PBUF_ALLOC_UNINITIALIZED, P2PBUF_ALLOC_PFNMAP, both or 0 (other bits: -EINVAL)
 * @length: in: bytes; a non-zero multiple of the page size, at most the provider's total
 *	(-EINVAL otherwise); -ENOMEM when the provider has not that much free; -ENOSPC when it
 *	would take the caller's cgroup (or an ancestor) over its dmem.max for the provider's
 *	region (p2pbuf/<PCI address>/bar<N> in dmem.capacity). Zeroing takes time
 *	proportional to @length: a signal that arrives meanwhile ends the call with -EINTR and
 *	nothing allocated (a handler installed with SA_RESTART restarts it instead)
 * @provider: in: provider id (see above): -ENODEV once its device is unbound, -ENOENT for
 *	an id never given out
 * @fd: out: the dma-buf, opened O_RDWR | O_CLOEXEC
 * @offset: out: where the buffer starts inside the BAR (for diagnostics and tests; the
 *	memory is zeroed before it is handed out)
 */
struct p2pbuf_alloc {
	__u32 size;
	__u32 flags;
	__u64 length;
	__u32 provider;
	__s32 fd;
	__u64 offset;
};

/**
 * struct p2pbuf_revoke - revoke a buffer: importers are told (invalidate_mappings), their
 *	mappings are torn down, later maps fail with -ENODEV, CPU mappings are zapped
 * @size: in: sizeof(struct p2pbuf_revoke)
 * @fd: in: a dma-buf fd exported by p2pbuf; -EBADF if @fd is not an open fd, -EINVAL if it
 *	is an fd of anything else (another exporter's dma-buf, a regular file, ...)
 * @flags: in: must be 0 (-EINVAL otherwise)
 *
 * Revoking a revoked buffer again succeeds and does nothing. So does revoking a buffer whose
 * provider's device was unbound: the unbind revoked it, and REVOKE returns 0 (only once that
 * revoke is complete, when the unbind is still running).
 */
struct p2pbuf_revoke {
	__u32 size;
	__s32 fd;
	__u64 flags;
};

/* Why the exporter refused an importing device (struct p2pbuf_refusal.reason). */
/* No importing device of this buffer was refused. */
#define P2PBUF_REFUSAL_NONE		0U
/*
 * The PCI topology has no peer-to-peer path between the provider and the importing device
 * (p2pdma map type NOT_SUPPORTED: they share no PCIe switch, and the host bridge is not one
 * p2pdma allows). The kernel log names the devices; a common switch, or a CPU/host bridge
 * that p2pdma allows, fixes it.
 */
#define P2PBUF_REFUSAL_NO_P2P_PATH	1U

#define P2PBUF_DEVICE_NAME_LEN	64
#define P2PBUF_REASON_LEN	128

/**
 * struct p2pbuf_refusal - the last importing device the exporter refused for a buffer
 * @size: in: sizeof(struct p2pbuf_refusal)
 * @fd: in: a dma-buf fd exported by p2pbuf; -EBADF if @fd is not an open fd, -EINVAL if it
 *	is an fd of anything else (or of a buffer whose provider was unbound)
 * @flags: in: must be 0 (-EINVAL otherwise)
 * @reason: out: P2PBUF_REFUSAL_* of the latest refusal; P2PBUF_REFUSAL_NONE when there was
 *	none (@device and @text are then empty)
 * @nr_refused: out: attachments to this buffer the exporter refused so far
 * @provider: out: id of the buffer's provider (for P2PBUF_IOCTL_PROVIDER_INFO)
 * @reserved: in: must be 0 (-EINVAL otherwise); out: 0
 * @device: out: NUL-terminated name of the refused device (dev_name(), for a PCI device its
 *	address, e.g. "0000:04:00.0"), cut to P2PBUF_DEVICE_NAME_LEN - 1 bytes
 * @text: out: NUL-terminated reason in words, for messages; programs test @reason
 *
 * The importer itself got -EOPNOTSUPP from its attach (ibv_reg_dmabuf_mr(), the DMA engine's
 * P2PBUF_DMA_IOCTL_IMPORT, ...); this says which device and why. Only the exporter's own
 * decision is recorded: importers that dma-buf refuses before asking it (not allowing
 * peer-to-peer, pinned and not revocable, a revoked buffer) are not.
 */
struct p2pbuf_refusal {
	__u32 size;
	__s32 fd;
	__u32 flags;
	__u32 reason;
	__u64 nr_refused;
	__u32 provider;
	__u32 reserved;
	char device[P2PBUF_DEVICE_NAME_LEN];
	char text[P2PBUF_REASON_LEN];
};

/**
 * struct p2pbuf_attachment - how the exporter reaches one importing device of a buffer
 * @size: in: sizeof(struct p2pbuf_attachment)
 * @fd: in: a dma-buf fd exported by p2pbuf; -EBADF if @fd is not an open fd, -EINVAL if it
 *	is an fd of anything else (or of a buffer whose provider was unbound)
 * @flags: in: must be 0 (-EINVAL otherwise)
 * @index: in: which attachment, from 0, in the order they attached; -ENOENT from
 *	@nr_attachments on
 * @nr_attachments: out: attachments of the buffer now (also written with -ENOENT: nothing
 *	else is; read it with @index 0 to learn how many there are)
 * @reserved: in: must be 0 (-EINVAL otherwise); out: 0. (It held the p2pdma route between
 *	the buffer's provider and the device; the dma-buf core tells an exporter only whether
 *	the device can reach the memory, and `p2pbuf path` explains the route from the topology.)
 * @device: out: NUL-terminated dev_name() of the importing device (for a PCI device its
 *	address), cut to P2PBUF_DEVICE_NAME_LEN - 1 bytes
 *
 * Every listed device passed the dma-buf core's check (dma_buf_phys_vec_check()) when it
 * attached; importers see only their DMA addresses (see struct p2pbuf_dma_import.map_type in
 * linux/p2pbuf-dma.h).
 * Attachments come and go; an @index read twice may
 * name another device. -EBUSY while the buffer is being revoked (a revoke may wait for the
 * buffer's fences: the ioctl does not wait behind it; ask again once REVOKE returned);
 * -EINTR if a signal came while it waited for the buffer's reservation lock.
 */
struct p2pbuf_attachment {
	__u32 size;
	__s32 fd;
	__u32 flags;
	__u32 index;
	__u32 nr_attachments;
	__u32 reserved;
	char device[P2PBUF_DEVICE_NAME_LEN];
};

#define P2PBUF_IOCTL_INFO		_IOWR(P2PBUF_IOCTL_MAGIC, 0x00, struct p2pbuf_info)
#define P2PBUF_IOCTL_PROVIDER_INFO	_IOWR(P2PBUF_IOCTL_MAGIC, 0x01, struct p2pbuf_provider_info)
#define P2PBUF_IOCTL_ALLOC		_IOWR(P2PBUF_IOCTL_MAGIC, 0x02, struct p2pbuf_alloc)
#define P2PBUF_IOCTL_REVOKE		_IOW(P2PBUF_IOCTL_MAGIC, 0x03, struct p2pbuf_revoke)
#define P2PBUF_IOCTL_REFUSAL		_IOWR(P2PBUF_IOCTL_MAGIC, 0x04, struct p2pbuf_refusal)
#define P2PBUF_IOCTL_ATTACHMENT		_IOWR(P2PBUF_IOCTL_MAGIC, 0x05, struct p2pbuf_attachment)

#endif /* _UAPI_LINUX_P2PBUF_H */

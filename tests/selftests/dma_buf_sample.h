/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The Rust dma-buf samples of series 4 (samples/rust/rust_dma_buf_exporter.rs and
 * rust_dma_buf_importer.rs) as their tests use them: their uAPI, as their module documentation
 * gives it, and moving a PCI device between a lab driver and a sample. Both samples match a
 * device that a lab driver has (ivshmem: p2pbuf_exporter; edu: p2pbuf_dma), so a test lends
 * the device to the sample and gives it back when it ends.
 */
#ifndef DMA_BUF_SAMPLE_H
#define DMA_BUF_SAMPLE_H

#include <stdint.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <linux/types.h>

#include "kselftest_harness.h"
#include "p2pbuf_test.h"

#define SAMPLE "rust_dma_buf_exporter"
#define SAMPLE_DRV "/sys/bus/pci/drivers/" SAMPLE
#define SAMPLE_DEV "/dev/rust-dma-buf-exporter"
#define SAMPLE_IMPORTER "rust_dma_buf_importer"
#define SAMPLE_IMPORTER_DRV "/sys/bus/pci/drivers/" SAMPLE_IMPORTER
#define SAMPLE_IMPORTER_DEV "/dev/rust-dma-buf-importer"
#define EXPORTER_DRV "/sys/bus/pci/drivers/p2pbuf_exporter"
#define DMA_DEV "/dev/p2pbuf-dma"
#define IMPORTER_DRV "/sys/bus/pci/drivers/p2pbuf_dma"
#define PAGE 4096UL

/* The exporter sample's uAPI. */
struct rust_dma_buf_exporter_export {
	__u64 size;
	__u32 flags;
	__s32 fd;
};

#define RUST_DMA_BUF_EXPORTER_EXPORT _IOWR('|', 0x90, struct rust_dma_buf_exporter_export)

/* The importer sample's uAPI. */
struct rust_dma_buf_importer_copy {
	__s32 src_fd;
	__s32 dst_fd;
	__u64 src_offset;
	__u64 dst_offset;
	__u64 len;
};

#define RUST_DMA_BUF_IMPORTER_COPY _IOW('|', 0x91, struct rust_dma_buf_importer_copy)

/* EXPORT of size bytes with flags: the dma-buf fd, or -errno. */
static inline int sample_export(int dev, __u64 size, __u32 flags)
{
	struct rust_dma_buf_exporter_export e = { .size = size, .flags = flags, .fd = -1 };

	return ioctl(dev, RUST_DMA_BUF_EXPORTER_EXPORT, &e) ? -errno : e.fd;
}

/*
 * A shared read/write mapping of len bytes of dma-buf fd at offset: the address, or NULL with
 * errno set.
 */
static inline uint8_t *sample_mmap(int fd, size_t len, off_t offset)
{
	void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);

	return m == MAP_FAILED ? NULL : m;
}

/* The driver_override file of PCI device `pci`. */
static inline void override_path(char *path, size_t len, const char *pci)
{
	snprintf(path, len, "/sys/bus/pci/devices/%s/driver_override", pci);
}

/* Whether PCI device `pci` is bound to a driver, any driver. */
static inline int has_driver(const char *pci)
{
	char path[512];

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver", pci);
	return access(path, F_OK) == 0;
}

/*
 * Moves PCI device `pci` from driver `from` (a driver's sysfs directory), if it has it, to the
 * sample whose driver directory is `sample`: 0 or -errno of the step that failed.
 */
static inline int lend_device(const char *pci, const char *from, const char *sample)
{
	char path[512];
	int r;

	snprintf(path, sizeof(path), "%s/%s", from, pci);
	if (access(path, F_OK) == 0) {
		snprintf(path, sizeof(path), "%s/unbind", from);
		r = sysfs_write(path, pci);
		if (r)
			return r;
	}
	snprintf(path, sizeof(path), "%s/bind", sample);
	return sysfs_write(path, pci);
}

/*
 * Takes PCI device `pci` from the sample whose driver directory is `sample` if it has it, then
 * binds it to `drv` (a driver's sysfs directory; NULL: none) if that driver is loaded and does
 * not have it yet.
 */
static inline void return_device(struct __test_metadata *_metadata, const char *sample,
				 const char *pci, const char *drv)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", sample, pci);
	if (access(path, F_OK) == 0) {
		snprintf(path, sizeof(path), "%s/unbind", sample);
		EXPECT_EQ(0, sysfs_write(path, pci));
	}
	if (!drv || access(drv, F_OK))
		return;
	snprintf(path, sizeof(path), "%s/%s", drv, pci);
	if (access(path, F_OK) == 0)
		return;
	snprintf(path, sizeof(path), "%s/bind", drv);
	EXPECT_EQ(0, sysfs_write(path, pci));
}

#endif /* DMA_BUF_SAMPLE_H */

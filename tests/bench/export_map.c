// SPDX-License-Identifier: GPL-2.0
/*
 * Benchmark: export + attach + map latency and scatter-gather entries, by size, for p2pbuf
 * device memory and for udmabuf (system memory), side by side in one run.
 *
 * "export" is the allocation ioctl that returns the dma-buf fd (for p2pbuf: allocate and zero
 * device memory; for udmabuf: memfd + UDMABUF_CREATE). "import" is P2PBUF_DMA_IOCTL_IMPORT on
 * the importer (the edu DMA engine's driver): dma_buf_dynamic_attach + map for its device,
 * which also reports the number of DMA ranges of the mapping.
 *
 * Output (the line protocol of docs/bench.md, parsed by `cargo xtask bench`): a BENCHINFO line
 * (udmabuf is the baseline, the sweep is size), a BENCHMETRIC line per metric, then one line per
 * repetition:
 *   BENCH export_map kind=<p2pbuf|udmabuf> size=<bytes> rep=<n> export_us=<t> import_us=<t> ranges=<n>
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <linux/udmabuf.h>

#include "uapi/linux/p2pbuf.h"
#include "../selftests/p2pbuf_test.h"

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int export_p2pbuf(int dev, size_t size)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = size };

	return p2pbuf_test_alloc(dev, &a) ? -errno : a.fd;
}

static int export_udmabuf(int dev, size_t size)
{
	struct udmabuf_create c = { 0 };
	int memfd, fd;

	memfd = memfd_create("bench", MFD_ALLOW_SEALING);
	if (memfd < 0)
		return -errno;
	if (ftruncate(memfd, size) || fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK)) {
		close(memfd);
		return -errno;
	}
	c.memfd = memfd;
	c.size = size;
	c.flags = UDMABUF_FLAGS_CLOEXEC;
	fd = ioctl(dev, UDMABUF_CREATE, &c);
	close(memfd);
	return fd < 0 ? -errno : fd;
}

int main(int argc, char **argv)
{
	/* udmabuf refuses more than its size_limit_mb (64 MiB by default). */
	static const size_t sizes[] = { 4096, 65536, 1 << 20, 16 << 20, 64 << 20 };
	int reps = argc > 1 ? atoi(argv[1]) : 5;
	int p2p = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	int udma = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	int imp = open("/dev/p2pbuf-dma", O_RDWR | O_CLOEXEC);
	unsigned int k, s;
	int r;

	if (p2p < 0 || udma < 0 || imp < 0) {
		fprintf(stderr, "need /dev/p2pbuf, /dev/udmabuf and /dev/p2pbuf-dma: %s\n", strerror(errno));
		return 4;
	}
	/* One unrecorded round of each kind first: the first ioctls pay for cold caches. */
	for (k = 0; k < 2; k++) {
		int fd = k ? export_udmabuf(udma, sizes[0]) : export_p2pbuf(p2p, sizes[0]);

		if (fd >= 0)
			close(fd);
	}
	printf("BENCHINFO export_map baseline=udmabuf title=export_+_attach+map:_p2pbuf_device_memory_vs_udmabuf x=size\n");
	printf("BENCHMETRIC export_map export_us unit=us better=lower\n");
	printf("BENCHMETRIC export_map import_us unit=us better=lower\n");
	printf("BENCHMETRIC export_map ranges unit=ranges better=lower\n");
	fflush(stdout);
	for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		for (r = 0; r < reps; r++) {
			for (k = 0; k < 2; k++) {
				struct p2pbuf_dma_import im = { .size = sizeof(im) };
				struct p2pbuf_dma_release rel = { .size = sizeof(rel) };
				double t0, t1, t2;
				int fd;

				t0 = now_us();
				fd = k ? export_udmabuf(udma, sizes[s]) : export_p2pbuf(p2p, sizes[s]);
				t1 = now_us();
				if (fd < 0) {
					fprintf(stderr, "export %zu: %s\n", sizes[s], strerror(-fd));
					return 1;
				}
				im.fd = fd;
				if (ioctl(imp, P2PBUF_DMA_IOCTL_IMPORT, &im)) {
					fprintf(stderr, "import %zu: %s\n", sizes[s], strerror(errno));
					return 1;
				}
				t2 = now_us();
				printf("BENCH export_map kind=%s size=%zu rep=%d export_us=%.1f import_us=%.1f ranges=%u\n",
				       k ? "udmabuf" : "p2pbuf", sizes[s], r, t1 - t0, t2 - t1, im.nr_ranges);
				fflush(stdout);
				rel.handle = im.handle;
				ioctl(imp, P2PBUF_DMA_IOCTL_RELEASE, &rel);
				close(fd);
			}
		}
	}
	return 0;
}

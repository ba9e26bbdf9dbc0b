// SPDX-License-Identifier: GPL-2.0
/*
 * NVMe <-> device memory: peer-to-peer vs the bounce path.
 *
 * p2p:    O_DIRECT pread from /dev/nvme0n1 straight into the mmap of a p2pbuf buffer (the
 *         drive DMAs into the ivshmem BAR); the write direction is O_DIRECT pwrite from it.
 * bounce: O_DIRECT pread into host memory, then memcpy into the device memory mmap (what
 *         a program without peer-to-peer does); the write direction is memcpy out of device
 *         memory into host memory, then O_DIRECT pwrite.
 *
 * Per sample, the operation is repeated until VOLUME bytes have moved (so that small sizes are
 * not below the clock's and getrusage's resolution), and we report
 *   MiBps          = bytes / wall time (CLOCK_MONOTONIC)
 *   cpu_ms_per_GiB = (ru_utime + ru_stime of this process) / GiB moved
 * The CPU time is the guest process's own: system calls, bio building and page pinning, the
 * completion, and for bounce the memcpy. Not counted: the drive's DMA (QEMU's device model,
 * host time outside the guest), other guest threads (interrupts are charged to whoever runs),
 * and the time the process sleeps waiting for the drive. The guest kernel's user/system time
 * is sampled at its 250 Hz tick, which is why every sample moves at least VOLUME bytes.
 *
 * Output: the line protocol of docs/bench.md (BENCHINFO/BENCHMETRIC/BENCH). argv[1] is the
 * number of repetitions. Exit status 1 when it could not measure.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "uapi/linux/p2pbuf.h"
#include "../selftests/p2pbuf_test.h"

#define MIB (1UL << 20)
#define GIB (1UL << 30)
#define MAX_SIZE (32 * MIB)
#define VOLUME (32 * MIB)
/* The drive region the benchmark reads and writes (apart from the tests' regions). */
#define DRIVE_OFF (256 * MIB)

static double cpu_s(void)
{
	struct rusage r;

	getrusage(RUSAGE_SELF, &r);
	return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec +
	       r.ru_stime.tv_usec / 1e6;
}

struct ctx {
	int nvme;
	uint8_t *dev;	/* device memory (p2pbuf mmap) */
	uint8_t *host;	/* host memory */
};

/* One operation of `size` bytes at drive offset `off`; 0 or -errno. */
static int op(struct ctx *c, int write, int p2p, size_t size, off_t off)
{
	ssize_t n;

	if (!write) {
		n = pread(c->nvme, p2p ? c->dev : c->host, size, off);
		if (n == (ssize_t)size && !p2p)
			memcpy(c->dev, c->host, size);
	} else {
		if (!p2p)
			memcpy(c->host, c->dev, size);
		n = pwrite(c->nvme, p2p ? c->dev : c->host, size, off);
	}
	if (n < 0)
		return -errno;
	return n == (ssize_t)size ? 0 : -EIO;
}

static int sample(struct ctx *c, const char *bench, int write, int p2p, size_t size, int rep)
{
	size_t iters = VOLUME / size ? VOLUME / size : 1, i;
	double t0, c0, t, cpu, bytes = (double)iters * size;
	int r;

	t0 = now();
	c0 = cpu_s();
	for (i = 0; i < iters; i++) {
		r = op(c, write, p2p, size, DRIVE_OFF + (off_t)((i * size) % MAX_SIZE));
		if (r) {
			fprintf(stderr, "# %s %s %zu bytes: %s\n", bench, p2p ? "p2p" : "bounce", size,
				strerror(-r));
			return r;
		}
	}
	t = now() - t0;
	cpu = cpu_s() - c0;
	printf("BENCH %s kind=%s size=%zu rep=%d MiBps=%.1f cpu_ms_per_GiB=%.1f\n", bench,
	       p2p ? "p2p" : "bounce", size, rep, bytes / MIB / t, cpu * 1000 / (bytes / GIB));
	fflush(stdout);
	return 0;
}

/* The device buffer holds the drive's bytes at DRIVE_OFF (after a read). */
static int verify(struct ctx *c, size_t size)
{
	size_t i;

	for (i = 0; i < size; i++)
		if (c->dev[i] != p2pbuf_pattern(i, 7))
			return -1;
	return 0;
}

int main(int argc, char **argv)
{
	const size_t sizes[] = { 64 * 1024, MIB, 8 * MIB, 32 * MIB };
	int reps = argc > 1 ? atoi(argv[1]) : 5, p2p, rep, write;
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = MAX_SIZE };
	struct ctx c;
	size_t s, i;
	int dev;

	if (reps < 1)
		reps = 1;
	dev = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	if (dev < 0 || p2pbuf_test_alloc(dev, &a)) {
		fprintf(stderr, "# nvme_p2p: /dev/p2pbuf: %s\n", strerror(errno));
		return 1;
	}
	c.nvme = open("/dev/nvme0n1", O_RDWR | O_DIRECT | O_CLOEXEC);
	c.dev = mmap(NULL, MAX_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
	if (c.nvme < 0 || c.dev == MAP_FAILED || posix_memalign((void **)&c.host, 4096, MAX_SIZE)) {
		fprintf(stderr, "# nvme_p2p: setup: %s\n", strerror(errno));
		return 1;
	}
	/* The drive region holds the pattern; host memory is faulted in before any timing. */
	for (i = 0; i < MAX_SIZE; i++)
		c.host[i] = p2pbuf_pattern(i, 7);
	if (pwrite(c.nvme, c.host, MAX_SIZE, DRIVE_OFF) != (ssize_t)MAX_SIZE) {
		fprintf(stderr, "# nvme_p2p: preparing the drive: %s\n", strerror(errno));
		return 1;
	}

	printf("BENCHINFO nvme_p2p baseline=bounce title=NVMe_read_into_device_memory x=size\n");
	printf("BENCHMETRIC nvme_p2p MiBps unit=MiB/s better=higher\n");
	printf("BENCHMETRIC nvme_p2p cpu_ms_per_GiB unit=ms better=lower\n");
	printf("BENCHINFO nvme_p2p_write baseline=bounce title=NVMe_write_from_device_memory x=size\n");
	printf("BENCHMETRIC nvme_p2p_write MiBps unit=MiB/s better=higher\n");
	printf("BENCHMETRIC nvme_p2p_write cpu_ms_per_GiB unit=ms better=lower\n");
	fflush(stdout);
	for (write = 0; write < 2; write++)
		for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
			for (rep = 0; rep < reps; rep++)
				/* Alternate which path goes first: neither always runs warm. */
				for (p2p = 0; p2p < 2; p2p++) {
					int k = (p2p + rep) & 1;

					if (!write)
						memset(c.dev, 0, sizes[s]);
					if (sample(&c, write ? "nvme_p2p_write" : "nvme_p2p", write, k,
						   sizes[s], rep))
						return 1;
					if (!write && sizes[s] == MAX_SIZE && verify(&c, sizes[s])) {
						fprintf(stderr, "# nvme_p2p: %s read: wrong bytes\n",
							k ? "p2p" : "bounce");
						return 1;
					}
				}
	printf("# nvme_p2p: done (p2pbuf buffer at BAR offset %#llx)\n",
	       (unsigned long long)a.offset);
	return 0;
}

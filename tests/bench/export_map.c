// SPDX-License-Identifier: GPL-2.0
/*
 * Benchmark: export + attach + map latency and scatter-gather entries, by size, for p2pbuf
 * device memory and for udmabuf (system memory), side by side in one run.
 *
 * "export" is the allocation ioctl that returns the dma-buf fd (for p2pbuf: allocate device
 * memory, P2PBUF_ALLOC_UNINITIALIZED: not zeroed, so that the sweep up to a 64 GiB BAR measures
 * the allocation and not memset_io(); for udmabuf: memfd + UDMABUF_CREATE, which faults in and
 * zeroes the memfd's pages, as it must). "import" is P2PBUF_DMA_IOCTL_IMPORT on the importer
 * (the edu DMA engine's driver): dma_buf_dynamic_attach + map for its device, which also
 * reports the number of DMA ranges of the mapping. "free" is the release of the import and the
 * close of the last fd (the buffer goes back to its allocator).
 *
 * Sizes: 4 KiB to 64 GiB, p2pbuf up to the provider's free memory (the BAR: cargo xtask bench
 * --gpu-mem-mib 65536), udmabuf up to what the guest's RAM holds: at most 1 GiB and a third of
 * MemAvailable (its size_limit_mb, INT_MAX on 7.3 and 64 MiB on older kernels, is raised to
 * that when lower; a larger memfd would run the guest out of memory). Points of
 * 1 GiB and more print "# progress:" lines (cargo xtask bench echoes them). argv[1]: the
 * repetitions; argv[2], optional: the largest size measured.
 *
 * A sample is one round, export + import + free; below 1 MiB it is the median of 15 rounds
 * (SMALL_ROUNDS), per metric. Before the first sample, 5 unrecorded rounds of each kind
 * (WARMUP_ROUNDS); the kinds alternate which goes first at each repetition.
 *
 * Output (the line protocol of docs/bench.md, parsed by `cargo xtask bench`): a BENCHINFO line
 * (udmabuf is the baseline, the sweep is size), a BENCHMETRIC line per metric, then one line per
 * repetition:
 *   BENCH export_map kind=<p2pbuf|udmabuf> size=<bytes> rep=<n> export_us=<t> import_us=<t> ranges=<n> free_us=<t>
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
#include "uapi/linux/p2pbuf-dma.h"
#include "../selftests/p2pbuf_test.h"

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int export_p2pbuf(int dev, size_t size)
{
	struct p2pbuf_alloc a = {
		.size = sizeof(a), .length = size, .flags = P2PBUF_ALLOC_UNINITIALIZED,
	};

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

/* MemAvailable of /proc/meminfo in bytes, 0 if unknown. */
static unsigned long long mem_available(void)
{
	unsigned long long kb = 0;
	char line[256];
	FILE *f = fopen("/proc/meminfo", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return kb << 10;
}

#define UDMABUF_LIMIT "/sys/module/udmabuf/parameters/size_limit_mb"

/*
 * The largest udmabuf this run makes: `want`, and udmabuf's size limit raised to it when that
 * is less and the parameter is writable (else the limit).
 */
static unsigned long long udmabuf_limit(unsigned long long want)
{
	unsigned long long mb = 64;
	FILE *f = fopen(UDMABUF_LIMIT, "r");

	if (f) {
		if (fscanf(f, "%llu", &mb) != 1)
			mb = 64;
		fclose(f);
	}
	if ((want >> 20) > mb) {
		f = fopen(UDMABUF_LIMIT, "w");
		if (f) {
			fprintf(f, "%llu\n", want >> 20);
			if (!fclose(f))
				mb = want >> 20;
		}
	}
	return (mb << 20) < want ? mb << 20 : want;
}

/* Unrecorded rounds of each kind before the first sample (see main()). */
#define WARMUP_ROUNDS 5

/*
 * Below SMALL_SIZE a sample is the median of SMALL_ROUNDS back-to-back rounds (export, import,
 * free), each metric's median on its own: one round takes tens of microseconds, less than
 * one preemption by the host's other work under TCG.
 */
#define SMALL_SIZE (1ULL << 20)
#define SMALL_ROUNDS 15

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, unsigned int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void human(char *out, size_t n, unsigned long long b)
{
	if (b >= 1ULL << 30)
		snprintf(out, n, "%llu GiB", b >> 30);
	else if (b >= 1ULL << 20)
		snprintf(out, n, "%llu MiB", b >> 20);
	else
		snprintf(out, n, "%llu KiB", b >> 10);
}

/*
 * WARMUP_ROUNDS unrecorded rounds of each kind first, export, import and release as below: the first
 * ioctls pay for cold caches, and the first attachment of the engine to the provider's
 * memory pays the p2pdma distance, computed once per client device and then looked up.
 * Under QEMU TCG the first runs of a code path also pay its translation. The times of the
 * first round are printed (a diagnostic, not a sample).
 */
static void warm_up(int p2p, int udma, int imp)
{
	unsigned int k;

	for (k = 0; k < 2 * WARMUP_ROUNDS; k++) {
		struct p2pbuf_dma_import im = { .size = sizeof(im) };
		struct p2pbuf_dma_release rel = { .size = sizeof(rel) };
		double t0, t1, t2;
		int fd = k % 2 ? export_udmabuf(udma, 4096) : export_p2pbuf(p2p, 4096);

		if (fd < 0)
			continue;
		im.fd = fd;
		t0 = now_us();
		if (!ioctl(imp, P2PBUF_DMA_IOCTL_IMPORT, &im)) {
			t1 = now_us();
			rel.handle = im.handle;
			ioctl(imp, P2PBUF_DMA_IOCTL_RELEASE, &rel);
			t2 = now_us();
			if (k < 2)
				printf("# export_map: first (cold, not recorded) %s 4 KiB import %.1f us, release %.1f us\n",
				       k ? "udmabuf" : "p2pbuf", t1 - t0, t2 - t1);
		}
		close(fd);
	}
}

/*
 * export_map: the devices, the warm-up, then the samples.
 * Over 100 lines on purpose: the measurement loop (each size, each repetition, the two kinds
 * in alternating order, the inner rounds of the small sizes) reads in the order of the table
 * it prints; its pieces share the sizes, the limits and the three devices.
 */
int main(int argc, char **argv)
{
	static const unsigned long long sizes[] = {
		4096, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1ULL << 30,
		4ULL << 30, 16ULL << 30, 64ULL << 30,
	};
	int reps = argc > 1 ? atoi(argv[1]) : 5;
	/* argv[2]: the largest size to measure (tests/bench/trace-small.sh traces 4 KiB alone). */
	unsigned long long only_upto = argc > 2 ? strtoull(argv[2], NULL, 0) : ~0ULL;
	int p2p = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	int udma = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	int imp = open("/dev/p2pbuf-dma", O_RDWR | O_CLOEXEC);
	struct p2pbuf_provider_info pi;
	unsigned long long p2p_max, udma_max, avail;
	unsigned int k, s;
	int r;

	if (p2p < 0 || udma < 0 || imp < 0) {
		fprintf(stderr, "need /dev/p2pbuf, /dev/udmabuf and /dev/p2pbuf-dma: %s\n", strerror(errno));
		return 4;
	}
	if (p2pbuf_first_provider_info(p2p, &pi)) {
		fprintf(stderr, "no p2pbuf provider: %s\n", strerror(errno));
		return 4;
	}
	p2p_max = pi.free;
	/* The memfd's pages are the guest's RAM; leave two thirds of what is available. */
	avail = mem_available();
	udma_max = 64ULL << 20;
	for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
		if (sizes[s] <= 1ULL << 30 && sizes[s] <= avail / 3)
			udma_max = sizes[s] > udma_max ? sizes[s] : udma_max;
	udma_max = udmabuf_limit(udma_max);
	printf("# export_map: p2pbuf up to %llu bytes (provider %u, BAR %llu bytes), udmabuf up to %llu bytes (MemAvailable %llu)\n",
	       p2p_max, pi.id, (unsigned long long)pi.bar_size, udma_max, avail);
	warm_up(p2p, udma, imp);
	printf("BENCHINFO export_map baseline=udmabuf title=export_+_attach+map:_p2pbuf_device_memory_vs_udmabuf x=size\n");
	printf("BENCHMETRIC export_map export_us unit=us better=lower\n");
	printf("BENCHMETRIC export_map import_us unit=us better=lower\n");
	printf("BENCHMETRIC export_map ranges unit=ranges better=lower\n");
	printf("BENCHMETRIC export_map free_us unit=us better=lower\n");
	fflush(stdout);
	for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		unsigned long long size = sizes[s];
		char h[32];

		human(h, sizeof(h), size);
		for (r = 0; r < reps; r++) {
			/* The kinds alternate which goes first at each repetition. */
			for (unsigned int kk = 0; kk < 2; kk++) {
				struct p2pbuf_dma_import im = { .size = sizeof(im) };
				struct p2pbuf_dma_release rel = { .size = sizeof(rel) };
				const char *kind;
				double t0, t1, t2, t3, ex[SMALL_ROUNDS], in[SMALL_ROUNDS], fr[SMALL_ROUNDS];
				unsigned int i, n;
				int fd;

				k = (kk + (unsigned int)r) % 2;
				kind = k ? "udmabuf" : "p2pbuf";
				if (size > (k ? udma_max : p2p_max) || size > only_upto)
					continue;
				if (size >= 1ULL << 30) {
					printf("# progress: export_map %s %s rep %d/%d: export, import, free...\n",
					       kind, h, r + 1, reps);
					fflush(stdout);
				}
				n = size < SMALL_SIZE ? SMALL_ROUNDS : 1;
				for (i = 0; i < n; i++) {
					t0 = now_us();
					fd = k ? export_udmabuf(udma, size) : export_p2pbuf(p2p, size);
					t1 = now_us();
					if (fd < 0) {
						fprintf(stderr, "export %s %llu: %s\n", kind, size, strerror(-fd));
						return 1;
					}
					im.fd = fd;
					if (ioctl(imp, P2PBUF_DMA_IOCTL_IMPORT, &im)) {
						fprintf(stderr, "import %s %llu: %s\n", kind, size, strerror(errno));
						return 1;
					}
					t2 = now_us();
					rel.handle = im.handle;
					ioctl(imp, P2PBUF_DMA_IOCTL_RELEASE, &rel);
					close(fd);
					t3 = now_us();
					ex[i] = t1 - t0;
					in[i] = t2 - t1;
					fr[i] = t3 - t2;
				}
				t0 = 0;
				t1 = median(ex, n);
				t2 = t1 + median(in, n);
				t3 = t2 + median(fr, n);
				printf("BENCH export_map kind=%s size=%llu rep=%d export_us=%.1f import_us=%.1f ranges=%u free_us=%.1f\n",
				       kind, size, r, t1 - t0, t2 - t1, im.nr_ranges, t3 - t2);
				if (size >= 1ULL << 30)
					printf("# progress: export_map %s %s rep %d/%d: export %.2f s, import %.2f ms, free %.2f s\n",
					       kind, h, r + 1, reps, (t1 - t0) / 1e6, (t2 - t1) / 1e3, (t3 - t2) / 1e6);
				fflush(stdout);
			}
		}
	}
	return 0;
}

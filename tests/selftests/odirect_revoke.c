// SPDX-License-Identifier: GPL-2.0
/*
 * REVOKE against O_DIRECT in flight (issue 27, "H2 residue"; ../shared/KERNEL_REVIEW.md H2(b)).
 *
 * The pages of a buffer's mmap are p2pdma pages, which GUP hands out with FOLL_PCI_P2PDMA:
 * an O_DIRECT read from the NVMe drive into the mapping pins them and has the drive write the
 * BAR. REVOKE zaps the CPU mapping, so pins taken after it fail (the fault handler sees the
 * buffer revoked: GUP returns EFAULT), but a pin taken before it is not a mapping and nothing
 * waits for it: the drive keeps writing the BAR after REVOKE returned, breaking the promise
 * "after REVOKE returns, nobody reaches this memory any more". Fixed, REVOKE returns only once
 * no page of the buffer is pinned any more (bounded), and refuses new pins.
 *
 * bar_unchanged_after_revoke, each round: a fresh buffer filled by the CPU with the device
 * pattern; NTHREADS threads loop O_DIRECT preads of CHUNK bytes from random chunks of a drive
 * region holding the drive pattern (different in every 8-byte word from the device pattern
 * and from every other drive chunk, so each read that lands changes what it covers) into
 * random chunks of the buffer; the main thread REVOKEs while reads are in flight. Half the
 * threads read into the buffer's (prefaulted) mapping, the other half into a fresh mapping
 * of the chunk per read, where GUP faults every page in: REVOKE's zap then often lands in the
 * middle of a read's pinning, and the block layer still submits the bios it built from the
 * pages pinned before the zap (plugged: at the end of the read, after the zap) with the read
 * returning EFAULT. Right after
 * REVOKE returns it reads the buffer's range of the BAR through the BAR's sysfs resource file
 * (mapped read-only at the ALLOC offset): first one word of every page, chunks with a read in
 * flight first (so that a write landing soon after REVOKE is seen), then the whole range;
 * then it waits until every thread has finished (bounded) and 200 ms more and reads the range
 * again. Any byte that changed is a write after REVOKE returned: the test fails with "the BAR
 * changed after REVOKE returned: N bytes in M pages". A read that began after REVOKE returned
 * and succeeded is a pin REVOKE did not refuse: also a failure. It also checks that an
 * O_DIRECT read into or write from the revoked mapping fails with EFAULT, and that the
 * buffer's memory goes back to the pool once closed and then holds what it held (the pool does
 * not zero freed memory: anything else is a write into pool memory) or zeros. Rounds:
 * p2pbuf.odirect_rounds=N (10); every round is logged (reads before / across / after REVOKE,
 * their errnos, whether the BAR changed), and the test fails at the end if any round saw it.
 *
 * new_pins_refused_after_revoke: the deterministic half, one thread: after REVOKE, O_DIRECT
 * read into / write from the mapping fails with EFAULT, and the CPU gets SIGBUS.
 *
 * Not confusing the host checks: this test prints no "# hostcheck" lines. Its buffers come
 * first-fit from the start of the BAR, below where nvme_p2p.c (1/2 of the BAR), nvme_cmb.c
 * (5/8), exporter_3_mmap.c (3/4) and lab_ivshmem.c (4 MiB below the end) leave bytes the host
 * checks after the run (asserted), and its drive region (DRIVE_OFF) is none of the drive regions
 * other tests check (8-17 MiB, 64 MiB, 96-110 MiB, 128 MiB). The bytes it leaves in freed
 * device memory are zeroed by the next ALLOC (checked at the end through the BAR).
 *
 * Every wait is bounded: warm-up, thread joins (pthread_timedjoin_np), the pool's return; the
 * harness timeout bounds a REVOKE that would never return.
 */
#include <stddef.h>
#include <linux/fs.h>
#include <pthread.h>

#include "kselftest_harness.h"
#include "races.h"

#define MIB (1UL << 20)
#define BUF_LEN (32 * MIB)
#define CHUNK (4 * MIB)
#define NCHUNKS ((int)(BUF_LEN / CHUNK))
#define NPAGES (BUF_LEN / PAGE)
#define PAGES_PER_CHUNK (CHUNK / PAGE)
/* The drive region: 256 MiB into the 512 MiB namespace, clear of every checked region. */
#define DRIVE_OFF (256 * MIB)
#define DRIVE_CHUNKS 16
#define DRIVE_LEN (DRIVE_CHUNKS * CHUNK)
#define NTHREADS 6
#define LOG_CAP 4096
#define WARM_LIMIT_S 20.0
#define JOIN_LIMIT_S 60.0
#define POOL_LIMIT_S 10.0
#define SETTLE_MS 200
/* Word w (byte offset 8w) of the drive region / of a round's buffer. */
#define DRIVE_TAG 0xd15c000000000000ULL
#define DEV_TAG 0xde71000000000000ULL
#define TAG_MASK 0xffff000000000000ULL

static uint64_t drive_word(size_t drive_byte)
{
	return DRIVE_TAG | drive_byte;
}

static uint64_t dev_word(size_t buf_byte, int round)
{
	return DEV_TAG | ((uint64_t)(round & 0xff) << 40) | buf_byte;
}

static const char *topology(void)
{
	const char *t = getenv("P2PBUF_TOPOLOGY");

	return t ? t : "";
}

/* One O_DIRECT read of a worker: when it began and returned, bytes or -errno. */
struct rd {
	double t0, t1;
	int ret;
	int chunk;
	int mmap_failed;	/* ret is mmap()'s -errno: no read was made */
};

struct worker {
	pthread_t th;
	int started;
	int nvme;
	uint8_t *map;
	int fd;			/* the buffer, for a fresh mapping per read */
	int fresh;		/* map the chunk afresh for every read (GUP faults every page) */
	int *stop;
	double deadline;
	uint64_t seed;
	int busy;		/* the chunk of the read in flight, -1: none */
	long done;		/* reads returned */
	int n;			/* entries in log */
	long dropped;
	struct rd log[LOG_CAP];
};

/*
 * Tells the readers to stop. Not on a round's stack: a reader stuck in pread past the join's
 * limit still reads it (and the workers are never freed, for the same reason).
 */
static int readers_stop;

static void *reader(void *arg)
{
	struct worker *w = arg;

	rnd_seed(w->seed);
	while (!__atomic_load_n(w->stop, __ATOMIC_ACQUIRE) && now() < w->deadline) {
		int c = (int)(rnd() % NCHUNKS), k = (int)(rnd() % DRIVE_CHUNKS);
		struct rd r = { .chunk = c };
		uint8_t *dst = w->map + (size_t)c * CHUNK;
		ssize_t n;

		r.t0 = now();
		if (w->fresh) {
			dst = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd,
				   (off_t)c * CHUNK);
			if (dst == MAP_FAILED) {
				r.ret = -errno;
				r.mmap_failed = 1;
				r.t1 = now();
				goto logit;
			}
		}
		__atomic_store_n(&w->busy, c, __ATOMIC_RELEASE);
		n = pread(w->nvme, dst, CHUNK, DRIVE_OFF + (off_t)k * CHUNK);
		r.t1 = now();
		r.ret = n < 0 ? -errno : (int)n;
		__atomic_store_n(&w->busy, -1, __ATOMIC_RELEASE);
		if (w->fresh)
			munmap(dst, CHUNK);
logit:
		if (w->n < LOG_CAP)
			w->log[w->n++] = r;
		else
			w->dropped++;
		__atomic_add_fetch(&w->done, 1, __ATOMIC_ACQ_REL);
	}
	return NULL;
}

/* How many of the 8 bytes of a and b differ. */
static size_t word_diff_bytes(uint64_t a, uint64_t b)
{
	size_t n = 0;

	for (uint64_t x = a ^ b; x; x >>= 8)
		n += (x & 0xff) != 0;
	return n;
}

/* Reads len bytes of the BAR view (8-byte loads: it is an uncached MMIO mapping). */
static void bar_copy(uint64_t *dst, const volatile uint64_t *src, size_t len)
{
	for (size_t i = 0; i < len / 8; i++)
		dst[i] = src[i];
}

FIXTURE(odirect)
{
	int p2p, nvme, res;
	char pci[64];
	char res_path[128];
	__u64 total;
	long long free0, avail0;
	double spins_per_s;
};

FIXTURE_SETUP(odirect)
{
	struct p2pbuf_provider_info p;
	unsigned long long size = 0;
	const char *why;

	self->p2p = self->nvme = self->res = -1;
	why = exporter_ready(_metadata, self->pci, sizeof(self->pci), &self->p2p, &p);
	if (why)
		SKIP(return, "%s", why);
	self->total = p.total;
	snprintf(self->res_path, sizeof(self->res_path), "/sys/bus/pci/devices/%s/resource%u",
		 p.pci_name, p.bar);
	self->res = open(self->res_path, O_RDONLY | O_CLOEXEC);
	if (self->res < 0)
		SKIP(return, "no BAR resource file %s: %s", self->res_path, strerror(errno));
	self->nvme = open("/dev/nvme0n1", O_RDWR | O_DIRECT | O_CLOEXEC);
	if (self->nvme < 0)
		SKIP(return, "no /dev/nvme0n1: %s", strerror(errno));
	if (ioctl(self->nvme, BLKGETSIZE64, &size) || size < DRIVE_OFF + DRIVE_LEN)
		SKIP(return, "/dev/nvme0n1 has %llu bytes, the test needs %lu", size,
		     DRIVE_OFF + DRIVE_LEN);
	self->free0 = provider_free(self->p2p);	/* also forgets released buffers */
	self->avail0 = pool_avail(self->pci);
	ASSERT_GE(self->free0, (long long)BUF_LEN);
	self->spins_per_s = spin_rate();
	install_fault_handlers();
	rnd_seed((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20));
}

FIXTURE_TEARDOWN(odirect)
{
	p2pbuf_close(&self->nvme);
	p2pbuf_close(&self->res);
	if (self->p2p >= 0) {
		expect_memory_back(_metadata, self->p2p, self->pci, self->free0, self->avail0);
		close(self->p2p);
	}
}

/* A buffer of BUF_LEN (uninitialized when allowed: the test fills it), mapped, and its BAR
 * range mapped read-only through the resource file. 0 or -errno. */
static int buf_open(FIXTURE_DATA(odirect) *self, struct p2pbuf_buf *b,
		    const volatile uint64_t **bar)
{
	return p2p_buf_open(self->p2p, self->res, BUF_LEN, P2PBUF_ALLOC_UNINITIALIZED, b, bar);
}

/* Waits (up to POOL_LIMIT_S) until the pool has what it had at the start; 0 or -ETIMEDOUT. */
static int wait_pool_back(FIXTURE_DATA(odirect) *self, long long *avail)
{
	double end = now() + POOL_LIMIT_S;

	for (;;) {
		*avail = pool_avail(self->pci);
		if (*avail == self->avail0)
			return 0;
		if (now() > end)
			return -ETIMEDOUT;
		usleep(10 * 1000);
	}
}

TEST_F_TIMEOUT(odirect, new_pins_refused_after_revoke, 120)
{
	const volatile uint64_t *bar;
	struct p2pbuf_buf b;
	long long avail;
	uint64_t *h;
	size_t i;
	ssize_t n;

	ASSERT_EQ(0, posix_memalign((void **)&h, PAGE, MIB));
	for (i = 0; i < MIB / 8; i++)
		h[i] = drive_word(i * 8);
	ASSERT_EQ((ssize_t)MIB, pwrite(self->nvme, h, MIB, DRIVE_OFF));
	ASSERT_EQ(0, buf_open(self, &b, &bar));
	memset(b.map, 0x5a, MIB);
	n = pread(self->nvme, b.map, MIB, DRIVE_OFF);
	if (n < 0 && (errno == EREMOTEIO || errno == EINVAL) && !strcmp(topology(), "rootports")) {
		p2pbuf_buf_free(&b);
		munmap((void *)bar, BUF_LEN);
		free(h);
		SKIP(return, "no P2P path between the drive and the memory on this topology");
	}
	ASSERT_EQ((ssize_t)MIB, n) TH_LOG("O_DIRECT read into device memory: %s", strerror(errno));
	/* The BAR view is the buffer: the drive's bytes are there, at the ALLOC offset. */
	for (i = 0; i < MIB / 8; i++)
		ASSERT_EQ(drive_word(i * 8), bar[i]) TH_LOG("BAR +%#llx word %zu",
							 (unsigned long long)b.bar_offset, i);
	ASSERT_EQ(0, p2p_revoke(self->p2p, b.fd));
	errno = 0;
	n = pread(self->nvme, b.map, MIB, DRIVE_OFF);
	EXPECT_EQ(-1, n) TH_LOG("O_DIRECT read into the revoked mapping returned %zd: a new pin", n);
	EXPECT_EQ(EFAULT, errno) TH_LOG("read: %s", strerror(errno));
	errno = 0;
	n = pread(self->nvme, b.map + 8 * PAGE, PAGE, DRIVE_OFF);
	EXPECT_EQ(-1, n);
	EXPECT_EQ(EFAULT, errno) TH_LOG("4 KiB read: %s", strerror(errno));
	errno = 0;
	n = pwrite(self->nvme, b.map, MIB, DRIVE_OFF + MIB);
	EXPECT_EQ(-1, n) TH_LOG("O_DIRECT write from the revoked mapping returned %zd", n);
	EXPECT_EQ(EFAULT, errno) TH_LOG("write: %s", strerror(errno));
	EXPECT_EQ(SIGBUS, probe_read(b.map));
	/* Nothing reached the BAR: it still holds the drive's bytes. */
	for (i = 0; i < MIB / 8; i++)
		ASSERT_EQ(drive_word(i * 8), bar[i]) TH_LOG("BAR word %zu after REVOKE", i);
	p2pbuf_buf_free(&b);
	munmap((void *)bar, BUF_LEN);
	EXPECT_EQ(0, wait_pool_back(self, &avail))
		TH_LOG("pool: %lld available, %lld before", avail, self->avail0);
	free(h);
}

/* What one round saw. */
struct round_result {
	long before_ok, before_err;	/* returned before REVOKE began */
	long across_ok, across_err;	/* in flight while REVOKE ran */
	long across_ok_late;		/* ...and returned success after REVOKE returned */
	long after_ok, after_err;	/* began after REVOKE returned */
	long short_reads;
	long mmap_refused;		/* fresh mappings refused during or after REVOKE */
	int errnos[8][2];		/* errno, count (across and after) */
	int nerrnos;
	size_t changed_bytes, changed_pages, probe_pages;
	size_t drive_pages;		/* pages holding the drive's bytes right after REVOKE */
	int busy_at_revoke;
	double revoke_ms;
};

static void count_errno(struct round_result *rr, int err)
{
	for (int i = 0; i < rr->nerrnos; i++)
		if (rr->errnos[i][0] == err) {
			rr->errnos[i][1]++;
			return;
		}
	if (rr->nerrnos < 8) {
		rr->errnos[rr->nerrnos][0] = err;
		rr->errnos[rr->nerrnos++][1] = 1;
	}
}

static void classify(struct worker *w, double r0, double r1, struct round_result *rr)
{
	for (int t = 0; t < NTHREADS; t++)
		for (int i = 0; i < w[t].n; i++) {
			struct rd *r = &w[t].log[i];
			int ok = r->ret == (int)CHUNK;

			if (r->mmap_failed) {
				if (r->t1 < r0)
					rr->before_err++;
				else
					rr->mmap_refused++;
				continue;
			}

			if (r->ret >= 0 && !ok)
				rr->short_reads++;
			if (r->t1 < r0) {
				ok ? rr->before_ok++ : rr->before_err++;
			} else if (r->t0 < r1) {
				ok ? rr->across_ok++ : rr->across_err++;
				if (ok && r->t1 > r1)
					rr->across_ok_late++;
				if (r->ret < 0)
					count_errno(rr, -r->ret);
			} else {
				ok ? rr->after_ok++ : rr->after_err++;
				if (r->ret < 0)
					count_errno(rr, -r->ret);
			}
		}
}

/* Stops the workers and joins them, all by deadline (monotonic); how many did not end. */
static int stop_and_join(struct worker *w, int *stop, double deadline)
{
	int left = 0;

	__atomic_store_n(stop, 1, __ATOMIC_RELEASE);
	for (int t = 0; t < NTHREADS; t++) {
		struct timespec ts;
		double d;

		if (!w[t].started)
			continue;
		/* pthread_timedjoin_np() takes a CLOCK_REALTIME deadline. */
		clock_gettime(CLOCK_REALTIME, &ts);
		d = deadline - now();
		if (d < 0)
			d = 0;
		d += (double)ts.tv_nsec / 1e9;
		ts.tv_sec += (time_t)d;
		ts.tv_nsec = (long)((d - (double)(time_t)d) * 1e9);
		if (pthread_timedjoin_np(w[t].th, NULL, &ts)) {
			left++;
			continue;
		}
		w[t].started = 0;
	}
	return left;
}

/*
 * One round. 0: ran (rr filled), 1: the race did not get going (logged; not a result),
 * -1: the test must stop (a failure is recorded, or workers are stuck).
 * Over 100 lines on purpose: one round in the order the race runs (the buffer, the readers
 * started on it, their O_DIRECT pins warmed up, REVOKE, what each reader and the BAR saw, the
 * pins given back); every step reads the round's buffer, readers and snapshots.
 */
static int one_round(struct __test_metadata *_metadata, FIXTURE_DATA(odirect) *self, int round,
		     struct worker *w, uint64_t *snap1, uint64_t *snap2, uint64_t *probe,
		     struct round_result *rr)
{
	const volatile uint64_t *bar = NULL;
	struct p2pbuf_buf b;
	uint64_t *map64;
	double r0, r1, warm_end;
	int *stop = &readers_stop, order[NCHUNKS], busy[NCHUNKS] = { 0 }, no = 0, ret = 0, err, left;
	long long avail;
	size_t i, p, other_words = 0;

	memset(rr, 0, sizeof(*rr));
	__atomic_store_n(stop, 0, __ATOMIC_RELEASE);
	err = buf_open(self, &b, &bar);
	ASSERT_EQ(0, err) TH_LOG("round %d: buffer: %s", round, strerror(-err));
	/* Not where other tests leave bytes for the host to check. */
	EXPECT_LE(b.bar_offset + BUF_LEN, self->total / 2)
		TH_LOG("buffer at BAR +%#llx reaches nvme_p2p.c's checked bytes at 1/2 of the BAR",
		       (unsigned long long)b.bar_offset);
	map64 = (uint64_t *)b.map;
	for (i = 0; i < BUF_LEN / 8; i++)
		map64[i] = dev_word(i * 8, round);
	/* The BAR view shows the buffer (a check that compares the wrong bytes would pass). */
	for (p = 0; p < NPAGES; p++)
		if (bar[p * PAGE / 8] != dev_word(p * PAGE, round))
			break;
	EXPECT_EQ(NPAGES, p) TH_LOG("round %d: %s at +%#llx does not show the buffer's bytes "
				    "(page %zu)", round, self->res_path,
				    (unsigned long long)b.bar_offset, p);
	if (p != NPAGES) {
		ret = -1;
		goto out;
	}

	for (int t = 0; t < NTHREADS; t++) {
		memset(&w[t], 0, offsetof(struct worker, log));
		w[t].nvme = self->nvme;
		w[t].map = b.map;
		w[t].fd = b.fd;
		w[t].fresh = !(t & 1);
		w[t].stop = stop;
		w[t].deadline = now() + JOIN_LIMIT_S;
		w[t].seed = rnd();
		w[t].busy = -1;
		if (pthread_create(&w[t].th, NULL, reader, &w[t]) == 0)
			w[t].started = 1;
	}
	/* Warm: every worker has had a read return (and none failed), then a random delay. */
	warm_end = now() + WARM_LIMIT_S;
	for (;;) {
		int warm = 1, failed = 0;

		for (int t = 0; t < NTHREADS; t++) {
			long d = __atomic_load_n(&w[t].done, __ATOMIC_ACQUIRE);

			if (!d)
				warm = 0;
			else if (w[t].log[0].ret != (int)CHUNK)
				failed = w[t].log[0].ret;
		}
		if (failed) {
			left = stop_and_join(w, stop, now() + JOIN_LIMIT_S);
			if (-failed == EINVAL || -failed == EREMOTEIO)
				if (!strcmp(topology(), "rootports")) {
					TH_LOG("no P2P path on this topology: %s", strerror(-failed));
					ret = 1;
					goto out_left;
				}
			EXPECT_EQ((int)CHUNK, failed) TH_LOG("round %d: O_DIRECT read before REVOKE: "
							     "%s", round, strerror(-failed));
			ret = -1;
			goto out_left;
		}
		if (warm)
			break;
		if (now() > warm_end) {
			left = stop_and_join(w, stop, now() + JOIN_LIMIT_S);
			EXPECT_TRUE(warm) TH_LOG("round %d: not every reader finished a read in %.0f s",
						 round, WARM_LIMIT_S);
			ret = -1;
			goto out_left;
		}
		usleep(1000);
	}
	spin((unsigned long)(self->spins_per_s * 0.004 * (double)(rnd() % 1000) / 1000.0));

	r0 = now();
	err = p2p_revoke(self->p2p, b.fd);
	r1 = now();
	__atomic_store_n(stop, 1, __ATOMIC_RELEASE);
	/* At once: one word of every page, the chunks with a read in flight first. */
	for (int t = 0; t < NTHREADS; t++) {
		int c = __atomic_load_n(&w[t].busy, __ATOMIC_ACQUIRE);

		if (c >= 0 && !busy[c]) {
			busy[c] = 1;
			order[no++] = c;
			rr->busy_at_revoke++;
		}
	}
	for (int c = 0; c < NCHUNKS; c++)
		if (!busy[c])
			order[no++] = c;
	for (int k = 0; k < NCHUNKS; k++)
		for (p = (size_t)order[k] * PAGES_PER_CHUNK; p < (size_t)(order[k] + 1) * PAGES_PER_CHUNK;
		     p++)
			probe[p] = bar[p * PAGE / 8];
	bar_copy(snap1, bar, BUF_LEN);
	rr->revoke_ms = (r1 - r0) * 1e3;
	EXPECT_EQ(0, err) TH_LOG("round %d: REVOKE: %s", round, strerror(-err));

	left = stop_and_join(w, stop, now() + JOIN_LIMIT_S);
	EXPECT_EQ(0, left) TH_LOG("round %d: %d readers still in pread %.0f s after REVOKE returned",
				  round, left, JOIN_LIMIT_S);
	if (left) {
		ret = -1;
		goto out_left;
	}
	usleep(SETTLE_MS * 1000);
	bar_copy(snap2, bar, BUF_LEN);

	classify(w, r0, r1, rr);
	for (p = 0; p < NPAGES; p++) {
		size_t w0 = p * PAGE / 8, nb = 0;

		if ((snap1[w0] & TAG_MASK) == DRIVE_TAG)
			rr->drive_pages++;
		for (i = w0; i < w0 + PAGE / 8; i++)
			if (snap1[i] != snap2[i])
				nb += word_diff_bytes(snap1[i], snap2[i]);
		if (!nb && probe[p] != snap2[w0]) {
			/* Written between the probe and the full copy: count the probed word. */
			nb = word_diff_bytes(probe[p], snap2[w0]);
			rr->probe_pages++;
		}
		if (nb) {
			rr->changed_bytes += nb;
			rr->changed_pages++;
		}
	}

	/* New pins are refused: O_DIRECT into the revoked mapping fails with EFAULT. */
	errno = 0;
	EXPECT_EQ(-1, pread(self->nvme, b.map, CHUNK, DRIVE_OFF))
		TH_LOG("round %d: O_DIRECT read into the revoked mapping succeeded: a new pin", round);
	EXPECT_EQ(EFAULT, errno) TH_LOG("round %d: O_DIRECT read after REVOKE: %s", round,
					strerror(errno));

	/* Closed, the memory goes back to the pool, and nothing writes it there. */
	munmap(b.map, BUF_LEN);
	b.map = NULL;
	p2pbuf_close(&b.fd);
	EXPECT_EQ(0, wait_pool_back(self, &avail))
		TH_LOG("round %d: pool: %lld available %.0f s after the close, %lld before", round,
		       avail, POOL_LIMIT_S, self->avail0);
	bar_copy(snap1, bar, BUF_LEN);	/* snap1 is done with: the range back in the pool */
	/* Word by word what the buffer held, or zero (should freed memory ever be cleared,
	 * at once or in the background): anything else was written into pool memory. */
	for (i = 0; i < BUF_LEN / 8; i++)
		other_words += snap1[i] != snap2[i] && snap1[i] != 0;
	EXPECT_EQ(0UL, other_words)
		TH_LOG("round %d: the BAR changed after the buffer's memory went back to the pool "
		       "(%zu words neither what the buffer held nor zero)", round, other_words);
	goto out;

out_left:
	if (left)
		TH_LOG("round %d: %d readers did not end", round, left);
out:
	p2pbuf_buf_free(&b);
	if (bar)
		munmap((void *)bar, BUF_LEN);
	return ret;
}

TEST_F_TIMEOUT(odirect, bar_unchanged_after_revoke, 400)
{
	int rounds = (int)cmdline_ul("odirect_rounds", 10), hit_rounds = 0, ran = 0;
	size_t total_bytes = 0, total_pages = 0;
	long late_pins = 0;
	uint64_t *snap1, *snap2, *probe, *h;
	struct worker *w;
	struct round_result rr;
	const volatile uint64_t *bar;
	size_t i;

	ASSERT_EQ(0, posix_memalign((void **)&h, PAGE, DRIVE_LEN));
	for (i = 0; i < DRIVE_LEN / 8; i++)
		h[i] = drive_word(i * 8);
	ASSERT_EQ((ssize_t)DRIVE_LEN, pwrite(self->nvme, h, DRIVE_LEN, DRIVE_OFF))
		TH_LOG("O_DIRECT write of the drive pattern: %s", strerror(errno));
	ASSERT_EQ(0, fsync(self->nvme));
	free(h);
	snap1 = malloc(BUF_LEN);
	snap2 = malloc(BUF_LEN);
	probe = calloc(NPAGES, sizeof(*probe));
	w = calloc(NTHREADS, sizeof(*w));
	ASSERT_TRUE(snap1 && snap2 && probe && w);

	for (int r = 0; r < rounds; r++) {
		int ret = one_round(_metadata, self, r, w, snap1, snap2, probe, &rr);
		char errs[160] = "";
		int o = 0;

		if (ret < 0)
			break;
		if (ret > 0) {
			free(snap1), free(snap2), free(probe);
			SKIP(return, "no P2P path between the drive and the memory on this topology");
		}
		ran++;
		for (int e = 0; e < rr.nerrnos && o < (int)sizeof(errs) - 40; e++)
			o += snprintf(errs + o, sizeof(errs) - o, "%s%s x%d", e ? ", " : "",
				      strerror(rr.errnos[e][0]), rr.errnos[e][1]);
		TH_LOG("round %d: REVOKE %.1f ms with %d chunks being read; reads: %ld ok before; "
		       "%ld ok + %ld failed in flight across it (%ld ok returned after it); "
		       "after it %ld ok, %ld failed; errors: %s; %ld mmaps refused; %zu pages held "
		       "the drive's bytes; BAR %s", r, rr.revoke_ms, rr.busy_at_revoke, rr.before_ok,
		       rr.across_ok, rr.across_err, rr.across_ok_late, rr.after_ok, rr.after_err,
		       rr.nerrnos ? errs : "none", rr.mmap_refused, rr.drive_pages,
		       rr.changed_pages ? "CHANGED after REVOKE returned" : "unchanged");
		if (rr.changed_pages) {
			TH_LOG("round %d: %zu bytes in %zu pages changed after REVOKE returned (%zu seen "
			       "only by the first-word probe)", r, rr.changed_bytes, rr.changed_pages,
			       rr.probe_pages);
			hit_rounds++;
		}
		EXPECT_EQ(0, rr.before_err) TH_LOG("round %d: reads failed before REVOKE", r);
		EXPECT_EQ(0, rr.short_reads) TH_LOG("round %d: short O_DIRECT reads", r);
		/* The race was run: reads landed in the BAR (it was there to be changed). */
		EXPECT_NE(0UL, rr.drive_pages) TH_LOG("round %d: no read reached the BAR", r);
		total_bytes += rr.changed_bytes;
		total_pages += rr.changed_pages;
		late_pins += rr.after_ok;
		if (_metadata->exit_code == KSFT_FAIL && !rr.changed_pages)
			break;
	}
	TH_LOG("%d of %d rounds ran; the BAR changed after REVOKE in %d", ran, rounds, hit_rounds);
	EXPECT_EQ(0, late_pins) TH_LOG("%ld O_DIRECT reads that began after REVOKE returned "
				       "succeeded: new pins were not refused", late_pins);
	EXPECT_EQ(0UL, total_pages)
		TH_LOG("the BAR changed after REVOKE returned: %zu bytes in %zu pages (in-flight "
		       "O_DIRECT writes), in %d of %d rounds", total_bytes, total_pages, hit_rounds,
		       ran);

	/* The next user gets zeroed memory, not this test's bytes (nor a late write's). */
	{
		struct p2pbuf_alloc a = { .size = sizeof(a), .length = BUF_LEN };

		ASSERT_EQ(0, p2pbuf_test_alloc(self->p2p, &a));
		bar = mmap(NULL, BUF_LEN, PROT_READ, MAP_SHARED, self->res, (off_t)a.offset);
		ASSERT_NE(MAP_FAILED, (void *)bar);
		for (i = 0; i < BUF_LEN / 8; i++)
			if (bar[i])
				break;
		EXPECT_EQ(BUF_LEN / 8, i) TH_LOG("a zeroed ALLOC at BAR +%#llx holds %#llx at +%zu",
						 (unsigned long long)a.offset,
						 (unsigned long long)bar[i], i * 8);
		munmap((void *)bar, BUF_LEN);
		close(a.fd);
	}
	free(snap1);
	free(snap2);
	free(probe);
}

TEST_HARNESS_MAIN

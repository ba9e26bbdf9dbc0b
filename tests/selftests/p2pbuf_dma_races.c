// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf engine races (H3 of the first kernel review, summed up in section 1 of the second,
 * KERNEL_REVIEW.md, shared with the project; answered in docs/exporter.md, "Races": importer
 * attachments and mappings are not tied to the importing device's lifetime): the DMA engine
 * (QEMU's edu device behind /dev/p2pbuf-dma) is unbound from p2pbuf_dma while it holds
 * device-memory buffers imported (attached, and mapped for the engine), once and in a loop
 * against a thread that keeps importing and copying.
 *
 * What must hold: the unbind returns within a time bound; the open file's handles then fail
 * with a documented errno (ENODEV, RELEASE included), close
 * works, the imported buffers go back to the provider when the engine lets them go (at
 * unbind), binding again gives a working engine (a verified copy); nothing on the console
 * (DMA-API debug reports a mapping that outlives its device; the harness fails the run on it).
 *
 * The file is named p2pbuf_dma_*: it runs on the p2pbuf-dma-icount boot (xtask/src/judge/boots.rs,
 * ENGINE_TESTS), where the engine's 100 ms per transfer costs no wall time; the main boot
 * leaves engine_* to that boot. The opt-in kcsan boot (KCSAN_TESTS) runs it too, in wall time.
 */
#include <pthread.h>
#include <linux/dma-buf.h>

#include "kselftest_harness.h"
#include "races.h"

#define EDU_VENDOR "0x1234"
#define EDU_DEVICE "0x11e8"
#define ENGINE_UNBIND IMPORTER_DRV "/unbind"

/* Guest seconds an unbind of the engine may take (it waits for a copy in flight: at most one
 * window step, two 100 ms transfers). */
#define ENGINE_UNBIND_LIMIT_S 30.0

static void sync_cpu(int fd, int start)
{
	struct dma_buf_sync s = {
		.flags = (start ? DMA_BUF_SYNC_START : DMA_BUF_SYNC_END) | DMA_BUF_SYNC_RW,
	};

	ioctl(fd, DMA_BUF_IOCTL_SYNC, &s);
}

/*
 * The engine works: copies len bytes (at most a page) between two fresh device-memory
 * buffers and compares. 0, -errno of a failed step, or -EIO for a mismatch.
 */
static int engine_check(int dma, int p2p, size_t len)
{
	int a = p2pbuf_alloc_fd(p2p, PAGE), b = p2pbuf_alloc_fd(p2p, PAGE), ha = -1, hb = -1, ret;
	uint8_t *ma = MAP_FAILED, *mb = MAP_FAILED;
	long n;

	ret = a < 0 ? a : b < 0 ? b : 0;
	if (ret)
		goto out;
	ma = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, a, 0);
	mb = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, b, 0);
	if (ma == MAP_FAILED || mb == MAP_FAILED) {
		ret = -errno;
		goto out;
	}
	sync_cpu(a, 1);
	for (size_t i = 0; i < PAGE; i++)
		ma[i] = (uint8_t)(i * 11 + 7);
	sync_cpu(a, 0);
	ha = dma_import(dma, a);
	hb = dma_import(dma, b);
	ret = ha < 0 ? ha : hb < 0 ? hb : 0;
	if (ret)
		goto out;
	n = dma_copy(dma, ha, hb, len);
	if (n != (long)len) {
		ret = n < 0 ? (int)n : -EIO;
		goto out;
	}
	sync_cpu(b, 1);
	ret = memcmp(ma, mb, len) ? -EIO : 0;
	sync_cpu(b, 0);
out:
	if (ha > 0)
		dma_release(dma, ha);
	if (hb > 0)
		dma_release(dma, hb);
	if (ma != MAP_FAILED)
		munmap(ma, PAGE);
	if (mb != MAP_FAILED)
		munmap(mb, PAGE);
	if (a >= 0)
		close(a);
	if (b >= 0)
		close(b);
	return ret;
}

FIXTURE(p2pbuf_dma_races) {
	int p2p, dma;
	char edu[64], gpu[64];
	long long free0, avail0;
	pid_t unbinder;
};

FIXTURE_SETUP(p2pbuf_dma_races)
{
	const char *why;
	int r;

	self->p2p = self->dma = -1;
	self->unbinder = 0;
	if (p2pbuf_pci_find(EDU_VENDOR, EDU_DEVICE, self->edu, sizeof(self->edu)))
		SKIP(return, "no edu device (the DMA engine) on this boot");
	if (access(IMPORTER_DRV, F_OK))
		SKIP(return, "p2pbuf_dma is not loaded");
	why = exporter_ready(_metadata, self->gpu, sizeof(self->gpu), &self->p2p, NULL);
	if (why)
		SKIP(return, "%s", why);
	r = ensure_bound(IMPORTER_DRV, self->edu);
	ASSERT_EQ(0, r) TH_LOG("bind %s to p2pbuf_dma: %s", self->edu, strerror(-r));
	self->dma = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	if (self->dma < 0)
		SKIP(return, "no %s: %s", DMA_DEV, strerror(errno));
	self->free0 = provider_free(self->p2p);
	self->avail0 = pool_avail(self->gpu);
	ASSERT_GT(self->free0, 0);
	rnd_seed((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20));
}

FIXTURE_TEARDOWN(p2pbuf_dma_races)
{
	int st;

	if (self->unbinder > 0 && wait_for(self->unbinder, 60, &st) != 1)
		TH_LOG("an unbind of %s is still in flight at teardown", self->edu);
	p2pbuf_close(&self->dma);
	if (self->p2p < 0)
		return;
	EXPECT_EQ(0, ensure_bound(IMPORTER_DRV, self->edu));
	expect_memory_back(_metadata, self->p2p, self->gpu, self->free0, self->avail0);
	close(self->p2p);
}

/*
 * H3: the engine holds two device-memory buffers, attached and mapped (imported, one copy
 * done), and their fds are closed (only the imports keep them). Unbind the engine: it
 * returns in time, the handles fail with ENODEV (RELEASE too), importing
 * fails with ENODEV, the buffers are back with the provider at once, close works, and after
 * binding again the engine copies correctly.
 */
TEST_F_TIMEOUT(p2pbuf_dma_races, h3_unbind_engine_while_imported, 300)
{
	const size_t len = 1UL << 20;
	int d1, d2, h1, h2, r, st = 0, done, fd;
	long long f_mid;
	double tu;
	pid_t u;

	d1 = p2pbuf_alloc_fd(self->p2p, len);
	d2 = p2pbuf_alloc_fd(self->p2p, len);
	ASSERT_GE(d1, 0);
	ASSERT_GE(d2, 0);
	h1 = dma_import(self->dma, d1);
	if (h1 == -EOPNOTSUPP) {
		close(d1);
		close(d2);
		SKIP(return, "the exporter refuses the engine: no peer-to-peer path in this topology");
	}
	ASSERT_GT(h1, 0) TH_LOG("import: %s", strerror(-h1));
	h2 = dma_import(self->dma, d2);
	ASSERT_GT(h2, 0) TH_LOG("import: %s", strerror(-h2));
	/* The attachments are mapped and the engine has used them. */
	EXPECT_EQ(256, dma_copy(self->dma, h1, h2, 256));
	close(d1);
	close(d2);
	f_mid = provider_free(self->p2p);
	EXPECT_EQ(self->free0 - 2 * (long long)len, f_mid);

	tu = now();
	u = sysfs_write_child(ENGINE_UNBIND, self->edu, -1, -1, 0, 0, 0);
	ASSERT_LT(0, u);
	self->unbinder = u;
	done = wait_for(u, ENGINE_UNBIND_LIMIT_S, &st);
	EXPECT_EQ(1, done) TH_LOG("the unbind of the engine has not returned after %.0f s while "
				  "buffers are imported", ENGINE_UNBIND_LIMIT_S);
	if (done != 1) {
		/* What it may wait for: our file's imports. */
		close(self->dma);
		self->dma = -1;
		ASSERT_EQ(1, wait_for(u, ENGINE_UNBIND_LIMIT_S, &st));
	}
	self->unbinder = 0;
	EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) TH_LOG("unbind status %#x", st);
	ksft_print_msg("engine unbound in %.2f s with 2 device-memory buffers imported\n",
		       now() - tu);
	if (self->dma >= 0) {
		EXPECT_EQ(-ENODEV, dma_copy(self->dma, h1, h2, 16));
		r = dma_release(self->dma, h1);
		ksft_print_msg("RELEASE of a handle after the unbind: %s\n", r ? strerror(-r) : "0");
		EXPECT_EQ(-ENODEV, r) TH_LOG("RELEASE: %s", strerror(-r));
		fd = p2pbuf_alloc_fd(self->p2p, PAGE);
		ASSERT_GE(fd, 0);
		EXPECT_EQ(-ENODEV, dma_import(self->dma, fd));
		close(fd);
	}
	/* The imports let the buffers go at unbind: the memory is back before the file closes. */
	EXPECT_EQ(self->free0, provider_free(self->p2p))
		TH_LOG("the unbound engine still holds the imported buffers");
	EXPECT_EQ(self->avail0, pool_avail(self->gpu));
	if (self->dma >= 0) {
		EXPECT_EQ(0, close(self->dma));
		self->dma = -1;
	}
	EXPECT_ERRNO(ENODEV, open(DMA_DEV, O_RDWR | O_CLOEXEC));

	ASSERT_EQ(0, ensure_bound(IMPORTER_DRV, self->edu));
	self->dma = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, self->dma);
	EXPECT_EQ(0, engine_check(self->dma, self->p2p, 2000));
}

struct h3_loop {
	volatile int stop;
	int p2p;
	unsigned long iters, imported, import_enodev, copies, copy_enodev, releases, opens_refused;
	unsigned long bad;
	int last_bad;
	const char *last_bad_what;
};

static void h3_bad(struct h3_loop *l, const char *what, int err)
{
	l->bad++;
	l->last_bad = err;
	l->last_bad_what = what;
}

/* Imports (and now and then copies between) fresh buffers until told to stop; reopens the
 * engine after an unbind. */
static void *h3_importer(void *p)
{
	struct h3_loop *l = p;
	int dma = -1;

	rnd_seed(0x5eed ^ (uint64_t)time(NULL));
	while (!l->stop) {
		int a, b, ha, hb, r, dead = 0;

		if (dma < 0) {
			dma = open(DMA_DEV, O_RDWR | O_CLOEXEC);
			if (dma < 0) {
				if (errno == ENODEV)
					l->opens_refused++;
				else
					h3_bad(l, "open", errno);
				usleep(20 * 1000);
				continue;
			}
		}
		l->iters++;
		a = p2pbuf_alloc_fd(l->p2p, 64 * 1024);
		b = p2pbuf_alloc_fd(l->p2p, 64 * 1024);
		if (a < 0 || b < 0) {
			h3_bad(l, "alloc", a < 0 ? -a : -b);
			if (a >= 0)
				close(a);
			if (b >= 0)
				close(b);
			continue;
		}
		ha = dma_import(dma, a);
		hb = dma_import(dma, b);
		for (int i = 0; i < 2; i++) {
			int h = i ? hb : ha;

			if (h > 0) {
				l->imported++;
			} else if (h == -ENODEV) {
				l->import_enodev++;
				dead = 1;
			} else {
				h3_bad(l, "import", -h);
			}
		}
		if (ha > 0 && hb > 0 && rnd() % 2) {
			long n = dma_copy(dma, ha, hb, 64);

			if (n == 64) {
				l->copies++;
			} else if (n == -ENODEV) {
				l->copy_enodev++;
				dead = 1;
			} else {
				h3_bad(l, "copy", n < 0 ? (int)-n : EIO);
			}
		}
		if (rnd() % 2) {
			for (int i = 0; i < 2; i++) {
				int h = i ? hb : ha;

				if (h <= 0)
					continue;
				r = dma_release(dma, h);
				if (r == 0 || r == -ENOENT || r == -ENODEV)
					l->releases++;
				else
					h3_bad(l, "release", -r);
			}
		}
		close(a);
		close(b);
		if (dead || rnd() % 8 == 0) {
			close(dma);
			dma = -1;
		}
	}
	if (dma >= 0)
		close(dma);
	return NULL;
}

/*
 * H3 stress: one thread imports, copies and releases device-memory buffers in a loop while
 * the engine is unbound and bound again (for races_s() guest seconds: at least 3 and at most
 * 20 cycles). Every call fails only with a documented errno, every unbind returns in time,
 * all memory comes back, the engine works afterwards.
 */
TEST_F_TIMEOUT(p2pbuf_dma_races, h3_import_loop_vs_engine_unbind, 400)
{
	struct h3_loop l = { .p2p = self->p2p };
	unsigned long late = 0, bad_unbind = 0;
	double t0 = now(), worst = 0;
	pthread_t t;
	int cycles, fd, h;

	/* Is there a path between the engine and device memory here at all? */
	fd = p2pbuf_alloc_fd(self->p2p, PAGE);
	ASSERT_GE(fd, 0);
	h = dma_import(self->dma, fd);
	close(fd);
	if (h == -EOPNOTSUPP)
		SKIP(return, "the exporter refuses the engine: no peer-to-peer path here");
	ASSERT_GT(h, 0);
	EXPECT_EQ(0, dma_release(self->dma, h));
	ASSERT_EQ(0, pthread_create(&t, NULL, h3_importer, &l));
	for (cycles = 0; cycles < 20 && (cycles < 3 || now() - t0 < races_s()); cycles++) {
		int c = cycles, st = 0, done;
		double tu;
		pid_t u;

		usleep(200 * 1000 + rnd() % (600 * 1000));
		tu = now();
		u = sysfs_write_child(ENGINE_UNBIND, self->edu, -1, -1, 0, 0, 0);
		ASSERT_LT(0, u);
		self->unbinder = u;
		done = wait_for(u, ENGINE_UNBIND_LIMIT_S, &st);
		if (done != 1) {
			late++;
			ksft_print_msg("cycle %d: the unbind of the engine has not returned after %.0f s\n",
				       c, ENGINE_UNBIND_LIMIT_S);
			l.stop = 1;
			ASSERT_EQ(1, wait_for(u, ENGINE_UNBIND_LIMIT_S, &st));
		} else if (now() - tu > worst) {
			worst = now() - tu;
		}
		self->unbinder = 0;
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			bad_unbind++;
		usleep(100 * 1000 + rnd() % (300 * 1000));
		ASSERT_EQ(0, ensure_bound(IMPORTER_DRV, self->edu));
	}
	usleep(300 * 1000);
	l.stop = 1;
	pthread_join(t, NULL);
	ksft_print_msg("H3 import loop vs engine unbind: %d unbind/bind cycles in %.1f s (slowest "
		       "unbind %.2f s); %lu iterations: %lu imports, %lu refused with ENODEV, %lu "
		       "copies, %lu copies stopped with ENODEV, %lu releases, %lu opens refused "
		       "while unbound; %lu undocumented results (last: %s %s)\n", cycles,
		       now() - t0, worst, l.iters, l.imported, l.import_enodev, l.copies,
		       l.copy_enodev, l.releases, l.opens_refused, l.bad,
		       l.bad ? l.last_bad_what : "-", l.bad ? strerror(l.last_bad) : "");
	EXPECT_EQ(0UL, l.bad);
	EXPECT_EQ(0UL, late);
	EXPECT_EQ(0UL, bad_unbind);
	EXPECT_LT(0UL, l.imported);
	/* The engine serves new files after all that. */
	close(self->dma);
	self->dma = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, self->dma);
	EXPECT_EQ(0, engine_check(self->dma, self->p2p, 2000));
}

TEST_HARNESS_MAIN

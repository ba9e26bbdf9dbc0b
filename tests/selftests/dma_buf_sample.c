// SPDX-License-Identifier: GPL-2.0
/*
 * The in-tree user of the Rust dma-buf exporter: samples/rust/rust_dma_buf_exporter.rs (series
 * 4, last patch), bound to the lab's ivshmem device in place of p2pbuf_exporter. Its one ioctl
 * and every errno it documents, its refusal of a second device, data through the edu DMA engine
 * (p2pbuf_dma) into and out of its device memory, exhaustion and release, CPU access through
 * mmap and DMA_BUF_IOCTL_SYNC (and the mappings it refuses), and the revoke on unbind, with
 * importers attached, with a CPU mapping, with exports racing the unbind and with opens of its
 * misc device racing it. The device goes back to p2pbuf_exporter after every test.
 *
 * rxe_writes_into_the_bar (series 5, the sample's vmap): a dma-buf memory region of rxe on a
 * buffer of the sample (rxe attaches for CPU access, without a device, and copies through the
 * BAR's kernel mapping the sample gives it); links libibverbs (the LDLIBS line below).
 *
 * Its name makes it run before p2pbuf_dma_large on the engine boot: exporting the whole BAR zeroes
 * it, which would wipe the pattern that p2pbuf_dma_large leaves there for the host's check of the
 * ivshmem backing file (xtask/src/judge/hostcheck.rs).
 */
// LDLIBS: -libverbs

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>
#include <linux/types.h>

#include "kselftest_harness.h"
#include "p2pbuf_test.h"
#include "dma_buf_sample.h"
#include "verbs_pair.h"



/* Modules this test loaded, to unload when it ends. */
static int loaded_sample, loaded_importer, loaded_exporter;

__attribute__((constructor)) static void load_modules(void)
{
	loaded_exporter = p2pbuf_load_module("p2pbuf_exporter");
	loaded_importer = p2pbuf_load_module("p2pbuf_dma");
	loaded_sample = p2pbuf_load_module(SAMPLE);
}

__attribute__((destructor)) static void unload_modules(void)
{
	p2pbuf_unload_module(SAMPLE, loaded_sample);
	p2pbuf_unload_module("p2pbuf_dma", loaded_importer);
	p2pbuf_unload_module("p2pbuf_exporter", loaded_exporter);
}


/* DMA_BUF_IOCTL_SYNC of read/write access, start (start != 0) or end: 0 or -errno. */
static int sample_sync(int fd, int start)
{
	struct dma_buf_sync s = {
		.flags = (start ? DMA_BUF_SYNC_START : DMA_BUF_SYNC_END) | DMA_BUF_SYNC_RW,
	};

	return ioctl(fd, DMA_BUF_IOCTL_SYNC, &s) ? -errno : 0;
}


static sigjmp_buf probe_jmp;
static volatile sig_atomic_t probe_sig;

static void on_probe_fault(int sig)
{
	probe_sig = sig;
	siglongjmp(probe_jmp, 1);
}

/* 0 if reading *p works, else the signal it raised (SIGBUS: a revoked mapping). */
static int probe_read(const volatile uint8_t *p)
{
	struct sigaction sa = { .sa_handler = on_probe_fault }, bus, segv;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &bus);
	sigaction(SIGSEGV, &sa, &segv);
	probe_sig = 0;
	if (sigsetjmp(probe_jmp, 1) == 0)
		(void)*p;
	sigaction(SIGBUS, &bus, NULL);
	sigaction(SIGSEGV, &segv, NULL);
	return probe_sig;
}

FIXTURE(sample)
{
	char pci[64];		/* the ivshmem device */
	unsigned long long bar;	/* its BAR 2's size */
	int dev;		/* /dev/rust-dma-buf-exporter */
	char lent[64];		/* a device lent to the sample by a test, "" if none */
	int lent_bound;		/* it was bound to p2pbuf_dma before */
};

/*
 * Gives a device lent to the sample back: no override, and to p2pbuf_dma if it was bound
 * there. Also from the teardown: a test stopped half-way does not leave the engine without its
 * driver for the tests after it.
 */
static void give_back(struct __test_metadata *_metadata, FIXTURE_DATA(sample) *self)
{
	char path[512];

	if (!self->lent[0])
		return;
	override_path(path, sizeof(path), self->lent);
	EXPECT_EQ(0, sysfs_write(path, "\n"));
	return_device(_metadata, SAMPLE_DRV, self->lent, self->lent_bound ? IMPORTER_DRV : NULL);
	self->lent[0] = 0;
}

/* Moves the ivshmem device from p2pbuf_exporter to the sample. */
FIXTURE_SETUP(sample)
{
	char path[512];
	unsigned long long lo, hi;
	int r;

	self->dev = -1;
	ASSERT_EQ(0, p2pbuf_pci_find("0x1af4", "0x1110", self->pci, sizeof(self->pci)))
		TH_LOG("no ivshmem device in this VM");
	ASSERT_EQ(0, access(SAMPLE_DRV, F_OK))
		TH_LOG(SAMPLE " is not loaded: is CONFIG_SAMPLE_RUST_DMA_BUF_EXPORTER=m built "
		       "and in /lib/modules/p2pbuf?");
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", self->pci);
	ASSERT_EQ(0, p2pbuf_bar_range(path, 2, &lo, &hi));
	self->bar = hi - lo;
	r = lend_device(self->pci, EXPORTER_DRV, SAMPLE_DRV);
	ASSERT_EQ(0, r) TH_LOG("move %s from p2pbuf_exporter to " SAMPLE ": %s", self->pci,
			       strerror(-r));
	self->dev = open(SAMPLE_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, self->dev) TH_LOG(SAMPLE_DEV ": %s", strerror(errno));
}

/* Gives the device back to p2pbuf_exporter, whatever the test left. */
FIXTURE_TEARDOWN(sample)
{
	p2pbuf_close(&self->dev);
	give_back(_metadata, self);
	return_device(_metadata, SAMPLE_DRV, self->pci, EXPORTER_DRV);
}

/* Every errno of the sample's documentation, and nothing handed out on failure. */
TEST_F(sample, bad_arguments)
{
	struct rust_dma_buf_exporter_export e = { .size = PAGE };
	int fd;

	EXPECT_EQ(-EINVAL, sample_export(self->dev, 0, 0));
	EXPECT_EQ(-EINVAL, sample_export(self->dev, PAGE + 1, 0));
	EXPECT_EQ(-EINVAL, sample_export(self->dev, PAGE, 1));
	EXPECT_EQ(-EINVAL, sample_export(self->dev, PAGE, 0x80000000u));
	EXPECT_EQ(-ENOMEM, sample_export(self->dev, self->bar + PAGE, 0));
	EXPECT_EQ(-ENOMEM, sample_export(self->dev, 1ULL << 62, 0));
	EXPECT_ERRNO(EFAULT, ioctl(self->dev, RUST_DMA_BUF_EXPORTER_EXPORT, NULL));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IOWR('|', 0x91, e), &e));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IO('|', 0x90), &e));
	/* After all that, the whole BAR is still free. */
	fd = sample_export(self->dev, self->bar, 0);
	ASSERT_LE(0, fd) TH_LOG("export of the whole BAR: %s", strerror(-fd));
	close(fd);
}

/*
 * The sample drives one device (its misc device's name is fixed): a second device bound to it is
 * refused with EBUSY, and the first goes on working. The lab has one ivshmem, so the second
 * device is the edu engine, moved from p2pbuf_dma with driver_override for the test (the
 * claim is the first thing the sample's probe does: the device is never touched).
 */
TEST_F(sample, second_device_busy)
{
	char edu[64], path[512];
	int r, fd;

	if (p2pbuf_pci_find("0x1234", "0x11e8", edu, sizeof(edu)))
		SKIP(return, "no edu device in this VM");
	snprintf(path, sizeof(path), IMPORTER_DRV "/%s", edu);
	/* Another driver than p2pbuf_dma: not ours to take away. */
	if (has_driver(edu) && access(path, F_OK))
		SKIP(return, "%s is bound to a driver other than p2pbuf_dma", edu);
	snprintf(self->lent, sizeof(self->lent), "%s", edu);
	self->lent_bound = has_driver(edu);
	if (self->lent_bound) {
		r = sysfs_write(IMPORTER_DRV "/unbind", edu);
		ASSERT_EQ(0, r) TH_LOG("unbind %s from p2pbuf_dma: %s", edu, strerror(-r));
	}
	/* The core's own EBUSY (a device that has a driver) must not pass for the sample's. */
	ASSERT_FALSE(has_driver(edu));
	override_path(path, sizeof(path), edu);
	ASSERT_EQ(0, sysfs_write(path, SAMPLE));
	r = sysfs_write(SAMPLE_DRV "/bind", edu);
	/* The engine goes back to its driver before anything is checked. */
	give_back(_metadata, self);
	EXPECT_EQ(-EBUSY, r) TH_LOG("bind of a second device: %s", strerror(-r));
	fd = sample_export(self->dev, PAGE, 0);
	ASSERT_LE(0, fd) TH_LOG("export after the refused bind: %s", strerror(-fd));
	close(fd);
}

static void on_alarm(int sig)
{
	(void)sig;
}

/*
 * A signal while the sample clears a new buffer (the whole BAR: 2 MiB at a time, with a signal
 * check between chunks) ends the export with EINTR when the handler does not restart calls,
 * and hands nothing out: the whole BAR exports again afterwards. With zero() instead of
 * zero_interruptible() the export always completes.
 */
TEST_F(sample, signal_interrupts_the_clear)
{
	struct sigaction sa = { .sa_handler = on_alarm }, old;
	struct itimerval every = { .it_interval = { 0, 500 }, .it_value = { 0, 500 } };
	struct itimerval stop = { 0 };
	int i, fd, interrupted = 0;

	sigemptyset(&sa.sa_mask);
	ASSERT_EQ(0, sigaction(SIGALRM, &sa, &old));
	for (i = 0; i < 10 && !interrupted; i++) {
		ASSERT_EQ(0, setitimer(ITIMER_REAL, &every, NULL));
		fd = sample_export(self->dev, self->bar, 0);
		setitimer(ITIMER_REAL, &stop, NULL);
		if (fd == -EINTR) {
			interrupted = 1;
			continue;
		}
		ASSERT_LE(0, fd) TH_LOG("export under signals: %s", strerror(-fd));
		close(fd);
	}
	sigaction(SIGALRM, &old, NULL);
	EXPECT_TRUE(interrupted) TH_LOG("10 exports of the whole BAR, a signal every 0.5 ms: "
					"none interrupted");
	fd = sample_export(self->dev, self->bar, 0);
	ASSERT_LE(0, fd) TH_LOG("the whole BAR after an interrupted export: %s", strerror(-fd));
	close(fd);
}

/* The whole BAR once, then nothing; closing the buffer gives it all back at once. */
TEST_F(sample, exhaustion_and_release)
{
	int fd, fd2;

	fd = sample_export(self->dev, self->bar, 0);
	ASSERT_LE(0, fd) TH_LOG("export of the whole BAR: %s", strerror(-fd));
	EXPECT_EQ(-ENOMEM, sample_export(self->dev, PAGE, 0));
	close(fd);
	fd2 = sample_export(self->dev, self->bar, 0);
	ASSERT_LE(0, fd2) TH_LOG("the BAR is not free after close: %s", strerror(-fd2));
	close(fd2);
}

/*
 * System memory -> device memory -> system memory through the edu engine, which attaches with
 * peer2peer and can be revoked: the bytes come back. Then the buffer is closed and the whole BAR
 * exported again (so the same memory, whatever the allocator's choice): the bytes written
 * before read as zeros, the sample hands out no stale data.
 */
TEST_F(sample, data_through_the_engine)
{
	struct p2pbuf_buf a = { .fd = -1, .memfd = -1 }, b = { .fd = -1, .memfd = -1 };
	int engine, fd, hd, ha, hb;
	size_t i, bad = 0, nonzero = 0;

	engine = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, engine) TH_LOG(DMA_DEV ": %s", strerror(errno));
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&a, PAGE));
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&b, PAGE));
	ha = dma_import(engine, a.fd);
	ASSERT_LT(0, ha);
	hb = dma_import(engine, b.fd);
	ASSERT_LT(0, hb);
	fd = sample_export(self->dev, self->bar, 0);
	ASSERT_LE(0, fd) TH_LOG("export: %s", strerror(-fd));
	hd = dma_import(engine, fd);
	ASSERT_LT(0, hd) TH_LOG("engine import of the sample's buffer: %s", strerror(-hd));

	for (i = 0; i < PAGE; i++)
		a.map[i] = (uint8_t)(i * 7 + 3) | 1;
	memset(b.map, 0, PAGE);
	ASSERT_EQ((long)PAGE, dma_copy(engine, ha, hd, PAGE));
	ASSERT_EQ((long)PAGE, dma_copy(engine, hd, hb, PAGE));
	for (i = 0; i < PAGE; i++)
		bad += b.map[i] != a.map[i];
	EXPECT_EQ(0UL, bad);

	/* Closed (the engine's handle too), the memory goes back; exported again, it is zeroed. */
	ASSERT_EQ(0, dma_release(engine, hd));
	close(fd);
	fd = sample_export(self->dev, self->bar, 0);
	ASSERT_LE(0, fd) TH_LOG("export again: %s", strerror(-fd));
	hd = dma_import(engine, fd);
	ASSERT_LT(0, hd);
	memset(b.map, 0xa5, PAGE);
	ASSERT_EQ((long)PAGE, dma_copy(engine, hd, hb, PAGE));
	for (i = 0; i < PAGE; i++)
		nonzero += b.map[i] != 0;
	EXPECT_EQ(0UL, nonzero) TH_LOG("a new buffer holds stale data");

	close(engine);
	close(fd);
	p2pbuf_buf_free(&a);
	p2pbuf_buf_free(&b);
}

/*
 * Unbind with the engine attached and a dma-buf fd and the misc device still open: the
 * importer is revoked (its copies fail with ENODEV), a new import is refused, the open misc
 * device exports nothing, and the device goes back to p2pbuf_exporter.
 */
TEST_F(sample, unbind_revokes)
{
	struct p2pbuf_buf s = { .fd = -1, .memfd = -1 };
	int engine, fd, hd, hs, r;

	engine = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, engine) TH_LOG(DMA_DEV ": %s", strerror(errno));
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&s, PAGE));
	fd = sample_export(self->dev, PAGE, 0);
	ASSERT_LE(0, fd);
	hd = dma_import(engine, fd);
	ASSERT_LT(0, hd);
	hs = dma_import(engine, s.fd);
	ASSERT_LT(0, hs);
	ASSERT_EQ((long)PAGE, dma_copy(engine, hs, hd, PAGE));

	r = sysfs_write(SAMPLE_DRV "/unbind", self->pci);
	ASSERT_EQ(0, r) TH_LOG("unbind: %s", strerror(-r));
	EXPECT_EQ(-ENODEV, dma_copy(engine, hs, hd, PAGE));
	EXPECT_EQ(-ENODEV, dma_copy(engine, hd, hs, PAGE));
	/* Releasing the revoked handle works; importing the buffer again is refused. */
	EXPECT_EQ(0, dma_release(engine, hd));
	EXPECT_EQ(-ENODEV, dma_import(engine, fd));
	EXPECT_EQ(-ENODEV, sample_export(self->dev, PAGE, 0));
	EXPECT_ERRNO(ENOENT, open(SAMPLE_DEV, O_RDWR | O_CLOEXEC));

	close(engine);
	close(fd);
	p2pbuf_buf_free(&s);
}

/*
 * CPU access: a fresh buffer maps as zeroes, what the CPU writes between DMA_BUF_IOCTL_SYNC
 * start and end reads back, through the same mapping and through a second one at an offset
 * (the fault handler inserts the page at the mapping's offset into the buffer).
 */
TEST_F(sample, mmap_and_sync)
{
	size_t len = 4 * PAGE, i, nonzero = 0, bad = 0;
	uint8_t *m, *m2;
	int fd;

	fd = sample_export(self->dev, len, 0);
	ASSERT_LE(0, fd) TH_LOG("export: %s", strerror(-fd));
	m = sample_mmap(fd, len, 0);
	ASSERT_NE(NULL, m) TH_LOG("mmap: %s", strerror(errno));
	for (i = 0; i < len; i++)
		nonzero += m[i] != 0;
	EXPECT_EQ(0UL, nonzero) TH_LOG("a new buffer maps stale data");

	EXPECT_EQ(0, sample_sync(fd, 1));
	for (i = 0; i < len; i++)
		m[i] = (uint8_t)(i * 13 + 5) | 1;
	EXPECT_EQ(0, sample_sync(fd, 0));
	for (i = 0; i < len; i++)
		bad += m[i] != ((uint8_t)(i * 13 + 5) | 1);
	EXPECT_EQ(0UL, bad);

	m2 = sample_mmap(fd, PAGE, 2 * PAGE);
	ASSERT_NE(NULL, m2) TH_LOG("mmap at an offset: %s", strerror(errno));
	EXPECT_EQ(0, memcmp(m2, m + 2 * PAGE, PAGE));
	m2[7] ^= 0xff;
	EXPECT_EQ(m2[7], m[2 * PAGE + 7]);

	munmap(m2, PAGE);
	munmap(m, len);
	close(fd);
}

/*
 * The mapping is the device memory: what the CPU writes into it, the edu engine copies out of
 * the BAR, and what the engine copies into the BAR, the CPU reads.
 */
TEST_F(sample, mmap_is_the_bar)
{
	struct p2pbuf_buf s = { .fd = -1, .memfd = -1 };
	int engine, fd, hd, hs;
	size_t i, bad = 0;
	uint8_t *m;

	engine = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, engine) TH_LOG(DMA_DEV ": %s", strerror(errno));
	ASSERT_EQ(0, p2pbuf_udmabuf_alloc(&s, PAGE));
	hs = dma_import(engine, s.fd);
	ASSERT_LT(0, hs);
	fd = sample_export(self->dev, PAGE, 0);
	ASSERT_LE(0, fd) TH_LOG("export: %s", strerror(-fd));
	hd = dma_import(engine, fd);
	ASSERT_LT(0, hd) TH_LOG("engine import of the sample's buffer: %s", strerror(-hd));
	m = sample_mmap(fd, PAGE, 0);
	ASSERT_NE(NULL, m) TH_LOG("mmap: %s", strerror(errno));

	ASSERT_EQ(0, sample_sync(fd, 1));
	for (i = 0; i < PAGE; i++)
		m[i] = (uint8_t)(i * 7 + 3) | 1;
	ASSERT_EQ(0, sample_sync(fd, 0));
	memset(s.map, 0, PAGE);
	ASSERT_EQ((long)PAGE, dma_copy(engine, hd, hs, PAGE));
	for (i = 0; i < PAGE; i++)
		bad += s.map[i] != m[i];
	EXPECT_EQ(0UL, bad) TH_LOG("the engine does not see what the CPU wrote");

	for (i = 0; i < PAGE; i++)
		s.map[i] = (uint8_t)(i * 11 + 1) | 2;
	ASSERT_EQ((long)PAGE, dma_copy(engine, hs, hd, PAGE));
	ASSERT_EQ(0, sample_sync(fd, 1));
	bad = 0;
	for (i = 0; i < PAGE; i++)
		bad += m[i] != s.map[i];
	EXPECT_EQ(0UL, bad) TH_LOG("the CPU does not see what the engine wrote");
	EXPECT_EQ(0, sample_sync(fd, 0));

	munmap(m, PAGE);
	EXPECT_EQ(0, dma_release(engine, hd));
	close(engine);
	close(fd);
	p2pbuf_buf_free(&s);
}

/*
 * The mappings that are refused, all with EINVAL: beyond the buffer's end (the dma-buf core's
 * check, before the sample is asked), and private (the sample's).
 */
TEST_F(sample, mmap_refused)
{
	uint8_t *m;
	void *p;
	int fd;

	fd = sample_export(self->dev, 2 * PAGE, 0);
	ASSERT_LE(0, fd) TH_LOG("export: %s", strerror(-fd));
	errno = 0;
	EXPECT_EQ(NULL, sample_mmap(fd, 3 * PAGE, 0));
	EXPECT_EQ(EINVAL, errno);
	errno = 0;
	EXPECT_EQ(NULL, sample_mmap(fd, 2 * PAGE, PAGE));
	EXPECT_EQ(EINVAL, errno);
	errno = 0;
	EXPECT_EQ(NULL, sample_mmap(fd, PAGE, 2 * PAGE));
	EXPECT_EQ(EINVAL, errno);
	p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	EXPECT_EQ(MAP_FAILED, p);
	EXPECT_EQ(EINVAL, errno);
	if (p != MAP_FAILED)
		munmap(p, PAGE);
	/* The last page, exactly: fits. */
	m = sample_mmap(fd, PAGE, PAGE);
	ASSERT_NE(NULL, m) TH_LOG("mmap of the last page: %s", strerror(errno));
	EXPECT_EQ(0, probe_read(m));
	munmap(m, PAGE);
	close(fd);
}

/*
 * Unbind with the buffer mapped, one page touched and one not: the revoke zaps the mapping, so
 * both pages raise SIGBUS, DMA_BUF_IOCTL_SYNC fails with ENODEV (the memory is back in the
 * pool) and a new mapping is refused with ENODEV.
 */
TEST_F(sample, unbind_revokes_mappings)
{
	uint8_t *m;
	int fd, r;

	fd = sample_export(self->dev, 2 * PAGE, 0);
	ASSERT_LE(0, fd) TH_LOG("export: %s", strerror(-fd));
	m = sample_mmap(fd, 2 * PAGE, 0);
	ASSERT_NE(NULL, m) TH_LOG("mmap: %s", strerror(errno));
	ASSERT_EQ(0, sample_sync(fd, 1));
	m[0] = 0x5a;
	ASSERT_EQ(0, probe_read(m));
	ASSERT_EQ(0, sample_sync(fd, 0));

	r = sysfs_write(SAMPLE_DRV "/unbind", self->pci);
	ASSERT_EQ(0, r) TH_LOG("unbind: %s", strerror(-r));
	EXPECT_EQ(SIGBUS, probe_read(m)) TH_LOG("the touched page is still mapped after unbind");
	EXPECT_EQ(SIGBUS, probe_read(m + PAGE)) TH_LOG("an untouched page faulted in after unbind");
	EXPECT_EQ(-ENODEV, sample_sync(fd, 1));
	EXPECT_EQ(-ENODEV, sample_sync(fd, 0));
	errno = 0;
	EXPECT_EQ(NULL, sample_mmap(fd, PAGE, 0));
	EXPECT_EQ(ENODEV, errno);

	munmap(m, 2 * PAGE);
	close(fd);
}

struct exporter_thread {
	int dev;
	volatile int stop;
	volatile int n;		/* exports so far */
	int fds[256];		/* the first 256 of them, kept open */
	int enodev;		/* the loop ended on ENODEV (the unbind), not on stop */
	int err;		/* the first errno other than ENODEV */
};

/* Exports until the unbind makes it fail (ENODEV), another error, or stop. */
static void *export_loop(void *arg)
{
	struct exporter_thread *t = arg;

	while (!t->stop) {
		int fd = sample_export(t->dev, PAGE, 0);

		if (fd == -ENODEV) {
			t->enodev = 1;
			break;
		}
		if (fd < 0) {
			t->err = -fd;
			break;
		}
		if (t->n < 256)
			t->fds[t->n] = fd;
		else
			close(fd);
		t->n++;
	}
	return NULL;
}

/* Waits up to 10 s until *count is positive: the thread is running before the unbind. */
static int wait_started(volatile int *count)
{
	int i;

	for (i = 0; i < 10000 && *count <= 0; i++)
		usleep(1000);
	return *count > 0;
}

/*
 * Exports racing the unbind: whatever was exported before, during or after the unbind is
 * revoked (an import of each fails with ENODEV), and the exporting thread only ever sees
 * ENODEV.
 */
TEST_F(sample, exports_racing_unbind)
{
	struct exporter_thread t = { .dev = self->dev };
	int engine, i, r, refused = 0;
	pthread_t th;

	engine = open(DMA_DEV, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, engine) TH_LOG(DMA_DEV ": %s", strerror(errno));
	ASSERT_EQ(0, pthread_create(&th, NULL, export_loop, &t));
	EXPECT_TRUE(wait_started(&t.n));
	r = sysfs_write(SAMPLE_DRV "/unbind", self->pci);
	/* The thread's next export after the unbind fails: give it the time for one. */
	for (i = 0; i < 5000 && !t.enodev && !t.err; i++)
		usleep(1000);
	t.stop = 1;
	ASSERT_EQ(0, pthread_join(th, NULL));
	ASSERT_EQ(0, r) TH_LOG("unbind: %s", strerror(-r));
	EXPECT_EQ(0, t.err) TH_LOG("export failed with %s", strerror(t.err));
	EXPECT_TRUE(t.enodev) TH_LOG("the exports did not end with ENODEV after the unbind");
	TH_LOG("%d buffers exported before the unbind", t.n);
	for (i = 0; i < t.n && i < 256; i++) {
		refused += dma_import(engine, t.fds[i]) == -ENODEV;
		close(t.fds[i]);
	}
	EXPECT_EQ(t.n < 256 ? t.n : 256, refused);
	close(engine);
}

struct opener_thread {
	volatile int stop;
	volatile int opened;
	int exported;
	int err;	/* the first unexpected errno */
};

static void *open_loop(void *arg)
{
	struct opener_thread *t = arg;

	while (!t->stop) {
		int dev = open(SAMPLE_DEV, O_RDWR | O_CLOEXEC);
		int fd;

		if (dev < 0) {
			/* The node goes with the misc device; ENODEV while it is going. */
			if (errno != ENOENT && errno != ENODEV)
				t->err = errno;
			break;
		}
		t->opened++;
		fd = sample_export(dev, PAGE, 0);
		if (fd >= 0) {
			t->exported++;
			close(fd);
		} else if (fd != -ENODEV) {
			t->err = -fd;
		}
		close(dev);
		if (t->err)
			break;
	}
	return NULL;
}

/*
 * Opens of the misc device racing the unbind, which deregisters it: open finds the device's
 * state through the registration (container_of), so it must never run on a half-dropped
 * device (KASAN would report it). Every open either works, and its export works or gives
 * ENODEV, or fails with ENOENT/ENODEV.
 */
TEST_F(sample, opens_racing_unbind)
{
	struct opener_thread t = { 0 };
	pthread_t th;
	int r;

	ASSERT_EQ(0, pthread_create(&th, NULL, open_loop, &t));
	EXPECT_TRUE(wait_started(&t.opened));
	r = sysfs_write(SAMPLE_DRV "/unbind", self->pci);
	usleep(20 * 1000);
	t.stop = 1;
	ASSERT_EQ(0, pthread_join(th, NULL));
	ASSERT_EQ(0, r) TH_LOG("unbind: %s", strerror(-r));
	TH_LOG("%d opens, %d exports before the device went", t.opened, t.exported);
	EXPECT_EQ(0, t.err) TH_LOG("unexpected %s", strerror(t.err));
	EXPECT_LT(0, t.opened);
}

/*
 * rxe on the sample's memory: a dma-buf memory region of a sample buffer takes an RDMA WRITE,
 * which lands in the BAR (read back through the buffer's mmap); once the unbind has revoked
 * the buffer, a write into the same region is refused and the region still deregisters.
 * rxe attaches for CPU access (dma_buf_cpu_attach(), no device): the abstraction accepts that
 * for exporters with a vmap, which is the sample's since series 5 (without it
 * ibv_reg_dmabuf_mr fails).
 */
TEST_F_TIMEOUT(sample, rxe_writes_into_the_bar, 120)
{
	const uint32_t len = 8192;
	struct ibv_context *ctx = verbs_first_device();
	struct ibv_mr *mr, *src_mr;
	struct verbs_qp_pair p;
	struct ibv_pd *pd;
	uint8_t *src, *map;
	int fd, st, r;

	if (!ctx)
		SKIP(return, "no RDMA device (and no rxe0 on eth0)");
	pd = ibv_alloc_pd(ctx);
	ASSERT_NE(NULL, pd) TH_LOG("ibv_alloc_pd: %s", strerror(errno));
	fd = sample_export(self->dev, 16 * PAGE, 0);
	ASSERT_LE(0, fd) TH_LOG("export: %s", strerror(-fd));
	mr = ibv_reg_dmabuf_mr(pd, 0, 16 * PAGE, 0, fd,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_dmabuf_mr of the sample's buffer: %s", strerror(errno));
	src = malloc(len);
	ASSERT_NE(NULL, src);
	for (uint32_t i = 0; i < len; i++)
		src[i] = (uint8_t)(i * 13 + 5);
	src_mr = ibv_reg_mr(pd, src, len, IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(NULL, src_mr) TH_LOG("ibv_reg_mr: %s", strerror(errno));
	ASSERT_EQ(0, verbs_qp_pair_create(pd, &p)) TH_LOG("two RC QPs: %s", strerror(errno));

	st = verbs_post_write(&p, src_mr, len, mr->rkey) ? -2 : verbs_poll_status(&p, 30);
	EXPECT_EQ(IBV_WC_SUCCESS, st) TH_LOG("RDMA WRITE into the sample's buffer: %s",
					     st == -2 ? strerror(errno) : verbs_wc_str(st));
	map = sample_mmap(fd, len, 0);
	ASSERT_NE(NULL, map) TH_LOG("mmap: %s", strerror(errno));
	EXPECT_EQ(0, memcmp(map, src, len)) TH_LOG("the BAR does not hold what rxe wrote");
	munmap(map, len);

	r = sysfs_write(SAMPLE_DRV "/unbind", self->pci);
	ASSERT_EQ(0, r) TH_LOG("unbind: %s", strerror(-r));
	st = verbs_post_write(&p, src_mr, len, mr->rkey) ? -2 : verbs_poll_status(&p, 30);
	EXPECT_NE(IBV_WC_SUCCESS, st) TH_LOG("an RDMA WRITE into the revoked buffer's region");
	EXPECT_NE(-1, st) TH_LOG("no completion within 30 s for the write after the unbind");
	TH_LOG("after the unbind: %s", st == -2 ? strerror(errno) : verbs_wc_str(st));
	verbs_qp_pair_destroy(&p);
	EXPECT_EQ(0, ibv_dereg_mr(mr)) TH_LOG("ibv_dereg_mr of the revoked region: %s",
					      strerror(errno));
	ibv_dereg_mr(src_mr);
	free(src);
	close(fd);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
}

TEST_HARNESS_MAIN

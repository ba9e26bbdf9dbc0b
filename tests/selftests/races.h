/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers shared by the race tests (races_*.c: the exporter, p2pbuf_dma_races.c: the DMA engine):
 * time budgets, sysfs bind/unbind with a time limit, the provider's pool as the kernel counts
 * it, CPU pinning and real-time priority (to place a preemption inside a kernel window), and
 * a SIGBUS probe that works in any thread.
 */
#ifndef P2PBUF_RACES_H
#define P2PBUF_RACES_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/dma-buf.h>

#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

#define RACES_HELPER static __attribute__((unused))

#define PAGE 4096UL
#define P2P_DEV "/dev/p2pbuf"
/* The emulated GPU memory (QEMU ivshmem-plain), PCI vendor and device. */
#define IVSHMEM_VENDOR "0x1af4"
#define IVSHMEM_DEVICE "0x1110"
#define DMA_DEV "/dev/p2pbuf-dma"
#define EXPORTER_DRV "/sys/bus/pci/drivers/p2pbuf_exporter"
#define IMPORTER_DRV "/sys/bus/pci/drivers/p2pbuf_dma"

/* How long an unbind may take before the test calls it hung (the hung-task detector of the
 * lab kernel fires at 30 s; the tests release what an unbind waits for before that). */
#define UNBIND_LIMIT_S 20.0

/* The real-time priority of the racing side that must preempt the other. */
#define RT_PRIO 10

/* An fd the helper children must not inherit (a sw_sync timeline: a child holding it would keep
 * the fence it waits for from ever being signalled by the timeline's release); -1: none. */
static int races_child_close_fd __attribute__((unused)) = -1;

/*
 * Seconds of racing per test phase: 12 by default, p2pbuf.races_s=N on the kernel command line
 * (cargo xtask test --append p2pbuf.races_s=N) for longer runs. Every test stops at its budget
 * or its iteration cap, whichever comes first, and prints how many iterations ran.
 */
RACES_HELPER double races_s(void)
{
	static double v;

	if (!v)
		v = (double)cmdline_ul("races_s", 12);
	return v;
}

/* xorshift64*, per thread, seeded by the caller. */
static __thread uint64_t rng_state __attribute__((unused)) = 0x9e3779b97f4a7c15ULL;

RACES_HELPER void rnd_seed(uint64_t s)
{
	rng_state = s | 1;
}

RACES_HELPER uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ULL;
}

/* A decimal number from a sysfs or debugfs file, or -1. */
RACES_HELPER long long sysfs_ll(const char *path)
{
	char buf[64];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	return strtoll(buf, NULL, 0);
}

/*
 * Bytes free in the p2pdma pool of PCI device pci (/sys/bus/pci/devices/<pci>/p2pmem/
 * available, gen_pool_avail() of the pool): the kernel's own count, which no ioctl of the
 * exporter updates or prunes. -1 if there is no pool (the device is not bound).
 */
RACES_HELPER long long pool_avail(const char *pci)
{
	char path[256];

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/p2pmem/available", pci);
	return sysfs_ll(path);
}

RACES_HELPER int p2p_provider(int p2p, struct p2pbuf_provider_info *p)
{
	return p2pbuf_first_provider_info(p2p, p) ? -errno : 0;
}

/* Free bytes of the first bound provider as PROVIDER_INFO reports them, or -errno. */
RACES_HELPER long long provider_free(int p2p)
{
	struct p2pbuf_provider_info p;
	int r = p2p_provider(p2p, &p);

	return r ? r : (long long)p.free;
}

/*
 * In a teardown: whatever the test did, the provider's memory is all back (free0, as the
 * first bound provider counts it, and avail0, as the p2pmem pool of pool_pci counts it).
 */
RACES_HELPER void expect_memory_back(struct __test_metadata *_metadata, int p2p,
				     const char *pool_pci, long long free0, long long avail0)
{
	EXPECT_EQ(free0, provider_free(p2p));
	EXPECT_EQ(avail0, pool_avail(pool_pci));
}

/*
 * A buffer of len bytes with ALLOC flags (P2PBUF_ALLOC_UNINITIALIZED dropped when the caller
 * lacks CAP_SYS_RAWIO), mapped shared; when bar is not NULL, its range of the BAR is mapped
 * read-only through res (the BAR's sysfs resource file). 0, or -errno with b empty.
 */
RACES_HELPER int p2p_buf_open(int p2p, int res, size_t len, __u32 flags, struct p2pbuf_buf *b,
			      const volatile uint64_t **bar)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = len, .flags = flags };
	void *v;

	memset(b, 0, sizeof(*b));
	b->fd = b->memfd = -1;
	if (p2pbuf_test_alloc(p2p, &a)) {
		if (errno != EPERM || !(flags & P2PBUF_ALLOC_UNINITIALIZED))
			return -errno;
		a.flags &= ~P2PBUF_ALLOC_UNINITIALIZED;
		if (p2pbuf_test_alloc(p2p, &a))
			return -errno;
	}
	b->fd = a.fd;
	b->bar_offset = a.offset;
	b->size = len;
	b->what = "device";
	b->map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
	if (b->map == MAP_FAILED)
		goto fail;
	if (bar) {
		v = mmap(NULL, len, PROT_READ, MAP_SHARED, res, (off_t)a.offset);
		if (v == MAP_FAILED)
			goto fail;
		*bar = v;
	}
	return 0;
fail:
	a.fd = -errno;
	p2pbuf_buf_free(b);
	return a.fd;
}

RACES_HELPER int p2p_revoke(int p2p, int fd)
{
	struct p2pbuf_revoke r = { .size = sizeof(r), .fd = fd };

	return ioctl(p2p, P2PBUF_IOCTL_REVOKE, &r) ? -errno : 0;
}

/* Whether pci is bound to the driver whose sysfs directory is drv. */
RACES_HELPER int is_bound(const char *drv, const char *pci)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", drv, pci);
	return access(path, F_OK) == 0;
}

/*
 * Binds pci to drv unless it is bound; waits (up to 40 s) for an unbind in flight, whose
 * device lock the bind write waits for. 0 when bound, else -errno of the last bind write.
 */
RACES_HELPER int ensure_bound(const char *drv, const char *pci)
{
	char path[512];
	double end = now() + 40;
	int r = 0;

	snprintf(path, sizeof(path), "%s/bind", drv);
	while (!is_bound(drv, pci)) {
		if (now() > end)
			return r ? r : -ETIMEDOUT;
		r = sysfs_write(path, pci);
		if (!is_bound(drv, pci))
			usleep(100 * 1000);
	}
	return 0;
}

/*
 * In a fixture's setup: the emulated GPU memory (ivshmem-plain) into pci (len bytes), bound to
 * the exporter (again, if a test before failed to rebind it), and /dev/p2pbuf opened into *p2p;
 * with `prov`, the first provider's PROVIDER_INFO into it, which must be that device's. NULL, or
 * why the boot cannot run the test (a SKIP reason).
 */
RACES_HELPER const char *exporter_ready(struct __test_metadata *_metadata, char *pci,
					size_t len, int *p2p, struct p2pbuf_provider_info *prov)
{
	static char why[128];
	int r;

	if (p2pbuf_pci_find(IVSHMEM_VENDOR, IVSHMEM_DEVICE, pci, len))
		return "no ivshmem-plain device (the emulated GPU memory) on this boot";
	if (access(EXPORTER_DRV, F_OK))
		return "p2pbuf_exporter is not loaded";
	r = ensure_bound(EXPORTER_DRV, pci);
	ASSERT_EQ(0, r) TH_LOG("bind %s to p2pbuf_exporter: %s", pci, strerror(-r));
	*p2p = open(P2P_DEV, O_RDWR | O_CLOEXEC);
	if (*p2p < 0) {
		snprintf(why, sizeof(why), "no %s: %s", P2P_DEV, strerror(errno));
		return why;
	}
	if (prov) {
		ASSERT_EQ(0, p2p_provider(*p2p, prov));
		ASSERT_STREQ(pci, prov->pci_name);
	}
	return NULL;
}

/*
 * Waits up to secs for child pid. 1: it ended (*status set), 0: still running, -1: error.
 */
RACES_HELPER int wait_for(pid_t pid, double secs, int *status)
{
	double end = now() + secs;

	for (;;) {
		pid_t r = waitpid(pid, status, WNOHANG);

		if (r == pid)
			return 1;
		if (r < 0 && errno != EINTR)
			return -1;
		if (now() > end)
			return 0;
		usleep(2000);
	}
}

/* Pins the calling thread to one CPU. */
RACES_HELPER int pin_cpu(int cpu)
{
	cpu_set_t s;

	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	return sched_setaffinity(0, sizeof(s), &s);
}

/* The calling thread becomes SCHED_FIFO at prio (0: back to SCHED_OTHER). */
RACES_HELPER int set_fifo(int prio)
{
	struct sched_param sp = { .sched_priority = prio };

	return sched_setscheduler(0, prio ? SCHED_FIFO : SCHED_OTHER, &sp);
}

RACES_HELPER int ncpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n > 0 ? (int)n : 1;
}

/* Sleeps ns nanoseconds (the lab kernel has no high-resolution timers: at least to the next
 * tick, 4 ms at HZ=250). */
RACES_HELPER void sleep_ns(long ns)
{
	struct timespec ts = { .tv_sec = ns / 1000000000L, .tv_nsec = ns % 1000000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

RACES_HELPER void spin(unsigned long n)
{
	for (volatile unsigned long i = 0; i < n; i++)
		;
}

/* Busy-loop iterations per second of spin() on this machine. */
RACES_HELPER double spin_rate(void)
{
	double t0 = now(), dt;

	spin(2000000);
	dt = now() - t0;
	return dt > 0 ? 2000000 / dt : 1e9;
}

/*
 * The fault probe: reads one byte and tells whether it faulted. Works in any thread (per-thread
 * jump buffer); a fault outside a probe kills the process as usual.
 */
static __thread sigjmp_buf probe_jmp __attribute__((unused));
static __thread volatile sig_atomic_t probing __attribute__((unused));
static __thread volatile sig_atomic_t probe_sig __attribute__((unused));

RACES_HELPER void on_fault(int sig)
{
	if (probing) {
		probe_sig = sig;
		siglongjmp(probe_jmp, 1);
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

RACES_HELPER void install_fault_handlers(void)
{
	struct sigaction sa = { .sa_handler = on_fault };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);
}

/* 0 if reading *p succeeded (the memory is reachable), else the signal it raised. */
RACES_HELPER int probe_read(const volatile uint8_t *p)
{
	probe_sig = 0;
	probing = 1;
	if (sigsetjmp(probe_jmp, 1) == 0)
		(void)*p;
	probing = 0;
	return probe_sig;
}

/*
 * Forks a child that writes val to path (a driver's bind or unbind file) once it reads a byte
 * from go_fd (-1: at once), after sleeping delay_ns (RT: pinned to cpu at SCHED_FIFO
 * RT_PRIO, so that it preempts whatever runs there) or spinning spins iterations (cpu < 0:
 * not pinned). Exit code: 0, or the errno of the write.
 */
RACES_HELPER pid_t sysfs_write_child(const char *path, const char *val, int go_fd, int cpu,
				     int rt, long delay_ns, unsigned long spins)
{
	pid_t pid = fork();

	if (pid != 0)
		return pid;
	if (races_child_close_fd >= 0)
		close(races_child_close_fd);
	if (cpu >= 0)
		pin_cpu(cpu);
	if (rt)
		set_fifo(RT_PRIO);
	if (go_fd >= 0) {
		char c;

		if (read(go_fd, &c, 1) < 0)
			_exit(100);
	}
	if (delay_ns > 0)
		sleep_ns(delay_ns);
	spin(spins);
	_exit(-sysfs_write(path, val));
}

/* ---- A fence that userspace controls (CONFIG_SW_SYNC) ----------------------------------- */

#define SW_SYNC_PATH "/sys/kernel/debug/sync/sw_sync"

struct sw_sync_create_fence_data {
	__u32 value;
	char name[32];
	__s32 fence;
};

#define SW_SYNC_IOC_CREATE_FENCE _IOWR('W', 0, struct sw_sync_create_fence_data)
#define SW_SYNC_IOC_INC _IOW('W', 1, __u32)

/*
 * Puts an unsignalled fence (a sw_sync point) into the reservation object of buf_fd as a
 * write: REVOKE then waits in dma_resv_wait_timeout() until the test signals it (with the
 * buffer's reservation lock held before the fix of review finding N7). Returns the timeline fd
 * (closing it signals the fence too), or -errno.
 */
RACES_HELPER int plant_fence(int buf_fd)
{
	struct sw_sync_create_fence_data d = { .value = 1, .name = "p2pbuf-races" };
	struct dma_buf_import_sync_file imp = { .flags = DMA_BUF_SYNC_WRITE };
	int tl = open(SW_SYNC_PATH, O_RDWR | O_CLOEXEC), e;

	if (tl < 0)
		return -errno;
	if (ioctl(tl, SW_SYNC_IOC_CREATE_FENCE, &d)) {
		e = -errno;
		close(tl);
		return e;
	}
	imp.fd = d.fence;
	if (ioctl(buf_fd, DMA_BUF_IOCTL_IMPORT_SYNC_FILE, &imp)) {
		e = -errno;
		close(d.fence);
		close(tl);
		return e;
	}
	close(d.fence);
	return tl;
}

/*
 * In a test: tl = plant_fence(buf_fd); the test is skipped on a kernel without sw_sync (closing
 * buf_fd first if close_on_skip), and fails on any other error.
 */
#define PLANT_FENCE_OR_SKIP(tl, buf_fd, close_on_skip) do {					\
	(tl) = plant_fence(buf_fd);								\
	if ((tl) == -ENOENT) {									\
		if (close_on_skip)								\
			close(buf_fd);								\
		SKIP(return, "no %s (CONFIG_SW_SYNC=n): no fence that userspace controls",	\
		     SW_SYNC_PATH);								\
	}											\
	ASSERT_LE(0, (tl)) TH_LOG("plant a fence: %s", strerror(-(tl)));			\
} while (0)

RACES_HELPER void fence_signal(int tl)
{
	__u32 one = 1;

	ioctl(tl, SW_SYNC_IOC_INC, &one);
}

#endif /* P2PBUF_RACES_H */

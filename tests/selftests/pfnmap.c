// SPDX-License-Identifier: GPL-2.0
/*
 * P2PBUF_ALLOC_PFNMAP (issue 27, item 3): a buffer whose userspace mapping is I/O memory without
 * struct pages (VM_IO | VM_PFNMAP, filled at fault time with vmf_insert_pfn(), as vfio-pci maps
 * BARs), for drivers that resolve I/O memory by PFN (cudaHostRegister with
 * cudaHostRegisterIoMemory: a GPU reaching an FPGA's BAR without /dev/mem).
 *
 * maps_as_io_memory: smaps shows VmFlags "io" and "pf" (and not "mm", which the default
 * mapping of struct pages shows, checked side by side); bytes written through the mapping are
 * in the BAR at the ALLOC offset (read through the BAR's sysfs resource file), and debugfs says
 * "cpu mapping pfn" with the pages faulted in.
 * private_mapping_refused: MAP_PRIVATE (copy-on-write, which VM_PFNMAP cannot do) is EINVAL.
 * odirect_refused: O_DIRECT reads into and writes from the mapping fail with EFAULT (nothing
 * can pin it), and neither the BAR nor the drive changes. (Plain ibv_reg_mr() of the mapping:
 * verbs_dmabuf_mr.c, which links libibverbs.)
 * revoke_is_a_zap: after REVOKE the CPU gets SIGBUS at once, in this process and in a child
 * that inherited the mapping by fork(); a new mmap is ENODEV; the memory goes back to the pool
 * when the fd is closed.
 * zeroed_without_uninitialized: without P2PBUF_ALLOC_UNINITIALIZED the mapping reads zeros.
 *
 * Its buffers come first-fit from the start of the BAR and it runs before rdma_7_peermem.sh
 * (alphabetical order), which leaves the bytes at BAR offset 0 for the host check; the BAR
 * regions other tests leave for the host (1/2, 5/8, 3/4 of the BAR, 4 MiB below its end) are
 * far above its 1 MiB buffers.
 */
#include <stddef.h>
#include <linux/fs.h>

#include "kselftest_harness.h"
#include "races.h"

#define MIB (1UL << 20)
#define LEN MIB
#define BUFFERS "/sys/kernel/debug/p2pbuf/buffers"
/* Where odirect_refused reads from and would write to: odirect_revoke.c's drive region. */
#define DRIVE_OFF (256 * MIB)

FIXTURE(pfnmap)
{
	int p2p, res;
	char pci[64];
	long long free0, avail0;
};

FIXTURE_SETUP(pfnmap)
{
	struct p2pbuf_provider_info p;
	char path[128];
	const char *why;

	self->p2p = self->res = -1;
	why = exporter_ready(_metadata, self->pci, sizeof(self->pci), &self->p2p, NULL);
	if (why)
		SKIP(return, "%s", why);
	ASSERT_EQ(0, p2p_provider(self->p2p, &p));
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource%u", p.pci_name, p.bar);
	self->res = open(path, O_RDONLY | O_CLOEXEC);
	if (self->res < 0)
		SKIP(return, "no BAR resource file %s: %s", path, strerror(errno));
	self->free0 = provider_free(self->p2p);	/* also forgets released buffers */
	self->avail0 = pool_avail(self->pci);
	install_fault_handlers();
}

FIXTURE_TEARDOWN(pfnmap)
{
	p2pbuf_close(&self->res);
	if (self->p2p >= 0) {
		expect_memory_back(_metadata, self->p2p, self->pci, self->free0, self->avail0);
		close(self->p2p);
	}
}

/* A buffer of LEN with flags, mapped; its BAR range too when bar is not NULL. 0 or -errno. */
static int pfn_buf(FIXTURE_DATA(pfnmap) *self, struct p2pbuf_buf *b, __u32 flags,
		   const volatile uint64_t **bar)
{
	return p2p_buf_open(self->p2p, self->res, LEN, flags, b, bar);
}

/* The VmFlags line of the mapping that starts at addr, from /proc/self/smaps; 0 or -1. */
static int vm_flags(const void *addr, char *out, size_t len)
{
	char line[512], want[32];
	int in = 0, found = -1;
	FILE *f = fopen("/proc/self/smaps", "r");

	if (!f)
		return -1;
	snprintf(want, sizeof(want), "%lx-", (unsigned long)addr);
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, want, strlen(want)))
			in = 1;
		else if (in && !strncmp(line, "VmFlags:", 8)) {
			snprintf(out, len, "%s", line + 8);
			found = 0;
			break;
		}
	}
	fclose(f);
	return found;
}

/* Whether the VmFlags line has the two-letter flag f (words are separated by spaces). */
static int has_flag(const char *flags, const char *f)
{
	char w[8];

	snprintf(w, sizeof(w), " %s", f);
	for (const char *p = flags; (p = strstr(p, w)); p += 3)
		if (p[3] == ' ' || p[3] == '\n' || p[3] == '\0')
			return 1;
	return 0;
}

/* The debugfs line of the buffer at BAR offset off ("buffer N on ...: ... at BAR offset 0x..."). */
static int buffer_line(__u64 off, char *out, size_t len)
{
	char line[1024], want[48];
	int found = -1;
	FILE *f = fopen(BUFFERS, "r");

	if (!f)
		return -1;
	snprintf(want, sizeof(want), "at BAR offset %#llx,", (unsigned long long)off);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "buffer ", 7) && strstr(line, want)) {
			snprintf(out, len, "%s", line);
			found = 0;
		}
	fclose(f);
	return found;
}

static uint64_t word(size_t i)
{
	return 0x9f40000000000000ULL | (uint64_t)i;
}

TEST_F(pfnmap, maps_as_io_memory)
{
	const volatile uint64_t *bar;
	struct p2pbuf_buf b, pages;
	char flags[512], line[1024], want[64];
	uint64_t *w;
	size_t i;

	ASSERT_EQ(0, pfn_buf(self, &b, P2PBUF_ALLOC_PFNMAP | P2PBUF_ALLOC_UNINITIALIZED, &bar));
	w = (uint64_t *)b.map;
	for (i = 0; i < LEN / 8; i++)
		w[i] = word(i);
	for (i = 0; i < LEN / 8; i++)
		ASSERT_EQ(word(i), w[i]) TH_LOG("word %zu through the mapping", i);
	/* The mapping is the buffer's range of the BAR. */
	for (i = 0; i < LEN / 8; i++)
		ASSERT_EQ(word(i), bar[i]) TH_LOG("BAR +%#llx word %zu",
						  (unsigned long long)b.bar_offset, i);
	ASSERT_EQ(0, vm_flags(b.map, flags, sizeof(flags)));
	EXPECT_TRUE(has_flag(flags, "io")) TH_LOG("VmFlags:%s", flags);
	EXPECT_TRUE(has_flag(flags, "pf")) TH_LOG("VmFlags:%s", flags);
	EXPECT_FALSE(has_flag(flags, "mm")) TH_LOG("VmFlags:%s", flags);
	TH_LOG("P2PBUF_ALLOC_PFNMAP mapping: VmFlags:%s", flags);
	if (buffer_line(b.bar_offset, line, sizeof(line)) == 0) {
		snprintf(want, sizeof(want), "cpu mapping pfn (%lu pages faulted in)", LEN / PAGE);
		EXPECT_NE(NULL, strstr(line, want)) TH_LOG("debugfs: %s", line);
	}

	/* Side by side: the default mapping holds struct pages (VM_MIXEDMAP). */
	ASSERT_EQ(0, pfn_buf(self, &pages, P2PBUF_ALLOC_UNINITIALIZED, NULL));
	(void)*(volatile uint8_t *)pages.map;
	ASSERT_EQ(0, vm_flags(pages.map, flags, sizeof(flags)));
	EXPECT_TRUE(has_flag(flags, "mm")) TH_LOG("VmFlags:%s", flags);
	EXPECT_FALSE(has_flag(flags, "pf")) TH_LOG("VmFlags:%s", flags);
	p2pbuf_buf_free(&pages);
	p2pbuf_buf_free(&b);
	munmap((void *)bar, LEN);
}

TEST_F(pfnmap, private_mapping_refused)
{
	struct p2pbuf_alloc a = {
		.size = sizeof(a), .length = LEN, .flags = P2PBUF_ALLOC_PFNMAP,
	};
	void *m;

	ASSERT_EQ(0, p2pbuf_test_alloc(self->p2p, &a));
	m = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE, a.fd, 0);
	EXPECT_EQ(MAP_FAILED, m);
	EXPECT_EQ(EINVAL, errno);
	m = mmap(NULL, LEN, PROT_READ, MAP_PRIVATE, a.fd, 0);
	EXPECT_EQ(MAP_FAILED, m) TH_LOG("a read-only private mapping of an O_RDWR fd may become writable");
	EXPECT_EQ(EINVAL, errno);
	close(a.fd);
}

TEST_F(pfnmap, odirect_refused)
{
	const volatile uint64_t *bar;
	unsigned long long size = 0;
	struct p2pbuf_buf b;
	uint64_t *h, *w;
	size_t i;
	ssize_t n;
	int nvme;

	nvme = open("/dev/nvme0n1", O_RDWR | O_DIRECT | O_CLOEXEC);
	if (nvme < 0)
		SKIP(return, "no /dev/nvme0n1: %s", strerror(errno));
	if (ioctl(nvme, BLKGETSIZE64, &size) || size < DRIVE_OFF + 2 * MIB) {
		close(nvme);
		SKIP(return, "/dev/nvme0n1 has %llu bytes, the test needs %lu", size,
		     DRIVE_OFF + 2 * MIB);
	}
	ASSERT_EQ(0, posix_memalign((void **)&h, PAGE, 2 * MIB));
	for (i = 0; i < 2 * MIB / 8; i++)
		h[i] = 0xd15c000000000000ULL | (i * 8);
	ASSERT_EQ((ssize_t)(2 * MIB), pwrite(nvme, h, 2 * MIB, DRIVE_OFF));
	ASSERT_EQ(0, pfn_buf(self, &b, P2PBUF_ALLOC_PFNMAP | P2PBUF_ALLOC_UNINITIALIZED, &bar));
	w = (uint64_t *)b.map;
	for (i = 0; i < LEN / 8; i++)
		w[i] = word(i);

	errno = 0;
	n = pread(nvme, b.map, LEN, DRIVE_OFF);
	EXPECT_EQ(-1, n) TH_LOG("O_DIRECT read into the PFN mapping returned %zd: a pin", n);
	EXPECT_EQ(EFAULT, errno) TH_LOG("read: %s", strerror(errno));
	errno = 0;
	n = pwrite(nvme, b.map, LEN, DRIVE_OFF + MIB);
	EXPECT_EQ(-1, n) TH_LOG("O_DIRECT write from the PFN mapping returned %zd: a pin", n);
	EXPECT_EQ(EFAULT, errno) TH_LOG("write: %s", strerror(errno));
	/* Neither side changed: the BAR holds what the CPU wrote, the drive what it held. */
	for (i = 0; i < LEN / 8; i++)
		ASSERT_EQ(word(i), bar[i]) TH_LOG("BAR word %zu", i);
	memset(h, 0, 2 * MIB);
	ASSERT_EQ((ssize_t)(2 * MIB), pread(nvme, h, 2 * MIB, DRIVE_OFF));
	for (i = 0; i < 2 * MIB / 8; i++)
		ASSERT_EQ(0xd15c000000000000ULL | (i * 8), h[i]) TH_LOG("drive word %zu", i);
	p2pbuf_buf_free(&b);
	munmap((void *)bar, LEN);
	free(h);
	close(nvme);
}

TEST_F(pfnmap, revoke_is_a_zap)
{
	int go[2], ready[2], status = 0;
	struct p2pbuf_buf b;
	char line[1024], c;
	pid_t child;
	void *m;
	size_t i;

	ASSERT_EQ(0, pfn_buf(self, &b, P2PBUF_ALLOC_PFNMAP | P2PBUF_ALLOC_UNINITIALIZED, NULL));
	for (i = 0; i < LEN; i += PAGE)
		ASSERT_EQ(0, probe_read(b.map + i));
	ASSERT_EQ(0, pipe(go));
	ASSERT_EQ(0, pipe(ready));
	child = fork();
	ASSERT_LE(0, child);
	if (child == 0) {
		close(go[1]);
		close(ready[0]);
		/* The mapping, inherited: readable until the parent revokes. */
		c = probe_read(b.map) || probe_read(b.map + LEN - PAGE) ? 'f' : 'r';
		if (write(ready[1], &c, 1) != 1 || c != 'r')
			_exit(100);
		if (read(go[0], &c, 1) != 1)
			_exit(101);
		_exit(probe_read(b.map) == SIGBUS && probe_read(b.map + LEN - PAGE) == SIGBUS ?
			      0 : 102);
	}
	close(go[0]);
	close(ready[1]);
	/* Only once the child has read through its copy of the mapping. */
	ASSERT_EQ(1, read(ready[0], &c, 1));
	EXPECT_EQ('r', c) TH_LOG("the child could not read the inherited mapping before REVOKE");
	close(ready[0]);
	ASSERT_EQ(0, p2p_revoke(self->p2p, b.fd));
	EXPECT_EQ(SIGBUS, probe_read(b.map));
	EXPECT_EQ(SIGBUS, probe_read(b.map + LEN - PAGE));
	ASSERT_EQ(1, write(go[1], "x", 1));
	close(go[1]);
	ASSERT_EQ(1, wait_for(child, 30, &status));
	EXPECT_TRUE(WIFEXITED(status)) TH_LOG("child: status %#x", status);
	EXPECT_EQ(0, WEXITSTATUS(status)) TH_LOG("the child that inherited the mapping: %s",
						 WEXITSTATUS(status) == 102 ?
						 "still reads it after REVOKE" : "failed");
	m = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd, 0);
	EXPECT_EQ(MAP_FAILED, m);
	EXPECT_EQ(ENODEV, errno);
	if (buffer_line(b.bar_offset, line, sizeof(line)) == 0)
		EXPECT_NE(NULL, strstr(line, ", revoked")) TH_LOG("debugfs: %s", line);
	p2pbuf_buf_free(&b);
}

TEST_F(pfnmap, zeroed_without_uninitialized)
{
	struct p2pbuf_buf b;
	size_t i;

	ASSERT_EQ(0, pfn_buf(self, &b, P2PBUF_ALLOC_PFNMAP, NULL));
	for (i = 0; i < LEN; i++)
		ASSERT_EQ(0, b.map[i]) TH_LOG("byte %zu of a zeroed PFN-mapped buffer", i);
	p2pbuf_buf_free(&b);
}

TEST_HARNESS_MAIN

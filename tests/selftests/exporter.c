// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf exporter: /dev/p2pbuf ioctls, dma-buf fds of device memory, mmap, fd passing, revoke.
 *
 * Needs the p2pbuf_exporter module bound to the lab's emulated GPU memory (ivshmem BAR2).
 * The host-side half of the mmap test: the test prints "# hostcheck target=gpu offset=X len=N seed=S"
 * and `cargo xtask test` checks those bytes in the ivshmem backing file.
 */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/capability.h>
#include <linux/dma-buf.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

#define PAGE 4096UL

static int p2p_info(int dev, struct p2pbuf_info *info)
{
	memset(info, 0, sizeof(*info));
	info->size = sizeof(*info);
	return ioctl(dev, P2PBUF_IOCTL_INFO, info);
}

static int p2p_provider(int dev, __u32 id, struct p2pbuf_provider_info *p)
{
	memset(p, 0, sizeof(*p));
	p->size = sizeof(*p);
	p->id = id;
	return ioctl(dev, P2PBUF_IOCTL_PROVIDER_INFO, p);
}

/* The provider the tests allocate from (set up by the fixture). */
static __u32 prov_id;

/* Returns the dma-buf fd, or -errno. */
static int p2p_alloc(int dev, __u64 length, __u32 flags, __u64 *offset)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .flags = flags, .length = length,
				  .provider = prov_id };

	if (ioctl(dev, P2PBUF_IOCTL_ALLOC, &a))
		return -errno;
	if (offset)
		*offset = a.offset;
	return a.fd;
}

static int p2p_revoke(int dev, int fd)
{
	struct p2pbuf_revoke r = { .size = sizeof(r), .fd = fd };

	return ioctl(dev, P2PBUF_IOCTL_REVOKE, &r) ? -errno : 0;
}

/* Reads "key:\t<value>" from /proc/self/fdinfo/<fd>. */
static int fdinfo(int fd, const char *key, char *out, size_t len)
{
	char path[64], line[256];
	size_t klen = strlen(key);
	FILE *f;
	int ret = -1;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, key, klen) && line[klen] == ':') {
			char *v = line + klen + 1;

			while (*v == ' ' || *v == '\t')
				v++;
			v[strcspn(v, "\n")] = 0;
			snprintf(out, len, "%s", v);
			ret = 0;
			break;
		}
	}
	fclose(f);
	return ret;
}

static void sync_buf(int fd, __u64 flags)
{
	struct dma_buf_sync s = { .flags = flags };

	ioctl(fd, DMA_BUF_IOCTL_SYNC, &s);
}

static sigjmp_buf bus_jmp;

static void on_sigbus(int sig)
{
	(void)sig;
	siglongjmp(bus_jmp, 1);
}

/* Returns 1 if reading *p raises SIGBUS. */
static int read_faults(volatile uint8_t *p)
{
	struct sigaction sa = { .sa_handler = on_sigbus }, old;
	int faulted = 0;

	sigaction(SIGBUS, &sa, &old);
	if (sigsetjmp(bus_jmp, 1) == 0)
		(void)*p;
	else
		faulted = 1;
	sigaction(SIGBUS, &old, NULL);
	return faulted;
}

FIXTURE(p2pbuf)
{
	int dev;
	struct p2pbuf_provider_info prov;
};

FIXTURE_SETUP(p2pbuf)
{
	self->dev = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->dev, 0) TH_LOG("/dev/p2pbuf: %s (is p2pbuf_exporter loaded and bound?)",
				       strerror(errno));
	prov_id = p2pbuf_first_provider(self->dev);
	ASSERT_NE(0U, prov_id) TH_LOG("no provider bound");
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &self->prov))
		TH_LOG("provider %u: %s", prov_id, strerror(errno));
}

FIXTURE_TEARDOWN(p2pbuf)
{
	close(self->dev);
}

TEST_F(p2pbuf, info_and_providers)
{
	struct p2pbuf_info info;

	ASSERT_EQ(0, p2p_info(self->dev, &info));
	EXPECT_EQ(P2PBUF_API_VERSION, (int)info.api_version);
	ASSERT_GE(info.nr_providers, 1U);
	EXPECT_EQ(2U, self->prov.bar);
	EXPECT_GT(self->prov.total, 0ULL);
	EXPECT_LE(self->prov.total, self->prov.bar_size);
	EXPECT_EQ(self->prov.total, self->prov.free);
	EXPECT_NE(0, self->prov.pci_name[0]);
	EXPECT_EQ(0, self->prov.pci_name[P2PBUF_PCI_NAME_LEN - 1]);
	EXPECT_NE(0U, self->prov.state & P2PBUF_PROVIDER_PUBLISHED);
	EXPECT_EQ(0U, self->prov.state & P2PBUF_PROVIDER_GONE);
	EXPECT_EQ(prov_id, self->prov.id);
	EXPECT_EQ(0U, self->prov.reserved);
	TH_LOG("provider %u: %s BAR%u, %llu MiB", prov_id, self->prov.pci_name, self->prov.bar,
	       (unsigned long long)self->prov.total >> 20);
}

/*
 * Providers are named by stable ids from 1: 0 and ids never given out are ENOENT, NEXT lists
 * the bound ones, unknown flags and a non-zero reserved field are EINVAL.
 */
TEST_F(p2pbuf, provider_ids)
{
	struct p2pbuf_info info;
	struct p2pbuf_provider_info p;
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = PAGE };
	__u32 id, n = 0, last = 0;

	ASSERT_EQ(0, p2p_info(self->dev, &info));
	/* Id 0 is no provider: a zeroed struct does not pick one by accident. */
	EXPECT_ERRNO(ENOENT, p2p_provider(self->dev, 0, &p));
	EXPECT_ERRNO(ENOENT, ioctl(self->dev, P2PBUF_IOCTL_ALLOC, &a));
	/* An id never given out. */
	EXPECT_ERRNO(ENOENT, p2p_provider(self->dev, 0xfffffff0U, &p));
	a.provider = 0xfffffff0U;
	EXPECT_ERRNO(ENOENT, ioctl(self->dev, P2PBUF_IOCTL_ALLOC, &a));
	/* Listing: NEXT from 1, then from the last id + 1, gives nr_providers providers. */
	for (id = 1;; id = p.id + 1) {
		memset(&p, 0, sizeof(p));
		p.size = sizeof(p);
		p.id = id;
		p.flags = P2PBUF_PROVIDER_INFO_NEXT;
		if (ioctl(self->dev, P2PBUF_IOCTL_PROVIDER_INFO, &p)) {
			EXPECT_EQ(ENOENT, errno);
			break;
		}
		EXPECT_GT(p.id, last);
		EXPECT_NE(0, p.pci_name[0]);
		last = p.id;
		n++;
	}
	EXPECT_EQ(info.nr_providers, n);
	/* Flags and reserved. */
	memset(&p, 0, sizeof(p));
	p.size = sizeof(p);
	p.id = prov_id;
	p.flags = 2;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_PROVIDER_INFO, &p));
	p.flags = 0;
	p.reserved = 1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_PROVIDER_INFO, &p));
}

TEST_F(p2pbuf, bad_arguments)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = PAGE };
	struct { struct p2pbuf_info i; __u32 extra; } big;
	struct p2pbuf_info info;

	/* Lengths: zero, unaligned, beyond the provider, overflowing. */
	EXPECT_EQ(-EINVAL, p2p_alloc(self->dev, 0, 0, NULL));
	EXPECT_EQ(-EINVAL, p2p_alloc(self->dev, 100, 0, NULL));
	EXPECT_EQ(-EINVAL, p2p_alloc(self->dev, PAGE + 1, 0, NULL));
	EXPECT_EQ(-EINVAL, p2p_alloc(self->dev, self->prov.total + PAGE, 0, NULL));
	EXPECT_EQ(-EINVAL, p2p_alloc(self->dev, ~0ULL & ~(PAGE - 1), 0, NULL));
	/* Unknown flags. */
	EXPECT_EQ(-EINVAL, p2p_alloc(self->dev, PAGE, 1u << 31, NULL));
	EXPECT_EQ(-EINVAL, p2p_alloc(self->dev, PAGE, 1u << 2, NULL));
	/* Unknown provider. */
	a.provider = 1000000;
	EXPECT_ERRNO(ENOENT, ioctl(self->dev, P2PBUF_IOCTL_ALLOC, &a));
	/* Struct sizes: too small, and larger with non-zero tail. */
	a.provider = prov_id;
	a.size = 4;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_ALLOC, &a));
	memset(&big, 0, sizeof(big));
	big.i.size = sizeof(big);
	EXPECT_EQ(0, ioctl(self->dev, P2PBUF_IOCTL_INFO, &big));
	big.extra = 1;
	EXPECT_ERRNO(E2BIG, ioctl(self->dev, P2PBUF_IOCTL_INFO, &big));
	/* Bad pointers, unknown ioctls, unknown info flags. */
	EXPECT_ERRNO(EFAULT, ioctl(self->dev, P2PBUF_IOCTL_ALLOC, (void *)16));
	EXPECT_ERRNO(EFAULT, ioctl(self->dev, P2PBUF_IOCTL_INFO, NULL));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IO(P2PBUF_IOCTL_MAGIC, 0x7f), &info));
	memset(&info, 0, sizeof(info));
	info.size = sizeof(info);
	info.flags = 1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_INFO, &info));
	/* Revoke of an fd that is not ours, of a closed fd (EBADF, as the header says). */
	EXPECT_EQ(-EINVAL, p2p_revoke(self->dev, self->dev));
	EXPECT_EQ(-EBADF, p2p_revoke(self->dev, 12345));
	EXPECT_EQ(-EBADF, p2p_revoke(self->dev, -1));
}

/*
 * The @size field is capped at the page size, as openat2() and clone3() cap theirs: a larger
 * one is E2BIG before the kernel reads anything past its own struct, however large it is and
 * whatever memory follows (it used to take up to 4 GiB and read it all for a zero tail). Up to
 * a page, a zero tail is accepted.
 */
TEST_F(p2pbuf, arg_size_is_capped_at_a_page)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uint8_t *m = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);
	struct p2pbuf_info *info = (void *)m;
	double t;

	ASSERT_NE(MAP_FAILED, m);
	/* A page-sized struct with a zero tail: accepted. */
	info->size = page;
	EXPECT_EQ(0, ioctl(self->dev, P2PBUF_IOCTL_INFO, info)) TH_LOG("%s", strerror(errno));
	EXPECT_EQ(P2PBUF_API_VERSION, (int)info->api_version);
	/* One byte more, the tail still all zeros (the second page is mapped): E2BIG. */
	memset(m, 0, 2 * page);
	info->size = page + 1;
	EXPECT_ERRNO(E2BIG, ioctl(self->dev, P2PBUF_IOCTL_INFO, info));
	/*
	 * 1 GiB declared at the start of a one-page mapping: E2BIG at once, not EFAULT after
	 * reading the rest of the page; the same for the largest size and for the other ioctls.
	 */
	ASSERT_EQ(0, munmap(m + page, page));
	memset(m, 0, page);
	info->size = 1U << 30;
	t = now();
	EXPECT_ERRNO(E2BIG, ioctl(self->dev, P2PBUF_IOCTL_INFO, info));
	EXPECT_LT(now() - t, 0.5);
	info->size = ~0U;
	EXPECT_ERRNO(E2BIG, ioctl(self->dev, P2PBUF_IOCTL_INFO, info));
	((struct p2pbuf_alloc *)m)->size = 1U << 30;
	EXPECT_ERRNO(E2BIG, ioctl(self->dev, P2PBUF_IOCTL_ALLOC, m));
	((struct p2pbuf_revoke *)m)->size = page + 1;
	EXPECT_ERRNO(E2BIG, ioctl(self->dev, P2PBUF_IOCTL_REVOKE, m));
	munmap(m, page);
}

/* An fd on /dev/kmsg positioned at its end (-errno): reads return the records logged after. */
static int kmsg_open_end(void)
{
	int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	if (lseek(fd, 0, SEEK_END) < 0) {
		close(fd);
		return -errno;
	}
	return fd;
}

/* Records of the kernel log read from kmsg (kmsg_open_end()) that contain what. */
static int kmsg_count(int kmsg, const char *what)
{
	char rec[8192];
	int n = 0;

	for (;;) {
		ssize_t r = read(kmsg, rec, sizeof(rec) - 1);

		if (r < 0 && errno == EPIPE)	/* overwritten records: go on with the next */
			continue;
		if (r <= 0)
			break;
		rec[r] = 0;
		if (strstr(rec, what))
			n++;
	}
	return n;
}

/*
 * Whoever holds a /dev/p2pbuf fd (here a process dropped to uid 65534, as a root service
 * would hand it on) cannot fill the kernel log: the message that explains a refused
 * oversized ALLOC is rate limited (a burst of at most 10, then nothing for 5 s). 200
 * refusals in a row add at most a dozen lines mentioning p2pbuf.
 */
TEST_F(p2pbuf, refused_allocs_do_not_flood_the_log)
{
	int kmsg = kmsg_open_end(), status = 0, lines;
	pid_t pid;

	if (kmsg < 0)
		SKIP(return, "/dev/kmsg: %s", strerror(-kmsg));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct p2pbuf_alloc a = { .size = sizeof(a), .provider = prov_id,
					  .length = self->prov.total + PAGE };
		int i;

		if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
			_exit(2);
		for (i = 0; i < 200; i++)
			if (ioctl(self->dev, P2PBUF_IOCTL_ALLOC, &a) == 0 || errno != EINVAL)
				_exit(3);
		_exit(0);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) TH_LOG("status %#x", status);
	lines = kmsg_count(kmsg, "p2pbuf");
	close(kmsg);
	TH_LOG("200 refused ALLOCs as uid 65534 logged %d line(s) mentioning p2pbuf", lines);
	EXPECT_LE(lines, 12);
}

/* Revoke's own flags: unknown bits are EINVAL, and nothing is revoked. */
TEST_F(p2pbuf, revoke_flags)
{
	int fd = p2p_alloc(self->dev, PAGE, 0, NULL);
	struct p2pbuf_revoke r = { .size = sizeof(r), .fd = fd, .flags = 1 };
	void *m;

	ASSERT_GE(fd, 0);
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_REVOKE, &r));
	m = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0);
	EXPECT_NE(MAP_FAILED, m);
	if (m != MAP_FAILED)
		munmap(m, PAGE);
	close(fd);
}

static int p2p_refusal(int dev, int fd, struct p2pbuf_refusal *r)
{
	memset(r, 0, sizeof(*r));
	r->size = sizeof(*r);
	r->fd = fd;
	return ioctl(dev, P2PBUF_IOCTL_REFUSAL, r) ? -errno : 0;
}

/*
 * P2PBUF_IOCTL_REFUSAL: a buffer nobody was refused answers NONE with its provider's id (the
 * positive case needs a fabric without a peer-to-peer path: topo_refusal.c); each documented
 * errno.
 */
TEST_F(p2pbuf, refusal)
{
	struct p2pbuf_refusal r;
	int fd = p2p_alloc(self->dev, PAGE, 0, NULL);

	ASSERT_GE(fd, 0);
	EXPECT_EQ(_IOC_READ | _IOC_WRITE, _IOC_DIR(P2PBUF_IOCTL_REFUSAL));
	EXPECT_EQ(sizeof(struct p2pbuf_refusal), _IOC_SIZE(P2PBUF_IOCTL_REFUSAL));
	ASSERT_EQ(0, p2p_refusal(self->dev, fd, &r));
	EXPECT_EQ(P2PBUF_REFUSAL_NONE, r.reason);
	EXPECT_EQ(0ULL, r.nr_refused);
	EXPECT_EQ(prov_id, r.provider);
	EXPECT_EQ(0, r.device[0]);
	EXPECT_EQ(0, r.text[0]);
	/* A revoked buffer still answers. */
	ASSERT_EQ(0, p2p_revoke(self->dev, fd));
	EXPECT_EQ(0, p2p_refusal(self->dev, fd, &r));
	/* Closed fd, no fd, not a p2pbuf dma-buf. */
	EXPECT_EQ(-EBADF, p2p_refusal(self->dev, 12345, &r));
	EXPECT_EQ(-EBADF, p2p_refusal(self->dev, -1, &r));
	EXPECT_EQ(-EINVAL, p2p_refusal(self->dev, self->dev, &r));
	/* Flags, reserved, a struct smaller than the first version. */
	memset(&r, 0, sizeof(r));
	r.size = sizeof(r);
	r.fd = fd;
	r.flags = 1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_REFUSAL, &r));
	r.flags = 0;
	r.reserved = 1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_REFUSAL, &r));
	r.reserved = 0;
	r.size = 16;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_REFUSAL, &r));
	close(fd);
}

static int p2p_attachment(int dev, int fd, __u32 index, struct p2pbuf_attachment *a)
{
	memset(a, 0, sizeof(*a));
	a->size = sizeof(*a);
	a->fd = fd;
	a->index = index;
	return ioctl(dev, P2PBUF_IOCTL_ATTACHMENT, a) ? -errno : 0;
}

/*
 * P2PBUF_IOCTL_ATTACHMENT: a buffer nobody attached has none (-ENOENT, with the count
 * written); each documented errno. The positive case needs an importer: importer.c
 * (devmem.import_reports_peer_to_peer) and topo_refusal.c.
 */
TEST_F(p2pbuf, attachment)
{
	struct p2pbuf_attachment a;
	int fd = p2p_alloc(self->dev, PAGE, 0, NULL);

	ASSERT_GE(fd, 0);
	EXPECT_EQ(_IOC_READ | _IOC_WRITE, _IOC_DIR(P2PBUF_IOCTL_ATTACHMENT));
	EXPECT_EQ(sizeof(struct p2pbuf_attachment), _IOC_SIZE(P2PBUF_IOCTL_ATTACHMENT));
	EXPECT_EQ(-ENOENT, p2p_attachment(self->dev, fd, 0, &a));
	EXPECT_EQ(0U, a.nr_attachments);
	EXPECT_EQ(0, a.device[0]);
	EXPECT_EQ(-ENOENT, p2p_attachment(self->dev, fd, ~0U, &a));
	/* Closed fd, no fd, not a p2pbuf dma-buf. */
	EXPECT_EQ(-EBADF, p2p_attachment(self->dev, 12345, 0, &a));
	EXPECT_EQ(-EBADF, p2p_attachment(self->dev, -1, 0, &a));
	EXPECT_EQ(-EINVAL, p2p_attachment(self->dev, self->dev, 0, &a));
	/* Flags, a struct smaller than the first version. */
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.fd = fd;
	a.flags = 1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_ATTACHMENT, &a));
	a.flags = 0;
	a.size = 16;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_ATTACHMENT, &a));
	close(fd);
}

/*
 * The ioctl numbers say what they pass (strace decodes them): _IOWR/_IOW with the size of the
 * struct's first version. The old _IO() numbers, and the right nr with another size or
 * direction, are not the ioctl: ENOTTY.
 */
TEST_F(p2pbuf, ioctl_numbers_encode_their_struct)
{
	struct p2pbuf_info info = { .size = sizeof(info) };
	struct { struct p2pbuf_info i; __u32 extra[2]; } big = { .i.size = sizeof(big) };

	EXPECT_EQ(_IOC_READ | _IOC_WRITE, _IOC_DIR(P2PBUF_IOCTL_INFO));
	EXPECT_EQ(sizeof(struct p2pbuf_info), _IOC_SIZE(P2PBUF_IOCTL_INFO));
	EXPECT_EQ(0xBBU, _IOC_TYPE(P2PBUF_IOCTL_INFO));
	EXPECT_EQ(_IOC_READ | _IOC_WRITE, _IOC_DIR(P2PBUF_IOCTL_PROVIDER_INFO));
	EXPECT_EQ(sizeof(struct p2pbuf_provider_info), _IOC_SIZE(P2PBUF_IOCTL_PROVIDER_INFO));
	EXPECT_EQ(_IOC_READ | _IOC_WRITE, _IOC_DIR(P2PBUF_IOCTL_ALLOC));
	EXPECT_EQ(sizeof(struct p2pbuf_alloc), _IOC_SIZE(P2PBUF_IOCTL_ALLOC));
	EXPECT_EQ(_IOC_WRITE, _IOC_DIR(P2PBUF_IOCTL_REVOKE));
	EXPECT_EQ(sizeof(struct p2pbuf_revoke), _IOC_SIZE(P2PBUF_IOCTL_REVOKE));
	EXPECT_EQ(0, ioctl(self->dev, P2PBUF_IOCTL_INFO, &info));
	/* A newer caller's larger struct still goes with the first version's number. */
	EXPECT_EQ(0, ioctl(self->dev, P2PBUF_IOCTL_INFO, &big));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IO(P2PBUF_IOCTL_MAGIC, 0x00), &info));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IOWR(P2PBUF_IOCTL_MAGIC, 0x00, big), &big));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IOR(P2PBUF_IOCTL_MAGIC, 0x00, struct p2pbuf_info), &info));
	EXPECT_ERRNO(ENOTTY, ioctl(self->dev, _IO(P2PBUF_IOCTL_MAGIC, 0x02), &info));
}

TEST_F(p2pbuf, alloc_sizes_are_dma_bufs)
{
	__u64 sizes[] = { PAGE, 2 * PAGE, 1UL << 20, 2UL << 20, 64UL << 20 };
	char v[64];
	size_t i;

	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		int fd = p2p_alloc(self->dev, sizes[i], 0, NULL);

		ASSERT_GE(fd, 0) TH_LOG("alloc %llu: %s", (unsigned long long)sizes[i], strerror(-fd));
		ASSERT_EQ(0, fdinfo(fd, "exp_name", v, sizeof(v)));
		EXPECT_STREQ("p2pbuf", v);
		ASSERT_EQ(0, fdinfo(fd, "size", v, sizeof(v)));
		EXPECT_EQ(sizes[i], strtoull(v, NULL, 0));
		EXPECT_EQ(FD_CLOEXEC, fcntl(fd, F_GETFD) & FD_CLOEXEC);
		EXPECT_EQ((off_t)sizes[i], lseek(fd, 0, SEEK_END));
		close(fd);
	}
}

TEST_F(p2pbuf, whole_bar_exhaustion_and_return)
{
	struct p2pbuf_provider_info p;
	int fd, fd2;

	fd = p2p_alloc(self->dev, self->prov.total, 0, NULL);
	ASSERT_GE(fd, 0) TH_LOG("whole provider: %s", strerror(-fd));
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(0ULL, p.free);
	fd2 = p2p_alloc(self->dev, PAGE, 0, NULL);
	EXPECT_EQ(-ENOMEM, fd2);
	if (fd2 >= 0)
		close(fd2);
	close(fd);
	/* The memory comes back once the last reference is gone. */
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(self->prov.total, p.free);
	fd = p2p_alloc(self->dev, self->prov.total, 0, NULL);
	EXPECT_GE(fd, 0);
	close(fd);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

/*
 * One zeroed ALLOC of the whole BAR with SIGALRM caught from 20 ms in (every 10 ms when
 * periodic); flags: the handler's sa_flags. Returns the ALLOC's fd or -errno; *caught: how
 * many alarms the handler saw during the ALLOC. The timer is stopped before the handler goes.
 */
static int alloc_with_alarm(struct __test_metadata *_metadata, FIXTURE_DATA(p2pbuf) *self,
			    int flags, int periodic, int *caught)
{
	struct sigaction sa = { .sa_handler = on_alarm, .sa_flags = flags }, old;
	struct itimerval it = { .it_value = { .tv_usec = 20 * 1000 } }, off = { 0 };
	const __u64 len = self->prov.total;
	double t0;
	int fd;

	if (periodic)
		it.it_interval.tv_usec = 10 * 1000;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGALRM, &sa, &old))
		return -errno;
	alarms = 0;
	if (setitimer(ITIMER_REAL, &it, NULL))
		return -errno;
	t0 = now();
	fd = p2p_alloc(self->dev, len, 0, NULL);
	*caught = alarms;
	setitimer(ITIMER_REAL, &off, NULL);
	TH_LOG("zeroed ALLOC of %llu MiB, SIGALRM from 20 ms%s%s: %s after %.3f s, %d alarm(s)",
	       (unsigned long long)len >> 20, periodic ? " every 10 ms" : "",
	       flags & SA_RESTART ? " (SA_RESTART)" : "", fd >= 0 ? "succeeded" : strerror(-fd),
	       now() - t0, *caught);
	sigaction(SIGALRM, &old, NULL);
	return fd;
}

/*
 * A zeroed ALLOC clears 2 MiB at a time and stops for a signal: a caught one ends it with EINTR
 * and nothing allocated, or restarts it for an SA_RESTART handler (the header says both). SKIP
 * if the whole BAR clears in less than 20 ms (no signal can arrive during it).
 */
TEST_F(p2pbuf, alloc_interrupted_by_a_caught_signal)
{
	struct p2pbuf_provider_info p;
	int fd, caught = 0;

	fd = alloc_with_alarm(_metadata, self, 0, 1, &caught);
	if (fd >= 0 && !caught) {
		close(fd);
		SKIP(return, "the clearing took less than 20 ms: no signal arrived during it");
	}
	EXPECT_EQ(-EINTR, fd);
	if (fd >= 0)
		close(fd);
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(self->prov.total, p.free) TH_LOG("the interrupted ALLOC left memory allocated");

	fd = alloc_with_alarm(_metadata, self, SA_RESTART, 0, &caught);
	EXPECT_GE(fd, 0) TH_LOG("restarted ALLOC: %s", strerror(-fd));
	if (fd >= 0)
		close(fd);
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(self->prov.total, p.free);
}

TEST_F(p2pbuf, mmap_fresh_is_zero_and_reaches_device_memory)
{
	const size_t len = 4UL << 20;
	unsigned int seed = (unsigned int)getpid() & 0xff;
	__u64 off = 0;
	uint8_t *m;
	size_t i;
	int fd, spacer;

	/*
	 * A spacer puts the checked buffer at 3/4 of the BAR, where later tests'
	 * allocations (first fit from the start, zeroed) do not overwrite it before the host
	 * looks at it after the run.
	 */
	spacer = p2p_alloc(self->dev, (self->prov.total / 4 * 3) & ~(PAGE - 1), 0, NULL);
	ASSERT_GE(spacer, 0);
	fd = p2p_alloc(self->dev, len, 0, &off);
	ASSERT_GE(fd, 0);
	close(spacer);
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, m) TH_LOG("mmap: %s", strerror(errno));
	sync_buf(fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_RW);
	for (i = 0; i < len; i++)
		ASSERT_EQ(0, m[i]) TH_LOG("fresh buffer not zero at %zu", i);
	for (i = 0; i < len; i++)
		m[i] = p2pbuf_host_pattern(i, seed);
	for (i = 0; i < len; i++)
		ASSERT_EQ(p2pbuf_host_pattern(i, seed), m[i]);
	sync_buf(fd, DMA_BUF_SYNC_END | DMA_BUF_SYNC_RW);
	/* The host checks these bytes in the ivshmem backing file (xtask/src/hostcheck.rs). */
	printf("# hostcheck target=gpu offset=%llu len=%zu seed=%u\n", (unsigned long long)off, len, seed);
	fflush(stdout);
	munmap(m, len);
	close(fd);
	/* Re-allocating the same memory hands it out zeroed again: no stale data leaks. */
	fd = p2p_alloc(self->dev, len, 0, &off);
	ASSERT_GE(fd, 0);
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, m);
	for (i = 0; i < len; i++)
		ASSERT_EQ(0, m[i]) TH_LOG("reallocated buffer has stale data at %zu", i);
	munmap(m, len);
	close(fd);
}

/* Drops CAP_SYS_RAWIO from the effective set of this process (all threads: there is one). */
static int drop_cap_sys_rawio(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];

	if (syscall(SYS_capget, &h, d))
		return -1;
	d[CAP_TO_INDEX(CAP_SYS_RAWIO)].effective &= ~CAP_TO_MASK(CAP_SYS_RAWIO);
	return syscall(SYS_capset, &h, d) ? -1 : 0;
}

/*
 * P2PBUF_ALLOC_UNINITIALIZED hands the memory out as it is (what the previous user left),
 * only to a caller with CAP_SYS_RAWIO; without the flag the same memory comes zeroed.
 */
TEST_F(p2pbuf, alloc_uninitialized_keeps_stale_data_and_needs_cap_sys_rawio)
{
	const size_t len = 1UL << 20;
	unsigned int seed = ((unsigned int)getpid() & 0xff) + 7;
	__u64 off = 0, off2 = 1;
	size_t i, stale = 0;
	uint8_t *m;
	pid_t pid;
	int fd, st;

	fd = p2p_alloc(self->dev, len, 0, &off);
	ASSERT_GE(fd, 0);
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, m);
	for (i = 0; i < len; i++)
		m[i] = p2pbuf_host_pattern(i, seed);
	munmap(m, len);
	close(fd);
	/* First fit: the same memory again, as it was left. */
	fd = p2p_alloc(self->dev, len, P2PBUF_ALLOC_UNINITIALIZED, &off2);
	ASSERT_GE(fd, 0) TH_LOG("uninitialized alloc as root: %s", strerror(-fd));
	ASSERT_EQ(off, off2) TH_LOG("not the same memory: first fit from the start expected");
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, m);
	for (i = 0; i < len; i++)
		stale += m[i] == p2pbuf_host_pattern(i, seed);
	EXPECT_EQ(len, stale) TH_LOG("only %zu of %zu bytes kept", stale, len);
	munmap(m, len);
	close(fd);
	/* Without the flag: zeroed. */
	fd = p2p_alloc(self->dev, len, 0, &off2);
	ASSERT_GE(fd, 0);
	EXPECT_EQ(off, off2);
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, m);
	for (i = 0; i < len && !m[i]; i++)
		;
	EXPECT_EQ(len, i) TH_LOG("stale byte at %zu of a zeroed allocation", i);
	munmap(m, len);
	close(fd);
	/* Root without CAP_SYS_RAWIO: EPERM for the flag, zeroed memory still allowed. */
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		int r;

		if (drop_cap_sys_rawio())
			_exit(10);
		r = p2p_alloc(self->dev, len, P2PBUF_ALLOC_UNINITIALIZED, NULL);
		if (r != -EPERM)
			_exit(r >= 0 ? 11 : 12);
		r = p2p_alloc(self->dev, len, 0, NULL);
		_exit(r >= 0 ? 0 : 13);
	}
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	ASSERT_TRUE(WIFEXITED(st));
	EXPECT_EQ(0, WEXITSTATUS(st))
		TH_LOG("child: 10 capset failed, 11 uninitialized alloc allowed without CAP_SYS_RAWIO, 12 it failed with another errno than EPERM, 13 a zeroed alloc failed");
}

TEST_F(p2pbuf, mmap_bounds)
{
	int fd = p2p_alloc(self->dev, 2 * PAGE, 0, NULL);

	ASSERT_GE(fd, 0);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, 3 * PAGE, PROT_READ, MAP_SHARED, fd, 0));
	EXPECT_EQ(MAP_FAILED, mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 2 * PAGE));
	EXPECT_NE(MAP_FAILED, mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, PAGE));
	close(fd);
}

static int send_fd(int sock, int fd)
{
	char c = 'F';
	struct iovec iov = { .iov_base = &c, .iov_len = 1 };
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
			      .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock)
{
	char c;
	struct iovec iov = { .iov_base = &c, .iov_len = 1 };
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
			      .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm;
	int fd;

	if (recvmsg(sock, &msg, 0) != 1)
		return -1;
	cm = CMSG_FIRSTHDR(&msg);
	if (!cm || cm->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

/* The fd works in another process; closing in either order leaks nothing. */
TEST_F(p2pbuf, fd_passing_scm_rights)
{
	const size_t len = 1UL << 20;
	struct p2pbuf_provider_info p;
	int sv[2], fd, status, order;
	char ack;

	for (order = 0; order < 2; order++) {
		pid_t pid;
		uint8_t *m;
		size_t i;

		ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
		fd = p2p_alloc(self->dev, len, 0, NULL);
		ASSERT_GE(fd, 0);
		pid = fork();
		ASSERT_GE(pid, 0);
		if (pid == 0) {
			int rfd = recv_fd(sv[1]);
			uint8_t *cm;
			char c = 0;

			if (rfd < 0)
				_exit(10);
			cm = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
			if (cm == MAP_FAILED)
				_exit(11);
			for (i = 0; i < len; i++)
				cm[i] = p2pbuf_host_pattern(i, 77);
			if (write(sv[1], &c, 1) != 1)
				_exit(12);
			/* order 1: wait for the parent to close its fd first. */
			if (order == 1 && read(sv[1], &c, 1) != 1)
				_exit(13);
			munmap(cm, len);
			close(rfd);
			_exit(0);
		}
		ASSERT_EQ(0, send_fd(sv[0], fd));
		ASSERT_EQ(1, read(sv[0], &ack, 1));
		m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
		ASSERT_NE(MAP_FAILED, m);
		for (i = 0; i < len; i++)
			ASSERT_EQ(p2pbuf_host_pattern(i, 77), m[i]);
		munmap(m, len);
		close(fd);
		if (order == 1) {
			char c = 0;

			ASSERT_EQ(1, write(sv[0], &c, 1));
		}
		ASSERT_EQ(pid, waitpid(pid, &status, 0));
		EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
			TH_LOG("child status %#x", status);
		close(sv[0]);
		close(sv[1]);
	}
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(self->prov.total, p.free);
}

TEST_F(p2pbuf, revoke)
{
	struct p2pbuf_provider_info p;
	uint8_t *m;
	int fd;

	fd = p2p_alloc(self->dev, 1UL << 20, 0, NULL);
	ASSERT_GE(fd, 0);
	m = mmap(NULL, 1UL << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, m);
	m[0] = 1;
	ASSERT_EQ(0, p2p_revoke(self->dev, fd));
	/* Revoke is idempotent; new CPU mappings are refused. */
	EXPECT_EQ(0, p2p_revoke(self->dev, fd));
	EXPECT_EQ(MAP_FAILED, mmap(NULL, 1UL << 20, PROT_READ, MAP_SHARED, fd, 0));
	EXPECT_EQ(ENODEV, errno);
	/* The existing CPU mapping was zapped: it faults instead of reaching freed memory. */
	EXPECT_TRUE(read_faults(m));
	munmap(m, 1UL << 20);
	close(fd);
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(self->prov.total, p.free);
}

/*
 * Unbinding the provider while buffers are mapped (CPU) and open: no oops, the buffers are
 * revoked (CPU mappings fault, new mmaps fail), the provider disappears from the list, its id
 * answers GONE and ALLOC with it ENODEV, and binding again gives the device a new id with all
 * of its memory free, while the old id stays stale (it does not reach the rebound device).
 * Runs last: it unbinds the device.
 */
TEST_F(p2pbuf, zz_unbind_while_mapped)
{
	struct p2pbuf_info info;
	struct p2pbuf_provider_info p;
	uint8_t *m1, *m2;
	int fd1, fd2;

	fd1 = p2p_alloc(self->dev, 1UL << 20, 0, NULL);
	fd2 = p2p_alloc(self->dev, 2UL << 20, 0, NULL);
	ASSERT_GE(fd1, 0);
	ASSERT_GE(fd2, 0);
	m1 = mmap(NULL, 1UL << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd1, 0);
	m2 = mmap(NULL, 2UL << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
	ASSERT_NE(MAP_FAILED, m1);
	ASSERT_NE(MAP_FAILED, m2);
	m1[0] = 0xaa;
	m2[4096] = 0x55;
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pbuf_exporter/unbind", self->prov.pci_name))
		TH_LOG("unbind %s", self->prov.pci_name);
	/* The buffers are revoked: CPU access faults, new mappings are refused. */
	EXPECT_TRUE(read_faults(m1));
	EXPECT_TRUE(read_faults(m2 + 4096));
	EXPECT_EQ(MAP_FAILED, mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd1, 0));
	EXPECT_EQ(0, p2p_info(self->dev, &info));
	EXPECT_EQ(0U, info.nr_providers);
	/* The stale id: GONE, and ALLOC says the device is gone rather than "no such id". */
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(P2PBUF_PROVIDER_GONE, p.state);
	EXPECT_EQ(prov_id, p.id);
	EXPECT_EQ(0ULL, p.total);
	EXPECT_EQ(0, p.pci_name[0]);
	EXPECT_EQ(-ENODEV, p2p_alloc(self->dev, 4096, 0, NULL));
	EXPECT_EQ(0U, p2pbuf_first_provider(self->dev));
	munmap(m1, 1UL << 20);
	munmap(m2, 2UL << 20);
	close(fd1);
	close(fd2);
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pbuf_exporter/bind", self->prov.pci_name));
	/* Rebound: a new id for the same device; the old one stays stale. */
	EXPECT_EQ(-ENODEV, p2p_alloc(self->dev, 4096, 0, NULL));
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &p));
	EXPECT_EQ(P2PBUF_PROVIDER_GONE, p.state);
	ASSERT_GT(p2pbuf_first_provider(self->dev), prov_id);
	ASSERT_EQ(0, p2p_provider(self->dev, p2pbuf_first_provider(self->dev), &p));
	EXPECT_STREQ(self->prov.pci_name, p.pci_name);
	EXPECT_EQ(P2PBUF_PROVIDER_PUBLISHED, p.state);
	EXPECT_EQ(p.total, p.free);
}

/*
 * REVOKE of a buffer whose provider was unbound: the unbind revoked it, so REVOKE succeeds and
 * does nothing, as for any revoked buffer, however often (it used to say EINVAL, as for an fd
 * that is no p2pbuf buffer at all). A buffer revoked before the unbind answers the same; a
 * dma-buf of another exporter stays EINVAL. REFUSAL still answers EINVAL for such a buffer,
 * as documented. Unbinds the device and binds it again.
 */
TEST_F(p2pbuf, zz_revoke_after_unbind)
{
	int fd1 = p2p_alloc(self->dev, PAGE, 0, NULL);
	int fd2 = p2p_alloc(self->dev, PAGE, 0, NULL);
	struct p2pbuf_refusal r = { .size = sizeof(r) };
	struct p2pbuf_buf sys;
	int have_sys, err;

	ASSERT_GE(fd1, 0);
	ASSERT_GE(fd2, 0);
	have_sys = p2pbuf_udmabuf_alloc(&sys, PAGE) == 0;
	if (have_sys)
		EXPECT_EQ(-EINVAL, p2p_revoke(self->dev, sys.fd));
	EXPECT_EQ(0, p2p_revoke(self->dev, fd2));
	err = sysfs_write("/sys/bus/pci/drivers/p2pbuf_exporter/unbind", self->prov.pci_name);
	ASSERT_EQ(0, err) TH_LOG("unbind %s: %s", self->prov.pci_name, strerror(-err));
	EXPECT_EQ(0, p2p_revoke(self->dev, fd1));
	EXPECT_EQ(0, p2p_revoke(self->dev, fd1));
	EXPECT_EQ(0, p2p_revoke(self->dev, fd2));
	/* Still refused: fds that are no p2pbuf buffer. */
	EXPECT_EQ(-EINVAL, p2p_revoke(self->dev, self->dev));
	if (have_sys)
		EXPECT_EQ(-EINVAL, p2p_revoke(self->dev, sys.fd));
	r.fd = fd1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_REFUSAL, &r));
	EXPECT_EQ(MAP_FAILED, mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd1, 0));
	close(fd1);
	close(fd2);
	if (have_sys)
		p2pbuf_buf_free(&sys);
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pbuf_exporter/bind", self->prov.pci_name));
}

TEST_HARNESS_MAIN

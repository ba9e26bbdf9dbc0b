// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf exporter, 1 of 4: the uAPI of /dev/p2pbuf (INFO, PROVIDER_INFO, argument checks,
 * REVOKE flags, REFUSAL, ATTACHMENT, the ioctl numbers). Wrappers and fixture: exporter.h.
 */
#include "exporter.h"

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
 * written); each documented errno. The positive case needs an importer: p2pbuf_dma.c
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
	/* Flags, the reserved field, a struct smaller than the first version. */
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.fd = fd;
	a.flags = 1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_ATTACHMENT, &a));
	a.flags = 0;
	a.reserved = 1;
	EXPECT_ERRNO(EINVAL, ioctl(self->dev, P2PBUF_IOCTL_ATTACHMENT, &a));
	a.reserved = 0;
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

TEST_HARNESS_MAIN

// SPDX-License-Identifier: GPL-2.0
/*
 * Device memory limits per cgroup (issue 31): /dev/p2pbuf registers each provider's BAR as a
 * region of the dmem cgroup controller ("p2pbuf/<PCI address>/bar<N>" in dmem.capacity) and
 * charges every buffer to the dmem cgroup of the process that allocates it, until the buffer's
 * memory goes back to the pool.
 *
 * Two tenants, different non-root users in two cgroups with dmem.max set on the BAR's region:
 * each gets its limit and no more (ENOSPC past it, the errno TTM gives when it cannot evict),
 * what one holds does not count against the other, and dmem.current is exact: back to 0 after
 * close, after REVOKE (with the fd still open), after kill -9, and after an unbind (the region
 * comes back with the BAR's size when the device is bound again).
 *
 * Isolation: a tenant never reads what another left in the BAR (ALLOC zeroes; the flag that
 * skips it needs CAP_SYS_RAWIO; the PCI core's p2pmem/allocate, which hands out the same pool
 * unzeroed until series 2 patch 1, is root's; it clears what it maps now, tested here too). The
 * node for a group: with the owner and mode a udev rule gives it
 * (exporter-kmod/70-p2pbuf.rules: group p2pbuf, 0660), a member opens it and allocates with
 * no capability, anyone else gets EACCES.
 */
#include "exporter.h"
#include <grp.h>
#include <sys/mount.h>
#include <sys/stat.h>

#define CG "/sys/fs/cgroup"
#define KIB 1024UL
#define MIB (1024UL * 1024)

/* The two tenants: cgroup, user, dmem.max. */
#define A_CG CG "/p2pbuf-tenant-a"
#define B_CG CG "/p2pbuf-tenant-b"
#define A_UID 65534
#define B_UID 65533
#define A_MAX (1 * MIB)
#define B_MAX (2 * MIB)
/* The group a udev rule would give the node (exporter-kmod/70-p2pbuf.rules). */
#define NODE_GID 65532
#define EXPORTER_DRV "/sys/bus/pci/drivers/p2pbuf_exporter"

/* The value of @region in a dmem.* file of "region value" lines; -1 if it is not listed. */
static long long region_value(const char *file, const char *region)
{
	char line[512];
	long long v = -1;
	size_t rlen = strlen(region);
	FILE *f = fopen(file, "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, region, rlen) && line[rlen] == ' ') {
			v = strtoll(line + rlen + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	return v;
}

/* cgroup2 at CG (the lab's init does not mount it); 0 or -errno. */
static int mount_cgroup2(void)
{
	if (!access(CG "/cgroup.controllers", F_OK))
		return 0;
	return mount("cgroup2", CG, "cgroup2", 0, NULL) ? -errno : 0;
}

/* The provider's region is in dmem.capacity, with the BAR's size. */
TEST_F(p2pbuf, dmem_capacity_is_the_bar)
{
	char region[128];
	long long cap;
	int ret = mount_cgroup2();

	ASSERT_EQ(0, ret) TH_LOG("mount cgroup2 on " CG ": %s (CONFIG_CGROUPS?)", strerror(-ret));
	ret = sysfs_write(CG "/cgroup.subtree_control", "+dmem");
	ASSERT_EQ(0, ret) TH_LOG("+dmem in cgroup.subtree_control: %s (CONFIG_CGROUP_DMEM?)",
				 strerror(-ret));
	snprintf(region, sizeof(region), "p2pbuf/%s/bar%u", self->prov.pci_name, self->prov.bar);
	cap = region_value(CG "/dmem.capacity", region);
	TH_LOG("%s: capacity %lld, BAR %llu bytes", region, cap,
	       (unsigned long long)self->prov.bar_size);
	if (cap < 0) {
		char buf[1024] = "";
		int fd = open(CG "/dmem.capacity", O_RDONLY | O_CLOEXEC);
		ssize_t n = fd < 0 ? -errno : read(fd, buf, sizeof(buf) - 1);

		TH_LOG("dmem.capacity: %zd: %s", n, n < 0 ? strerror(-n) : buf);
		if (fd >= 0)
			close(fd);
	}
	EXPECT_EQ((long long)self->prov.bar_size, cap);
}

FIXTURE(dmem)
{
	int dev;
	struct p2pbuf_provider_info prov;
	char region[128];
	char current_a[96], current_b[96];
};

FIXTURE_SETUP(dmem)
{
	char limit[192];
	int ret;

	self->dev = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->dev, 0) TH_LOG("/dev/p2pbuf: %s", strerror(errno));
	prov_id = p2pbuf_first_provider(self->dev);
	ASSERT_NE(0U, prov_id) TH_LOG("no provider bound");
	ASSERT_EQ(0, p2p_provider(self->dev, prov_id, &self->prov));
	snprintf(self->region, sizeof(self->region), "p2pbuf/%s/bar%u", self->prov.pci_name,
		 self->prov.bar);

	/* cgroup2 with the dmem controller for the children of the root. */
	ret = mount_cgroup2();
	ASSERT_EQ(0, ret) TH_LOG("mount cgroup2 on " CG ": %s (CONFIG_CGROUPS?)", strerror(-ret));
	ret = sysfs_write(CG "/cgroup.subtree_control", "+dmem");
	ASSERT_EQ(0, ret) TH_LOG("+dmem in cgroup.subtree_control: %s (CONFIG_CGROUP_DMEM?)",
				 strerror(-ret));
	ASSERT_TRUE(!mkdir(A_CG, 0755) || errno == EEXIST);
	ASSERT_TRUE(!mkdir(B_CG, 0755) || errno == EEXIST);
	snprintf(limit, sizeof(limit), "%s %lu", self->region, A_MAX);
	ASSERT_EQ(0, sysfs_write(A_CG "/dmem.max", limit)) TH_LOG("%s -> dmem.max", limit);
	snprintf(limit, sizeof(limit), "%s %lu", self->region, B_MAX);
	ASSERT_EQ(0, sysfs_write(B_CG "/dmem.max", limit)) TH_LOG("%s -> dmem.max", limit);
	snprintf(self->current_a, sizeof(self->current_a), "%s", A_CG "/dmem.current");
	snprintf(self->current_b, sizeof(self->current_b), "%s", B_CG "/dmem.current");
}

FIXTURE_TEARDOWN(dmem)
{
	close(self->dev);
	rmdir(A_CG);
	rmdir(B_CG);
}

/*
 * Forks a tenant: the child joins @cg, becomes @uid (no groups, no capabilities) and exits
 * with what @body returns. @dev was opened by root (the node is root's): the charge goes to the
 * cgroup of the process that allocates, not to the opener. Returns the child's pid.
 */
static pid_t tenant(const char *cg, uid_t uid, int dev, int (*body)(int dev, void *arg),
		    void *arg)
{
	char procs[128];
	pid_t pid = fork();

	if (pid)
		return pid;
	snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg);
	if (sysfs_write(procs, "0") || setgroups(0, NULL) || setgid(uid) || setuid(uid))
		_exit(100);
	_exit(body(dev, arg));
}

static int wait_exit(pid_t pid)
{
	int status;

	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* What tenant A does while B works: the pipes of "held" and "go on". */
struct hold {
	int held[2], go[2];
};

/*
 * Allocates @limit in 4 pieces, checks that one page more is ENOSPC and that the cgroup's
 * dmem.current says exactly @limit; then, with @h, says so and waits before closing.
 * Exit codes name the failed step.
 */
static int fill_to_limit(int dev, unsigned long limit, const char *current, const char *region,
			 struct hold *h)
{
	int fds[4], i, extra;
	char c = 1;

	for (i = 0; i < 4; i++) {
		fds[i] = p2p_alloc(dev, limit / 4, 0, NULL);
		if (fds[i] < 0)
			return 10 + i;
	}
	extra = p2p_alloc(dev, 4 * KIB, 0, NULL);
	if (extra != -ENOSPC)
		return 20;
	if (region_value(current, region) != (long long)limit)
		return 21;
	if (h) {
		if (write(h->held[1], &c, 1) != 1 || read(h->go[0], &c, 1) != 1)
			return 22;
	}
	for (i = 0; i < 4; i++)
		close(fds[i]);
	return 0;
}

struct fill_arg {
	unsigned long limit;
	const char *current, *region;
	struct hold *hold;
};

static int fill_body(int dev, void *p)
{
	struct fill_arg *a = p;

	return fill_to_limit(dev, a->limit, a->current, a->region, a->hold);
}

TEST_F(dmem, two_tenants_each_get_their_limit)
{
	struct hold h;
	struct fill_arg a = { A_MAX, self->current_a, self->region, &h };
	struct fill_arg b = { B_MAX, self->current_b, self->region, NULL };
	pid_t pa, pb;
	char c = 0;
	int rc;

	ASSERT_EQ(0, pipe(h.held));
	ASSERT_EQ(0, pipe(h.go));
	/* A fills its 1 MiB and holds it ... */
	pa = tenant(A_CG, A_UID, self->dev, fill_body, &a);
	ASSERT_GT(pa, 0);
	ASSERT_EQ(1, read(h.held[0], &c, 1)) TH_LOG("tenant A did not get its limit");
	EXPECT_EQ((long long)A_MAX, region_value(self->current_a, self->region));
	/* ... while B, another user in another cgroup, gets all of its 2 MiB, and no more. */
	pb = tenant(B_CG, B_UID, self->dev, fill_body, &b);
	ASSERT_GT(pb, 0);
	rc = wait_exit(pb);
	EXPECT_EQ(0, rc) TH_LOG("tenant B failed at step %d (see fill_to_limit)", rc);
	EXPECT_EQ(0LL, region_value(self->current_b, self->region));
	/* A still holds exactly its own: B's use never counted against it. */
	EXPECT_EQ((long long)A_MAX, region_value(self->current_a, self->region));
	ASSERT_EQ(1, write(h.go[1], &c, 1));
	rc = wait_exit(pa);
	EXPECT_EQ(0, rc) TH_LOG("tenant A failed at step %d (see fill_to_limit)", rc);
	EXPECT_EQ(0LL, region_value(self->current_a, self->region));
	close(h.held[0]);
	close(h.held[1]);
	close(h.go[0]);
	close(h.go[1]);
}

/* REVOKE gives the memory back with the fd still open: the charge goes with it. */
static int revoke_body(int dev, void *p)
{
	const char **f = p;
	int fd = p2p_alloc(dev, 512 * KIB, 0, NULL);

	if (fd < 0)
		return 10;
	if (region_value(f[0], f[1]) != (long long)(512 * KIB))
		return 11;
	if (p2p_revoke(dev, fd))
		return 12;
	if (region_value(f[0], f[1]) != 0)
		return 13;
	/* A second REVOKE and the close uncharge nothing more. */
	if (p2p_revoke(dev, fd))
		return 14;
	close(fd);
	return region_value(f[0], f[1]) == 0 ? 0 : 15;
}

TEST_F(dmem, revoke_uncharges_once)
{
	const char *f[2] = { self->current_a, self->region };

	EXPECT_EQ(0, wait_exit(tenant(A_CG, A_UID, self->dev, revoke_body, f)));
	EXPECT_EQ(0LL, region_value(self->current_a, self->region));
}

/* A tenant killed with buffers open: its charges go when its files do. */
static int hold_body(int dev, void *p)
{
	struct hold *h = p;
	char c = 1;
	int i;

	for (i = 0; i < 3; i++)
		if (p2p_alloc(dev, 256 * KIB, 0, NULL) < 0)
			return 10;
	if (write(h->held[1], &c, 1) != 1)
		return 11;
	pause();
	return 12;
}

TEST_F(dmem, kill_uncharges)
{
	struct hold h;
	pid_t pid;
	char c;

	ASSERT_EQ(0, pipe(h.held));
	pid = tenant(B_CG, B_UID, self->dev, hold_body, &h);
	ASSERT_GT(pid, 0);
	ASSERT_EQ(1, read(h.held[0], &c, 1));
	EXPECT_EQ((long long)(768 * KIB), region_value(self->current_b, self->region));
	ASSERT_EQ(0, kill(pid, SIGKILL));
	EXPECT_EQ(128 + SIGKILL, wait_exit(pid));
	EXPECT_EQ(0LL, region_value(self->current_b, self->region));
	close(h.held[0]);
	close(h.held[1]);
}

/* Results a tenant hands back to the test: in a shared anonymous mapping. */
struct seen {
	__u64 offset;
	long long nonzero; /* first non-zero byte of what the second tenant got; -1: none */
	int uninit_errno, p2pmem_errno;
};

static struct seen *seen_map(void)
{
	void *p = mmap(NULL, sizeof(struct seen), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/*
 * 1 MiB of device memory, written with @byte through a mapping (unmapped again); its BAR offset
 * in @offset. The fd, or the step that failed, negated: -10 ALLOC, -11 mmap.
 */
static int write_secret(int dev, uint8_t byte, __u64 *offset)
{
	int fd = p2p_alloc(dev, MIB, 0, offset);
	uint8_t *m;

	if (fd < 0)
		return -10;
	m = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return -11;
	}
	memset(m, byte, MIB);
	munmap(m, MIB);
	return fd;
}

/* Tenant A: 1 MiB written with a secret, closed: the range goes back to the pool. */
static int secret_body(int dev, void *p)
{
	struct seen *s = p;
	int fd = write_secret(dev, 0xa5, &s->offset);

	if (fd < 0)
		return -fd;
	close(fd);
	return 0;
}

/* Tenant B: the same size, by every way a tenant has; what it saw goes to @p. */
struct peek_arg {
	struct seen *seen;
	const char *p2pmem;
};

static int peek_body(int dev, void *p)
{
	struct peek_arg *a = p;
	struct seen *s = a->seen;
	int fd, pfd;
	uint8_t *m;

	fd = p2p_alloc(dev, MIB, P2PBUF_ALLOC_UNINITIALIZED, NULL);
	s->uninit_errno = fd < 0 ? -fd : 0;
	if (fd >= 0)
		close(fd);
	pfd = open(a->p2pmem, O_RDWR | O_CLOEXEC);
	s->p2pmem_errno = pfd < 0 ? errno : 0;
	if (pfd >= 0)
		close(pfd);
	fd = p2p_alloc(dev, MIB, 0, &s->offset);
	if (fd < 0)
		return 10;
	m = mmap(NULL, MIB, PROT_READ, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return 11;
	s->nonzero = -1;
	for (size_t i = 0; i < MIB; i++) {
		if (m[i]) {
			s->nonzero = (long long)i;
			break;
		}
	}
	munmap(m, MIB);
	close(fd);
	return 0;
}

TEST_F(dmem, no_tenant_reads_anothers_data)
{
	struct seen *a = seen_map(), *b = seen_map();
	char p2pmem[160];
	struct peek_arg pa = { b, p2pmem };

	ASSERT_NE(NULL, a);
	ASSERT_NE(NULL, b);
	snprintf(p2pmem, sizeof(p2pmem), "/sys/bus/pci/devices/%s/p2pmem/allocate",
		 self->prov.pci_name);
	ASSERT_EQ(0, wait_exit(tenant(A_CG, A_UID, self->dev, secret_body, a)));
	ASSERT_EQ(0, wait_exit(tenant(B_CG, B_UID, self->dev, peek_body, &pa)));
	TH_LOG("A wrote at BAR offset %#llx, B got %#llx%s", (unsigned long long)a->offset,
	       (unsigned long long)b->offset,
	       a->offset == b->offset ? " (the same range)" : "");
	EXPECT_EQ(-1, b->nonzero) TH_LOG("B read a non-zero byte at %lld", b->nonzero);
	EXPECT_EQ(EPERM, b->uninit_errno) TH_LOG("ALLOC_UNINITIALIZED without CAP_SYS_RAWIO: %s",
						 strerror(b->uninit_errno));
	/* The PCI core's own allocator of the pool: not a tenant's (EACCES), or not there. */
	EXPECT_TRUE(b->p2pmem_errno == EACCES || b->p2pmem_errno == ENOENT)
		TH_LOG("%s opened by a tenant: %s", p2pmem, strerror(b->p2pmem_errno));
	munmap(a, sizeof(*a));
	munmap(b, sizeof(*b));
}

/* Opens the node as @uid, with NODE_GID as its only group if @member; allocates 64 KiB. */
static int open_as(uid_t uid, int member)
{
	gid_t g = NODE_GID;
	pid_t pid = fork();
	int fd;

	if (pid)
		return wait_exit(pid);
	if (setgroups(member ? 1 : 0, &g) || setgid(uid) || setuid(uid))
		_exit(100);
	fd = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		_exit(errno == EACCES ? 20 : 21);
	prov_id = p2pbuf_first_provider(fd);
	_exit(p2p_alloc(fd, 64 * KIB, 0, NULL) >= 0 ? 0 : 22);
}

TEST_F(dmem, group_node_admits_members_only)
{
	struct stat st;
	int member, other;

	ASSERT_EQ(0, stat("/dev/p2pbuf", &st));
	/* What the udev rule does: GROUP="p2pbuf", MODE="0660". */
	ASSERT_EQ(0, chown("/dev/p2pbuf", 0, NODE_GID));
	ASSERT_EQ(0, chmod("/dev/p2pbuf", 0660));
	member = open_as(A_UID, 1);
	other = open_as(B_UID, 0);
	chown("/dev/p2pbuf", st.st_uid, st.st_gid);
	chmod("/dev/p2pbuf", st.st_mode & 07777);
	EXPECT_EQ(0, member) TH_LOG("a member of the node's group: step %d (21: open, 22: ALLOC)",
				    member);
	EXPECT_EQ(20, other) TH_LOG("not a member: step %d (20 is EACCES at open)", other);
}

/*
 * A tenant's buffers across unbind and bind: held while the device is unbound (the unbind
 * revokes them and uncharges; the region goes), closed after it is bound again (nothing is
 * uncharged twice), then a new allocation charges the new region exactly.
 */
static int across_body(int dev, void *p)
{
	struct hold *h = p;
	const char *current = B_CG "/dmem.current";
	struct p2pbuf_provider_info prov;
	char region[128];
	int fds[3], i, fd;
	char c = 1;

	for (i = 0; i < 3; i++) {
		fds[i] = p2p_alloc(dev, 256 * KIB, 0, NULL);
		if (fds[i] < 0)
			return 10;
	}
	if (write(h->held[1], &c, 1) != 1 || read(h->go[0], &c, 1) != 1)
		return 11;
	for (i = 0; i < 3; i++)
		close(fds[i]);
	prov_id = p2pbuf_first_provider(dev);
	if (!prov_id || p2p_provider(dev, prov_id, &prov))
		return 12;
	snprintf(region, sizeof(region), "p2pbuf/%s/bar%u", prov.pci_name, prov.bar);
	if (region_value(current, region) > 0)
		return 13;
	fd = p2p_alloc(dev, 128 * KIB, 0, NULL);
	if (fd < 0)
		return 14;
	if (region_value(current, region) != (long long)(128 * KIB))
		return 15;
	close(fd);
	return region_value(current, region) == 0 ? 0 : 16;
}

TEST_F(dmem, unbind_uncharges_and_rebind_registers_again)
{
	struct hold h;
	long long cur;
	pid_t pid;
	char c;
	int rc;

	ASSERT_EQ(0, pipe(h.held));
	ASSERT_EQ(0, pipe(h.go));
	pid = tenant(B_CG, B_UID, self->dev, across_body, &h);
	ASSERT_GT(pid, 0);
	ASSERT_EQ(1, read(h.held[0], &c, 1));
	EXPECT_EQ((long long)(768 * KIB), region_value(self->current_b, self->region));

	rc = sysfs_write(EXPORTER_DRV "/unbind", self->prov.pci_name);
	EXPECT_EQ(0, rc) TH_LOG("unbind %s: %s", self->prov.pci_name, strerror(-rc));
	cur = region_value(self->current_b, self->region);
	/* Uncharged; the region itself is gone from the file (-1) or listed at 0. */
	EXPECT_GE(0LL, cur) TH_LOG("dmem.current after unbind: %lld", cur);
	EXPECT_EQ(-1LL, region_value(CG "/dmem.capacity", self->region))
		TH_LOG("the region is still registered after unbind");

	rc = sysfs_write(EXPORTER_DRV "/bind", self->prov.pci_name);
	ASSERT_EQ(0, rc) TH_LOG("bind %s: %s", self->prov.pci_name, strerror(-rc));
	EXPECT_EQ((long long)self->prov.bar_size, region_value(CG "/dmem.capacity", self->region));

	ASSERT_EQ(1, write(h.go[1], &c, 1));
	rc = wait_exit(pid);
	EXPECT_EQ(0, rc) TH_LOG("the tenant failed at step %d (see across_body)", rc);
	close(h.held[0]);
	close(h.held[1]);
	close(h.go[0]);
	close(h.go[1]);
}

/*
 * The pool is the PCI core's, shared with its own allocator: root's p2pmem/allocate (and nvmet
 * once the provider is published). A range goes back to the pool as its user left it, so the
 * allocator that maps it into a process must clear it first (series 2, patch 1). Tenant A
 * writes a secret into 1 MiB and gives it back by each of the three ways a buffer's memory
 * goes (close, REVOKE with the fd still open, kill -9); root then maps the same range through
 * p2pmem/allocate (the pool is first-fit: the lowest free range of that size, checked through
 * /proc/self/pagemap) and must read zeroes.
 */
enum give_back { BY_CLOSE, BY_REVOKE, BY_KILL };

struct secret_arg {
	struct seen *seen;
	struct hold *hold;
	enum give_back how;
};

static int give_back_body(int dev, void *p)
{
	struct secret_arg *a = p;
	int fd = write_secret(dev, 0x5a, &a->seen->offset);
	char c = 1;

	/* Only root's ends: if root goes, the read below ends. */
	close(a->hold->held[0]);
	close(a->hold->go[1]);
	if (fd < 0)
		return -fd;
	if (a->how == BY_CLOSE)
		close(fd);
	if (a->how == BY_REVOKE && p2p_revoke(dev, fd))
		return 12;
	if (write(a->hold->held[1], &c, 1) != 1)
		return 13;
	if (a->how == BY_KILL)
		pause();
	/* BY_REVOKE: the fd stays open until root has looked. */
	return read(a->hold->go[0], &c, 1) == 1 ? 0 : 14;
}

/* The BAR offset of the page mapped at @addr (root sees PFNs in pagemap); -1 if unknown. */
static long long bar_offset_of(const void *addr, const char *pci, unsigned int bar)
{
	unsigned long long start = 0, entry = 0;
	char path[160], line[160];
	unsigned int i;
	FILE *f;
	int fd;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource", pci);
	f = fopen(path, "re");
	if (!f)
		return -1;
	for (i = 0; i <= bar && fgets(line, sizeof(line), f); i++)
		start = strtoull(line, NULL, 16);
	fclose(f);
	fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (pread(fd, &entry, sizeof(entry), (uintptr_t)addr / 4096 * sizeof(entry)) !=
	    sizeof(entry))
		entry = 0;
	close(fd);
	if (!(entry >> 63) || !(entry & ((1ULL << 55) - 1)))
		return -1;
	return (long long)((entry & ((1ULL << 55) - 1)) * 4096 - start);
}

TEST_F(dmem, p2pmem_allocate_reads_no_tenants_data)
{
	static const char *const ways[] = { "close", "REVOKE (fd open)", "kill -9" };
	struct seen *a = seen_map();
	char p2pmem[160];
	struct hold h;

	ASSERT_NE(NULL, a);
	ASSERT_EQ(0, pipe(h.held));
	ASSERT_EQ(0, pipe(h.go));
	snprintf(p2pmem, sizeof(p2pmem), "/sys/bus/pci/devices/%s/p2pmem/allocate",
		 self->prov.pci_name);
	for (int how = BY_CLOSE; how <= BY_KILL; how++) {
		struct secret_arg arg = { a, &h, how };
		long long got, nonzero = -1;
		pid_t pid;
		uint8_t *m;
		char c = 0;
		int pfd;

		pid = tenant(A_CG, A_UID, self->dev, give_back_body, &arg);
		ASSERT_GT(pid, 0);
		ASSERT_EQ(1, read(h.held[0], &c, 1)) TH_LOG("%s: the tenant failed", ways[how]);
		if (how == BY_KILL) {
			ASSERT_EQ(0, kill(pid, SIGKILL));
			ASSERT_EQ(128 + SIGKILL, wait_exit(pid));
		}
		pfd = open(p2pmem, O_RDWR | O_CLOEXEC);
		ASSERT_LE(0, pfd) TH_LOG("%s: %s", p2pmem, strerror(errno));
		m = mmap(NULL, MIB, PROT_READ, MAP_SHARED, pfd, 0);
		ASSERT_NE(MAP_FAILED, m) TH_LOG("mmap of %s: %s", p2pmem, strerror(errno));
		got = bar_offset_of(m, self->prov.pci_name, self->prov.bar);
		for (size_t i = 0; i < MIB && nonzero < 0; i++)
			if (m[i])
				nonzero = (long long)i;
		munmap(m, MIB);
		close(pfd);
		if (how != BY_KILL) {
			ASSERT_EQ(1, write(h.go[1], &c, 1));
			EXPECT_EQ(0, wait_exit(pid));
		}
		TH_LOG("%s: the tenant wrote at BAR offset %#llx, p2pmem/allocate gave %#llx",
		       ways[how], (unsigned long long)a->offset, (unsigned long long)got);
		/* Not the same range: the check below would prove nothing. */
		ASSERT_EQ((long long)a->offset, got);
		EXPECT_EQ(-1, nonzero) TH_LOG("%s: the tenant's data at byte %lld of the range",
					      ways[how], nonzero);
	}
	munmap(a, sizeof(*a));
	close(h.held[0]);
	close(h.held[1]);
	close(h.go[0]);
	close(h.go[1]);
}

TEST_HARNESS_MAIN

// SPDX-License-Identifier: GPL-2.0
/*
 * p2pbuf exporter, 4 of 4: unbinding the provider under open and mapped buffers (runs
 * last: it unbinds the device). Wrappers and fixture: exporter.h.
 */
#include "exporter.h"

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

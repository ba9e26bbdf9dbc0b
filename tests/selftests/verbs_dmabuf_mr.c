// SPDX-License-Identifier: GPL-2.0
/*
 * ibv_reg_dmabuf_mr of p2pbuf device memory, at the verbs level in C: a selftest that links
 * libibverbs (the `LDLIBS` line below; xtask builds it against rdma-core's staging root, see
 * docs/lab.md). The region covers the buffer and carries its keys; one past the buffer's end
 * is refused with EINVAL and the exporter keeps working. Without an RDMA device it adds rxe0
 * on eth0 (soft-RoCE) first; SKIP when there is none, or no p2pbuf device memory.
 */
// LDLIBS: -libverbs

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "kselftest_harness.h"
#include "p2pbuf_test.h"

#define LEN (1UL << 20)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

FIXTURE(verbs)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	int p2p, fd;
};

/* The first RDMA device, opened; after adding rxe0 on eth0 when there is none. */
static struct ibv_context *first_device(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	int n = 0;

	list = ibv_get_device_list(&n);
	if ((!list || !n) &&
	    !system("ip link set eth0 up && rdma link add rxe0 type rxe netdev eth0 2>/dev/null")) {
		ibv_free_device_list(list);
		list = ibv_get_device_list(&n);
	}
	if (list && n)
		ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	return ctx;
}

FIXTURE_SETUP(verbs)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = LEN };

	self->pd = NULL;
	self->fd = -1;
	self->p2p = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	self->ctx = first_device();
	if (self->p2p < 0)
		SKIP(return, "no /dev/p2pbuf: %s", strerror(errno));
	if (!self->ctx)
		SKIP(return, "no RDMA device (and no rxe0 on eth0)");
	self->pd = ibv_alloc_pd(self->ctx);
	ASSERT_NE(NULL, self->pd) TH_LOG("ibv_alloc_pd: %s", strerror(errno));
	/*
	 * Uninitialized: this test writes nothing, and zeroing would overwrite what an earlier
	 * test left at the same BAR offset for the host check at the end of the run.
	 */
	a.flags = P2PBUF_ALLOC_UNINITIALIZED;
	ASSERT_EQ(0, p2pbuf_test_alloc(self->p2p, &a)) TH_LOG("P2PBUF_IOCTL_ALLOC: %s",
							       strerror(errno));
	self->fd = a.fd;
}

FIXTURE_TEARDOWN(verbs)
{
	p2pbuf_close(&self->fd);
	if (self->pd)
		ibv_dealloc_pd(self->pd);
	if (self->ctx)
		ibv_close_device(self->ctx);
	p2pbuf_close(&self->p2p);
}

TEST_F(verbs, dmabuf_mr_covers_the_buffer)
{
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(self->pd, 0, LEN, 0, self->fd, ACCESS);

	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_dmabuf_mr on %s: %s",
				   ibv_get_device_name(self->ctx->device), strerror(errno));
	EXPECT_EQ(LEN, mr->length);
	EXPECT_NE(0U, mr->rkey);
	EXPECT_EQ(0, ibv_dereg_mr(mr));
}

TEST_F(verbs, dmabuf_mr_past_the_end_is_refused)
{
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(self->pd, 4096, LEN, 0, self->fd, ACCESS);

	EXPECT_EQ(NULL, mr);
	EXPECT_EQ(EINVAL, errno);
	if (mr)
		ibv_dereg_mr(mr);
	/* The exporter still answers for the buffer. */
	EXPECT_EQ(0, ioctl(self->p2p, P2PBUF_IOCTL_INFO, &(struct p2pbuf_info){
		.size = sizeof(struct p2pbuf_info) }));
}

/*
 * A buffer allocated with P2PBUF_ALLOC_PFNMAP maps as I/O memory without struct pages
 * (VM_IO | VM_PFNMAP): plain ibv_reg_mr() of its mapping cannot pin it and fails with EFAULT,
 * where nvidia-peermem-style code would need the pages; the dma-buf itself still registers.
 */
TEST_F(verbs, reg_mr_of_a_pfn_mapping_is_refused)
{
	struct p2pbuf_alloc a = {
		.size = sizeof(a), .length = LEN,
		.flags = P2PBUF_ALLOC_PFNMAP | P2PBUF_ALLOC_UNINITIALIZED,
	};
	struct ibv_mr *mr;
	uint8_t *map;

	ASSERT_EQ(0, p2pbuf_test_alloc(self->p2p, &a)) TH_LOG("P2PBUF_IOCTL_ALLOC: %s",
							       strerror(errno));
	map = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
	ASSERT_NE(MAP_FAILED, map) TH_LOG("mmap: %s", strerror(errno));
	/* Faulted in: the refusal is not about an empty mapping. */
	(void)*(volatile uint8_t *)map;
	errno = 0;
	mr = ibv_reg_mr(self->pd, map, LEN, ACCESS);
	EXPECT_EQ(NULL, mr) TH_LOG("ibv_reg_mr pinned a PFN mapping");
	EXPECT_EQ(EFAULT, errno) TH_LOG("ibv_reg_mr: %s", strerror(errno));
	if (mr)
		ibv_dereg_mr(mr);
	mr = ibv_reg_dmabuf_mr(self->pd, 0, LEN, 0, a.fd, ACCESS);
	EXPECT_NE(NULL, mr) TH_LOG("ibv_reg_dmabuf_mr: %s", strerror(errno));
	if (mr)
		EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(map, LEN);
	close(a.fd);
}

TEST_HARNESS_MAIN

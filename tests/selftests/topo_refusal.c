// SPDX-License-Identifier: GPL-2.0
/*
 * P2PBUF_IOCTL_REFUSAL on the topology boots: the DMA engine (the edu device, bound to
 * p2pbuf_dma) imports a buffer of the exporter's device memory. Where the fabric has no
 * peer-to-peer path (each device on its own root port, a CPU p2pdma does not trust), the
 * exporter refuses the engine (EOPNOTSUPP) and the refusal ioctl names the engine's PCI
 * device, with P2PBUF_REFUSAL_NO_P2P_PATH and the reason in words, counting each refusal;
 * where the import works, the buffer has no refusal.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "uapi/linux/p2pbuf.h"
#include "p2pbuf_test.h"

#define IMPORTER_DRV "/sys/bus/pci/drivers/p2pbuf_dma"

/* Whether p2pdma must refuse this boot's fabric (tests/vm/lib.sh p2p_fabric = refused). */
static int fabric_refuses(void)
{
	const char *topo = getenv("P2PBUF_TOPOLOGY");
	char line[256];
	int amd = 0, family = 0;
	FILE *f;

	if (!topo || strcmp(topo, "rootports"))
		return 0;
	f = fopen("/proc/cpuinfo", "r");
	if (!f)
		return 1;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "vendor_id", 9) && strstr(line, "AuthenticAMD"))
			amd = 1;
		if (!strncmp(line, "cpu family", 10) && !family)
			family = atoi(strchr(line, ':') ? strchr(line, ':') + 1 : "0");
	}
	fclose(f);
	return !(amd && family >= 0x17);
}

static int refusal(int p2p, int fd, struct p2pbuf_refusal *r)
{
	memset(r, 0, sizeof(*r));
	r->size = sizeof(*r);
	r->fd = fd;
	return ioctl(p2p, P2PBUF_IOCTL_REFUSAL, r) ? -errno : 0;
}

static long engine_import(int dma, int fd)
{
	struct p2pbuf_dma_import im = { .size = sizeof(im), .fd = fd };

	return ioctl(dma, P2PBUF_DMA_IOCTL_IMPORT, &im) ? -errno : (long)im.handle;
}

TEST(refusal_names_the_engine)
{
	struct p2pbuf_alloc a = { .size = sizeof(a), .length = 4096 };
	struct p2pbuf_alloc b = { .size = sizeof(b), .length = 4096 };
	struct p2pbuf_refusal r;
	char engine[300];
	int p2p, dma;
	long h;

	p2p = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC);
	if (p2p < 0)
		SKIP(return, "/dev/p2pbuf: %s", strerror(errno));
	dma = open("/dev/p2pbuf-dma", O_RDWR | O_CLOEXEC);
	if (dma < 0 || p2pbuf_bound_device(IMPORTER_DRV, engine, sizeof(engine)))
		SKIP(return, "no DMA engine (/dev/p2pbuf-dma, p2pbuf_dma bound)");
	ASSERT_EQ(0, p2pbuf_test_alloc(p2p, &a)) TH_LOG("alloc: %s", strerror(errno));
	ASSERT_EQ(0, refusal(p2p, a.fd, &r));
	EXPECT_EQ(P2PBUF_REFUSAL_NONE, r.reason);
	EXPECT_EQ(0ULL, r.nr_refused);
	EXPECT_EQ(a.provider, r.provider);
	h = engine_import(dma, a.fd);
	if (!fabric_refuses()) {
		EXPECT_GT(h, 0) TH_LOG("import: %s", strerror((int)-h));
		ASSERT_EQ(0, refusal(p2p, a.fd, &r));
		EXPECT_EQ(P2PBUF_REFUSAL_NONE, r.reason);
		EXPECT_EQ(0ULL, r.nr_refused);
		TH_LOG("fabric with a peer-to-peer path: %s imported, no refusal", engine);
		close(a.fd);
		close(dma);
		close(p2p);
		return;
	}
	EXPECT_EQ(-EOPNOTSUPP, h);
	ASSERT_EQ(0, refusal(p2p, a.fd, &r));
	EXPECT_EQ(P2PBUF_REFUSAL_NO_P2P_PATH, r.reason);
	EXPECT_EQ(1ULL, r.nr_refused);
	EXPECT_STREQ(engine, r.device);
	EXPECT_NE(NULL, strstr(r.text, "no peer-to-peer path"));
	EXPECT_EQ(0, r.device[P2PBUF_DEVICE_NAME_LEN - 1]);
	EXPECT_EQ(0, r.text[P2PBUF_REASON_LEN - 1]);
	TH_LOG("refused %s: reason %u, \"%s\"", r.device, r.reason, r.text);
	/* Each refusal counts; the record is the buffer's own (a fresh buffer has none). */
	EXPECT_EQ(-EOPNOTSUPP, engine_import(dma, a.fd));
	ASSERT_EQ(0, refusal(p2p, a.fd, &r));
	EXPECT_EQ(2ULL, r.nr_refused);
	ASSERT_EQ(0, p2pbuf_test_alloc(p2p, &b));
	ASSERT_EQ(0, refusal(p2p, b.fd, &r));
	EXPECT_EQ(P2PBUF_REFUSAL_NONE, r.reason);
	close(b.fd);
	close(a.fd);
	close(dma);
	close(p2p);
}

TEST_HARNESS_MAIN

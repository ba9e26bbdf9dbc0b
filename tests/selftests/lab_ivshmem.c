// SPDX-License-Identifier: GPL-2.0
/*
 * The emulated GPU memory of the lab: BAR2 of the ivshmem-plain device, mapped through sysfs,
 * is writable and reads back; the bytes written here are checked from the host in the
 * memory-backend-file by `cargo xtask test` (the "# hostcheck" line; the pattern is
 * xtask/src/judge/hostcheck.rs's). The bytes go 4 MiB below the end of the BAR, where the other
 * tests' allocations (first fit from the start) do not reach.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "p2pbuf_test.h"

#define LAB_FROM_END (4UL << 20)
#define LAB_LEN 4096UL

/* The path of BAR 2 of the first ivshmem-plain device (1af4:1110); 0, or -1 for none. */
static int find_ivshmem(char *path, size_t len)
{
	char pci[64];

	if (p2pbuf_pci_find("0x1af4", "0x1110", pci, sizeof(pci)))
		return -1;
	snprintf(path, len, "/sys/bus/pci/devices/%s/resource2", pci);
	return 0;
}

TEST(bar2_write_read_back)
{
	unsigned int seed = ((unsigned int)getpid() & 0x7f) + 3;
	char path[600];
	volatile uint8_t *bar;
	struct stat st;
	size_t i, off;
	int fd;

	if (find_ivshmem(path, sizeof(path)))
		SKIP(return, "no ivshmem-plain device (1af4:1110)");
	fd = open(path, O_RDWR | O_SYNC);
	ASSERT_GE(fd, 0) TH_LOG("open %s: %s", path, strerror(errno));
	ASSERT_EQ(0, fstat(fd, &st));
	ASSERT_GE((size_t)st.st_size, LAB_FROM_END);
	off = st.st_size - LAB_FROM_END;
	bar = mmap(NULL, LAB_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
	ASSERT_NE(MAP_FAILED, (void *)bar) TH_LOG("mmap %s: %s", path, strerror(errno));
	for (i = 0; i < LAB_LEN; i++)
		bar[i] = p2pbuf_pattern(i, seed);
	for (i = 0; i < LAB_LEN; i++)
		ASSERT_EQ(p2pbuf_pattern(i, seed), bar[i]);
	printf("# hostcheck target=gpu offset=%zu len=%lu seed=%u\n", off, LAB_LEN, seed);
	fflush(stdout);
	munmap((void *)bar, LAB_LEN);
	close(fd);
}

TEST_HARNESS_MAIN

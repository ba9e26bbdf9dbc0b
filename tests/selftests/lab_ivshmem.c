// SPDX-License-Identifier: GPL-2.0
/*
 * The emulated GPU memory of the lab: BAR2 of the ivshmem-plain device, mapped through sysfs,
 * is writable and reads back; the bytes written here are checked from the host in the
 * memory-backend-file by `cargo xtask test` (the "# hostcheck" line; the pattern is
 * xtask/src/hostcheck.rs's). The bytes go 4 MiB below the end of the BAR, where the other
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

#define LAB_FROM_END (4UL << 20)
#define LAB_LEN 4096UL

static int find_ivshmem(char *path, size_t len)
{
	DIR *d = opendir("/sys/bus/pci/devices");
	struct dirent *e;
	int found = -1;

	if (!d)
		return -1;
	while ((e = readdir(d))) {
		char p[512], v[16] = "", id[16] = "";
		FILE *f;

		snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/vendor", e->d_name);
		f = fopen(p, "r");
		if (!f)
			continue;
		if (!fgets(v, sizeof(v), f))
			v[0] = 0;
		fclose(f);
		snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/device", e->d_name);
		f = fopen(p, "r");
		if (!f)
			continue;
		if (!fgets(id, sizeof(id), f))
			id[0] = 0;
		fclose(f);
		if (!strncmp(v, "0x1af4", 6) && !strncmp(id, "0x1110", 6)) {
			snprintf(path, len, "/sys/bus/pci/devices/%s/resource2", e->d_name);
			found = 0;
			break;
		}
	}
	closedir(d);
	return found;
}

static uint8_t pattern(size_t i, unsigned int seed)
{
	return (uint8_t)(i * 13 + seed + (i >> 12));
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
		bar[i] = pattern(i, seed);
	for (i = 0; i < LAB_LEN; i++)
		ASSERT_EQ(pattern(i, seed), bar[i]);
	printf("# hostcheck target=gpu offset=%zu len=%lu seed=%u\n", off, LAB_LEN, seed);
	fflush(stdout);
	munmap((void *)bar, LAB_LEN);
	close(fd);
}

TEST_HARNESS_MAIN

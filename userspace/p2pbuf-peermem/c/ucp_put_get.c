// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * ucp-put-get: UCX carries bytes into another node's memory, written against UCP alone (the
 * API applications, MPI and NCCL's UCX plugin use): no dma-buf, no verbs, no p2pbuf in its
 * UCX calls. Run under LD_PRELOAD=libp2pbuf_peermem.so, the plain ibv_reg_mr that UCX's IB
 * memory domain makes for ucp_mem_map() of a p2pbuf mmap becomes ibv_reg_dmabuf_mr
 * (docs/rdma.md, "UCX: can a caller hand it a dma-buf fd?").
 *
 *   ucp-put-get serve --port P --size N (--p2pbuf [--at A] | --host-mem) [--timeout S]
 *   ucp-put-get client --server HOST:PORT [--timeout S] SIZE:OFFSET:SEED...
 *
 * serve: takes N bytes of memory and maps it: --p2pbuf, device memory of the first p2pbuf
 * provider (/dev/p2pbuf, a dma-buf that this process keeps open and maps MAP_SHARED; --at A
 * first takes A bytes uninitialized, so that the buffer lands after them without zeroing
 * them, and gives them back); --host-mem, an anonymous mapping (for UCX without RDMA, on
 * any host). Then ucp_mem_map() of that address range, ucp_rkey_pack(), and a TCP listener
 * on port P: the one client gets the worker's address, the rkey, the address and the size,
 * and asks for checks ("verify OFFSET LEN SEED": the range is read through the mapping and
 * compared with the lab pattern of SEED) until it says "done".
 *
 * client: connects (retrying until the server listens, within the timeout), creates a UCP
 * endpoint to the server's worker, unpacks the rkey, and for each SIZE:OFFSET:SEED
 * ucp_put_nbx()es the lab pattern of SEED into the server's memory at OFFSET, flushes, has the
 * server verify it through its mapping, ucp_get_nbx()es the range back and compares. Last, a
 * check that must fail: the first range against SEED + 1, by the server and here.
 *
 * The lab pattern: p2pbuf_pattern.h. What UCX chose: ucp_ep_print_info() (client), as
 * "# " lines. Exit status: 0 all verified; 2 usage or set-up; 3 ucp_mem_map failed (stdout:
 * "MEM_MAP_FAILED status=... errno=N", errno as it stood when ucp_mem_map returned; UCX's own
 * message on stderr has the errno of the failed registration); 4 a transfer or the
 * connection failed; 5 data not as it must be.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <ucp/api/ucp.h>

#include "p2pbuf_test.h"

static double timeout_s = 120;

static void die(const char *what)
{
	fprintf(stderr, "ucp-put-get: %s: %s (errno %d)\n", what, strerror(errno), errno);
	exit(2);
}

static void die_ucs(const char *what, ucs_status_t st, int code)
{
	fprintf(stderr, "ucp-put-get: %s: %s\n", what, ucs_status_string(st));
	exit(code);
}

static size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 0);

	if (*end == 'k' || *end == 'K')
		v <<= 10;
	else if (*end == 'M')
		v <<= 20;
	else if (*end == 'G')
		v <<= 30;
	return v;
}

/* Index of the first byte of [p, p + len) that is not the pattern of seed, or -1. */
static long long first_mismatch(const uint8_t *p, size_t len, unsigned int seed)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != p2pbuf_pattern(i, seed))
			return (long long)i;
	return -1;
}

static ucp_context_h ctx;
static ucp_worker_h worker;

static void ucp_start(void)
{
	ucp_params_t p = {
		.field_mask = UCP_PARAM_FIELD_FEATURES,
		.features = UCP_FEATURE_RMA,
	};
	ucp_worker_params_t wp = {
		.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
		.thread_mode = UCS_THREAD_MODE_SINGLE,
	};
	ucp_config_t *cfg;
	ucs_status_t st;

	st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK)
		die_ucs("ucp_config_read", st, 2);
	st = ucp_init(&p, cfg, &ctx);
	ucp_config_release(cfg);
	if (st != UCS_OK)
		die_ucs("ucp_init", st, 2);
	st = ucp_worker_create(ctx, &wp, &worker);
	if (st != UCS_OK)
		die_ucs("ucp_worker_create", st, 2);
	printf("ucx: %s, UCX_TLS=%s, UCX_NET_DEVICES=%s\n", ucp_get_version_string(),
	       getenv("UCX_TLS") ?: "(all)", getenv("UCX_NET_DEVICES") ?: "(all)");
}

/* Waits for request r of a *_nbx call, progressing the worker; its final status. */
static ucs_status_t wait_req(ucs_status_ptr_t r)
{
	double end = now() + timeout_s;
	ucs_status_t st;

	if (r == NULL)
		return UCS_OK;
	if (UCS_PTR_IS_ERR(r))
		return UCS_PTR_STATUS(r);
	while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS && now() < end)
		ucp_worker_progress(worker);
	if (st == UCS_INPROGRESS) {
		ucp_request_cancel(worker, r);
		st = UCS_ERR_TIMED_OUT;
	}
	ucp_request_free(r);
	return st;
}

/* Sends all of [p, p + len) on socket s. */
static void send_all(int s, const void *p, size_t len)
{
	while (len) {
		ssize_t n = send(s, p, len, MSG_NOSIGNAL);

		if (n <= 0)
			die("send");
		p = (const char *)p + n;
		len -= n;
	}
}

/*
 * A line from socket s into buf (without the newline), progressing the worker while none has
 * come (a transport without RDMA emulates put and get with messages that the server's worker
 * must answer); 0, or -1 on EOF or after the timeout.
 */
static int recv_line(int s, char *buf, size_t len)
{
	double end = now() + timeout_s;
	size_t got = 0;

	while (now() < end) {
		struct pollfd p = { .fd = s, .events = POLLIN };
		char c;

		ucp_worker_progress(worker);
		if (poll(&p, 1, 1) <= 0)
			continue;
		if (recv(s, &c, 1, 0) != 1)
			return -1;
		if (c == '\n') {
			buf[got] = 0;
			return 0;
		}
		if (got + 1 < len)
			buf[got++] = c;
	}
	return -1;
}

/* The blob the server sends after its header line: the worker's address, then the rkey. */
struct hello {
	uint64_t addr, size, worker_len, rkey_len;
};

/*
 * serve: the memory (p2pbuf device memory or host memory), mapped by UCP, offered to one
 * client and checked through the mapping on its request.
 * Over 100 lines on purpose: the UCP calls in the order an application makes them (memory,
 * ucp_mem_map, rkey, listen, serve, then the releases in reverse), as the example it is.
 */
static int serve(int port, size_t size, int p2pbuf, size_t at)
{
	struct p2pbuf_buf b = { .fd = -1, .memfd = -1 };
	ucp_mem_map_params_t mp = {
		.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
	};
	ucp_mem_attr_t ma = { .field_mask = UCP_MEM_ATTR_FIELD_MEM_TYPE };
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct hello h = { .size = size };
	ucp_address_t *waddr;
	ucp_mem_h memh;
	void *rkey;
	size_t wlen, rlen;
	int ls, s, one = 1, ok = 0, bad = 0, err;
	char line[256];
	ucs_status_t st;

	if (p2pbuf) {
		int dev = open("/dev/p2pbuf", O_RDWR | O_CLOEXEC), spacer = -1;

		if (dev < 0)
			die("open /dev/p2pbuf");
		if (at) {
			struct p2pbuf_alloc a = {
				.size = sizeof(a), .flags = P2PBUF_ALLOC_UNINITIALIZED, .length = at,
			};

			if (p2pbuf_test_alloc(dev, &a))
				die("P2PBUF_IOCTL_ALLOC (the uninitialized bytes before the buffer)");
			spacer = a.fd;
		}
		err = p2pbuf_devbuf_alloc(dev, &b, size);
		p2pbuf_close(&spacer);
		close(dev);
		if (err) {
			errno = -err;
			die("p2pbuf device memory");
		}
		printf("memory: %zu bytes of p2pbuf device memory at BAR offset %#llx, dma-buf fd %d, mapped at %p\n",
		       size, (unsigned long long)b.bar_offset, b.fd, (void *)b.map);
	} else {
		b.size = size;
		b.map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (b.map == MAP_FAILED)
			die("mmap");
		printf("memory: %zu bytes of host memory (anonymous), mapped at %p\n", size,
		       (void *)b.map);
	}
	/* Something that is not the pattern, so that a put that lands nowhere shows. */
	memset(b.map, 0xa5, size);
	ucp_start();
	mp.address = b.map;
	mp.length = size;
	errno = 0;
	st = ucp_mem_map(ctx, &mp, &memh);
	if (st != UCS_OK) {
		err = errno;
		printf("MEM_MAP_FAILED status=%d (%s) errno=%d (%s)\n", st, ucs_status_string(st),
		       err, strerror(err));
		fflush(stdout);
		return 3;
	}
	if (ucp_mem_query(memh, &ma) == UCS_OK)
		printf("ucp_mem_map(address %p, length %zu): OK, UCP's memory type: %s\n", b.map,
		       size, ucs_memory_type_names[ma.mem_type]);
	st = ucp_rkey_pack(ctx, memh, &rkey, &rlen);
	if (st != UCS_OK)
		die_ucs("ucp_rkey_pack", st, 2);
	st = ucp_worker_get_address(worker, &waddr, &wlen);
	if (st != UCS_OK)
		die_ucs("ucp_worker_get_address", st, 2);
	printf("rkey: %zu bytes packed; worker address: %zu bytes\n", rlen, wlen);
	h.addr = (uintptr_t)b.map;
	h.worker_len = wlen;
	h.rkey_len = rlen;
	ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 1))
		die("listen");
	printf("listening on port %d\n", port);
	fflush(stdout);
	{
		struct pollfd p = { .fd = ls, .events = POLLIN };

		if (poll(&p, 1, (int)(timeout_s * 1000)) <= 0) {
			printf("no client within %.0f s\n", timeout_s);
			return 4;
		}
	}
	s = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
	if (s < 0)
		die("accept");
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	send_all(s, &h, sizeof(h));
	send_all(s, waddr, wlen);
	send_all(s, rkey, rlen);
	while (recv_line(s, line, sizeof(line)) == 0) {
		unsigned long long off, len;
		unsigned int seed;
		long long m;

		if (!strcmp(line, "done"))
			break;
		if (sscanf(line, "verify %llu %llu %u", &off, &len, &seed) != 3 || off > size ||
		    len > size - off) {
			printf("client: bad request \"%s\"\n", line);
			bad++;
			break;
		}
		if (p2pbuf)
			p2pbuf_cpu_access(&b, 1);
		m = first_mismatch(b.map + off, len, seed);
		if (p2pbuf)
			p2pbuf_cpu_access(&b, 0);
		if (m < 0) {
			printf("client: %llu bytes at offset %llu (seed %u): verified through the mapping\n",
			       len, off, seed);
			snprintf(line, sizeof(line), "verified\n");
			ok++;
		} else {
			printf("client: %llu bytes at offset %llu (seed %u): MISMATCH at offset %llu\n",
			       len, off, seed, off + m);
			snprintf(line, sizeof(line), "mismatch at %llu\n", off + m);
			bad++;
		}
		fflush(stdout);
		send_all(s, line, strlen(line));
	}
	printf("done: %d verified, %d not\n", ok, bad);
	close(s);
	close(ls);
	ucp_rkey_buffer_release(rkey);
	ucp_worker_release_address(worker, waddr);
	ucp_mem_unmap(ctx, memh);
	ucp_worker_destroy(worker);
	ucp_cleanup(ctx);
	p2pbuf_buf_free(&b);
	return 0;
}

/* Connects to host:port, retrying until it listens or the timeout passes; the socket. */
static int dial(const char *server)
{
	char host[256];
	const char *colon = strrchr(server, ':');
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai;
	double end = now() + timeout_s;
	int one = 1;

	if (!colon || colon - server >= (long)sizeof(host))
		return -1;
	memcpy(host, server, colon - server);
	host[colon - server] = 0;
	if (getaddrinfo(host, colon + 1, &hints, &ai))
		return -1;
	while (now() < end) {
		int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (s >= 0 && connect(s, ai->ai_addr, ai->ai_addrlen) == 0) {
			freeaddrinfo(ai);
			setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			return s;
		}
		if (s >= 0)
			close(s);
		usleep(200000);
	}
	freeaddrinfo(ai);
	return -1;
}

/* Asks the server to check [off, off + len) against seed: 1 verified, 0 mismatch, -1 error. */
static int server_verify(int s, size_t off, size_t len, unsigned int seed)
{
	char line[128];

	snprintf(line, sizeof(line), "verify %zu %zu %u\n", off, len, seed);
	send_all(s, line, strlen(line));
	if (recv_line(s, line, sizeof(line)))
		return -1;
	printf("server: %s\n", line);
	return !strcmp(line, "verified") ? 1 : 0;
}

/* One op: put, flush, the server's check, get, the check here; exit code (0 ok). */
static int put_get(ucp_ep_h ep, ucp_rkey_h rk, const struct hello *h, int s, size_t size,
		   size_t off, unsigned int seed)
{
	ucp_request_param_t rp = { .op_attr_mask = 0 };
	uint8_t *buf = malloc(size);
	double t0, t1, t2;
	long long m;
	int v;
	ucs_status_t st;

	if (!buf || off > h->size || size > h->size - off) {
		printf("%zu bytes at offset %zu: not within the server's %" PRIu64 " bytes\n", size,
		       off, h->size);
		free(buf);
		return 2;
	}
	for (size_t i = 0; i < size; i++)
		buf[i] = p2pbuf_pattern(i, seed);
	t0 = now();
	st = wait_req(ucp_put_nbx(ep, buf, size, h->addr + off, rk, &rp));
	if (st == UCS_OK)
		st = wait_req(ucp_ep_flush_nbx(ep, &rp));
	t1 = now();
	if (st != UCS_OK) {
		printf("ucp_put_nbx of %zu bytes at offset %zu: %s\n", size, off,
		       ucs_status_string(st));
		free(buf);
		return 4;
	}
	printf("ucp_put_nbx of %zu bytes at offset %zu (seed %u): done, %.1f MiB/s\n", size, off,
	       seed, size / (t1 - t0) / 1048576);
	v = server_verify(s, off, size, seed);
	memset(buf, 0x5a, size);
	t1 = now();
	st = wait_req(ucp_get_nbx(ep, buf, size, h->addr + off, rk, &rp));
	t2 = now();
	if (st != UCS_OK) {
		printf("ucp_get_nbx of %zu bytes at offset %zu: %s\n", size, off,
		       ucs_status_string(st));
		free(buf);
		return 4;
	}
	m = first_mismatch(buf, size, seed);
	free(buf);
	if (m >= 0)
		printf("ucp_get_nbx of %zu bytes at offset %zu: MISMATCH at offset %zu\n", size, off,
		       off + (size_t)m);
	else
		printf("ucp_get_nbx of %zu bytes at offset %zu: the pattern of seed %u, %.1f MiB/s\n",
		       size, off, seed, size / (t2 - t1) / 1048576);
	if (v < 0)
		return 4;
	return v == 1 && m < 0 ? 0 : 5;
}

/* Prints what UCX chose for ep (its lanes and transports), each line as a comment. */
static void print_ep(ucp_ep_h ep)
{
	char *text = NULL, *l, *save;
	size_t n = 0;
	FILE *f = open_memstream(&text, &n);

	if (!f)
		return;
	ucp_ep_print_info(ep, f);
	fclose(f);
	for (l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		l += strspn(l, "# ");
		if (*l)
			printf("# ep: %s\n", l);
	}
	free(text);
}

static int client(const char *server, char **ops, int nops)
{
	ucp_ep_params_t ep_p = { .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS };
	ucp_request_param_t rp = { .op_attr_mask = 0 };
	struct hello h;
	size_t first_size = 0, first_off = 0;
	unsigned int first_seed = 0;
	void *waddr, *rkey;
	ucp_rkey_h rk;
	ucp_ep_h ep;
	int s, rc = 0, v;
	ucs_status_t st;
	uint8_t *buf;

	s = dial(server);
	if (s < 0) {
		printf("could not connect to %s within %.0f s\n", server, timeout_s);
		return 4;
	}
	if (read_within(s, &h, sizeof(h), timeout_s) != sizeof(h) ||
	    h.worker_len > (1 << 20) || h.rkey_len > (1 << 20)) {
		printf("no greeting from %s\n", server);
		return 4;
	}
	waddr = malloc(h.worker_len);
	rkey = malloc(h.rkey_len);
	if (!waddr || !rkey || read_within(s, waddr, h.worker_len, timeout_s) != (ssize_t)h.worker_len ||
	    read_within(s, rkey, h.rkey_len, timeout_s) != (ssize_t)h.rkey_len) {
		printf("short greeting from %s\n", server);
		return 4;
	}
	printf("connected to %s: %" PRIu64 " bytes at %#" PRIx64 ", worker address %" PRIu64
	       " bytes, rkey %" PRIu64 " bytes\n", server, h.size, h.addr, h.worker_len, h.rkey_len);
	ucp_start();
	ep_p.address = waddr;
	st = ucp_ep_create(worker, &ep_p, &ep);
	if (st != UCS_OK)
		die_ucs("ucp_ep_create", st, 4);
	st = ucp_ep_rkey_unpack(ep, rkey, &rk);
	if (st != UCS_OK)
		die_ucs("ucp_ep_rkey_unpack", st, 4);
	print_ep(ep);
	for (int i = 0; i < nops && !rc; i++) {
		char *a = ops[i], *b = strchr(a, ':'), *c = b ? strchr(b + 1, ':') : NULL;

		if (!c) {
			printf("bad operation \"%s\" (want SIZE:OFFSET:SEED)\n", a);
			return 2;
		}
		*b = *c = 0;
		if (!i) {
			first_size = parse_size(a);
			first_off = parse_size(b + 1);
			first_seed = strtoul(c + 1, NULL, 0);
		}
		rc = put_get(ep, rk, &h, s, parse_size(a), parse_size(b + 1),
			     strtoul(c + 1, NULL, 0));
	}
	/* The checks must be live: the first range is not the pattern of another seed. */
	if (!rc && nops) {
		v = server_verify(s, first_off, first_size, first_seed + 1);
		buf = malloc(first_size);
		st = buf ? wait_req(ucp_get_nbx(ep, buf, first_size, h.addr + first_off, rk, &rp))
			 : UCS_ERR_NO_MEMORY;
		if (st == UCS_OK && v == 0 && first_mismatch(buf, first_size, first_seed + 1) == 0) {
			printf("seed %u at offset %zu: not the pattern from its first byte, here and on the server, as it must be\n",
			       first_seed + 1, first_off);
		} else {
			printf("seed %u at offset %zu: want a mismatch at its first byte on both ends (server: %d, get: %s)\n",
			       first_seed + 1, first_off, v, ucs_status_string(st));
			rc = 5;
		}
		free(buf);
	}
	send_all(s, "done\n", 5);
	ucp_rkey_destroy(rk);
	wait_req(ucp_ep_close_nbx(ep, &rp));
	close(s);
	ucp_worker_destroy(worker);
	ucp_cleanup(ctx);
	free(waddr);
	free(rkey);
	if (!rc)
		printf("OK\n");
	return rc;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: ucp-put-get serve --port P --size N (--p2pbuf [--at A] | --host-mem) [--timeout S]\n"
		"       ucp-put-get client --server HOST:PORT [--timeout S] SIZE:OFFSET:SEED...\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *server = NULL;
	size_t size = 0, at = 0;
	int port = 0, p2pbuf = -1, i = 2;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		usage();
	for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
		const char *o = argv[i];

		if (!strcmp(o, "--p2pbuf"))
			p2pbuf = 1;
		else if (!strcmp(o, "--host-mem"))
			p2pbuf = 0;
		else if (i + 1 >= argc)
			usage();
		else if (!strcmp(o, "--port"))
			port = atoi(argv[++i]);
		else if (!strcmp(o, "--size"))
			size = parse_size(argv[++i]);
		else if (!strcmp(o, "--at"))
			at = parse_size(argv[++i]);
		else if (!strcmp(o, "--timeout"))
			timeout_s = atof(argv[++i]);
		else if (!strcmp(o, "--server"))
			server = argv[++i];
		else
			usage();
	}
	if (!strcmp(argv[1], "serve") && port && size && p2pbuf >= 0 && i == argc)
		return serve(port, size, p2pbuf, at);
	if (!strcmp(argv[1], "client") && server)
		return client(server, argv + i, argc - i);
	usage();
	return 2;
}

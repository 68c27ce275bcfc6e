/*
 * cuobjpeer: the memory side of a cuObject RC client (protocol 1002) on
 * rdma_rxe, for interop/cuobj. It registers one buffer with known content
 * twice, as a goroce client does (one MR granting remote WRITE for GET
 * tokens, one granting remote READ for PUT tokens), listens with rdma_cm
 * and accepts the cuObject server's connections, answering its hello
 * (cuobj/hello.go) for its endpoint number. It never posts a work request:
 * the server WRITEs into and READs from the buffer.
 *
 * Usage: cuobjpeer ADDR PORT ENDPOINT INFO STOP
 *
 * Once listening it writes INFO (atomically):
 *   addr=HEX len=DEC wkey=HEX rkey=HEX
 * When the file STOP appears it checks the buffer against the plan below,
 * prints "verified N bytes" or the mismatches, and exits 0 only if every
 * byte is what the plan says.
 *
 * The plan (shared with rxe_test.go): byte i of the buffer starts as
 * fill(i); GET k writes get(k, j) at get_off[k] + j for j < get_len[k];
 * every other byte, the ones past the MR end included, must keep fill(i).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define BUF_LEN (3u << 20)
/* A guard page past the MR: a WRITE rxe wrongly let through past the end
 * would land here, where the check sees it. */
#define GUARD 4096u

static const size_t get_off[] = {(1u << 20) + 17, (1u << 20) + 8192, 2u << 20};
static const size_t get_len[] = {1, 4097, 1u << 20};
#define NGET (sizeof get_off / sizeof get_off[0])

static uint8_t fill(size_t i) { return (uint8_t)(i * 131 + (i >> 12) * 7 + 1); }
static uint8_t get(size_t k, size_t j) { return (uint8_t)(k * 29 + j * 13 + 5); }

static int expected(size_t i, uint8_t *v)
{
	for (size_t k = 0; k < NGET; k++) {
		if (i >= get_off[k] && i < get_off[k] + get_len[k]) {
			*v = get(k, i - get_off[k]);
			return 1;
		}
	}
	*v = fill(i);
	return 0;
}

static void die(const char *what)
{
	fprintf(stderr, "cuobjpeer: %s: %s\n", what, strerror(errno));
	exit(2);
}

struct conn {
	struct rdma_cm_id *id;
	struct ibv_cq *cq;
	struct conn *next;
};

static struct conn *conns;

static void drop(struct rdma_cm_id *id)
{
	for (struct conn **p = &conns; *p; p = &(*p)->next) {
		struct conn *c = *p;
		if (c->id != id)
			continue;
		*p = c->next;
		rdma_destroy_qp(c->id);
		ibv_destroy_cq(c->cq);
		rdma_destroy_id(c->id);
		free(c);
		return;
	}
}

/* hello is cuobj/hello.go: "CUOBJ", version 1, protocol 1002 and the
 * endpoint number, big endian; the rest of the private data is zero. */
static void hello(uint8_t *b, uint32_t ep)
{
	memcpy(b, "CUOBJ", 5);
	b[5] = 1;
	b[6] = 1002 >> 8;
	b[7] = 1002 & 0xff;
	b[8] = ep >> 24;
	b[9] = ep >> 16;
	b[10] = ep >> 8;
	b[11] = ep;
}

static int hello_ok(const uint8_t *b, size_t n, uint32_t ep)
{
	uint8_t want[12];
	if (!b || n < 12)
		return 0;
	hello(want, ep);
	if (memcmp(b, want, 12) != 0)
		return 0;
	for (size_t i = 12; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: cuobjpeer ADDR PORT ENDPOINT INFO STOP\n");
		return 2;
	}
	const char *addr = argv[1], *port = argv[2], *info = argv[4], *stop = argv[5];
	uint32_t ep = strtoul(argv[3], NULL, 0);
	setvbuf(stdout, NULL, _IOLBF, 0);

	size_t page = sysconf(_SC_PAGESIZE);
	uint8_t *buf = mmap(NULL, BUF_LEN + GUARD + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		die("mmap");
	for (size_t i = 0; i < BUF_LEN + GUARD; i++)
		buf[i] = fill(i);

	struct rdma_event_channel *ech = rdma_create_event_channel();
	if (!ech)
		die("rdma_create_event_channel");
	struct rdma_cm_id *lid;
	if (rdma_create_id(ech, &lid, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_PASSIVE}, *ai;
	if (getaddrinfo(addr, port, &hints, &ai))
		die("getaddrinfo");
	if (rdma_bind_addr(lid, ai->ai_addr))
		die("rdma_bind_addr");
	freeaddrinfo(ai);
	if (!lid->verbs) {
		errno = ENODEV;
		die("bound id without a device");
	}
	struct ibv_pd *pd = ibv_alloc_pd(lid->verbs);
	if (!pd)
		die("ibv_alloc_pd");
	struct ibv_mr *wmr = ibv_reg_mr(pd, buf, BUF_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *rmr = ibv_reg_mr(pd, buf, BUF_LEN, IBV_ACCESS_REMOTE_READ);
	if (!wmr || !rmr)
		die("ibv_reg_mr");
	if (rdma_listen(lid, 8))
		die("rdma_listen");

	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", info);
	FILE *f = fopen(tmp, "w");
	if (!f)
		die("fopen info");
	fprintf(f, "addr=%llx len=%u wkey=%x rkey=%x\n", (unsigned long long)(uintptr_t)buf, BUF_LEN, wmr->rkey, rmr->rkey);
	if (fclose(f) || rename(tmp, info))
		die("writing info");
	printf("listening on %s port %s, endpoint %u\n", addr, port, ep);

	int fl = fcntl(ech->fd, F_GETFL);
	fcntl(ech->fd, F_SETFL, fl | O_NONBLOCK);
	time_t deadline = time(NULL) + 600;
	int accepted = 0, rejected = 0;
	while (access(stop, F_OK) != 0) {
		if (time(NULL) > deadline) {
			fprintf(stderr, "cuobjpeer: no stop file after 600 s\n");
			return 2;
		}
		struct pollfd pfd = {.fd = ech->fd, .events = POLLIN};
		if (poll(&pfd, 1, 100) <= 0)
			continue;
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ech, &ev)) {
			if (errno == EAGAIN)
				continue;
			die("rdma_get_cm_event");
		}
		struct rdma_cm_id *id = ev->id;
		switch (ev->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST: {
			struct rdma_conn_param *p = &ev->param.conn;
			if (!hello_ok(p->private_data, p->private_data_len, ep)) {
				printf("rejecting a connection without our hello\n");
				rejected++;
				rdma_reject(id, NULL, 0);
				/* rdma_destroy_id waits for the id's events to be acked. */
				rdma_ack_cm_event(ev);
				rdma_destroy_id(id);
				continue;
			}
			struct conn *c = calloc(1, sizeof *c);
			c->id = id;
			c->cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
			if (!c->cq)
				die("ibv_create_cq");
			struct ibv_qp_init_attr qa = {.send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC,
						      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
			if (rdma_create_qp(id, pd, &qa))
				die("rdma_create_qp");
			uint8_t pdata[12];
			hello(pdata, ep);
			/* The server READs for a PUT: grant what it asks for. */
			struct rdma_conn_param cp = {.private_data = pdata, .private_data_len = sizeof pdata,
						     .responder_resources = p->initiator_depth ? p->initiator_depth : 1,
						     .initiator_depth = 1, .rnr_retry_count = 7};
			if (cp.responder_resources > 16)
				cp.responder_resources = 16;
			c->next = conns;
			conns = c;
			if (rdma_accept(id, &cp))
				die("rdma_accept");
			accepted++;
			printf("accepted connection %d (server initiator depth %u)\n", accepted, p->initiator_depth);
			break;
		}
		case RDMA_CM_EVENT_ESTABLISHED:
			printf("established\n");
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			printf("disconnected\n");
			rdma_ack_cm_event(ev);
			rdma_disconnect(id);
			drop(id);
			continue;
		default:
			printf("cm event %s (status %d)\n", rdma_event_str(ev->event), ev->status);
			break;
		}
		rdma_ack_cm_event(ev);
	}

	size_t bad = 0, written = 0;
	for (size_t i = 0; i < BUF_LEN + GUARD; i++) {
		uint8_t want;
		written += expected(i, &want);
		if (buf[i] != want) {
			if (bad < 10)
				printf("byte %zu: %#x, want %#x\n", i, buf[i], want);
			bad++;
		}
	}
	printf("connections accepted %d, rejected %d\n", accepted, rejected);
	if (bad) {
		printf("%zu bytes wrong\n", bad);
		return 1;
	}
	printf("verified %u bytes (%zu written by GETs)\n", BUF_LEN + GUARD, written);
	return 0;
}

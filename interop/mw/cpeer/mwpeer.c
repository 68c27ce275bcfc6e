/*
 * mwpeer: the rdma_rxe side of interop/mw, which qualifies goroce's memory
 * windows against rxe's. It registers a buffer of known content, listens
 * with rdma_cm, accepts goroce's RC connections (numbered 1, 2, ... in the
 * order their requests arrive) and runs the steps the test hands it, one
 * at a time, through files in a directory both sides see:
 *
 *   DIR/step.K   (K = 1, 2, ...; written atomically by the test)
 *   DIR/res.K    "status=S rkey=HEX"; S is the work completion's
 *                ibv_wc_status, or -errno when posting failed, -ETIMEDOUT
 *                when no completion came
 *   DIR/data.K   what a read or dump step got, written before res.K
 *
 * Steps (C is a connection number, numbers in hex where marked 0x...):
 *
 *   bind C OFF LEN     allocate a type 2 window (ibv_alloc_mw) and bind it
 *                      through connection C's QP (IBV_WR_BIND_MW) over
 *                      LEN bytes at OFF of the buffer, remote READ and
 *                      WRITE; res names its new rkey
 *   inv C RKEY         IBV_WR_LOCAL_INV of RKEY through connection C
 *   read C ADDR LEN RKEY        RDMA READ of goroce's memory into a local
 *                      scratch buffer; data.K holds what came
 *   write C ADDR LEN RKEY SEED  RDMA WRITE of pattern(SEED, j) into
 *                      goroce's memory
 *   dump OFF LEN       data.K = the registered buffer's bytes
 *   stop               exit 0
 *
 * Usage: mwpeer ADDR PORT DIR
 *
 * Once listening it writes DIR/info (atomically): "addr=HEX len=DEC", the
 * registered buffer (MR_LEN bytes, filled with fill(i), registered with
 * LOCAL_WRITE and MW_BIND only: remote access goes through windows).
 */
#define _GNU_SOURCE
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

#define MR_LEN (64u << 10)
#define SCRATCH_LEN (64u << 10)
#define MAX_CONNS 64
#define OP_TIMEOUT 30 /* seconds: TCG guests on a busy host are slow */

static uint8_t fill(size_t i) { return (uint8_t)(i * 131 + (i >> 12) * 7 + 1); }
static uint8_t pattern(unsigned seed, size_t j) { return (uint8_t)(seed * 29 + j * 13 + 5); }

static void die(const char *what)
{
	fprintf(stderr, "mwpeer: %s: %s\n", what, strerror(errno));
	exit(2);
}

struct conn {
	struct rdma_cm_id *id;
	struct ibv_cq *cq;
	int established;
};

static struct conn conns[MAX_CONNS + 1];
static int nconns;
static struct ibv_pd *pd;
static uint64_t wrid;

static void put_file(const char *dir, const char *name, const void *b, size_t n)
{
	char path[4096], tmp[4200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		die(tmp);
	if ((n && fwrite(b, 1, n, f) != n) || fclose(f) || rename(tmp, path))
		die(path);
}

/* post posts wr on connection c and waits for its completion: the
 * completion's status, or -errno. */
static int post(struct conn *c, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	wr->wr_id = ++wrid;
	wr->send_flags |= IBV_SEND_SIGNALED;
	int err = ibv_post_send(c->id->qp, wr, &bad);
	if (err)
		return -err;
	time_t deadline = time(NULL) + OP_TIMEOUT;
	for (;;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 1) {
			if (wc.wr_id != wr->wr_id)
				continue;
			return wc.status;
		}
		if (time(NULL) > deadline)
			return -ETIMEDOUT;
		usleep(100);
	}
}

static void handle_event(struct rdma_event_channel *ech)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ech, &ev)) {
		if (errno == EAGAIN)
			return;
		die("rdma_get_cm_event");
	}
	struct rdma_cm_id *id = ev->id;
	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST: {
		struct rdma_conn_param *p = &ev->param.conn;
		if (nconns == MAX_CONNS) {
			rdma_reject(id, NULL, 0);
			rdma_ack_cm_event(ev);
			rdma_destroy_id(id);
			return;
		}
		struct conn *c = &conns[++nconns];
		c->id = id;
		id->context = c;
		c->cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
		if (!c->cq)
			die("ibv_create_cq");
		struct ibv_qp_init_attr qa = {.send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
		if (rdma_create_qp(id, pd, &qa))
			die("rdma_create_qp");
		struct rdma_conn_param cp = {.responder_resources = p->initiator_depth ? p->initiator_depth : 1,
					     .initiator_depth = p->responder_resources ? p->responder_resources : 1,
					     .rnr_retry_count = 7};
		if (cp.responder_resources > 16)
			cp.responder_resources = 16;
		if (cp.initiator_depth > 16)
			cp.initiator_depth = 16;
		if (rdma_accept(id, &cp))
			die("rdma_accept");
		printf("connection %d: accepted\n", nconns);
		break;
	}
	case RDMA_CM_EVENT_ESTABLISHED:
		((struct conn *)id->context)->established = 1;
		printf("connection %d: established\n", (int)((struct conn *)id->context - conns));
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		/* The QP stays: a window bound through it keeps naming it. */
		printf("connection %d: disconnected\n", (int)((struct conn *)id->context - conns));
		break;
	default:
		printf("cm event %s (status %d)\n", rdma_event_str(ev->event), ev->status);
		break;
	}
	rdma_ack_cm_event(ev);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: mwpeer ADDR PORT DIR\n");
		return 2;
	}
	const char *addr = argv[1], *port = argv[2], *dir = argv[3];
	setvbuf(stdout, NULL, _IOLBF, 0);

	size_t page = sysconf(_SC_PAGESIZE);
	uint8_t *buf = mmap(NULL, MR_LEN + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *scratch = mmap(NULL, SCRATCH_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED || scratch == MAP_FAILED)
		die("mmap");
	for (size_t i = 0; i < MR_LEN + page; i++)
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
	if (!(pd = ibv_alloc_pd(lid->verbs)))
		die("ibv_alloc_pd");
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, MR_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mr *smr = ibv_reg_mr(pd, scratch, SCRATCH_LEN, IBV_ACCESS_LOCAL_WRITE);
	if (!mr || !smr)
		die("ibv_reg_mr");
	if (rdma_listen(lid, 8))
		die("rdma_listen");
	char line[256];
	int n = snprintf(line, sizeof line, "addr=%llx len=%u\n", (unsigned long long)(uintptr_t)buf, MR_LEN);
	put_file(dir, "info", line, n);
	printf("listening on %s port %s, buffer %u bytes at %p\n", addr, port, MR_LEN, (void *)buf);

	int fl = fcntl(ech->fd, F_GETFL);
	fcntl(ech->fd, F_SETFL, fl | O_NONBLOCK);
	time_t deadline = time(NULL) + 900;
	for (int k = 1;; k++) {
		char path[4096], step[256] = {0};
		snprintf(path, sizeof path, "%s/step.%d", dir, k);
		/* Wait for step k, serving the CM meanwhile. */
		for (;;) {
			FILE *f = fopen(path, "r");
			if (f) {
				size_t got = fread(step, 1, sizeof step - 1, f);
				fclose(f);
				step[got] = 0;
				break;
			}
			if (time(NULL) > deadline) {
				fprintf(stderr, "mwpeer: no step %d after 900 s\n", k);
				return 2;
			}
			struct pollfd pfd = {.fd = ech->fd, .events = POLLIN};
			if (poll(&pfd, 1, 20) > 0)
				handle_event(ech);
		}
		char op[16] = {0};
		int ci = 0;
		unsigned long long a = 0, b = 0, c = 0, d = 0;
		int nf = sscanf(step, "%15s", op);
		int status = 0;
		uint32_t rkey = 0;
		const void *data = NULL;
		size_t dlen = 0;
		struct conn *cn = NULL;
		int stop = 0;
		if (nf == 1 && strcmp(op, "dump") && strcmp(op, "stop")) {
			if (sscanf(step, "%*s %d", &ci) != 1 || ci < 1 || ci > MAX_CONNS) {
				fprintf(stderr, "mwpeer: step %d: bad connection in %s", k, step);
				return 2;
			}
			/* Wait for the connection: the test's dial may return
			 * before this side has seen it established. */
			time_t until = time(NULL) + OP_TIMEOUT;
			while (ci > nconns || !conns[ci].established) {
				if (time(NULL) > until) {
					fprintf(stderr, "mwpeer: step %d: connection %d never established\n", k, ci);
					return 2;
				}
				struct pollfd pfd = {.fd = ech->fd, .events = POLLIN};
				if (poll(&pfd, 1, 20) > 0)
					handle_event(ech);
			}
			cn = &conns[ci];
		}
		if (!strcmp(op, "bind") && sscanf(step, "%*s %*d %llx %llx", &a, &b) == 2) {
			struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
			if (!mw) {
				status = -errno;
			} else {
				/* A type 2 bind names the window's next key. */
				rkey = ibv_inc_rkey(mw->rkey);
				struct ibv_send_wr wr = {.opcode = IBV_WR_BIND_MW};
				wr.bind_mw.mw = mw;
				wr.bind_mw.rkey = rkey;
				wr.bind_mw.bind_info.mr = mr;
				wr.bind_mw.bind_info.addr = (uint64_t)(uintptr_t)buf + a;
				wr.bind_mw.bind_info.length = b;
				wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
				status = post(cn, &wr);
			}
		} else if (!strcmp(op, "inv") && sscanf(step, "%*s %*d %llx", &a) == 1) {
			struct ibv_send_wr wr = {.opcode = IBV_WR_LOCAL_INV, .invalidate_rkey = (uint32_t)a};
			status = post(cn, &wr);
		} else if (!strcmp(op, "read") && sscanf(step, "%*s %*d %llx %llx %llx", &a, &b, &c) == 3 && b <= SCRATCH_LEN) {
			memset(scratch, 0, b);
			struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)scratch, .length = (uint32_t)b, .lkey = smr->lkey};
			struct ibv_send_wr wr = {.opcode = IBV_WR_RDMA_READ, .sg_list = &sge, .num_sge = 1};
			wr.wr.rdma.remote_addr = a;
			wr.wr.rdma.rkey = (uint32_t)c;
			status = post(cn, &wr);
			if (status == IBV_WC_SUCCESS)
				data = scratch, dlen = b;
		} else if (!strcmp(op, "write") && sscanf(step, "%*s %*d %llx %llx %llx %llx", &a, &b, &c, &d) == 4 && b <= SCRATCH_LEN) {
			for (size_t j = 0; j < b; j++)
				scratch[j] = pattern((unsigned)d, j);
			struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)scratch, .length = (uint32_t)b, .lkey = smr->lkey};
			struct ibv_send_wr wr = {.opcode = IBV_WR_RDMA_WRITE, .sg_list = &sge, .num_sge = 1};
			wr.wr.rdma.remote_addr = a;
			wr.wr.rdma.rkey = (uint32_t)c;
			status = post(cn, &wr);
		} else if (!strcmp(op, "dump") && sscanf(step, "%*s %llx %llx", &a, &b) == 2 && a + b <= MR_LEN + page) {
			data = buf + a, dlen = b;
		} else if (!strcmp(op, "stop")) {
			stop = 1;
		} else {
			fprintf(stderr, "mwpeer: step %d: cannot parse %s", k, step);
			return 2;
		}
		printf("step %d: %.*s -> status %d (%s) rkey %#x\n", k, (int)strcspn(step, "\n"), step, status,
		       status >= 0 ? ibv_wc_status_str(status) : strerror(-status), rkey);
		char name[32];
		if (data) {
			snprintf(name, sizeof name, "data.%d", k);
			put_file(dir, name, data, dlen);
		}
		snprintf(name, sizeof name, "res.%d", k);
		n = snprintf(line, sizeof line, "status=%d rkey=%x\n", status, rkey);
		put_file(dir, name, line, n);
		if (stop) {
			printf("stopped after %d steps, %d connections\n", k, nconns);
			return 0;
		}
	}
}

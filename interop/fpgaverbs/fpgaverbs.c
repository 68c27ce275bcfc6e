/*
 * fpgaverbs: an ibverbs RC peer in the formats of SLAC Rogue's RoCEv2
 * protocol, for the rdma_rxe lab (perftest cannot send immediates).
 *
 *   fpgaverbs send  ... plays the FPGA: one SEND WITH IMMEDIATE (or, with -w,
 *                   RDMA WRITE WITH IMMEDIATE at mr_addr + (i mod depth)*slot)
 *                   per frame, immediate (i << 8) | channel, rnr_retry 7.
 *   fpgaverbs recv  ... plays Rogue's Server: depth receives of slot bytes
 *                   posted before RTR, each frame checked and re-posted.
 *
 * Connection values go through files (the lab's 9p share): the program
 * writes its own as "qpn psn psn gid mr_addr rkey" to -o FILE (psn: the
 * PSN a receiver expects first, drawn at random), reads the peer's from -i
 * FILE (waiting for it), and the sender waits for -G FILE to exist before
 * its first frame (the host completes its connection first). Peer file:
 * "qpn psn gid [mr_addr rkey slot depth]"; for the sender psn is the host's
 * SQ PSN, which the FPGA's send queue starts at (PyRogue's pairing).
 * The receiver creates FILE.ready once its QP is in RTS.
 *
 * send -R FILE: after the -n frames, wait for FILE (a new host's "qpn psn
 * gid"), move the QP through RESET to the new host but keep sending at the
 * PSN after the last frame, as an FPGA that was not reset does, and send -N
 * more frames ("reconnected: ... acknowledged|failed").
 *
 * Frame i has size sz(i) (fixed -s N, or with -s 0 a sweep from 1 byte to
 * the path MTU) and payload: i as 64-bit big-endian, then byte(i*31 + j*7)
 * at offset j (truncated to the frame). recv prints one line per bad frame
 * and a summary "frames=N bytes=N errors=N"; exit 0 if every frame of -n
 * arrived in order, byte-exact, with channel -c.
 *
 * Build: cc -O2 -o fpgaverbs fpgaverbs.c -libverbs
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what, int err)
{
	fprintf(stderr, "fpgaverbs: %s: %s\n", what, strerror(err));
	exit(2);
}

static int frame_size(unsigned long i, int fixed, int mtu)
{
	if (fixed > 0)
		return fixed;
	if (i % 50 == 49)
		return mtu;
	return 1 + (int)((i * 997) % (unsigned long)mtu);
}

static void pattern(unsigned char *b, int n, unsigned long i)
{
	for (int j = 0; j < n; j++)
		b[j] = (unsigned char)(i * 31 + j * 7);
	for (int j = 0; j < 8 && j < n; j++)
		b[j] = (unsigned char)(i >> (56 - 8 * j));
}

static void wait_file(const char *path)
{
	for (int k = 0; access(path, R_OK) != 0; k++) {
		if (k > 6000) {
			fprintf(stderr, "fpgaverbs: no %s after 600 s\n", path);
			exit(2);
		}
		usleep(100000);
	}
}

static enum ibv_mtu mtu_enum(int mtu)
{
	switch (mtu) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	default: return IBV_MTU_4096;
	}
}

struct sender {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	unsigned char *buf;
	int ring, mtu, size, channel, write_imm;
	unsigned long long raddr;
	unsigned rkey, pslot, pdepth;
};

/* send_frames sends frames first..last-1 and waits for their completions. */
static int send_frames(struct sender *sd, unsigned long first, unsigned long last, unsigned long *frames,
		       unsigned long *bytes)
{
	struct ibv_wc wc[16];
	unsigned long posted = first, done = first;
	while (done < last) {
		while (posted < last && posted - done < (unsigned long)sd->ring) {
			int n = frame_size(posted, sd->size, sd->mtu);
			unsigned char *p = sd->buf + (posted % sd->ring) * sd->mtu;
			pattern(p, n, posted);
			struct ibv_sge sge = { (uintptr_t)p, n, sd->mr->lkey };
			struct ibv_send_wr wr = { .wr_id = posted, .sg_list = &sge, .num_sge = 1,
				.opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				.imm_data = htonl((uint32_t)((posted & 0xFFFFFF) << 8) | sd->channel) }, *bad;
			if (sd->write_imm) {
				wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
				wr.imm_data = htonl((uint32_t)((posted % sd->pdepth) << 8) | sd->channel);
				wr.wr.rdma.remote_addr = sd->raddr + (posted % sd->pdepth) * sd->pslot;
				wr.wr.rdma.rkey = sd->rkey;
			}
			if ((errno = ibv_post_send(sd->qp, &wr, &bad)))
				die("post send", errno);
			posted++;
			(*frames)++;
			*bytes += n;
		}
		int n = ibv_poll_cq(sd->cq, 16, wc);
		for (int k = 0; k < n; k++) {
			if (wc[k].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "fpgaverbs: frame %llu: %s\n", (unsigned long long)wc[k].wr_id,
					ibv_wc_status_str(wc[k].status));
				return 1;
			}
			done++;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *dev_name = "rxe0", *out = NULL, *in = NULL, *go = NULL, *reconnect = NULL;
	unsigned long count2 = 20;
	int gidx = 1, size = 0, mtu = 4096, channel = 1, write_imm = 0, depth = 64, slot = 4096;
	unsigned long count = 100;
	int hold_us = 0, opt;

	if (argc < 2 || (strcmp(argv[1], "send") && strcmp(argv[1], "recv"))) {
		fprintf(stderr, "usage: fpgaverbs send|recv [-d dev] [-g gid_index] [-n count] [-s size] [-m mtu] [-c channel] [-w] [-D depth] [-S slot] [-H hold_us] -o out -i in [-G go] [-R reconnect_file [-N count2]]\n");
		return 2;
	}
	int sender = !strcmp(argv[1], "send");
	optind = 2;
	while ((opt = getopt(argc, argv, "d:g:n:s:m:c:wD:S:H:o:i:G:R:N:")) != -1) {
		switch (opt) {
		case 'd': dev_name = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'n': count = strtoul(optarg, NULL, 0); break;
		case 's': size = atoi(optarg); break;
		case 'm': mtu = atoi(optarg); break;
		case 'c': channel = atoi(optarg); break;
		case 'w': write_imm = 1; break;
		case 'D': depth = atoi(optarg); break;
		case 'S': slot = atoi(optarg); break;
		case 'H': hold_us = atoi(optarg); break;
		case 'o': out = optarg; break;
		case 'i': in = optarg; break;
		case 'G': go = optarg; break;
		case 'R': reconnect = optarg; break;
		case 'N': count2 = strtoul(optarg, NULL, 0); break;
		default: return 2;
		}
	}
	if (!out || !in)
		return 2;

	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	for (int k = 0; list && list[k]; k++)
		if (!strcmp(ibv_get_device_name(list[k]), dev_name))
			ctx = ibv_open_device(list[k]);
	if (!ctx)
		die("open device", ENODEV);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	int ring = sender ? 16 : depth;
	int bsz = sender ? mtu : slot;
	unsigned char *buf = aligned_alloc(4096, (size_t)ring * bsz);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, (size_t)ring * bsz,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * ring + 2, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = sender ? ring : 1, .max_recv_wr = sender ? 1 : depth,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (!pd || !buf || !mr || !cq)
		die("resources", errno);
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("create qp", errno);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)))
		die("INIT", errno);

	union ibv_gid gid;
	char gs[INET6_ADDRSTRLEN];
	ibv_query_gid(ctx, 1, gidx, &gid);
	inet_ntop(AF_INET6, gid.raw, gs, sizeof gs);
	srand48(time(NULL) ^ getpid());
	uint32_t my_psn = lrand48() & 0xFFFFFF;
	FILE *f = fopen(out, "w");
	fprintf(f, "%u %u %u %s %llu %u\n", qp->qp_num, my_psn, my_psn, gs,
		(unsigned long long)(uintptr_t)buf, mr->rkey);
	fclose(f);

	wait_file(in);
	unsigned peer_qpn = 0, peer_psn = 0, rkey = 0, pslot = 0, pdepth = 0;
	unsigned long long raddr = 0;
	char pgid[64] = "";
	for (int k = 0; k < 50; k++) {
		f = fopen(in, "r");
		int got = f ? fscanf(f, "%u %u %63s %llu %u %u %u", &peer_qpn, &peer_psn, pgid, &raddr, &rkey, &pslot, &pdepth) : 0;
		if (f)
			fclose(f);
		if (got >= 3)
			break;
		usleep(100000); /* the file may be half written */
	}
	union ibv_gid dgid;
	if (inet_pton(AF_INET6, pgid, dgid.raw) != 1)
		die("peer gid", EINVAL);

	if (!sender) {
		for (int s = 0; s < depth; s++) {
			struct ibv_sge sge = { (uintptr_t)(buf + (size_t)s * slot), slot, mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = s, .sg_list = &sge, .num_sge = 1 }, *bad;
			if ((errno = ibv_post_recv(qp, &wr, &bad)))
				die("post recv", errno);
		}
	}
	/* Rogue's RTR and RTS (recv) or the firmware's (send). Send side:
	 * our SQ PSN is the peer's (host's) SQ PSN given in the file, as the
	 * FPGA is programmed with hostSqPsn. */
	uint32_t sq_psn = sender ? peer_psn : my_psn;
	uint32_t rq_psn = my_psn; /* recv: the PSN the sender was told to start at */
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu_enum(mtu);
	a.dest_qp_num = peer_qpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = dgid;
	a.ah_attr.grh.sgid_index = gidx;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)))
		die("RTR", errno);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)))
		die("RTS", errno);
	if (!sender) {
		/* Ready to receive: the sender may start (as the host completes
		 * its connection before the FPGA's data is enabled). */
		char ready[4096];
		snprintf(ready, sizeof ready, "%s.ready", out);
		f = fopen(ready, "w");
		if (f)
			fclose(f);
	}
	struct ibv_wc wc[16];
	unsigned long frames = 0, bytes = 0, errors = 0;
	if (sender) {
		struct sender sd = { qp, cq, mr, buf, ring, mtu, size, channel, write_imm, raddr, rkey, pslot, pdepth };
		if (go)
			wait_file(go);
		if (send_frames(&sd, 0, count, &frames, &bytes))
			return 1;
		printf("frames=%lu bytes=%lu errors=0\n", frames, bytes);
		if (!reconnect)
			return 0;
		/* An FPGA that was not reset: connect to the new host QP but
		 * go on at the PSN after the last frame (one packet each). */
		fflush(stdout);
		wait_file(reconnect);
		f = fopen(reconnect, "r");
		if (!f || fscanf(f, "%u %u %63s", &peer_qpn, &peer_psn, pgid) != 3)
			die("reconnect file", EINVAL);
		fclose(f);
		if (inet_pton(AF_INET6, pgid, dgid.raw) != 1)
			die("peer gid", EINVAL);
		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_RESET;
		if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE)))
			die("RESET", errno);
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)))
			die("INIT", errno);
		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = mtu_enum(mtu);
		a.dest_qp_num = peer_qpn;
		a.rq_psn = rq_psn;
		a.max_dest_rd_atomic = 16;
		a.min_rnr_timer = 1;
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = dgid;
		a.ah_attr.grh.sgid_index = gidx;
		a.ah_attr.grh.hop_limit = 64;
		a.ah_attr.port_num = 1;
		if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)))
			die("RTR", errno);
		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = (sq_psn + count) & 0xFFFFFF;
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 16;
		if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)))
			die("RTS", errno);
		frames = bytes = 0;
		int rc = send_frames(&sd, count, count + count2, &frames, &bytes);
		printf("reconnected: frames=%lu bytes=%lu %s\n", frames, bytes, rc ? "failed" : "acknowledged");
		return 0;
	}

	unsigned char *want = malloc(mtu > slot ? mtu : slot);
	time_t deadline = time(NULL) + 600;
	while (frames < count && time(NULL) < deadline) {
		int n = ibv_poll_cq(cq, 16, wc);
		for (int k = 0; k < n; k++) {
			int s = (int)wc[k].wr_id;
			if (wc[k].status != IBV_WC_SUCCESS) {
				printf("completion %d: %s\n", s, ibv_wc_status_str(wc[k].status));
				return 1;
			}
			int ok = (wc[k].wc_flags & IBV_WC_WITH_IMM) &&
				 wc[k].opcode == (write_imm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV);
			uint32_t imm = ntohl(wc[k].imm_data);
			int len = frame_size(frames, size, mtu);
			pattern(want, len, frames);
			if (!ok || (int)wc[k].byte_len != len || (int)(imm & 0xFF) != channel ||
			    memcmp(buf + (size_t)s * slot, want, len)) {
				printf("frame %lu: opcode %d flags %#x len %u (want %d) imm %#x differs\n", frames,
				       wc[k].opcode, wc[k].wc_flags, wc[k].byte_len, len, imm);
				errors++;
			}
			frames++;
			bytes += wc[k].byte_len;
			if (hold_us)
				usleep(hold_us);
			struct ibv_sge sge = { (uintptr_t)(buf + (size_t)s * slot), slot, mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = s, .sg_list = &sge, .num_sge = 1 }, *bad;
			if ((errno = ibv_post_recv(qp, &wr, &bad)))
				die("repost", errno);
		}
	}
	printf("frames=%lu bytes=%lu errors=%lu\n", frames, bytes, errors);
	return frames == count && errors == 0 ? 0 : 1;
}

/*
 * naaice_verify: a NAAICE host written with the C library's own AP1 calls
 * (the same calls, in the same order, as its examples/naaice_client.c),
 * which checks every byte of every region after every RPC.
 *
 *   naaice_verify [-l local-ip] [-p port] [-i "internal sizes"] [-w pause-ms]
 *                 remote-ip fncode rpcs "size1 size2 ..."
 *
 * Regions: all inputs; region i holds the byte 10+i. With more than one
 * region, region 0 is single-send and its first write is 2 bytes long
 * (naaice_set_bytes_to_send), as in the example client; the regions from
 * max(1, N/2) on are also outputs. With the example routines of the
 * software NAA (fncode 1 adds 1 to every byte, 2 adds 2, 3 nothing), after
 * RPC r an output region i holds 10+i + add*r and every other region keeps
 * 10+i. The last line says "verified" or "NOT verified"; the exit status
 * says the same (0 or 1; 2 for usage errors).
 */
#include <naaice.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int parse_sizes(char *s, size_t *out, int max) {
  int n = 0;
  for (char *tok = strtok(s, " ,"); tok != NULL; tok = strtok(NULL, " ,")) {
    if (n == max) {
      return -1;
    }
    long v = strtol(tok, NULL, 10);
    if (v < 1) {
      return -1;
    }
    out[n++] = (size_t)v;
  }
  return n;
}

static int fail(const char *what) {
  printf("NOT verified: %s\n", what);
  return 1;
}

int main(int argc, char *argv[]) {
  const char *local_ip = NULL;
  uint16_t port = SERVER_CONNECTION_PORT;
  size_t internal_sizes[MAX_MRS];
  int n_internal = 0;
  int pause_ms = 0;
  int opt;
  while ((opt = getopt(argc, argv, "l:p:i:w:")) != -1) {
    switch (opt) {
    case 'l':
      local_ip = optarg;
      break;
    case 'p':
      port = (uint16_t)atoi(optarg);
      break;
    case 'i':
      n_internal = parse_sizes(optarg, internal_sizes, MAX_MRS);
      break;
    case 'w':
      pause_ms = atoi(optarg);
      break;
    default:
      return 2;
    }
  }
  if (argc - optind != 4 || n_internal < 0) {
    fprintf(stderr, "usage: naaice_verify [-l local-ip] [-p port] [-i \"internal sizes\"] "
                    "[-w pause-ms] remote-ip fncode rpcs \"sizes\"\n");
    return 2;
  }
  const char *remote_ip = argv[optind];
  int fncode = atoi(argv[optind + 1]);
  int rpcs = atoi(argv[optind + 2]);
  size_t sizes[MAX_MRS];
  int n = parse_sizes(argv[optind + 3], sizes, MAX_MRS);
  if (fncode < 1 || fncode > 127 || rpcs < 1 || n < 1 || n + n_internal > MAX_MRS - 1) {
    fprintf(stderr, "naaice_verify: bad arguments\n");
    return 2;
  }
  unsigned char add = fncode == 1 ? 1 : fncode == 2 ? 2 : 0;
  int first_out = n / 2 > 1 ? n / 2 : 1;
  if (n == 1) {
    first_out = 0;
  }

  char *params[MAX_MRS];
  for (int i = 0; i < n; i++) {
    params[i] = malloc(sizes[i]);
    if (params[i] == NULL) {
      return fail("out of memory");
    }
    memset(params[i], 10 + i, sizes[i]);
  }

  struct naaice_communication_context *comm_ctx = NULL;
  if (naaice_init_communication_context(&comm_ctx, 0, sizes, params, n, n_internal, internal_sizes,
                                        (uint8_t)fncode, local_ip, remote_ip, port)) {
    return fail("naaice_init_communication_context");
  }
  if (naaice_setup_connection(comm_ctx)) {
    return fail("naaice_setup_connection");
  }
  for (int i = 0; i < n; i++) {
    if (naaice_set_input_mr(comm_ctx, i)) {
      return fail("naaice_set_input_mr");
    }
  }
  for (int i = first_out; i < n; i++) {
    if (naaice_set_output_mr(comm_ctx, i)) {
      return fail("naaice_set_output_mr");
    }
  }
  if (n > 1 && naaice_set_singlesend_mr(comm_ctx, 0)) {
    return fail("naaice_set_singlesend_mr");
  }
  if (naaice_register_mrs(comm_ctx)) {
    return fail("naaice_register_mrs");
  }
  if (n > 1 && naaice_set_bytes_to_send(comm_ctx, 0, 2)) {
    return fail("naaice_set_bytes_to_send");
  }
  uint8_t imm_bytes[3] = {1, 2, 3};
  if (naaice_set_immediate(comm_ctx, imm_bytes)) {
    return fail("naaice_set_immediate");
  }
  if (naaice_do_mrsp(comm_ctx)) {
    return fail("naaice_do_mrsp");
  }
  for (int r = 1; r <= rpcs; r++) {
    if (pause_ms > 0) {
      usleep(pause_ms * 1000);
    }
    if (naaice_do_data_transfer(comm_ctx)) {
      printf("NOT verified: RPC %d failed\n", r);
      return 1;
    }
    if (comm_ctx->naa_returncode != 0) {
      printf("NOT verified: RPC %d returned code %d\n", r, comm_ctx->naa_returncode);
      return 1;
    }
    if (n > 1 && naaice_set_bytes_to_send(comm_ctx, 0, -1)) {
      return fail("naaice_set_bytes_to_send");
    }
    for (int i = 0; i < n; i++) {
      unsigned char want = (unsigned char)(10 + i);
      if (i >= first_out) {
        want = (unsigned char)(want + add * r);
      }
      const unsigned char *p = (const unsigned char *)params[i];
      for (size_t j = 0; j < sizes[i]; j++) {
        if (p[j] != want) {
          printf("NOT verified: after RPC %d region %d byte %zu is %u, want %u\n", r, i, j, p[j], want);
          return 1;
        }
      }
    }
  }
  if (naaice_disconnect_and_cleanup(comm_ctx)) {
    return fail("naaice_disconnect_and_cleanup");
  }
  printf("verified: %d RPCs of function %d on %d regions, %d internal\n", rpcs, fncode, n, n_internal);
  return 0;
}

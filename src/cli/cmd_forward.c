/* dspark forward: runs the target over given token ids and writes what it computed
 * (logits, final-normed hidden states, captured layer outputs) to a safetensors file, so a
 * user can compare the engine with their own implementation. --chunk N feeds the tokens
 * N at a time through the KV cache (incremental decode) instead of one prefill. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/backend.h"
#include "dspark/profile.h"
#include "dspark/safetensors.h"
#include "dspark/target.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark forward MODEL --ids IDS --out FILE.safetensors [options]\n"
          "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
          CLI_WEIGHTS_HELP
          CLI_KV_CACHE_HELP
          "  --ids IDS          token ids, comma-separated; ';' separates the sequences of a batch\n"
          "                     (every sequence needs at least one id; an empty one is a usage error)\n"
          "  --out FILE         safetensors with, per sequence b: logits.b [n, V] (or [1, V] with\n"
          "                     --logits last), final_hidden.b [n, d], captured.b [n, m*d]\n"
          "  --capture LAYERS   comma-separated layer ids to capture (-1 = embeddings, up to L-2)\n"
          "  --logits MODE      all (default), last, or none\n"
          "  --chunk N          feed N tokens per sequence per forward through the KV cache\n"
          "                     (default: the whole sequence in one prefill)\n"
          "  --threads N        threads for BLAS and kernels\n"
          "  --compute fp32|bf16|int8  matmul precision (default fp32 with a GGUF's quantized matrices in\n"
          "                     int8, as llama.cpp; docs/compute.md)\n"
          "  --device cpu|cuda  where the target runs (default cpu; cuda: a DSPARK_CUDA build, docs/cuda.md)\n"
          "  --profile          print time and GFLOP/s per kernel to stderr\n"
          "  --repeat N         run the whole forward N times in this process (the KV caches\n"
          "                     emptied between runs) and report each time and the best: the warm\n"
          "                     figure (primitives made, frozen weights packed from the second run\n"
          "                     under --compute bf16); the last run's results are written\n");
}

typedef struct {
  int32_t *ids;
  int64_t n;
} seq_ids;

static void free_batch(seq_ids *seqs, int n) {
  for (int i = 0; seqs && i < n; i++) free(seqs[i].ids);
  free(seqs);
}

/* "1,2,3;4,5" -> one seq_ids per ';'-separated sequence; each needs at least one id. Returns 0
 * after a usage message. */
static int parse_batch(const char *s, seq_ids **out, int *n_out) {
  if (!*s) {
    fprintf(stderr, "dspark forward: --ids is empty: give comma-separated token ids, ';' between sequences\n");
    return 0;
  }
  int n = 1;
  for (const char *p = s; *p; p++) n += *p == ';';
  seq_ids *seqs = calloc((size_t)n, sizeof *seqs);
  char *copy = strdup(s);
  if (!seqs || !copy) {
    fprintf(stderr, "dspark forward: out of memory reading --ids\n");
    free(seqs);
    free(copy);
    return 0;
  }
  char *p = copy;
  for (int k = 0; k < n; k++) {
    char *semi = strchr(p, ';');
    if (semi) *semi = 0;
    if (!cli_int_list("--ids", p, &seqs[k].ids, &seqs[k].n) || seqs[k].n == 0) {
      if (seqs[k].ids || !*p) fprintf(stderr, "dspark forward: sequence %d of --ids is empty\n", k);
      free(copy);
      free_batch(seqs, n);
      return 0;
    }
    p = semi ? semi + 1 : p + strlen(p);
  }
  free(copy);
  *out = seqs;
  *n_out = n;
  return 1;
}

int cmd_forward(int argc, char **argv) {
  const char *dir = NULL, *ids_arg = NULL, *out_path = NULL, *capture_arg = NULL, *logits_mode = "all";
  const char *device = "cpu";
  int64_t chunk = 0, threads = 0, repeat = 1;
  int profile = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (cli_is_help(a)) { usage(stdout); return 0; }
    if (!strcmp(a, "--ids")) { if (!(ids_arg = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--out")) { if (!(out_path = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--capture")) { if (!(capture_arg = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--logits")) { if (!(logits_mode = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--device")) { if (!(device = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--profile")) profile = 1;
    else if (!strcmp(a, "--chunk")) {
      const char *v = cli_value(argc, argv, &i);
      if (!v || !cli_int(a, v, 1, INT32_MAX, &chunk)) return 2;
    } else if (!strcmp(a, "--repeat")) {
      const char *v = cli_value(argc, argv, &i);
      if (!v || !cli_int(a, v, 1, 1000, &repeat)) return 2;
    } else if (!strcmp(a, "--threads")) {
      const char *v = cli_value(argc, argv, &i);
      if (!v || !cli_int(a, v, 1, 1024, &threads)) return 2;
    } else if (a[0] == '-' || dir) {
      fprintf(stderr, "dspark forward: unexpected argument '%s'\n", a);
      usage(stderr);
      return 2;
    } else dir = a;
  }
  if (!dir || !ids_arg || !out_path) {
    fprintf(stderr, "dspark forward: MODEL, --ids and --out are required\n");
    usage(stderr);
    return 2;
  }
  const ds_input_path inputs[] = {{"MODEL", dir}};
  int refused = cli_output_refused("forward", "--out", out_path, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  int want_all = !strcmp(logits_mode, "all"), want_last = !strcmp(logits_mode, "last");
  if (!want_all && !want_last && strcmp(logits_mode, "none") != 0) {
    fprintf(stderr, "dspark forward: --logits must be all, last or none (got '%s')\n", logits_mode);
    return 2;
  }
  ds_set_num_threads((int)threads);
  const ds_backend *dev = ds_backend_named(device);
  if (!dev) return cli_report_error("forward");
  if (dev->device_memory) ds_cuda_set_bf16_gemm(ds_matmul_compute() == DS_COMPUTE_BF16);

  seq_ids *seqs = NULL;
  int n_seqs = 0;
  int32_t *capture = NULL;
  int64_t n_capture = 0;
  if (!parse_batch(ids_arg, &seqs, &n_seqs)) return 2;
  if (capture_arg && (!cli_int_list("--capture", capture_arg, &capture, &n_capture) || n_capture == 0)) {
    if (capture && !n_capture) fprintf(stderr, "dspark forward: --capture needs at least one layer id\n");
    free_batch(seqs, n_seqs);
    free(capture);
    return 2;
  }

  int rc = 1;
  ds_target *m = NULL;
  ds_kv_cache **caches = calloc((size_t)n_seqs, sizeof *caches);
  float **logits = calloc((size_t)n_seqs, sizeof *logits), **hidden = calloc((size_t)n_seqs, sizeof *hidden),
        **captured = calloc((size_t)n_seqs, sizeof *captured);
  ds_target_seq *batch = calloc((size_t)n_seqs, sizeof *batch);
  int *owner = calloc((size_t)n_seqs, sizeof *owner); /* batch slot -> sequence */
  int64_t *last_rows = calloc((size_t)n_seqs, sizeof *last_rows); /* --logits last: rows of a round */
  ds_st_writer *w = ds_st_writer_new();
  char name[64];
  if (!caches || !logits || !hidden || !captured || !batch || !owner || !last_rows || !w) {
    DS_FAIL(DS_ERR_NOMEM, "cannot allocate the per-sequence tables of %d sequences", n_seqs);
    goto report;
  }
  ds_profile prof = {0};
  const ds_backend *be = profile ? ds_backend_profiled(dev, &prof) : dev;
  if (ds_target_load(dir, be, &m) != DS_OK) goto report;
  const ds_model_config *c = ds_target_config(m);
  int64_t d = c->hidden_size, V = c->vocab_size;
  if (n_capture && ds_target_check_capture_layers(m, capture, (int)n_capture) != DS_OK) goto report;

  int64_t max_n = 0, total = 0;
  for (int s = 0; s < n_seqs; s++) {
    int64_t n = seqs[s].n;
    max_n = n > max_n ? n : max_n;
    total += n;
    if (ds_kv_cache_new(m, n, &caches[s]) != DS_OK) goto report;
    hidden[s] = ds_malloc((size_t)(n * d) * sizeof(float), "final hidden states");
    logits[s] = ds_malloc((size_t)((want_all ? n : 1) * V) * sizeof(float), "logits");
    captured[s] = ds_malloc((size_t)(n * (n_capture ? n_capture : 1) * d) * sizeof(float), "captured layers");
    if (!hidden[s] || !logits[s] || !captured[s]) goto report;
  }
  if (!chunk) chunk = max_n;
  float *round_hidden = ds_malloc((size_t)(total * d) * sizeof(float), "final hidden states");
  float *round_logits = ds_malloc((size_t)(total * V) * sizeof(float), "logits");
  float *round_capt = ds_malloc((size_t)(total * (n_capture ? n_capture : 1) * d) * sizeof(float), "captured layers");
  if (!round_hidden || !round_logits || !round_capt) { free(round_hidden); free(round_logits); free(round_capt); goto report; }

  double best = 0;
  for (int64_t run = 0; run < repeat; run++) {
  for (int s = 0; s < n_seqs; s++)
    if (ds_kv_cache_crop(caches[s], 0) != DS_OK) { free(round_hidden); free(round_logits); free(round_capt); goto report; }
  if (profile) memset(&prof, 0, sizeof prof); /* the profile of the last run */
  double t0 = ds_time_sec();
  for (int64_t start = 0; start < max_n; start += chunk) {
    int nb = 0;
    for (int s = 0; s < n_seqs; s++) {
      if (start >= seqs[s].n) continue;
      int64_t take = seqs[s].n - start < chunk ? seqs[s].n - start : chunk;
      batch[nb] = (ds_target_seq){seqs[s].ids + start, take, caches[s]};
      owner[nb++] = s;
    }
    /* --logits last: only the sequences' last rows go through the vocabulary matmul */
    int64_t n_last = 0, row0 = 0;
    for (int b = 0; b < nb; b++) {
      row0 += batch[b].n;
      if (want_last && start + batch[b].n == seqs[owner[b]].n) last_rows[n_last++] = row0 - 1;
    }
    ds_target_outputs out = {capture, (int)n_capture, n_capture ? round_capt : NULL, round_hidden,
                             want_last ? last_rows : NULL, n_last, (want_all || n_last) ? round_logits : NULL};
    if (ds_target_forward(m, batch, nb, &out) != DS_OK) {
      free(round_hidden); free(round_logits); free(round_capt);
      goto report;
    }
    int64_t row = 0, li = 0;
    for (int b = 0; b < nb; b++) {
      int s = owner[b];
      int64_t take = batch[b].n;
      memcpy(hidden[s] + start * d, round_hidden + row * d, (size_t)(take * d) * sizeof(float));
      if (n_capture)
        memcpy(captured[s] + start * n_capture * d, round_capt + row * n_capture * d,
               (size_t)(take * n_capture * d) * sizeof(float));
      if (want_all)
        memcpy(logits[s] + start * V, round_logits + row * V, (size_t)(take * V) * sizeof(float));
      else if (want_last && start + take == seqs[s].n)
        memcpy(logits[s], round_logits + (li++) * V, (size_t)V * sizeof(float));
      row += take;
    }
  }
  double dt = ds_time_sec() - t0;
  best = run == 0 || dt < best ? dt : best;
  if (repeat > 1) fprintf(stderr, "run %lld: ", (long long)run + 1);
  fprintf(stderr, "forward: %lld tokens in %d sequences, %.3f s (%.1f tokens/s)\n", (long long)total, n_seqs, dt,
          total / (dt > 0 ? dt : 1e-9));
  if (profile && run + 1 == repeat) ds_profile_print(&prof, dt, stderr);
  }
  free(round_hidden);
  free(round_logits);
  free(round_capt);
  if (repeat > 1)
    fprintf(stderr, "forward, best of %lld runs: %.3f s (%.1f tokens/s)\n", (long long)repeat, best,
            total / (best > 0 ? best : 1e-9));

  for (int s = 0; s < n_seqs; s++) {
    int64_t n = seqs[s].n;
    int64_t hs[2] = {n, d}, ls[2] = {want_all ? n : 1, V}, cs[2] = {n, n_capture * d};
    snprintf(name, sizeof name, "final_hidden.%d", s); /* the writer copies names */
    ds_status st = ds_st_writer_add(w, name, DS_F32, 2, hs, hidden[s]);
    if (st == DS_OK && (want_all || want_last)) {
      snprintf(name, sizeof name, "logits.%d", s);
      st = ds_st_writer_add(w, name, DS_F32, 2, ls, logits[s]);
    }
    if (st == DS_OK && n_capture) {
      snprintf(name, sizeof name, "captured.%d", s);
      st = ds_st_writer_add(w, name, DS_F32, 2, cs, captured[s]);
    }
    if (st != DS_OK) goto report;
  }
  if (ds_st_writer_write(w, out_path) != DS_OK) {
    ds_error_wrap(DS_ERR_IO, "--out %s", out_path);
    goto report;
  }
  rc = 0;
  goto done;
report:
  rc = cli_report_error("forward");
done:
  ds_st_writer_free(w);
  for (int s = 0; s < n_seqs; s++) {
    if (caches) ds_kv_cache_free(caches[s]);
    if (logits) free(logits[s]);
    if (hidden) free(hidden[s]);
    if (captured) free(captured[s]);
  }
  free_batch(seqs, n_seqs);
  free(caches);
  free(logits);
  free(hidden);
  free(captured);
  free(batch);
  free(owner);
  free(last_rows);
  free(capture);
  ds_target_free(m);
  return rc;
}

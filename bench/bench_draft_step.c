/* One DSpark draft optimizer step, timed: ds_draft_zero_grads, ds_draft_loss_seq (forward, the
 * chunked DSpark loss fused with the lm_head matmul, backward), ds_clip_grad_norm (1.0) and
 * ds_adamw_step (lr 6e-4, weight decay 0), on a random draft and random inputs. The driver
 * bench/bench_draft_step.py runs it beside a PyTorch eager peer of the same step.
 *
 *   bench_draft_step [--threads N (2)] [--steps N (5)] [--seed S (1)]
 *                    [--vocab V (32000)] [--hidden D (512)] [--inter I (1536)] [--heads H (8)]
 *                    [--kv-heads H (2)] [--head-dim HD (64)] [--layers N (2)] [--captured M (5)]
 *                    [--block G (7)] [--anchors N (64)] [--seq-len T (512)] [--rank R (256)]
 *                    [--chunk-rows N (128)] [--rope-theta X (1e6)] [--draft-vocab N (0: all of V)]
 *                    [--dump FILE] [--profile] [--compute fp32|bf16] [--tables f32|bf16]
 *
 * Draft: ds_draft_new's random init (normal(0, 0.02) matrices, unit norms) over random frozen
 * embed / lm_head tables (uniform, amplitude 0.5 and 0.1); vanilla Markov head of rank R and
 * the confidence head with Markov input. Inputs: ctx [T, M*D] and last [T, D] uniform in
 * [-1, 1], ids uniform in [0, V-1) (V-1 is the mask token), N distinct sorted anchors in
 * [0, T-2], every block kept, eval mask from ds_anchor_eval_mask with a loss mask of ones.
 *
 * After one warm-up step (whose loss is that of the initial weights), --steps timed steps.
 * Prints one JSON line on stdout: best / median / every step time, each step's two parts
 * (loss_seq: zero grads + forward + loss + backward; optimizer: clip + AdamW) and their medians,
 * the first and last numerators and W, the grad norm of the first step, the RSS after setup and
 * the peak RSS (VmHWM) in MiB, sizes. Progress per step on stderr.
 *
 * --dump FILE writes, before any step, the inputs (input.ctx, input.last, input.ids I32,
 * input.anchors I64, input.block_keep U8, input.eval_mask U8) and every draft tensor under its
 * HF export name (ds_draft_tensor_at), with the config in the "config" metadata key, so a
 * peer can run the same step on the same numbers. The dump costs memory: time and measure
 * RSS in a run without it (the same seed gives the same numbers).
 * --tables bf16 holds the frozen embed / lm_head in BF16 (rounded from the same random values),
 * as a draft of a bf16 target does; not with --dump (the peer reads F32 tables).
 * --draft-vocab N trains a draft over a reduced vocabulary of N ids (spec section 4a; S = every
 * (V / N)-th id): the draft's head products run over N rows, the teacher's over V (the target's
 * lm_head kept whole, as training keeps it); not with --dump.
 * --profile wraps the cpu backend in the profiling backend and prints, on stderr, the time
 * per kernel over the timed steps (loss_seq only; the rest is loss rows, copies and heads). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/anchors.h"
#include "dspark/backend.h"
#include "dspark/draft.h"
#include "dspark/draft_loss.h"
#include "dspark/dtype.h"
#include "dspark/dspark_loss.h"
#include "dspark/optim.h"
#include "dspark/profile.h"
#include "dspark/rng.h"
#include "dspark/safetensors.h"

typedef struct {
  int threads, steps, profile, tables_bf16;
  uint64_t seed;
  int64_t V, D, I, H, KV, HD, layers, M, G, anchors, T, rank, chunk, draft_vocab;
  double rope_theta;
  const char *dump;
} options;

static void usage(void) {
  fprintf(stderr,
          "usage: bench_draft_step [--threads N] [--steps N] [--seed S] [--vocab V] [--hidden D] [--inter I]\n"
          "       [--heads H] [--kv-heads H] [--head-dim HD] [--layers N] [--captured M] [--block G]\n"
          "       [--anchors N] [--seq-len T] [--rank R] [--chunk-rows N] [--rope-theta X] [--dump FILE] [--profile]\n"
          "       [--compute fp32|bf16] [--tables f32|bf16] [--draft-vocab N]\n");
  exit(2);
}

static void parse(int argc, char **argv, options *o) {
  *o = (options){2, 5, 0, 0, 1, 32000, 512, 1536, 8, 2, 64, 2, 5, 7, 64, 512, 256, 128, 0, 1e6, NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--profile")) { o->profile = 1; continue; }
    if (i + 1 >= argc) usage();
    const char *v = argv[++i];
    char *end;
    if (!strcmp(a, "--dump")) { o->dump = v; continue; }
    if (!strcmp(a, "--tables")) {
      if (strcmp(v, "f32") && strcmp(v, "bf16")) usage();
      o->tables_bf16 = !strcmp(v, "bf16");
      continue;
    }
    if (!strcmp(a, "--compute")) { /* the matmul precision (include/dspark/backend.h) */
      ds_compute c;
      if (!ds_compute_parse(v, &c)) usage();
      ds_set_matmul_compute(c);
      continue;
    }
    if (!strcmp(a, "--rope-theta")) {
      o->rope_theta = strtod(v, &end);
      if (*end || !(o->rope_theta > 0)) usage();
      continue;
    }
    long long x = strtoll(v, &end, 10);
    if (*end || x < 0) usage();
    if (!strcmp(a, "--threads")) o->threads = (int)x;
    else if (!strcmp(a, "--steps")) o->steps = (int)x;
    else if (!strcmp(a, "--seed")) o->seed = (uint64_t)x;
    else if (!strcmp(a, "--vocab")) o->V = x;
    else if (!strcmp(a, "--hidden")) o->D = x;
    else if (!strcmp(a, "--inter")) o->I = x;
    else if (!strcmp(a, "--heads")) o->H = x;
    else if (!strcmp(a, "--kv-heads")) o->KV = x;
    else if (!strcmp(a, "--head-dim")) o->HD = x;
    else if (!strcmp(a, "--layers")) o->layers = x;
    else if (!strcmp(a, "--captured")) o->M = x;
    else if (!strcmp(a, "--block")) o->G = x;
    else if (!strcmp(a, "--anchors")) o->anchors = x;
    else if (!strcmp(a, "--seq-len")) o->T = x;
    else if (!strcmp(a, "--rank")) o->rank = x;
    else if (!strcmp(a, "--chunk-rows")) o->chunk = x;
    else if (!strcmp(a, "--draft-vocab")) o->draft_vocab = x;
    else usage();
  }
  if (o->threads < 1 || o->steps < 1 || o->V < 2 || o->D < 1 || o->M < 1 || o->M > 32 || o->T < 2 ||
      o->anchors < 1 || o->anchors > o->T - 1 || o->chunk < 1 || o->draft_vocab > o->V || (o->draft_vocab && o->dump))
    usage();
}

static void die(ds_status st, const char *what) {
  fprintf(stderr, "bench_draft_step: %s: %s (%s)\n", what, ds_last_error(), ds_status_name(st));
  exit(1);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "bench_draft_step: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

static float *uniform(size_t n, ds_rng *r, float amp) {
  float *p = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = (2.0f * ds_rng_uniform_f32(r) - 1.0f) * amp;
  return p;
}

/* A memory line of /proc/self/status ("VmHWM:" = peak resident set, "VmRSS:" = current) in
 * MiB; 0 if unknown. */
static double status_mib(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  size_t n = strlen(key);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, n)) {
      sscanf(line + n, "%lf", &kib);
      break;
    }
  fclose(f);
  return kib / 1024.0;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static double median(const double *x, int n) { /* x left as it is */
  double *s = xmalloc((size_t)n * sizeof(double));
  memcpy(s, x, (size_t)n * sizeof(double));
  double m = ds_median(s, n);
  free(s);
  return m;
}

typedef struct {
  int64_t T, n_blocks;
  float *ctx, *last;
  int32_t *ids;
  int64_t *anchors;
  uint8_t *keep, *eval_mask;
} inputs;

static void make_inputs(const options *o, ds_rng *rng, inputs *in) {
  int64_t T = o->T, nb = o->anchors;
  in->T = T;
  in->n_blocks = nb;
  in->ctx = uniform((size_t)(T * o->M * o->D), rng, 1.0f);
  in->last = uniform((size_t)(T * o->D), rng, 1.0f);
  in->ids = xmalloc((size_t)T * sizeof(int32_t));
  for (int64_t t = 0; t < T; t++) in->ids[t] = (int32_t)(ds_rng_next_u64(rng) % (uint64_t)(o->V - 1));
  /* nb distinct anchors in [0, T-2]: a partial Fisher-Yates shuffle, then sorted. */
  int64_t n_elig = T - 1;
  int64_t *pool = xmalloc((size_t)n_elig * sizeof(int64_t));
  for (int64_t i = 0; i < n_elig; i++) pool[i] = i;
  for (int64_t i = 0; i < nb; i++) {
    int64_t j = i + (int64_t)(ds_rng_next_u64(rng) % (uint64_t)(n_elig - i));
    int64_t tmp = pool[i];
    pool[i] = pool[j];
    pool[j] = tmp;
  }
  in->anchors = xmalloc((size_t)nb * sizeof(int64_t));
  memcpy(in->anchors, pool, (size_t)nb * sizeof(int64_t));
  free(pool);
  qsort(in->anchors, (size_t)nb, sizeof(int64_t), cmp_i64);
  in->keep = xmalloc((size_t)nb);
  memset(in->keep, 1, (size_t)nb);
  uint8_t *loss_mask = xmalloc((size_t)T);
  memset(loss_mask, 1, (size_t)T);
  in->eval_mask = xmalloc((size_t)(nb * o->G));
  ds_anchor_eval_mask(loss_mask, T, in->anchors, in->keep, nb, o->G, in->eval_mask);
  free(loss_mask);
}

static void free_inputs(inputs *in) {
  free(in->ctx);
  free(in->last);
  free(in->ids);
  free(in->anchors);
  free(in->keep);
  free(in->eval_mask);
}

static void dump(const options *o, const ds_draft_config *c, ds_draft *d, const inputs *in, const char *path) {
  ds_st_writer *w = ds_st_writer_new();
  if (!w) die(DS_ERR_NOMEM, "safetensors writer");
  ds_status st = DS_OK;
  int64_t s_ctx[2] = {in->T, o->M * o->D}, s_last[2] = {in->T, o->D}, s_T[1] = {in->T}, s_nb[1] = {in->n_blocks};
  int64_t s_rows[1] = {in->n_blocks * o->G};
  if (!st) st = ds_st_writer_add(w, "input.ctx", DS_F32, 2, s_ctx, in->ctx);
  if (!st) st = ds_st_writer_add(w, "input.last", DS_F32, 2, s_last, in->last);
  if (!st) st = ds_st_writer_add(w, "input.ids", DS_I32, 1, s_T, in->ids);
  if (!st) st = ds_st_writer_add(w, "input.anchors", DS_I64, 1, s_nb, in->anchors);
  if (!st) st = ds_st_writer_add(w, "input.block_keep", DS_U8, 1, s_nb, in->keep);
  if (!st) st = ds_st_writer_add(w, "input.eval_mask", DS_U8, 1, s_rows, in->eval_mask);
  for (size_t i = 0; !st && i < ds_draft_tensor_count(d); i++) {
    const ds_draft_tensor *t = ds_draft_tensor_at(d, i);
    st = ds_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
  }
  char cfg[1024];
  ds_dspark_loss_config lc = ds_dspark_loss_config_default();
  snprintf(cfg, sizeof cfg,
           "{\"vocab_size\": %lld, \"hidden_size\": %lld, \"intermediate_size\": %lld, \"num_attention_heads\": %lld, "
           "\"num_key_value_heads\": %lld, \"head_dim\": %lld, \"rms_norm_eps\": %.17g, \"rope_theta\": %.17g, "
           "\"num_layers\": %lld, \"block_size\": %lld, \"n_target_layers\": %d, \"mask_token_id\": %d, "
           "\"markov_type\": \"%s\", \"markov_rank\": %lld, \"enable_confidence_head\": %d, "
           "\"confidence_head_with_markov\": %d, \"alpha_ce\": %g, \"alpha_l1\": %g, \"alpha_conf\": %g, "
           "\"decay_gamma\": %g, \"chunk_rows\": %lld, \"lr\": 6e-4, \"weight_decay\": 0, \"max_grad_norm\": 1.0}",
           (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->intermediate_size,
           (long long)c->num_attention_heads, (long long)c->num_key_value_heads, (long long)c->head_dim,
           c->rms_norm_eps, o->rope_theta, (long long)c->num_layers, (long long)c->block_size, c->n_target_layers,
           c->mask_token_id, ds_markov_type_name(c->markov_type), (long long)c->markov_rank,
           c->enable_confidence_head, c->confidence_head_with_markov, lc.alpha_ce, lc.alpha_l1, lc.alpha_conf,
           lc.decay_gamma, (long long)o->chunk);
  if (!st) st = ds_st_writer_set_metadata(w, "config", cfg);
  if (!st) st = ds_st_writer_write(w, path);
  ds_st_writer_free(w);
  if (st) die(st, path);
}

int main(int argc, char **argv) {
  options o;
  parse(argc, argv, &o);
  if (o.tables_bf16 && o.dump) usage();
  ds_set_num_threads(o.threads);

  ds_draft_config c;
  memset(&c, 0, sizeof c);
  c.vocab_size = o.V;
  c.hidden_size = o.D;
  c.intermediate_size = o.I;
  c.num_attention_heads = o.H;
  c.num_key_value_heads = o.KV;
  c.head_dim = o.HD;
  c.rms_norm_eps = 1e-6;
  c.rope_source.head_dim = o.HD;
  c.rope_source.rope_theta = o.rope_theta;
  c.rope_source.rope_type = DS_ROPE_DEFAULT;
  c.num_layers = o.layers;
  c.block_size = o.G;
  c.num_target_layers = 4 * o.M + 2;
  for (int i = 0; i < (int)o.M; i++) c.target_layer_ids[i] = 1 + 4 * i;
  c.n_target_layers = (int)o.M;
  c.mask_token_id = (int32_t)(o.V - 1);
  c.markov_type = o.rank > 0 ? DS_MARKOV_VANILLA : DS_MARKOV_NONE;
  c.markov_rank = o.rank;
  c.enable_confidence_head = 1;
  c.confidence_head_with_markov = o.rank > 0;
  c.num_anchors = o.anchors;
  c.draft_vocab_size = o.draft_vocab;
  int32_t *vocab = NULL; /* S: every (V / N)-th id */
  if (o.draft_vocab) {
    vocab = xmalloc((size_t)o.draft_vocab * sizeof *vocab);
    for (int64_t j = 0; j < o.draft_vocab; j++) vocab[j] = (int32_t)(j * o.V / o.draft_vocab);
  }

  ds_rng rng;
  ds_rng_seed(&rng, o.seed);
  size_t table = (size_t)(o.V * o.D);
  float *embed = uniform(table, &rng, 0.5f), *lm_head = uniform(table, &rng, 0.1f);
  ds_profile prof;
  memset(&prof, 0, sizeof prof);
  const ds_backend *be = o.profile ? ds_backend_profiled(ds_backend_cpu(), &prof) : ds_backend_cpu();
  ds_draft *d;
  ds_weight we = {embed, DS_F32}, wl = {lm_head, DS_F32};
  uint16_t *embed16 = NULL, *lm_head16 = NULL;
  if (o.tables_bf16) { /* as a bf16 target's draft holds them */
    embed16 = xmalloc(table * sizeof(uint16_t));
    lm_head16 = xmalloc(table * sizeof(uint16_t));
    for (size_t i = 0; i < table; i++) embed16[i] = ds_f32_to_bf16(embed[i]), lm_head16[i] = ds_f32_to_bf16(lm_head[i]);
    we = (ds_weight){embed16, DS_BF16}, wl = (ds_weight){lm_head16, DS_BF16};
  }
  ds_status st = ds_draft_new_vocab(&c, we, wl, vocab, o.seed + 1, be, &d);
  if (st) die(st, "ds_draft_new");
  free(vocab);
  free(embed); /* the draft holds its own copies; a reduced draft's teacher keeps the whole lm_head */
  free(embed16);
  if (!o.draft_vocab) {
    free(lm_head);
    free(lm_head16);
    lm_head = NULL, lm_head16 = NULL;
  }
  inputs in;
  make_inputs(&o, &rng, &in);
  double rss_init = status_mib("VmRSS:");
  if (o.dump) dump(&o, &c, d, &in, o.dump);

  ds_draft_seq seq = {in.T, in.ctx, in.last, in.ids, in.n_blocks, in.anchors, in.keep, in.eval_mask, {NULL, DS_F32}};
  if (o.draft_vocab) seq.teacher_head = o.tables_bf16 ? (ds_weight){lm_head16, DS_BF16} : (ds_weight){lm_head, DS_F32};
  ds_dspark_loss_config lc = ds_dspark_loss_config_default();
  lc.chunk_rows = o.chunk;
  int64_t R = in.n_blocks * o.G;
  uint8_t *sup = xmalloc((size_t)R);
  double *wts = xmalloc((size_t)R * sizeof(double));
  st = ds_dspark_loss_weights(&lc, in.n_blocks, o.G, in.eval_mask, in.keep, sup, wts);
  if (st) die(st, "ds_dspark_loss_weights");
  double W = 0;
  for (int64_t i = 0; i < R; i++) W += wts[i];
  free(sup);
  free(wts);

  size_t n = ds_draft_num_params(d);
  ds_adamw opt;
  if ((st = ds_adamw_init(&opt, n))) die(st, "ds_adamw_init");
  ds_adamw_config ocfg = ds_adamw_defaults();
  ocfg.weight_decay = 0.0;
  const double lr = 6e-4, max_norm = 1.0;

  int total = o.steps + 1;
  double *t_step = xmalloc((size_t)total * sizeof(double)), *t_loss = xmalloc((size_t)total * sizeof(double));
  double *t_opt = xmalloc((size_t)total * sizeof(double)), *num = xmalloc((size_t)total * sizeof(double));
  double first_norm = 0, pa[64], pc[64];
  ds_dspark_loss_result first_res;
  for (int s = 0; s < total; s++) {
    if (s == 1 && o.profile) memset(&prof, 0, sizeof prof); /* profile the timed steps only */
    ds_dspark_loss_result res;
    memset(&res, 0, sizeof res);
    memset(pa, 0, sizeof pa);
    memset(pc, 0, sizeof pc);
    double t0 = ds_time_sec();
    ds_draft_zero_grads(d);
    st = ds_draft_loss_seq(d, &seq, &lc, 1.0 / W, 1, &res, pa, pc);
    if (st) die(st, "ds_draft_loss_seq");
    double t1 = ds_time_sec();
    double norm = ds_grad_norm(ds_draft_grads(d), n); /* clipped inside the update, as the trainer does */
    ds_adamw_step_scaled(&opt, &ocfg, lr, ds_draft_params(d), ds_draft_grads(d), ds_grad_clip_coef(norm, max_norm));
    double t2 = ds_time_sec();
    t_step[s] = t2 - t0;
    t_loss[s] = t1 - t0;
    t_opt[s] = t2 - t1;
    num[s] = res.numerator;
    if (s == 0) {
      first_norm = norm;
      first_res = res;
    }
    fprintf(stderr, "step %d: %.3f s (loss_seq %.3f, optimizer %.3f), loss %.6f, grad norm %.4g\n", s, t_step[s],
            t_loss[s], t_opt[s], res.numerator / W, norm);
  }
  const double *timed = t_step + 1;
  double best = timed[0];
  for (int s = 1; s < o.steps; s++) best = timed[s] < best ? timed[s] : best;
  double rss = status_mib("VmHWM:");
  if (o.profile) {
    double tot = 0;
    for (int s = 1; s < total; s++) tot += t_loss[s];
    fprintf(stderr, "profile of ds_draft_loss_seq over %d timed steps (%.3f s):\n", o.steps, tot);
    ds_profile_print(&prof, tot, stderr);
  }

  int bf16 = ds_matmul_compute() == DS_COMPUTE_BF16;
  printf("{\"bench\": \"draft_step\", \"compute\": \"%s\", \"tables\": \"%s\", \"gemm_bf16\": \"%s\",",
         ds_compute_name(ds_matmul_compute()), o.tables_bf16 ? "bf16" : "f32",
         bf16 ? ds_gemm_bf16_name() : "");
  printf(" \"threads\": %d, \"gemm\": \"%s\", \"steps\": %d, \"best_s\": %.6f, "
         "\"median_s\": %.6f, \"median_loss_seq_s\": %.6f, \"median_optimizer_s\": %.6f, \"warmup_s\": %.6f, \"times_s\": [",
         o.threads, ds_gemm_name(), o.steps, best, median(timed, o.steps), median(t_loss + 1, o.steps),
         median(t_opt + 1, o.steps), t_step[0]);
  for (int s = 0; s < o.steps; s++) printf("%s%.6f", s ? ", " : "", timed[s]);
  printf("], \"loss_seq_times_s\": [");
  for (int s = 0; s < o.steps; s++) printf("%s%.6f", s ? ", " : "", t_loss[s + 1]);
  printf("], \"optimizer_times_s\": [");
  for (int s = 0; s < o.steps; s++) printf("%s%.6f", s ? ", " : "", t_opt[s + 1]);
  printf("], \"numerators\": [");
  for (int s = 0; s < total; s++) printf("%s%.17g", s ? ", " : "", num[s]);
  printf("], \"first_numerator\": %.17g, \"W\": %.17g, \"first_loss\": %.9g, \"last_loss\": %.9g, "
         "\"first_ce\": %.9g, \"first_l1\": %.9g, \"first_conf\": %.9g, \"first_accept_rate\": %.9g, "
         "\"first_grad_norm\": %.9g, \"num_tokens\": %lld, \"peak_rss_mib\": %.1f, \"n_params\": %zu, "
         "\"vocab\": %lld, \"hidden\": %lld, \"layers\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, "
         "\"inter\": %lld, \"captured\": %lld, \"block\": %lld, \"anchors\": %lld, \"seq_len\": %lld, \"rank\": %lld, "
         "\"chunk_rows\": %lld, \"draft_vocab\": %lld, \"profile\": %d, \"rss_after_init_mib\": %.1f}\n",
         num[0], W, num[0] / W, num[total - 1] / W, first_res.pair[DS_DSPARK_PAIR_CE][0] / W,
         first_res.pair[DS_DSPARK_PAIR_L1][0] / W, first_res.pair[DS_DSPARK_PAIR_CONF][0] / W,
         first_res.pair[DS_DSPARK_PAIR_ACCEPT][0] / first_res.pair[DS_DSPARK_PAIR_ACCEPT][1], first_norm,
         (long long)first_res.num_tokens, rss, n, (long long)o.V, (long long)o.D, (long long)o.layers, (long long)o.H,
         (long long)o.KV, (long long)o.HD, (long long)o.I, (long long)o.M, (long long)o.G, (long long)o.anchors,
         (long long)o.T, (long long)o.rank, (long long)o.chunk, (long long)o.draft_vocab, o.profile, rss_init);

  free(t_step);
  free(t_loss);
  free(t_opt);
  free(num);
  ds_adamw_free(&opt);
  free_inputs(&in);
  ds_draft_free(d);
  free(lm_head);
  free(lm_head16);
  return 0;
}

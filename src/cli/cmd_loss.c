/* dspark loss: evaluates the DSpark training objective (spec/dspark.md section 4) on tensors
 * from a safetensors file and writes the numerator, the token count, W, the reporting pairs,
 * the per-position acceptance, the per-row values and the gradients, so that a user can
 * check the engine against their own implementation. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/input_tensors.h"
#include "dspark/backend.h"
#include "dspark/dspark_loss.h"
#include "dspark/safetensors.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark loss IN.safetensors --out OUT.safetensors [options]\n"
          "Evaluates the DSpark loss (CE + raw L1 + confidence BCE) and its gradients.\n"
          "\n"
          "Input tensors (rows are block-major: row = b * g + k):\n"
          "  draft_logits     F32 [R, V] or [B, g, V]  draft logits, Markov bias included\n"
          "  target_logits    F32, same shape           teacher logits (optional: without them\n"
          "                                             only CE is on; no accept rate or tau)\n"
          "  target_ids       I32 or I64 [R] or [B, g]  ids to predict (anything at unsupervised slots)\n"
          "  eval_mask        U8 or BOOL [R] or [B, g]  nonzero = evaluated\n"
          "  block_keep_mask  U8 or BOOL [B]            nonzero = anchor kept\n"
          "  conf_logits      F32 [R] or [B, g]         confidence logits (optional)\n"
          "  draft_vocab      I32 or I64 [N]            a reduced draft vocabulary S (spec section 4a,\n"
          "                                             optional): the strictly increasing target ids of\n"
          "                                             draft_logits' N columns; target_logits keep the\n"
          "                                             full V (q over S, p the full softmax, CE only\n"
          "                                             where the target id is in S, l1 adds p's mass\n"
          "                                             outside S); without target_logits, --vocab-size\n"
          "  Checked first, naming the tensor and the index: dtypes and shapes; U8 masks are nonzero = 1,\n"
          "  BOOL bytes 0 or 1; at supervised slots (eval_mask and block_keep_mask) the target id must be in\n"
          "  [0, V) and the draft / target logits and the confidence logit free of NaN and +inf; the other\n"
          "  slots may hold anything. A tensor of another name is ignored with a warning.\n"
          "Output tensors:\n"
          "  numerator F64 [], num_tokens I64 [], W F64 []\n"
          "  pair.loss, pair.ce, pair.l1, pair.confidence F64 [2]   [numerator, W] (with draft_vocab,\n"
          "                                                        pair.ce's sums cover the slots whose\n"
          "                                                        target id is in S)\n"
          "  pair.accept_rate, pair.tau F64 [2]                     (with a teacher)\n"
          "  per_position.accept, per_position.count F64 [g]        sum accept*sup, sum sup per slot\n"
          "  row.ce, row.l1, row.accept, row.bce F64 [R]            per-row values (0 where unsupervised)\n"
          "  grad.draft_logits F32 (shape of draft_logits), grad.conf_logits F32 (shape of conf_logits)\n"
          "  The gradients are grad_scale * d numerator / d input: with the default --grad-scale 1\n"
          "  they are the gradients of the UNNORMALIZED numerator (a trainer passes 1 / global W).\n"
          "\n"
          "Options:\n"
          "  --out FILE          output safetensors (required)\n"
          "  --block-size G      slots per block; default: from a [B, g, V] draft_logits, else R / B\n"
          "  --alpha-ce A        weight of the CE term (default 0.1)\n"
          "  --alpha-l1 B        weight of the raw L1 term (default 0.9)\n"
          "  --alpha-conf C      weight of the confidence BCE term (default 1.0)\n"
          "  --decay-gamma X     weights exp(-k / X), k = 0-based slot (default 4.0; <= 0: no decay)\n"
          "  --decay MODE        deepspec (default, uses --decay-gamma), paper (exp(-(k1-1)/g) with\n"
          "                      1-based k1 and g the block size), or none\n"
          "  --chunk-rows N      rows per chunk (default 128); results do not depend on it\n"
          "  --grad-scale S      multiplies both gradients (default 1)\n"
          "  --vocab-size V      the target's vocabulary, for draft_vocab without target_logits\n"
          "  --no-teacher        ignore target_logits (CE only)\n"
          "  --no-conf           ignore conf_logits (confidence term off)\n"
          "  --no-grad           compute values only; write no gradients\n"
          "  --threads N         threads (OpenMP over rows)\n"
          "Prints the pairs to stdout and, to stderr, a timing line for the loss alone (inputs paged in\n"
          "and the gradient buffer touched before the clock starts). Exit status: 0 ok, 1 error, 2 usage.\n");
}

static void shape_str(char *buf, size_t cap, const ds_tensor_view *t) {
  size_t used = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < t->ndim && used < cap; d++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* Per-row tensor: [R] or [B, g]. */
static ds_status check_rows(const ds_tensor_view *t, int64_t B, int64_t g) {
  if ((t->ndim == 1 && t->shape[0] == B * g) || (t->ndim == 2 && t->shape[0] == B && t->shape[1] == g)) return DS_OK;
  char have[128];
  shape_str(have, sizeof have, t);
  return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%lld] or [%lld, %lld]", t->file, t->name, have,
                 (long long)(B * g), (long long)B, (long long)g);
}

typedef struct loss_args loss_args;

/* The rows the loss reads: a supervised row's target id must be in [0, V), and its draft
 * logits, teacher logits and confidence logit must hold no NaN or +inf (-inf is a probability
 * of 0). Unsupervised rows may hold anything (sentinel ids, NaN padding): they are never read.
 * Each refusal names the tensor and the index. */
static ds_status check_supervised(const loss_args *a, const ds_tensor_view *td, const ds_tensor_view *tt,
                                  const ds_tensor_view *ti, const ds_tensor_view *tc, const float *draft,
                                  const float *target, const float *conf, const int64_t *ids, const uint8_t *sup,
                                  int64_t g, int64_t N, int64_t V);

struct loss_args {
  const char *in_path, *out_path;
  int64_t block_size, threads, vocab_size;
  double grad_scale;
  int no_teacher, no_conf, no_grad;
  ds_dspark_loss_config cfg;
};

static int parse_args(int argc, char **argv, loss_args *a) {
  memset(a, 0, sizeof *a);
  a->cfg = ds_dspark_loss_config_default();
  a->grad_scale = 1.0;
  int decay_none = 0;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *v = NULL;
    if (cli_is_help(o)) {
      usage(stdout);
      return 0;
    }
#define VALUE() \
  if (!(v = cli_value(argc, argv, &i))) return 2
    if (!strcmp(o, "--out")) {
      VALUE();
      a->out_path = v;
    } else if (!strcmp(o, "--block-size")) {
      VALUE();
      if (!cli_int(o, v, 1, INT32_MAX, &a->block_size)) return 2;
    } else if (!strcmp(o, "--alpha-ce")) {
      VALUE();
      if (!cli_float(o, v, 0, 1e30, &a->cfg.alpha_ce)) return 2;
    } else if (!strcmp(o, "--alpha-l1")) {
      VALUE();
      if (!cli_float(o, v, 0, 1e30, &a->cfg.alpha_l1)) return 2;
    } else if (!strcmp(o, "--alpha-conf")) {
      VALUE();
      if (!cli_float(o, v, 0, 1e30, &a->cfg.alpha_conf)) return 2;
    } else if (!strcmp(o, "--decay-gamma")) {
      VALUE();
      if (!cli_float(o, v, -1e30, 1e30, &a->cfg.decay_gamma)) return 2;
    } else if (!strcmp(o, "--decay")) {
      VALUE();
      if (!strcmp(v, "deepspec")) a->cfg.decay = DS_DSPARK_DECAY_DEEPSPEC;
      else if (!strcmp(v, "paper")) a->cfg.decay = DS_DSPARK_DECAY_PAPER;
      else if (!strcmp(v, "none")) decay_none = 1;
      else {
        fprintf(stderr, "dspark loss: --decay must be deepspec, paper or none (got '%s')\n", v);
        return 2;
      }
    } else if (!strcmp(o, "--chunk-rows")) {
      VALUE();
      if (!cli_int(o, v, 1, INT32_MAX, &a->cfg.chunk_rows)) return 2;
    } else if (!strcmp(o, "--grad-scale")) {
      VALUE();
      if (!cli_float(o, v, -1e30, 1e30, &a->grad_scale)) return 2;
    } else if (!strcmp(o, "--threads")) {
      VALUE();
      if (!cli_int(o, v, 1, 1024, &a->threads)) return 2;
    } else if (!strcmp(o, "--vocab-size")) {
      VALUE();
      if (!cli_int(o, v, 1, INT32_MAX, &a->vocab_size)) return 2;
    } else if (!strcmp(o, "--no-teacher")) a->no_teacher = 1;
    else if (!strcmp(o, "--no-conf")) a->no_conf = 1;
    else if (!strcmp(o, "--no-grad")) a->no_grad = 1;
    else if (o[0] == '-' || a->in_path) {
      fprintf(stderr, "dspark loss: unexpected argument '%s'\n", o);
      usage(stderr);
      return 2;
    } else a->in_path = o;
#undef VALUE
  }
  if (decay_none) a->cfg.decay = DS_DSPARK_DECAY_DEEPSPEC, a->cfg.decay_gamma = 0.0;
  if (!a->in_path || !a->out_path) {
    usage(stderr);
    return 2;
  }
  const ds_input_path inputs[] = {{"IN", a->in_path}};
  int refused = cli_output_refused("loss", "--out", a->out_path, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  return -1; /* go on */
}

static const char *value_name(float x) { return x != x ? "NaN" : x > 0 ? "+inf" : "-inf"; }

static ds_status check_supervised(const loss_args *a, const ds_tensor_view *td, const ds_tensor_view *tt,
                                  const ds_tensor_view *ti, const ds_tensor_view *tc, const float *draft,
                                  const float *target, const float *conf, const int64_t *ids, const uint8_t *sup,
                                  int64_t g, int64_t N, int64_t V) {
  char at[160];
  int64_t R = ti->numel;
  for (int64_t r = 0; r < R; r++) {
    if (!sup[r]) continue;
    if (ids[r] < 0 || ids[r] >= V) {
      cli_in_index(ti, r, at, sizeof at);
      return DS_FAIL(DS_ERR_RANGE, "%s: tensor 'target_ids' holds %lld at %s: block %lld slot %lld (row %lld) is "
                     "supervised, and the id is outside the vocabulary [0, %lld)", a->in_path, (long long)ids[r], at,
                     (long long)(r / g), (long long)(r % g), (long long)r, (long long)V);
    }
    const ds_tensor_view *views[2] = {td, tt};
    const char *what[2] = {"draft logits", "target logits"};
    const float *rows[2] = {draft, target};
    const int64_t width[2] = {N, V};
    for (int k = 0; k < 2; k++) {
      if (!rows[k]) continue;
      const float *x = rows[k] + r * width[k];
      for (int64_t v = 0; v < width[k]; v++) {
        if (!(x[v] != x[v] || x[v] == INFINITY)) continue;
        cli_in_index(views[k], r * width[k] + v, at, sizeof at);
        return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s' holds %s at %s: the %s of block %lld slot %lld (row %lld), "
                       "a supervised slot", a->in_path, views[k]->name, value_name(x[v]), at, what[k],
                       (long long)(r / g), (long long)(r % g), (long long)r);
      }
    }
    if (conf && target && !isfinite(conf[r])) { /* read only with a teacher */
      cli_in_index(tc, r, at, sizeof at);
      return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor 'conf_logits' holds %s at %s: the confidence logit of block %lld "
                     "slot %lld (row %lld), a supervised slot", a->in_path, value_name(conf[r]), at, (long long)(r / g),
                     (long long)(r % g), (long long)r);
    }
  }
  return DS_OK;
}

static ds_status add_f64(ds_st_writer *w, const char *name, int ndim, int64_t n, const double *data) {
  return ds_st_writer_add(w, name, DS_F64, ndim, &n, data);
}

static ds_status write_metadata(ds_st_writer *w, const loss_args *a) {
  char buf[64];
  const char *keys[] = {"alpha_ce", "alpha_l1", "alpha_conf", "decay_gamma", "grad_scale"};
  const double vals[] = {a->cfg.alpha_ce, a->cfg.alpha_l1, a->cfg.alpha_conf, a->cfg.decay_gamma, a->grad_scale};
  for (int i = 0; i < 5; i++) {
    snprintf(buf, sizeof buf, "%.17g", vals[i]);
    DS_TRY(ds_st_writer_set_metadata(w, keys[i], buf));
  }
  DS_TRY(ds_st_writer_set_metadata(w, "decay", a->cfg.decay == DS_DSPARK_DECAY_PAPER ? "paper" : "deepspec"));
  snprintf(buf, sizeof buf, "%lld", (long long)a->cfg.chunk_rows);
  DS_TRY(ds_st_writer_set_metadata(w, "chunk_rows", buf));
  DS_TRY(ds_st_writer_set_metadata(w, "has_teacher", a->cfg.has_teacher ? "1" : "0"));
  return ds_st_writer_set_metadata(w, "has_conf", a->cfg.has_conf ? "1" : "0");
}

int cmd_loss(int argc, char **argv) {
  loss_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0) return rc;
  rc = 1;
  ds_set_num_threads((int)a.threads);

  ds_safetensors *st = NULL;
  ds_st_writer *wr = NULL;
  float *own_draft = NULL, *own_target = NULL, *own_conf = NULL, *grad = NULL, *gconf = NULL;
  int32_t *ids = NULL, *vocab_ids = NULL, *vocab_index = NULL;
  ds_dspark_vocab vocab = {0, NULL, NULL};
  int64_t *ids64 = NULL;
  uint8_t *em = NULL, *bk = NULL, *sup = NULL;
  double *wts = NULL, *rowv = NULL, *pos = NULL;
  if (ds_st_open(a.in_path, &st) != DS_OK) goto report;

  static const char *const names[] = {"draft_logits", "target_logits", "target_ids", "eval_mask", "block_keep_mask",
                                      "conf_logits", "draft_vocab"};
  const ds_tensor_view *td, *tt, *ti, *te, *tb, *tc, *tv;
  if (cli_in_get(st, "draft_logits", 1, CLI_DT(DS_F32), &td) || cli_in_get(st, "target_logits", 0, CLI_DT(DS_F32), &tt) ||
      cli_in_get(st, "target_ids", 1, CLI_DT_INTS, &ti) || cli_in_get(st, "eval_mask", 1, CLI_DT_MASKS, &te) ||
      cli_in_get(st, "block_keep_mask", 1, CLI_DT_MASKS, &tb) || cli_in_get(st, "conf_logits", 0, CLI_DT(DS_F32), &tc) ||
      cli_in_get(st, "draft_vocab", 0, CLI_DT_INTS, &tv))
    goto report;
  cli_in_warn_unknown(st, names, (int)(sizeof names / sizeof names[0]), "loss");
  if (a.no_teacher) tt = NULL;
  if (a.no_conf) tc = NULL;

  /* shapes: B from block_keep_mask, g and V from draft_logits */
  char have[128];
  if (tb->ndim != 1) {
    shape_str(have, sizeof have, tb);
    DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'block_keep_mask' has shape %s, expected [B]", a.in_path, have);
    goto report;
  }
  int64_t B = tb->shape[0], g, V, R, N; /* N: draft_logits' columns (V without draft_vocab) */
  if (td->ndim == 3) {
    g = td->shape[1], V = td->shape[2];
    if (g < 1) {
      shape_str(have, sizeof have, td);
      DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'draft_logits' has shape %s: its block axis is empty (g >= 1 slots are needed)",
              a.in_path, have);
      goto report;
    }
    if (td->shape[0] != B || (a.block_size && a.block_size != g)) {
      shape_str(have, sizeof have, td);
      DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'draft_logits' has shape %s, expected [%lld, %lld, V] (B from block_keep_mask%s)",
              a.in_path, have, (long long)B, (long long)(a.block_size ? a.block_size : g),
              a.block_size ? ", g from --block-size" : "");
      goto report;
    }
  } else if (td->ndim == 2) {
    R = td->shape[0], V = td->shape[1];
    g = a.block_size ? a.block_size : (B > 0 ? R / B : 7);
    if (g < 1 || R % g != 0 || R / g != B) {
      shape_str(have, sizeof have, td);
      DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'draft_logits' has shape %s: its %lld rows are not %lld blocks (block_keep_mask) "
              "x %lld slots%s", a.in_path, have, (long long)R, (long long)B, (long long)g,
              a.block_size ? " (--block-size)" : "");
      goto report;
    }
  } else {
    shape_str(have, sizeof have, td);
    DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'draft_logits' has shape %s, expected [R, V] or [B, g, V]", a.in_path, have);
    goto report;
  }
  R = B * g;
  if (V < 1) {
    DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'draft_logits' has an empty vocabulary axis", a.in_path);
    goto report;
  }
  N = V;
  if (tv) { /* the draft's columns are S; the target's vocabulary comes from target_logits or --vocab-size */
    V = tt ? tt->shape[tt->ndim - 1] : a.vocab_size;
    if (!V) {
      DS_FAIL(DS_ERR_ARG, "%s: tensor 'draft_vocab' without target_logits needs --vocab-size (the target's "
              "vocabulary, which the target ids must lie in)", a.in_path);
      goto report;
    }
    if (tv->ndim != 1 || tv->shape[0] != N) {
      shape_str(have, sizeof have, tv);
      DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'draft_vocab' has shape %s, expected [%lld] (one target id per column of "
              "draft_logits)", a.in_path, have, (long long)N);
      goto report;
    }
  }
  if (tt) {
    int same = tt->ndim == td->ndim;
    for (int d = 0; same && d < td->ndim; d++) same = tt->shape[d] == (d + 1 < td->ndim ? td->shape[d] : V);
    if (!same) {
      char want[128];
      ds_tensor_view wv = *td; /* draft_logits' shape with the target's vocabulary last */
      wv.shape[wv.ndim - 1] = V;
      shape_str(have, sizeof have, tt);
      shape_str(want, sizeof want, &wv);
      DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'target_logits' has shape %s, expected %s (the shape of draft_logits%s)",
              a.in_path, have, want, tv ? ", the target's vocabulary last" : "");
      goto report;
    }
  }
  if (check_rows(ti, B, g) || check_rows(te, B, g) || (tc && check_rows(tc, B, g))) goto report;
  a.cfg.has_teacher = tt != NULL;
  a.cfg.has_conf = tc != NULL;
  if (ds_dspark_loss_config_check(&a.cfg) != DS_OK) goto report;

  /* inputs in memory */
  size_t nR = (size_t)(R ? R : 1);
  ids = ds_malloc(nR * sizeof *ids, "target ids");
  em = cli_alloc(R, 1, "eval_mask"), bk = cli_alloc(B, 1, "block_keep_mask");
  ids64 = cli_alloc(R, sizeof *ids64, "target_ids");
  sup = ds_malloc(nR, "supervision mask");
  wts = ds_malloc(nR * sizeof *wts, "weights");
  rowv = ds_malloc(4 * nR * sizeof *rowv, "row values");
  pos = ds_malloc(2 * (size_t)g * sizeof *pos, "per-position acceptance");
  const float *draft = cli_in_f32(td, &own_draft), *target = tt ? cli_in_f32(tt, &own_target) : NULL;
  const float *conf = tc ? cli_in_f32(tc, &own_conf) : NULL;
  if (tv) { /* S: strictly increasing ids in [0, V), and its inverse */
    vocab_ids = ds_malloc((size_t)N * sizeof *vocab_ids, "draft_vocab");
    vocab_index = ds_malloc((size_t)V * sizeof *vocab_index, "draft_vocab index");
    int64_t *s64 = cli_alloc(N, sizeof *s64, "draft_vocab");
    ds_status vs = vocab_ids && vocab_index && s64 ? cli_in_ints(tv, 0, V - 1, "the target's vocabulary", s64)
                                                   : DS_ERR_NOMEM;
    for (int64_t j = 0; vs == DS_OK && j < N; j++) {
      if (j > 0 && s64[j] <= s64[j - 1]) {
        vs = DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'draft_vocab' holds %lld at [%lld] after %lld: the ids must be strictly "
                     "increasing", a.in_path, (long long)s64[j], (long long)j, (long long)s64[j - 1]);
        break;
      }
      vocab_ids[j] = (int32_t)s64[j];
    }
    free(s64);
    if (vs != DS_OK) goto report;
    for (int64_t v = 0; v < V; v++) vocab_index[v] = -1;
    for (int64_t j = 0; j < N; j++) vocab_index[vocab_ids[j]] = (int32_t)j;
    vocab = (ds_dspark_vocab){N, vocab_ids, vocab_index};
  }
  if (!a.no_grad) {
    grad = ds_malloc_aligned((size_t)(R * N) * sizeof(float) + 1, "grad.draft_logits");
    gconf = ds_malloc(nR * sizeof *gconf, "grad.conf_logits");
  }
  if (!ids || !em || !bk || !ids64 || !sup || !wts || !rowv || !pos || !draft || (tt && !target) || (tc && !conf) ||
      (!a.no_grad && (!grad || !gconf)))
    goto report;
  if (cli_in_mask(te, em) != DS_OK || cli_in_mask(tb, bk) != DS_OK) goto report;
  if (ds_dspark_loss_weights(&a.cfg, B, g, em, bk, sup, wts) != DS_OK) goto report;
  if (cli_in_ints(ti, INT64_MIN, INT64_MAX, "any", ids64) != DS_OK ||
      check_supervised(&a, td, tt, ti, tc, draft, target, conf, ids64, sup, g, N, V) != DS_OK)
    goto report;
  for (int64_t r = 0; r < R; r++) /* supervised ids are in [0, V); anything else is never read */
    ids[r] = sup[r] ? (int32_t)ids64[r] : -1;

  ds_dspark_loss_inputs in = {draft, target, ids, em, bk, conf, tv ? &vocab : NULL};
  ds_dspark_row_stats rows = {rowv, rowv + nR, rowv + 2 * nR, rowv + 3 * nR, NULL};
  ds_dspark_loss_result res;
  cli_page_in(draft, (size_t)(R * N) * sizeof(float));
  if (target) cli_page_in(target, (size_t)(R * V) * sizeof(float));
  if (grad) memset(grad, 0, (size_t)(R * N) * sizeof(float)); /* first touch, as a trainer's reused buffer */
  double t0 = ds_time_sec();
  ds_status s = ds_dspark_loss(&a.cfg, B, g, V, &in, a.grad_scale, &res, pos, pos + g, grad, gconf, &rows);
  double dt = ds_time_sec() - t0;
  if (s != DS_OK) {
    ds_error_wrap(s, "%s", a.in_path);
    goto report;
  }
  fprintf(stderr, "loss: %lld rows (%lld blocks x %lld) x V %lld (draft columns %lld), %d threads, %s: %.4f s\n",
          (long long)R, (long long)B, (long long)g, (long long)V, (long long)N, ds_get_num_threads(),
          a.no_grad ? "forward" : "forward+backward", dt);
  printf("numerator %.9g  num_tokens %lld  W %.9g\n", res.numerator, (long long)res.num_tokens, res.W);
  for (int i = 0; i < DS_DSPARK_PAIR_COUNT; i++)
    if (res.pair_present[i])
      printf("%-12s %.9g  (%.9g / %.9g)\n", ds_dspark_pair_name(i),
             res.pair[i][1] != 0 ? res.pair[i][0] / res.pair[i][1] : 0.0, res.pair[i][0], res.pair[i][1]);

  wr = ds_st_writer_new();
  if (!wr) goto report;
  char name[64];
  s = write_metadata(wr, &a);
  if (s == DS_OK) s = ds_st_writer_add(wr, "numerator", DS_F64, 0, NULL, &res.numerator);
  if (s == DS_OK) s = ds_st_writer_add(wr, "num_tokens", DS_I64, 0, NULL, &res.num_tokens);
  if (s == DS_OK) s = ds_st_writer_add(wr, "W", DS_F64, 0, NULL, &res.W);
  for (int i = 0; i < DS_DSPARK_PAIR_COUNT && s == DS_OK; i++)
    if (res.pair_present[i]) {
      snprintf(name, sizeof name, "pair.%s", ds_dspark_pair_name(i));
      s = add_f64(wr, name, 1, 2, res.pair[i]);
    }
  if (s == DS_OK && a.cfg.has_teacher) s = add_f64(wr, "per_position.accept", 1, g, pos);
  if (s == DS_OK && a.cfg.has_teacher) s = add_f64(wr, "per_position.count", 1, g, pos + g);
  const char *row_names[4] = {"row.ce", "row.l1", "row.accept", "row.bce"};
  for (int i = 0; i < 4 && s == DS_OK; i++) s = add_f64(wr, row_names[i], 1, R, rowv + (size_t)i * nR);
  if (s == DS_OK && grad) s = ds_st_writer_add(wr, "grad.draft_logits", DS_F32, td->ndim, td->shape, grad);
  if (s == DS_OK && grad && tc) s = ds_st_writer_add(wr, "grad.conf_logits", DS_F32, tc->ndim, tc->shape, gconf);
  if (s == DS_OK && (s = ds_st_writer_write(wr, a.out_path)) != DS_OK) ds_error_wrap(s, "--out %s", a.out_path);
  if (s != DS_OK) goto report;
  rc = 0;
  goto done;
report:
  rc = cli_report_error("loss");
done:
  ds_st_writer_free(wr);
  ds_st_close(st);
  free(own_draft), free(own_target), free(own_conf), free(gconf), free(ids), free(ids64), free(em), free(bk), free(sup);
  free(wts), free(rowv), free(pos), free(vocab_ids), free(vocab_index);
  ds_free_aligned(grad);
  return rc;
}

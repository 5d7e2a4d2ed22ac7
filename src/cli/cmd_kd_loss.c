/* dspark kd-loss: evaluates the distillation objective (spec/kd.md sections 2-3) on tensors from
 * a safetensors file and writes the per-token KD and LM values, the numerator, the token count,
 * the reporting pairs and the gradient w.r.t. the student logits, so that a user can check the
 * engine against their own implementation. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/input_tensors.h"
#include "dspark/backend.h"
#include "dspark/kd_loss.h"
#include "dspark/safetensors.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark kd-loss IN.safetensors --out OUT.safetensors [options]\n"
          "Evaluates the KD loss (kd.md: sparse ghost-token KL or dense KL, mixed with the LM cross-entropy)\n"
          "and its gradient w.r.t. the student logits.\n"
          "\n"
          "Input tensors (R rows = token positions, V vocabulary, K entries per row):\n"
          "  student_logits  F32 [R, V]              student logits\n"
          "  topk_ids        I32 or I64 [R, K]       the teacher's top-K ids, by descending log-prob; -1 = dropped\n"
          "                                          (the kept entries a prefix, at least the first one)\n"
          "  topk_logprobs   F32, F16 or BF16 [R, K] their FULL-vocabulary log-probs (-inf at dropped entries),\n"
          "                                          as `dspark capture --topk` writes them\n"
          "  teacher_logits  F32 [R, V]              instead of topk_*: the dense KL against these logits\n"
          "  loss_mask       U8 or BOOL [R]          nonzero = supervised (optional: every row)\n"
          "  labels          I32 or I64 [R]          next-token ids (needed when --kd-loss-alpha < 1)\n"
          "  The teacher (topk_* or teacher_logits) is needed when --kd-loss-alpha > 0. Checked first, each\n"
          "  refusal naming the tensor and the index: dtypes and shapes; at supervised rows ids in [0, V) or\n"
          "  -1, kept ids distinct, kept log-probs finite (and sorted when --top-p < 1) and summing to at most\n"
          "  1.1, labels in [0, V), logits free of NaN and +inf, a finite student logit at the label. The\n"
          "  other rows may hold anything. A tensor of another name is ignored with a warning.\n"
          "Output tensors (all F32):\n"
          "  kd_per_token [R], lm_per_token [R]   per-row KD and LM loss (0 at unsupervised rows and for a\n"
          "                                       term that is not computed: KD at alpha 0, LM at alpha 1)\n"
          "  numerator []                         sum over supervised rows of (1 - alpha) lm + alpha kd\n"
          "  num_tokens []                        supervised rows (divide the numerator by the global count)\n"
          "  pair.loss, pair.kd, pair.lm [2]      [sum, tokens] (pair.kd absent at alpha 0, pair.lm at alpha 1)\n"
          "  grad.student_logits [R, V]           d numerator / d student_logits (the UNNORMALIZED numerator)\n"
          "\n"
          "Options:\n"
          "  --out FILE          output safetensors (required)\n"
          "  --temperature T     student (and dense teacher) logits / T (default 1; topk_logprobs are used as\n"
          "                      given, at the capture's temperature; the LM term is always at T = 1)\n"
          "  --top-p P           training-time top-p on the kept entries, keeping entry i iff the mass\n"
          "                      before it is < P or i < --min-k (default 1: keep all; needs topk_*)\n"
          "  --min-k M           the top-p floor (default 1)\n"
          "  --reverse           KL(student || teacher) instead of KL(teacher || student), ghost included\n"
          "  --no-ghost          ablation: both sides renormalized over the kept entries, no ghost bucket\n"
          "  --kd-loss-alpha A   total = (1 - A) lm + A kd, A in [0, 1] (default 1: KD only, LM not computed;\n"
          "                      0: LM only, the teacher not read)\n"
          "  --chunk-rows N      rows per chunk (default 128); results do not depend on it\n"
          "  --threads N         threads (OpenMP over rows)\n"
          "--skip-lm-loss and --kd-loss-scale were removed: " DS_KD_REMOVED_OPTION_HINT ".\n"
          "Prints the pairs to stdout and, to stderr, a timing line for the loss alone (inputs paged in and\n"
          "the gradient buffer touched before the clock starts). Exit status: 0 ok, 1 error, 2 usage.\n");
}

typedef struct {
  const char *in_path, *out_path;
  int64_t threads;
  ds_kd_loss_config cfg;
} kd_args;

static int parse_args(int argc, char **argv, kd_args *a) {
  memset(a, 0, sizeof *a);
  a->cfg = ds_kd_loss_config_default();
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
    } else if (!strcmp(o, "--temperature")) {
      VALUE();
      if (!cli_float(o, v, -1e30, 1e30, &a->cfg.temperature)) return 2;
    } else if (!strcmp(o, "--top-p")) {
      VALUE();
      if (!cli_float(o, v, -1e30, 1e30, &a->cfg.top_p)) return 2;
    } else if (!strcmp(o, "--min-k")) {
      VALUE();
      if (!cli_int(o, v, INT64_MIN, INT64_MAX, &a->cfg.min_k)) return 2;
    } else if (!strcmp(o, "--kd-loss-alpha")) {
      VALUE();
      if (!cli_float(o, v, -1e30, 1e30, &a->cfg.kd_loss_alpha)) return 2;
    } else if (!strcmp(o, "--chunk-rows")) {
      VALUE();
      if (!cli_int(o, v, INT64_MIN, INT64_MAX, &a->cfg.chunk_rows)) return 2;
    } else if (!strcmp(o, "--threads")) {
      VALUE();
      if (!cli_int(o, v, 1, 1024, &a->threads)) return 2;
    } else if (!strcmp(o, "--reverse")) {
      a->cfg.reverse = 1;
    } else if (!strcmp(o, "--no-ghost")) {
      a->cfg.no_ghost = 1;
    } else if (ds_kd_check_removed_option(o) != DS_OK) {
      fprintf(stderr, "dspark kd-loss: %s\n", ds_last_error());
      return 2;
    } else if (o[0] == '-' || a->in_path) {
      fprintf(stderr, "dspark kd-loss: unexpected argument '%s'\n", o);
      usage(stderr);
      return 2;
    } else {
      a->in_path = o;
    }
#undef VALUE
  }
  if (!a->in_path || !a->out_path) {
    usage(stderr);
    return 2;
  }
  const ds_input_path inputs[] = {{"IN", a->in_path}};
  int refused = cli_output_refused("kd-loss", "--out", a->out_path, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  a->cfg.top_k = 1; /* the ranges alone here; the mode comes from the input's tensors */
  if (ds_kd_loss_config_check(&a->cfg, 0) != DS_OK) {
    fprintf(stderr, "dspark kd-loss: %s\n", ds_last_error());
    return 2;
  }
  return -1; /* go on */
}

/* Integer tensor v (I32 / I64) -> dst as int32. Values at unsupervised rows (mask [R], `per`
 * values per row) are never read and become -1; at supervised rows a value outside int32 is
 * refused here (the library checks the vocabulary range and would see a truncated value). */
static ds_status ints_to_i32(const ds_tensor_view *v, const uint8_t *mask, int64_t per, int32_t *dst,
                             const char *what) {
  const unsigned char *p = v->data;
  for (int64_t i = 0; i < v->numel; i++) {
    int64_t x;
    if (v->dtype == DS_I64) {
      memcpy(&x, p + 8 * i, 8);
    } else {
      int32_t y;
      memcpy(&y, p + 4 * i, 4);
      x = y;
    }
    if (!mask[i / per]) {
      dst[i] = -1;
      continue;
    }
    if (x < INT32_MIN || x > INT32_MAX) {
      char at[160];
      cli_in_index(v, i, at, sizeof at);
      return DS_FAIL(DS_ERR_RANGE, "%s: tensor '%s' holds %lld at %s (row %lld is supervised): outside %s", v->file,
                     v->name, (long long)x, at, (long long)(i / per), what);
    }
    dst[i] = (int32_t)x;
  }
  return DS_OK;
}

static ds_status add_f32(ds_st_writer *w, const char *name, int ndim, const int64_t *shape, const float *data) {
  return ds_st_writer_add(w, name, DS_F32, ndim, shape, data);
}

static ds_status write_metadata(ds_st_writer *w, const kd_args *a, int dense) {
  char buf[64];
  const char *keys[] = {"kd_loss_alpha", "temperature", "top_p"};
  const double vals[] = {a->cfg.kd_loss_alpha, a->cfg.temperature, a->cfg.top_p};
  for (int i = 0; i < 3; i++) {
    snprintf(buf, sizeof buf, "%.17g", vals[i]);
    DS_TRY(ds_st_writer_set_metadata(w, keys[i], buf));
  }
  snprintf(buf, sizeof buf, "%lld", (long long)a->cfg.min_k);
  DS_TRY(ds_st_writer_set_metadata(w, "min_k", buf));
  snprintf(buf, sizeof buf, "%lld", (long long)a->cfg.chunk_rows);
  DS_TRY(ds_st_writer_set_metadata(w, "chunk_rows", buf));
  DS_TRY(ds_st_writer_set_metadata(w, "reverse", a->cfg.reverse ? "1" : "0"));
  if (a->cfg.no_ghost) DS_TRY(ds_st_writer_set_metadata(w, "no_ghost", "1"));
  return ds_st_writer_set_metadata(w, "teacher", dense ? "dense" : "topk");
}

int cmd_kd_loss(int argc, char **argv) {
  kd_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0) return rc;
  rc = 1;
  ds_set_num_threads((int)a.threads);

  ds_safetensors *st = NULL;
  ds_st_writer *wr = NULL;
  float *own_s = NULL, *own_t = NULL, *lq = NULL, *grad = NULL, *outf = NULL;
  int32_t *ids = NULL, *labels = NULL;
  uint8_t *mask = NULL;
  double *kd = NULL, *lm = NULL;
  if (ds_st_open(a.in_path, &st) != DS_OK) goto report;

  static const char *const names[] = {"student_logits", "topk_ids", "topk_logprobs", "teacher_logits", "loss_mask",
                                      "labels"};
  const ds_tensor_view *ts, *ti, *tq, *tt, *tm, *tl;
  if (cli_in_get(st, "student_logits", 1, CLI_DT(DS_F32), &ts) || cli_in_get(st, "topk_ids", 0, CLI_DT_INTS, &ti) ||
      cli_in_get(st, "topk_logprobs", 0, CLI_DT_FLOATS, &tq) ||
      cli_in_get(st, "teacher_logits", 0, CLI_DT(DS_F32), &tt) || cli_in_get(st, "loss_mask", 0, CLI_DT_MASKS, &tm) ||
      cli_in_get(st, "labels", 0, CLI_DT_INTS, &tl))
    goto report;
  cli_in_warn_unknown(st, names, (int)(sizeof names / sizeof names[0]), "kd-loss");
  const int want_kd = a.cfg.kd_loss_alpha > 0.0, want_lm = a.cfg.kd_loss_alpha < 1.0;

  /* shapes: R and V from student_logits, K from topk_ids */
  if (ts->ndim != 2 || ts->shape[1] < 1) {
    if (ts->ndim == 2) DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'student_logits' has an empty vocabulary axis", a.in_path);
    else DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'student_logits' has %d dimensions, expected 2: [R, V]", a.in_path, ts->ndim);
    goto report;
  }
  const int64_t R = ts->shape[0], V = ts->shape[1];
  if ((ti != NULL) != (tq != NULL)) {
    DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' is missing (tensor '%s' is given: the sparse teacher needs both)",
            a.in_path, ti ? "topk_logprobs" : "topk_ids", ti ? "topk_ids" : "topk_logprobs");
    goto report;
  }
  if (ti && tt) {
    DS_FAIL(DS_ERR_FORMAT, "%s: both teacher_logits (dense KL) and topk_ids / topk_logprobs (sparse KL) are given: "
            "give one teacher", a.in_path);
    goto report;
  }
  if (want_kd && !ti && !tt) {
    DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor 'topk_ids' is missing: with --kd-loss-alpha %g > 0 the KD term needs "
            "topk_ids + topk_logprobs, or teacher_logits", a.in_path, a.cfg.kd_loss_alpha);
    goto report;
  }
  if (want_lm && !tl) {
    DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor 'labels' is missing: with --kd-loss-alpha %g < 1 the LM term needs it",
            a.in_path, a.cfg.kd_loss_alpha);
    goto report;
  }
  int64_t K = 0;
  if (ti) {
    if (ti->ndim != 2 || ti->shape[0] != R || ti->shape[1] < 1) {
      int64_t want[2] = {R, ti->ndim == 2 && ti->shape[1] >= 1 ? ti->shape[1] : 1};
      cli_in_shape(ti, 2, want, "[R, K] with K >= 1");
      if (ti->ndim == 2 && ti->shape[0] == R)
        DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'topk_ids' has no entries (K = 0)", a.in_path);
      goto report;
    }
    K = ti->shape[1];
    if (K > V) {
      DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'topk_ids' has %lld entries per row, more than the vocabulary of "
              "student_logits (%lld)", a.in_path, (long long)K, (long long)V);
      goto report;
    }
    int64_t rk[2] = {R, K};
    if (cli_in_shape(tq, 2, rk, "[R, K] (the shape of topk_ids)")) goto report;
  }
  int64_t rv[2] = {R, V}, r1[1] = {R};
  if ((tt && cli_in_shape(tt, 2, rv, "[R, V] (the shape of student_logits)")) ||
      (tm && cli_in_shape(tm, 1, r1, "[R]")) || (tl && cli_in_shape(tl, 1, r1, "[R]")))
    goto report;
  a.cfg.top_k = K; /* 0: dense */
  if (!ti && a.cfg.top_p < 1.0) { /* an option the input's mode does not use */
    fprintf(stderr, "dspark kd-loss: --top-p %g needs a top-K teacher (topk_ids + topk_logprobs), but %s gives "
            "teacher_logits (the dense KL)\n", a.cfg.top_p, a.in_path);
    rc = 2;
    goto done;
  }
  if (ds_kd_loss_config_check(&a.cfg, V) != DS_OK) goto report;

  /* inputs in memory: the masks, ids and labels converted (values at unsupervised rows are never
   * read), log-probs to fp32, the logits mapped */
  mask = cli_alloc(R ? R : 1, 1, "loss_mask");
  if (!mask) goto report;
  if (tm) {
    if (cli_in_mask(tm, mask) != DS_OK) goto report;
  } else {
    memset(mask, 1, (size_t)(R ? R : 1));
  }
  if (want_kd && ti) {
    ids = cli_alloc(R * K, sizeof *ids, "topk_ids");
    lq = cli_alloc(R * K, sizeof *lq, "topk_logprobs");
    if (!ids || !lq || ints_to_i32(ti, mask, K, ids, "[0, V) and not the sentinel -1") != DS_OK ||
        cli_in_floats(tq, lq) != DS_OK)
      goto report;
  }
  if (want_lm) {
    labels = cli_alloc(R ? R : 1, sizeof *labels, "labels");
    if (!labels || ints_to_i32(tl, mask, 1, labels, "the vocabulary [0, V)") != DS_OK) goto report;
  }
  const float *s = cli_in_f32(ts, &own_s), *t = want_kd && tt ? cli_in_f32(tt, &own_t) : NULL;
  kd = cli_alloc(R ? R : 1, sizeof *kd, "kd_per_token");
  lm = cli_alloc(R ? R : 1, sizeof *lm, "lm_per_token");
  outf = cli_alloc(2 * (R ? R : 1), sizeof *outf, "per-token outputs");
  grad = ds_malloc_aligned((size_t)(R * V) * sizeof(float) + 1, "grad.student_logits");
  if (!s || (want_kd && tt && !t) || !kd || !lm || !outf || !grad) goto report;

  ds_kd_rows_in in = {s, ids, lq, K, t, labels, mask};
  ds_kd_loss_result res;
  cli_page_in(s, (size_t)(R * V) * sizeof(float));
  if (t) cli_page_in(t, (size_t)(R * V) * sizeof(float));
  memset(grad, 0, (size_t)(R * V) * sizeof(float)); /* first touch, as a trainer's reused buffer */
  double t0 = ds_time_sec();
  ds_status sst = ds_kd_loss(&a.cfg, R, V, &in, 1.0, &res, kd, lm, grad);
  double dt = ds_time_sec() - t0;
  if (sst != DS_OK) {
    ds_error_wrap(sst, "%s", a.in_path);
    goto report;
  }
  fprintf(stderr, "kd-loss: %lld rows x V %lld, %s, %d threads, forward+backward: %.4f s\n", (long long)R,
          (long long)V, !want_kd ? "LM only" : ti ? "top-K" : "dense", ds_get_num_threads(), dt);
  printf("numerator %.9g  num_tokens %lld\n", res.numerator, (long long)res.num_tokens);
  for (int i = 0; i < DS_KD_PAIR_COUNT; i++)
    if (res.pair_present[i])
      printf("%-6s %.9g  (%.9g / %.9g)\n", ds_kd_pair_name(i),
             res.pair[i][1] != 0 ? res.pair[i][0] / res.pair[i][1] : 0.0, res.pair[i][0], res.pair[i][1]);

  wr = ds_st_writer_new();
  if (!wr) goto report;
  float num = (float)res.numerator, tokens = (float)res.num_tokens, pairs[DS_KD_PAIR_COUNT][2];
  for (int64_t r = 0; r < R; r++) outf[r] = (float)kd[r], outf[R + r] = (float)lm[r];
  sst = write_metadata(wr, &a, tt != NULL);
  if (sst == DS_OK) sst = add_f32(wr, "kd_per_token", 1, r1, outf);
  if (sst == DS_OK) sst = add_f32(wr, "lm_per_token", 1, r1, outf + R);
  if (sst == DS_OK) sst = add_f32(wr, "numerator", 0, NULL, &num);
  if (sst == DS_OK) sst = add_f32(wr, "num_tokens", 0, NULL, &tokens);
  for (int i = 0; i < DS_KD_PAIR_COUNT && sst == DS_OK; i++)
    if (res.pair_present[i]) {
      char name[32];
      int64_t two = 2;
      snprintf(name, sizeof name, "pair.%s", ds_kd_pair_name(i));
      pairs[i][0] = (float)res.pair[i][0], pairs[i][1] = (float)res.pair[i][1];
      sst = add_f32(wr, name, 1, &two, pairs[i]); /* the writer keeps the pointer until it writes */
    }
  if (sst == DS_OK) sst = add_f32(wr, "grad.student_logits", 2, rv, grad);
  if (sst == DS_OK && (sst = ds_st_writer_write(wr, a.out_path)) != DS_OK) ds_error_wrap(sst, "--out %s", a.out_path);
  if (sst != DS_OK) goto report;
  rc = 0;
  goto done;
report:
  rc = cli_report_error("kd-loss");
done:
  ds_st_writer_free(wr);
  ds_st_close(st);
  free(own_s), free(own_t), free(lq), free(ids), free(labels), free(mask), free(kd), free(lm), free(outf);
  ds_free_aligned(grad);
  return rc;
}

/* dspark loss: evaluates the DSpark training objective (spec/dspark.md section 4) on tensors
 * from a safetensors file and writes the numerator, the token count, W, the reporting pairs,
 * the per-position acceptance, the per-row values and the gradients, so that a user can
 * check the engine against their own implementation. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
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
          "Output tensors:\n"
          "  numerator F64 [], num_tokens I64 [], W F64 []\n"
          "  pair.loss, pair.ce, pair.l1, pair.confidence F64 [2]   [numerator, W]\n"
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
          "  --no-teacher        ignore target_logits (CE only)\n"
          "  --no-conf           ignore conf_logits (confidence term off)\n"
          "  --no-grad           compute values only; write no gradients\n"
          "  --threads N         threads (OpenMP over rows)\n"
          "Prints the pairs to stdout and, to stderr, a timing line for the loss alone (inputs paged in\n"
          "and the gradient buffer touched before the clock starts). Exit status: 0 ok, 1 error, 2 usage.\n");
}

/* A tensor of the input file, checked: name, one of two dtypes, shape [R] / [B, g] style. */
static ds_status find_tensor(const ds_safetensors *st, const char *name, int required, const ds_tensor_view **out) {
  *out = ds_st_find(st, name);
  if (!*out && required)
    return DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' is missing", ds_st_path(st), name);
  return DS_OK;
}

static ds_status check_dtype(const ds_tensor_view *t, ds_dtype a, ds_dtype b) {
  if (t->dtype == a || t->dtype == b) return DS_OK;
  if (a == b)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected %s", t->file, t->name,
                   ds_dtype_name(t->dtype), ds_dtype_name(a));
  return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected %s or %s", t->file, t->name,
                 ds_dtype_name(t->dtype), ds_dtype_name(a), ds_dtype_name(b));
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

/* fp32 data of a view, aligned: the mapping itself when it is aligned, else a copy in *own. */
static const float *f32_data(const ds_tensor_view *t, float **own) {
  *own = NULL;
  if ((uintptr_t)t->data % _Alignof(float) == 0) return t->data;
  *own = ds_malloc(t->nbytes ? t->nbytes : 1, t->name);
  if (*own) memcpy(*own, t->data, t->nbytes);
  return *own;
}

static uint8_t *bytes_of_mask(const ds_tensor_view *t) {
  uint8_t *m = ds_malloc(t->numel ? (size_t)t->numel : 1, t->name);
  if (m) memcpy(m, t->data, (size_t)t->numel); /* U8 and BOOL are one byte each */
  return m;
}

/* Reads one byte per page so that the mapped input is resident before the clock starts: the
 * timing line then covers the loss alone, not the page faults of reading the file. */
static void page_in(const void *p, size_t nbytes) {
  const volatile unsigned char *b = p;
  unsigned char acc = 0;
  for (size_t i = 0; i < nbytes; i += 4096) acc ^= b[i];
  if (nbytes) acc ^= b[nbytes - 1];
  (void)acc;
}

typedef struct {
  const char *in_path, *out_path;
  int64_t block_size, threads;
  double grad_scale;
  int no_teacher, no_conf, no_grad;
  ds_dspark_loss_config cfg;
} loss_args;

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
  return -1; /* go on */
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
  int32_t *ids = NULL;
  uint8_t *em = NULL, *bk = NULL, *sup = NULL;
  double *wts = NULL, *rowv = NULL, *pos = NULL;
  if (ds_st_open(a.in_path, &st) != DS_OK) goto report;

  const ds_tensor_view *td, *tt, *ti, *te, *tb, *tc;
  if (find_tensor(st, "draft_logits", 1, &td) || find_tensor(st, "target_logits", 0, &tt) ||
      find_tensor(st, "target_ids", 1, &ti) || find_tensor(st, "eval_mask", 1, &te) ||
      find_tensor(st, "block_keep_mask", 1, &tb) || find_tensor(st, "conf_logits", 0, &tc))
    goto report;
  if (a.no_teacher) tt = NULL;
  if (a.no_conf) tc = NULL;
  if (check_dtype(td, DS_F32, DS_F32) || (tt && check_dtype(tt, DS_F32, DS_F32)) || check_dtype(ti, DS_I32, DS_I64) ||
      check_dtype(te, DS_U8, DS_BOOL) || check_dtype(tb, DS_U8, DS_BOOL) || (tc && check_dtype(tc, DS_F32, DS_F32)))
    goto report;

  /* shapes: B from block_keep_mask, g and V from draft_logits */
  char have[128];
  if (tb->ndim != 1) {
    shape_str(have, sizeof have, tb);
    DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'block_keep_mask' has shape %s, expected [B]", a.in_path, have);
    goto report;
  }
  int64_t B = tb->shape[0], g, V, R;
  if (td->ndim == 3) {
    g = td->shape[1], V = td->shape[2];
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
    if (g < 1 || R != B * g) {
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
  if (tt) {
    int same = tt->ndim == td->ndim;
    for (int d = 0; same && d < td->ndim; d++) same = tt->shape[d] == td->shape[d];
    if (!same) {
      char want[128];
      shape_str(have, sizeof have, tt);
      shape_str(want, sizeof want, td);
      DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'target_logits' has shape %s, expected %s (the shape of draft_logits)",
              a.in_path, have, want);
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
  em = bytes_of_mask(te), bk = bytes_of_mask(tb);
  sup = ds_malloc(nR, "supervision mask");
  wts = ds_malloc(nR * sizeof *wts, "weights");
  rowv = ds_malloc(4 * nR * sizeof *rowv, "row values");
  pos = ds_malloc(2 * (size_t)g * sizeof *pos, "per-position acceptance");
  const float *draft = f32_data(td, &own_draft), *target = tt ? f32_data(tt, &own_target) : NULL;
  const float *conf = tc ? f32_data(tc, &own_conf) : NULL;
  if (!a.no_grad) {
    grad = ds_malloc_aligned((size_t)(R * V) * sizeof(float) + 1, "grad.draft_logits");
    gconf = ds_malloc(nR * sizeof *gconf, "grad.conf_logits");
  }
  if (!ids || !em || !bk || !sup || !wts || !rowv || !pos || !draft || (tt && !target) || (tc && !conf) ||
      (!a.no_grad && (!grad || !gconf)))
    goto report;
  if (ds_dspark_loss_weights(&a.cfg, B, g, em, bk, sup, wts) != DS_OK) goto report;
  for (int64_t r = 0; r < R; r++) {
    if (ti->dtype == DS_I32) {
      memcpy(&ids[r], (const char *)ti->data + r * 4, 4);
      continue;
    }
    int64_t v;
    memcpy(&v, (const char *)ti->data + r * 8, 8);
    if (v >= INT32_MIN && v <= INT32_MAX) ids[r] = (int32_t)v;
    else if (!sup[r]) ids[r] = -1; /* a sentinel at an unsupervised slot: never read */
    else {
      DS_FAIL(DS_ERR_RANGE, "%s: target id %lld at block %lld slot %lld (row %lld) is supervised but outside "
              "[0, %lld)", a.in_path, (long long)v, (long long)(r / g), (long long)(r % g), (long long)r, (long long)V);
      goto report;
    }
  }

  ds_dspark_loss_inputs in = {draft, target, ids, em, bk, conf};
  ds_dspark_row_stats rows = {rowv, rowv + nR, rowv + 2 * nR, rowv + 3 * nR};
  ds_dspark_loss_result res;
  page_in(draft, (size_t)(R * V) * sizeof(float));
  if (target) page_in(target, (size_t)(R * V) * sizeof(float));
  if (grad) memset(grad, 0, (size_t)(R * V) * sizeof(float)); /* first touch, as a trainer's reused buffer */
  double t0 = ds_time_sec();
  ds_status s = ds_dspark_loss(&a.cfg, B, g, V, &in, a.grad_scale, &res, pos, pos + g, grad, gconf, &rows);
  double dt = ds_time_sec() - t0;
  if (s != DS_OK) {
    ds_error_wrap(s, "%s", a.in_path);
    goto report;
  }
  fprintf(stderr, "loss: %lld rows (%lld blocks x %lld) x V %lld, %d threads, %s: %.4f s\n", (long long)R,
          (long long)B, (long long)g, (long long)V, ds_get_num_threads(),
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
  if (s == DS_OK) s = ds_st_writer_write(wr, a.out_path);
  if (s != DS_OK) goto report;
  rc = 0;
  goto done;
report:
  rc = cli_report_error("loss");
done:
  ds_st_writer_free(wr);
  ds_st_close(st);
  free(own_draft), free(own_target), free(own_conf), free(gconf), free(ids), free(em), free(bk), free(sup);
  free(wts), free(rowv), free(pos);
  ds_free_aligned(grad);
  return rc;
}

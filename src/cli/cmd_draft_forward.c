/* dspark draft-forward: runs a draft over given context features and anchors, and writes the
 * block logits and confidence logits; with --loss also the DSpark loss, its reporting pairs
 * and the gradient of every trainable tensor, so users can check the engine against their
 * own implementation (and our conformance test checks it against PyTorch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/draft_loss.h"
#include "dspark/anchors.h"
#include "dspark/checkpoint.h"
#include "dspark/dtype.h"
#include "dspark/fileio.h"

static void usage(FILE *f) {
  fprintf(f,
    "usage: dspark draft-forward DRAFT --inputs IN.safetensors --out OUT.safetensors [--loss] [options]\n"
    "DRAFT is an exported HF draft directory or a training run directory (its checkpoint).\n"
    "IN tensors:  ctx [T, m*d] F32 (captured target layers, in target_layer_ids order)\n"
    "             input_ids [T] I32/I64;  anchors [B] I32/I64 (anchor positions)\n"
    "             block_keep [B] U8/BOOL (optional, default all kept)\n"
    "             loss_mask [T] U8/BOOL (optional, default all 1; gives the eval mask, spec 5)\n"
    "             eval_mask [B*g] U8/BOOL (optional; overrides the one from loss_mask)\n"
    "             last [T, d] F32 (optional: the target's final-normed hidden states = teacher)\n"
    "OUT tensors: logits [B*g, V] (Markov bias of the teacher-forced previous token included),\n"
    "             conf_logits [B*g] (when the draft has a confidence head); with --loss also\n"
    "             numerator, num_tokens, W [1] F64, pair.<loss|ce|l1|confidence|accept_rate|tau> [2] F64,\n"
    "             accept_per_position [g, 2] F64 and grad.<tensor name> for every trainable tensor\n"
    "             (gradient of numerator * grad_scale).\n"
    "options: --loss  --grad-scale X (1)  --alpha-ce A --alpha-l1 B --alpha-conf C  --decay-gamma X\n"
    "         --decay-paper  --chunk-rows N (128)  --threads N\n");
}

static ds_status load_draft(const char *dir, ds_draft **d) {
  char *ckpt = ds_path_join(dir, "checkpoint.safetensors");
  if (!ckpt) return DS_ERR_NOMEM;
  int there = 0;
  /* A checkpoint name that is there but unreachable (a symlink loop) is an error, not "no
   * checkpoint, so read an export". */
  ds_status st = ds_path_probe(ckpt, &there);
  if (st == DS_OK && there) {
    ds_adamw opt;
    ds_checkpoint_info info;
    st = ds_checkpoint_load(ckpt, ds_backend_cpu(), d, &opt, &info);
    if (st == DS_OK) {
      ds_adamw_free(&opt);
      ds_checkpoint_info_free(&info);
    }
  } else if (st == DS_OK) {
    st = ds_draft_load_hf(dir, ds_backend_cpu(), d);
  }
  free(ckpt);
  return st;
}

/* Reads an integer or boolean tensor of n elements into int64. */
static ds_status read_ints(const ds_safetensors *st, const char *name, int64_t n, int64_t *dst, int required) {
  const ds_tensor_view *v = ds_st_find(st, name);
  if (!v) return required ? DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' is missing", ds_st_path(st), name) : DS_ERR_NOT_FOUND;
  if (n >= 0 && v->numel != n)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has %lld elements, expected %lld", ds_st_path(st), name,
                   (long long)v->numel, (long long)n);
  const unsigned char *p = v->data;
  for (int64_t i = 0; i < v->numel; i++) {
    switch (v->dtype) {
      case DS_I64: { int64_t x; memcpy(&x, p + 8 * i, 8); dst[i] = x; break; }
      case DS_I32: { int32_t x; memcpy(&x, p + 4 * i, 4); dst[i] = x; break; }
      case DS_U8: case DS_BOOL: dst[i] = p[i]; break;
      default:
        return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s; expected I64, I32, U8 or BOOL", ds_st_path(st),
                       name, ds_dtype_name(v->dtype));
    }
  }
  return DS_OK;
}

static ds_status read_f32(const ds_safetensors *st, const char *name, int64_t rows, int64_t cols, float **out) {
  const ds_tensor_view *v = ds_st_find(st, name);
  if (!v) return DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' is missing", ds_st_path(st), name);
  if (v->ndim != 2 || v->shape[0] != rows || (cols >= 0 && v->shape[1] != cols))
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' must be [%lld, %lld]", ds_st_path(st), name, (long long)rows,
                   (long long)cols);
  *out = ds_malloc((size_t)v->numel * sizeof(float), name);
  if (!*out) return DS_ERR_NOMEM;
  return ds_convert_to_f32(*out, v->data, v->dtype, (size_t)v->numel);
}

int cmd_draft_forward(int argc, char **argv) {
  const char *dir = NULL, *in_path = NULL, *out_path = NULL;
  int want_loss = 0;
  double grad_scale = 1.0, x;
  int64_t n;
  ds_dspark_loss_config lc = ds_dspark_loss_config_default();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    else if (!strcmp(a, "--inputs")) { if (!(in_path = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--out")) { if (!(out_path = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--loss")) want_loss = 1;
    else if (!strcmp(a, "--decay-paper")) lc.decay = DS_DSPARK_DECAY_PAPER;
    else if (!strcmp(a, "--grad-scale") || !strcmp(a, "--alpha-ce") || !strcmp(a, "--alpha-l1") ||
             !strcmp(a, "--alpha-conf") || !strcmp(a, "--decay-gamma")) {
      if (!(v = cli_value(argc, argv, &i)) || !cli_float(a, v, -1e9, 1e9, &x)) return 2;
      if (!strcmp(a, "--grad-scale")) grad_scale = x;
      else if (!strcmp(a, "--alpha-ce")) lc.alpha_ce = x;
      else if (!strcmp(a, "--alpha-l1")) lc.alpha_l1 = x;
      else if (!strcmp(a, "--alpha-conf")) lc.alpha_conf = x;
      else lc.decay_gamma = x;
    } else if (!strcmp(a, "--chunk-rows") || !strcmp(a, "--threads")) {
      if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 1, 1 << 20, &n)) return 2;
      if (!strcmp(a, "--chunk-rows")) lc.chunk_rows = n;
      else ds_set_num_threads((int)n);
    } else if (a[0] == '-' || dir) { fprintf(stderr, "dspark draft-forward: unexpected argument '%s'\n", a); return 2; }
    else dir = a;
  }
  if (!dir || !in_path || !out_path) { usage(stderr); return 2; }

  int rc = 1;
  ds_draft *d = NULL;
  ds_safetensors *in = NULL;
  ds_st_writer *w = ds_st_writer_new();
  float *ctx = NULL, *last = NULL, *logits = NULL, *conf = NULL;
  int64_t *ids64 = NULL, *anchors = NULL, *tmp = NULL;
  int32_t *ids = NULL;
  uint8_t *keep = NULL, *eval = NULL, *mask = NULL;
  if (!w) goto done;
  if (load_draft(dir, &d) != DS_OK || ds_st_open(in_path, &in) != DS_OK) goto report;
  const ds_draft_config *c = ds_draft_get_config(d);
  int64_t dm = c->hidden_size, V = c->vocab_size, g = c->block_size;
  const ds_tensor_view *idv = ds_st_find(in, "input_ids"), *anv = ds_st_find(in, "anchors");
  if (!idv || !anv) {
    DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensors 'input_ids' and 'anchors' are required", in_path);
    goto report;
  }
  int64_t T = idv->numel, B = anv->numel, R = B * g;
  ids64 = malloc((size_t)T * sizeof *ids64);
  ids = malloc((size_t)T * sizeof *ids);
  anchors = malloc((size_t)B * sizeof *anchors);
  tmp = malloc((size_t)(R > T ? R : T) * sizeof *tmp);
  keep = malloc((size_t)B);
  eval = malloc((size_t)R);
  mask = malloc((size_t)T);
  logits = ds_malloc_aligned((size_t)(R * V) * sizeof(float), "logits");
  conf = malloc((size_t)R * sizeof(float));
  if (!ids64 || !ids || !anchors || !tmp || !keep || !eval || !mask || !logits || !conf) goto done;
  if (read_ints(in, "input_ids", T, ids64, 1) != DS_OK || read_ints(in, "anchors", B, anchors, 1) != DS_OK) goto report;
  for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)ids64[t];
  ds_status st = read_ints(in, "block_keep", B, tmp, 0);
  if (st != DS_OK && st != DS_ERR_NOT_FOUND) goto report;
  for (int64_t b = 0; b < B; b++) keep[b] = st == DS_OK ? tmp[b] != 0 : 1;
  st = read_ints(in, "loss_mask", T, tmp, 0);
  if (st != DS_OK && st != DS_ERR_NOT_FOUND) goto report;
  for (int64_t t = 0; t < T; t++) mask[t] = st == DS_OK ? tmp[t] != 0 : 1;
  ds_anchor_eval_mask(mask, T, anchors, keep, B, g, eval);
  st = read_ints(in, "eval_mask", R, tmp, 0);
  if (st != DS_OK && st != DS_ERR_NOT_FOUND) goto report;
  if (st == DS_OK) for (int64_t r = 0; r < R; r++) eval[r] = tmp[r] != 0;
  if (read_f32(in, "ctx", T, (int64_t)c->n_target_layers * dm, &ctx) != DS_OK) goto report;
  if (ds_st_find(in, "last") && read_f32(in, "last", T, dm, &last) != DS_OK) goto report;

  ds_draft_seq seq = {T, ctx, last, ids, B, anchors, keep, eval};
  if (ds_draft_forward_blocks(d, &seq, logits, conf) != DS_OK) goto report;
  int64_t ls[2] = {R, V}, cs[1] = {R};
  if (ds_st_writer_add(w, "logits", DS_F32, 2, ls, logits) != DS_OK) goto report;
  if (c->enable_confidence_head && ds_st_writer_add(w, "conf_logits", DS_F32, 1, cs, conf) != DS_OK) goto report;

  ds_dspark_loss_result res;
  double pa[64] = {0}, pc[64] = {0}, scalars[3], pairs[DS_DSPARK_PAIR_COUNT][2], pos[64][2];
  char name[300];
  if (want_loss) {
    memset(&res, 0, sizeof res);
    ds_draft_zero_grads(d);
    if (ds_draft_loss_seq(d, &seq, &lc, grad_scale, 1, &res, pa, pc) != DS_OK) goto report;
    scalars[0] = res.numerator;
    scalars[1] = (double)res.num_tokens;
    scalars[2] = res.W;
    int64_t one = 1, two = 2, pshape[2] = {g, 2};
    const char *snames[3] = {"numerator", "num_tokens", "W"};
    for (int i = 0; i < 3; i++)
      if (ds_st_writer_add(w, snames[i], DS_F64, 1, &one, &scalars[i]) != DS_OK) goto report;
    for (int p = 0; p < DS_DSPARK_PAIR_COUNT; p++) {
      if (!res.pair_present[p]) continue;
      pairs[p][0] = res.pair[p][0];
      pairs[p][1] = res.pair[p][1];
      snprintf(name, sizeof name, "pair.%s", ds_dspark_pair_name(p));
      if (ds_st_writer_add(w, name, DS_F64, 1, &two, pairs[p]) != DS_OK) goto report;
    }
    for (int64_t k = 0; k < g; k++) pos[k][0] = pa[k], pos[k][1] = pc[k];
    if (ds_st_writer_add(w, "accept_per_position", DS_F64, 2, pshape, pos) != DS_OK) goto report;
    for (size_t i = 0; i < ds_draft_tensor_count(d); i++) {
      const ds_draft_tensor *t = ds_draft_tensor_at(d, i);
      if (!t->grad) continue;
      int64_t shape[2] = {t->shape[0], t->shape[1]};
      snprintf(name, sizeof name, "grad.%s", t->name);
      if (ds_st_writer_add(w, name, DS_F32, t->ndim, shape, t->grad) != DS_OK) goto report;
    }
  }
  if (ds_st_writer_write(w, out_path) != DS_OK) goto report;
  rc = 0;
  goto done;
report:
  rc = cli_report_error("draft-forward");
done:
  ds_st_writer_free(w);
  ds_st_close(in);
  ds_draft_free(d);
  free(ctx);
  free(last);
  ds_free_aligned(logits);
  free(conf);
  free(ids64);
  free(ids);
  free(anchors);
  free(tmp);
  free(keep);
  free(eval);
  free(mask);
  return rc;
}

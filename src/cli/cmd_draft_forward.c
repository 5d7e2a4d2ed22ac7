/* dspark draft-forward: runs a draft over given context features and anchors, and writes the
 * block logits and confidence logits; with --loss also the DSpark loss, its reporting pairs
 * and the gradient of every trainable tensor, so users can check the engine against their
 * own implementation (and our conformance test checks it against PyTorch). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/input_tensors.h"
#include "dspark/draft_loss.h"
#include "dspark/anchors.h"
#include "dspark/checkpoint.h"
#include "dspark/dtype.h"
#include "dspark/fileio.h"

static void usage(FILE *f) {
  fprintf(f,
    "usage: dspark draft-forward DRAFT --inputs IN.safetensors --out OUT.safetensors [--loss] [options]\n"
    "DRAFT is an exported HF draft directory or a training run directory (its checkpoint).\n"
    "IN tensors:  ctx [T, m*d] F32 (F16/BF16 converted; captured target layers, in target_layer_ids order)\n"
    "             input_ids [T] I32/I64, each in [0, V);  anchors [B] I32/I64 (anchor positions; a kept\n"
    "             block's anchor in [0, T-2], a dropped block's anchor is ignored)\n"
    "             block_keep [B] U8/BOOL (optional, default all kept)\n"
    "             loss_mask [T] U8/BOOL (optional, default all 1; gives the eval mask, spec 5)\n"
    "             eval_mask [B*g] or [B, g] U8/BOOL (optional; overrides the one from loss_mask; a\n"
    "             supervised slot's target position anchor + k + 1 must be < T)\n"
    "             last [T, d] F32 (optional: the target's final-normed hidden states = teacher)\n"
    "             teacher_head [V, d] F32 (a draft over a reduced vocabulary, with --loss and last: the\n"
    "             target's whole lm_head, which the teacher's distribution needs; finite)\n"
    "             Every tensor is checked for dtype, shape and range first; U8 masks: nonzero = 1, BOOL\n"
    "             bytes are 0 or 1. ctx must be finite, and with --loss so must every row of last that a\n"
    "             supervised slot reads (other rows may hold anything, NaN included). A refusal names the\n"
    "             tensor and the index (exit 1); a tensor of another name is ignored with a warning.\n"
    "OUT tensors: logits [B*g, N] (Markov bias of the teacher-forced previous token included; N = V,\n"
    "             or the draft_vocab_size of a reduced draft, whose column j is target id j + d2t[j]),\n"
    "             conf_logits [B*g] (when the draft has a confidence head); with --loss also\n"
    "             numerator, num_tokens, W [1] F64, pair.<loss|ce|l1|confidence|accept_rate|tau> [2] F64,\n"
    "             accept_per_position [g, 2] F64 and grad.<tensor name> for every trainable tensor\n"
    "             (gradient of numerator * grad_scale).\n"
    "options: --loss  --grad-scale X (1)  --alpha-ce A --alpha-l1 B --alpha-conf C  --decay-gamma X\n"
    "         --decay-paper  --chunk-rows N (128)  --threads N\n");
}

static const char *nonfinite_name(float x) { return isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf"; }

/* The inputs of one run, read and checked (tensor names as in the usage text). */
typedef struct {
  int64_t T, B, R;
  int32_t *ids;     /* [T] in [0, V) */
  int64_t *anchors; /* [B]: kept ones in [0, T-2]; dropped ones set to 0 */
  uint8_t *keep;    /* [B] */
  uint8_t *mask;    /* [T] */
  uint8_t *eval;    /* [B*g] */
  float *ctx;       /* [T, m*d] finite */
  float *last;      /* [T, d] or NULL */
  float *teacher;   /* [V, d] the target's lm_head (a reduced draft's teacher) or NULL */
} fwd_inputs;

static void inputs_free(fwd_inputs *in) {
  free(in->ids);
  free(in->anchors);
  free(in->keep);
  free(in->mask);
  free(in->eval);
  free(in->ctx);
  free(in->last);
  free(in->teacher);
}

/* A 1-D tensor that defines a size (T for input_ids, B for anchors). */
static ds_status defining_1d(const ds_tensor_view *v, const char *size_name, int64_t min, const char *why,
                             int64_t *n) {
  if (v->ndim != 1)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, expected one ([%s])", v->file, v->name, v->ndim,
                   size_name);
  *n = v->shape[0];
  if (*n < min)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has %lld elements; %s", v->file, v->name, (long long)*n, why);
  return DS_OK;
}

static ds_status read_inputs(const ds_safetensors *st, const ds_draft_config *c, int want_loss, fwd_inputs *in) {
  static const char *const names[] = {"ctx", "input_ids", "anchors", "block_keep", "loss_mask", "eval_mask", "last",
                                      "teacher_head"};
  const int64_t g = c->block_size, V = c->vocab_size, dm = c->hidden_size, md = (int64_t)c->n_target_layers * dm;
  const ds_tensor_view *idv, *anv, *kv, *lmv, *ev, *cv, *lv, *hv;
  DS_TRY(cli_in_get(st, "input_ids", 1, CLI_DT_INTS, &idv));
  DS_TRY(cli_in_get(st, "anchors", 1, CLI_DT_INTS, &anv));
  DS_TRY(cli_in_get(st, "ctx", 1, CLI_DT_FLOATS, &cv));
  DS_TRY(cli_in_get(st, "block_keep", 0, CLI_DT_MASKS, &kv));
  DS_TRY(cli_in_get(st, "loss_mask", 0, CLI_DT_MASKS, &lmv));
  DS_TRY(cli_in_get(st, "eval_mask", 0, CLI_DT_MASKS, &ev));
  DS_TRY(cli_in_get(st, "last", 0, CLI_DT_FLOATS, &lv));
  /* a reduced draft's teacher needs the target's whole lm_head, which the draft does not hold */
  int need_head = want_loss && lv && c->draft_vocab_size > 0;
  DS_TRY(cli_in_get(st, "teacher_head", need_head, CLI_DT(DS_F32), &hv));
  cli_in_warn_unknown(st, names, (int)(sizeof names / sizeof names[0]), "draft-forward");

  /* shapes: T from input_ids, B from anchors */
  int64_t T = 0, B = 0;
  DS_TRY(defining_1d(idv, "T", 2, "the draft needs a sequence of at least 2 tokens", &T));
  DS_TRY(defining_1d(anv, "B", 1, "at least one anchor is needed", &B));
  if (B > INT64_MAX / g || B * g > (INT64_MAX / 4) / V)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'anchors' has %lld elements: %lld blocks x %lld slots x %lld logits do "
                   "not fit in memory", anv->file, (long long)B, (long long)B, (long long)g, (long long)V);
  int64_t R = B * g;
  int64_t sT[1] = {T}, sB[1] = {B}, sR[1] = {R}, sctx[2] = {T, md}, slast[2] = {T, dm};
  DS_TRY(cli_in_shape(cv, 2, sctx, "[T, m*d]"));
  if (kv) DS_TRY(cli_in_shape(kv, 1, sB, "[B]"));
  if (lmv) DS_TRY(cli_in_shape(lmv, 1, sT, "[T]"));
  if (ev && !(ev->ndim == 2 && ev->shape[0] == B && ev->shape[1] == g)) DS_TRY(cli_in_shape(ev, 1, sR, "[B*g]"));
  if (lv) DS_TRY(cli_in_shape(lv, 2, slast, "[T, d]"));
  int64_t shead[2] = {V, dm};
  if (hv) DS_TRY(cli_in_shape(hv, 2, shead, "[V, d]"));
  in->T = T, in->B = B, in->R = R;

  /* values */
  in->ids = cli_alloc(T, sizeof *in->ids, "input_ids");
  in->anchors = cli_alloc(B, sizeof *in->anchors, "anchors");
  in->keep = cli_alloc(B, 1, "block_keep");
  in->mask = cli_alloc(T, 1, "loss_mask");
  in->eval = cli_alloc(R, 1, "eval_mask");
  int64_t *tmp = cli_alloc(T, sizeof *tmp, "input_ids");
  in->ctx = cli_alloc(T * md, sizeof(float), "ctx");
  if (!in->ids || !in->anchors || !in->keep || !in->mask || !in->eval || !tmp || !in->ctx) {
    free(tmp);
    return DS_ERR_NOMEM;
  }
  ds_status s = cli_in_ints(idv, 0, V - 1, "the draft's vocabulary", tmp);
  for (int64_t t = 0; s == DS_OK && t < T; t++) in->ids[t] = (int32_t)tmp[t];
  free(tmp);
  DS_TRY(s);
  DS_TRY(cli_in_ints(anv, INT64_MIN, INT64_MAX, "any", in->anchors));
  if (kv) DS_TRY(cli_in_mask(kv, in->keep));
  else memset(in->keep, 1, (size_t)B);
  for (int64_t b = 0; b < B; b++) {
    if (!in->keep[b]) {
      in->anchors[b] = 0; /* a dropped block's anchor is never read */
      continue;
    }
    if (in->anchors[b] < 0 || in->anchors[b] > T - 2)
      return DS_FAIL(DS_ERR_RANGE, "%s: tensor 'anchors' holds %lld at [%lld], outside [0, %lld]: a kept block's anchor "
                     "needs a next token in input_ids (T = %lld); mark unused blocks with block_keep 0",
                     anv->file, (long long)in->anchors[b], (long long)b, (long long)(T - 2), (long long)T);
  }
  if (lmv) DS_TRY(cli_in_mask(lmv, in->mask));
  else memset(in->mask, 1, (size_t)T);
  if (ev) {
    DS_TRY(cli_in_mask(ev, in->eval));
    for (int64_t r = 0; r < R; r++) {
      int64_t b = r / g, k = r % g;
      if (in->eval[r] && in->keep[b] && in->anchors[b] + k + 1 >= T)
        return DS_FAIL(DS_ERR_RANGE, "%s: tensor 'eval_mask' supervises block %lld slot %lld (row %lld), whose target "
                       "position %lld (anchor %lld + %lld + 1) is past the sequence (T = %lld)", ev->file,
                       (long long)b, (long long)k, (long long)r, (long long)(in->anchors[b] + k + 1),
                       (long long)in->anchors[b], (long long)k, (long long)T);
    }
  } else {
    ds_anchor_eval_mask(in->mask, T, in->anchors, in->keep, B, g, in->eval);
  }
  DS_TRY(cli_in_floats(cv, in->ctx));
  int64_t bad = cli_first_nonfinite(in->ctx, T * md, 0);
  if (bad >= 0) {
    char at[160];
    cli_in_index(cv, bad, at, sizeof at);
    return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor 'ctx' holds %s at %s (position %lld, captured layer %d of the draft's "
                   "target_layer_ids): the context features must be finite", cv->file, nonfinite_name(in->ctx[bad]),
                   at, (long long)(bad / md), c->target_layer_ids[(bad % md) / dm]);
  }
  if (hv) {
    in->teacher = cli_alloc(V * dm, sizeof(float), "teacher_head");
    if (!in->teacher) return DS_ERR_NOMEM;
    DS_TRY(cli_in_floats(hv, in->teacher));
    bad = cli_first_nonfinite(in->teacher, V * dm, 0);
    if (bad >= 0) {
      char at[160];
      cli_in_index(hv, bad, at, sizeof at);
      return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor 'teacher_head' holds %s at %s: the target's lm_head must be finite",
                     hv->file, nonfinite_name(in->teacher[bad]), at);
    }
  }
  if (lv) {
    in->last = cli_alloc(T * dm, sizeof(float), "last");
    if (!in->last) return DS_ERR_NOMEM;
    DS_TRY(cli_in_floats(lv, in->last));
    /* With the loss, every supervised slot reads its teacher row last[a + k]; the others are
     * never read, so anything (NaN included) may stand there. */
    for (int64_t r = 0; want_loss && r < R; r++) {
      int64_t b = r / g, k = r % g, t = in->anchors[b] + k;
      if (!in->eval[r] || !in->keep[b]) continue;
      bad = cli_first_nonfinite(in->last + t * dm, dm, 0);
      if (bad >= 0) {
        char at[160];
        cli_in_index(lv, t * dm + bad, at, sizeof at);
        return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor 'last' holds %s at %s, the teacher state of block %lld slot %lld, "
                       "which is supervised (only rows that no supervised slot reads may be non-finite)", lv->file,
                       nonfinite_name(in->last[t * dm + bad]), at, (long long)b, (long long)k);
      }
    }
  }
  return DS_OK;
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
    else if (!strcmp(a, "--grad-scale") || !strcmp(a, "--decay-gamma")) {
      if (!(v = cli_value(argc, argv, &i)) || !cli_float(a, v, -1e9, 1e9, &x)) return 2;
      if (!strcmp(a, "--grad-scale")) grad_scale = x;
      else lc.decay_gamma = x;
    } else if (!strcmp(a, "--alpha-ce") || !strcmp(a, "--alpha-l1") || !strcmp(a, "--alpha-conf")) {
      if (!(v = cli_value(argc, argv, &i)) || !cli_float(a, v, 0, 1e9, &x)) return 2;
      if (!strcmp(a, "--alpha-ce")) lc.alpha_ce = x;
      else if (!strcmp(a, "--alpha-l1")) lc.alpha_l1 = x;
      else lc.alpha_conf = x;
    } else if (!strcmp(a, "--chunk-rows") || !strcmp(a, "--threads")) {
      if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 1, !strcmp(a, "--threads") ? 1024 : 1 << 20, &n)) return 2;
      if (!strcmp(a, "--chunk-rows")) lc.chunk_rows = n;
      else ds_set_num_threads((int)n);
    } else if (a[0] == '-' || dir) {
      fprintf(stderr, "dspark draft-forward: unexpected argument '%s' (see --help)\n", a);
      return 2;
    } else dir = a;
  }
  if (!dir || !in_path || !out_path) {
    fprintf(stderr, "dspark draft-forward: DRAFT, --inputs and --out are required\n");
    usage(stderr);
    return 2;
  }
  const ds_input_path inputs[] = {{"DRAFT", dir}, {"--inputs", in_path}};
  int refused = cli_output_refused("draft-forward", "--out", out_path, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;

  int rc = 1;
  ds_draft *d = NULL;
  ds_safetensors *st_in = NULL;
  ds_st_writer *w = NULL;
  fwd_inputs in;
  memset(&in, 0, sizeof in);
  float *logits = NULL, *conf = NULL;
  if (ds_draft_open(dir, ds_backend_cpu(), &d) != DS_OK || ds_st_open(in_path, &st_in) != DS_OK) goto report;
  const ds_draft_config *c = ds_draft_get_config(d);
  int64_t N = ds_draft_vocab_size(d), g = c->block_size; /* the logits' columns */
  if (read_inputs(st_in, c, want_loss, &in) != DS_OK) goto report;
  int64_t R = in.R;
  logits = ds_malloc_aligned((size_t)(R * N) * sizeof(float), "the logits [B*g, N]");
  if (!logits) goto report;
  conf = cli_alloc(R, sizeof(float), "the confidence logits [B*g]");
  if (!conf) goto report;
  w = ds_st_writer_new();
  if (!w) {
    DS_FAIL(DS_ERR_NOMEM, "cannot allocate the output writer");
    goto report;
  }

  ds_draft_seq seq = {in.T, in.ctx, in.last, in.ids, in.B, in.anchors, in.keep, in.eval, {in.teacher, DS_F32}};
  if (ds_draft_forward_blocks(d, &seq, logits, conf) != DS_OK) goto report;
  int64_t ls[2] = {R, N}, cs[1] = {R};
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
  if (ds_st_writer_write(w, out_path) != DS_OK) {
    ds_error_wrap(DS_ERR_IO, "--out %s", out_path);
    goto report;
  }
  rc = 0;
  goto done;
report:
  rc = cli_report_error("draft-forward");
done:
  ds_st_writer_free(w);
  ds_st_close(st_in);
  ds_draft_free(d);
  inputs_free(&in);
  ds_free_aligned(logits);
  free(conf);
  return rc;
}

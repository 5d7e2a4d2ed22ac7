/* The DSpark loss (include/dspark/dspark_loss.h): supervision weights, the
 * finishing reduction (pairs, tau, per-position acceptance) and the whole-batch driver that
 * runs the row-chunk core of dspark_loss_rows.c over chunks of rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/dspark_loss.h"

/* n_blocks x g rows over a vocabulary of V: sizes valid and R * V within int64 */
static ds_status check_sizes(int64_t n_blocks, int64_t g, int64_t V) {
  if (n_blocks < 0 || g < 1 || V < 1)
    return DS_FAIL(DS_ERR_ARG, "dspark loss: need n_blocks >= 0, g >= 1, V >= 1 (got %lld, %lld, %lld)",
                   (long long)n_blocks, (long long)g, (long long)V);
  if (n_blocks > INT64_MAX / g || n_blocks * g > INT64_MAX / V)
    return DS_FAIL(DS_ERR_ARG, "dspark loss: %lld blocks x %lld slots x %lld vocabulary overflows 64 bits",
                   (long long)n_blocks, (long long)g, (long long)V);
  return DS_OK;
}

/* eval_mask [R], block_keep [n_blocks] -> sup [R], w [R];  R = n_blocks * g */
ds_status ds_dspark_loss_weights(const ds_dspark_loss_config *cfg, int64_t n_blocks, int64_t g,
                                 const uint8_t *eval_mask, const uint8_t *block_keep, uint8_t *sup, double *w) {
  DS_TRY(ds_dspark_loss_config_check(cfg));
  DS_TRY(check_sizes(n_blocks, g, 1));
  if (n_blocks > 0 && (!eval_mask || !block_keep || !sup || !w))
    return DS_FAIL(DS_ERR_ARG, "dspark loss weights: NULL mask or output");
  for (int64_t b = 0; b < n_blocks; b++)
    for (int64_t k = 0; k < g; k++) {
      int64_t r = b * g + k;
      sup[r] = (uint8_t)(eval_mask[r] && block_keep[b]);
      w[r] = sup[r] ? ds_dspark_loss_decay(cfg, k, g) : 0.0;
    }
  return DS_OK;
}

/* sup [R], w [R], rows->{ce, l1, accept, bce} [R] -> out, pos_accept [g], pos_count [g] */
ds_status ds_dspark_loss_finish(const ds_dspark_loss_config *cfg, int64_t n_blocks, int64_t g,
                                const uint8_t *sup, const double *w, const ds_dspark_row_stats *rows,
                                ds_dspark_loss_result *out, double *pos_accept, double *pos_count) {
  DS_TRY(ds_dspark_loss_config_check(cfg));
  DS_TRY(check_sizes(n_blocks, g, 1));
  if (!out || (n_blocks > 0 && (!sup || !w || !rows || !rows->ce || !rows->l1 || !rows->accept || !rows->bce)))
    return DS_FAIL(DS_ERR_ARG, "dspark loss finish: NULL mask, weights, row values or output");
  int teacher = cfg->has_teacher != 0, conf_on = teacher && cfg->has_conf;
  double ce = 0, l1 = 0, bce = 0, W = 0, W_ce = 0, acc = 0, tau = 0, valid_blocks = 0;
  int64_t tokens = 0;
  if (pos_accept) memset(pos_accept, 0, (size_t)g * sizeof *pos_accept);
  if (pos_count) memset(pos_count, 0, (size_t)g * sizeof *pos_count);
  for (int64_t b = 0; b < n_blocks; b++) {
    double cum = 1.0, tau_b = 1.0;
    int valid = 0;
    for (int64_t k = 0; k < g; k++) {
      int64_t r = b * g + k;
      if (!sup[r]) { /* selected out: nothing of the row is read */
        cum = 0.0;
        continue;
      }
      valid = 1;
      tokens++;
      W += w[r];
      if (!rows->ce_on || rows->ce_on[r]) { /* a reduced vocabulary: CE only where x* is in S */
        W_ce += w[r];
        ce += w[r] * rows->ce[r];
      }
      if (teacher) {
        l1 += w[r] * rows->l1[r];
        acc += rows->accept[r];
        cum *= rows->accept[r];
        tau_b += cum;
        if (pos_accept) pos_accept[k] += rows->accept[r];
        if (pos_count) pos_count[k] += 1.0;
      }
      if (conf_on) bce += w[r] * rows->bce[r];
    }
    if (valid) tau += tau_b, valid_blocks += 1.0;
  }
  memset(out, 0, sizeof *out);
  out->num_tokens = tokens;
  out->W = W;
  out->numerator = cfg->alpha_ce * ce + cfg->alpha_l1 * l1 + cfg->alpha_conf * bce;
  const double num[4] = {out->numerator, ce, l1, bce};
  for (int i = DS_DSPARK_PAIR_LOSS; i <= DS_DSPARK_PAIR_CONF; i++) {
    out->pair[i][0] = num[i];
    out->pair[i][1] = i == DS_DSPARK_PAIR_CE ? W_ce : W;
    out->pair_present[i] = 1;
  }
  if (teacher) {
    out->pair[DS_DSPARK_PAIR_ACCEPT][0] = acc;
    out->pair[DS_DSPARK_PAIR_ACCEPT][1] = (double)tokens;
    out->pair[DS_DSPARK_PAIR_TAU][0] = tau;
    out->pair[DS_DSPARK_PAIR_TAU][1] = valid_blocks;
    out->pair_present[DS_DSPARK_PAIR_ACCEPT] = out->pair_present[DS_DSPARK_PAIR_TAU] = 1;
  }
  return DS_OK;
}

ds_status ds_dspark_vocab_check(const ds_dspark_vocab *vb, int64_t V) {
  if (!vb || !vb->ids || !vb->index || vb->n < 1 || vb->n > V)
    return DS_FAIL(DS_ERR_ARG, "draft vocabulary: %lld ids over a vocabulary of %lld (need 1 .. V), or no ids / index",
                   vb ? (long long)vb->n : 0LL, (long long)V);
  for (int64_t j = 0; j < vb->n; j++) {
    int32_t v = vb->ids[j];
    if (v < 0 || v >= V || (j > 0 && v <= vb->ids[j - 1]))
      return DS_FAIL(DS_ERR_ARG, "draft vocabulary: id %d at %lld is outside [0, %lld) or not above the one before "
                     "(the ids must be strictly increasing)", v, (long long)j, (long long)V);
    if (vb->index[v] != (int32_t)j)
      return DS_FAIL(DS_ERR_ARG, "draft vocabulary: index[%d] = %d, but id %d is column %lld", v, vb->index[v], v,
                     (long long)j);
  }
  int64_t in = 0;
  for (int64_t v = 0; v < V; v++) in += vb->index[v] >= 0;
  if (in != vb->n)
    return DS_FAIL(DS_ERR_ARG, "draft vocabulary: the index marks %lld ids, the vocabulary has %lld", (long long)in,
                   (long long)vb->n);
  return DS_OK;
}

/* in: draft [R, N], target [R, V], ids [R], eval_mask [R], block_keep [n_blocks], conf [R]
 * -> out, pos_accept [g], pos_count [g], grad_draft [R, N], grad_conf [R], rows [R] each;
 * N = in->vocab->n, or V */
ds_status ds_dspark_loss(const ds_dspark_loss_config *cfg, int64_t n_blocks, int64_t g, int64_t V,
                         const ds_dspark_loss_inputs *in, double grad_scale, ds_dspark_loss_result *out,
                         double *pos_accept, double *pos_count, float *grad_draft, float *grad_conf,
                         const ds_dspark_row_stats *rows) {
  DS_TRY(ds_dspark_loss_config_check(cfg));
  DS_TRY(check_sizes(n_blocks, g, V));
  if (!in || !out) return DS_FAIL(DS_ERR_ARG, "dspark loss: inputs or output is NULL");
  int64_t R = n_blocks * g;
  if (R > 0 && (!in->draft_logits || !in->target_ids || !in->eval_mask || !in->block_keep))
    return DS_FAIL(DS_ERR_ARG, "dspark loss: draft_logits, target_ids, eval_mask and block_keep_mask are required");
  if (!!cfg->has_teacher != (in->target_logits != NULL))
    return DS_FAIL(DS_ERR_ARG, "dspark loss: has_teacher is %d but target_logits is %s", cfg->has_teacher,
                   in->target_logits ? "given" : "NULL");
  if (!!cfg->has_conf != (in->conf_logits != NULL))
    return DS_FAIL(DS_ERR_ARG, "dspark loss: has_conf is %d but conf_logits is %s", cfg->has_conf,
                   in->conf_logits ? "given" : "NULL");

  const ds_dspark_vocab *vb = in->vocab;
  if (vb) DS_TRY(ds_dspark_vocab_check(vb, V));
  int64_t N = vb ? vb->n : V;

  size_t n = (size_t)(R > 0 ? R : 1);
  uint8_t *sup = ds_malloc(n, "dspark loss mask");
  double *w = ds_malloc(n * sizeof *w, "dspark loss weights");
  double *own = rows ? NULL : ds_malloc(4 * n * sizeof *own, "dspark loss row values");
  uint8_t *ce_on = vb && !(rows && rows->ce_on) ? ds_malloc(n, "dspark loss CE mask") : NULL;
  ds_status st = DS_ERR_NOMEM;
  if (!sup || !w || (!rows && !own) || (vb && !(rows && rows->ce_on) && !ce_on)) goto done;
  ds_dspark_row_stats all = rows ? *rows : (ds_dspark_row_stats){own, own + n, own + 2 * n, own + 3 * n, NULL};
  if (ce_on) all.ce_on = ce_on;

  st = ds_dspark_loss_weights(cfg, n_blocks, g, in->eval_mask, in->block_keep, sup, w);
  if (st == DS_OK) st = ds_dspark_loss_check_ids(0, g, R, V, in->target_ids, sup); /* before any output */
  for (int64_t r0 = 0; r0 < R && st == DS_OK; r0 += cfg->chunk_rows) {
    int64_t c = R - r0 < cfg->chunk_rows ? R - r0 : cfg->chunk_rows;
    ds_dspark_row_stats part = {all.ce + r0, all.l1 + r0, all.accept + r0, all.bce + r0,
                                all.ce_on ? all.ce_on + r0 : NULL};
    st = ds_dspark_loss_rows_vocab(cfg, vb, r0, g, c, V, in->draft_logits + r0 * N,
                                   in->target_logits ? in->target_logits + r0 * V : NULL, in->target_ids + r0,
                                   sup + r0, w + r0, in->conf_logits ? in->conf_logits + r0 : NULL, grad_scale, &part,
                                   grad_draft ? grad_draft + r0 * N : NULL, grad_conf ? grad_conf + r0 : NULL);
  }
  if (st == DS_OK) st = ds_dspark_loss_finish(cfg, n_blocks, g, sup, w, &all, out, pos_accept, pos_count);
done:
  free(sup);
  free(w);
  free(own);
  free(ce_on);
  return st;
}

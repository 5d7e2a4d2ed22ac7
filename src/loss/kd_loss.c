/* The KD loss (include/dspark/kd_loss.h): the finishing reduction (numerator, token count,
 * pairs) and the whole-batch driver that runs the row-chunk core of kd_loss_rows.c over chunks
 * of rows. */
#include <stdlib.h>
#include <string.h>

#include "dspark/kd_loss.h"

/* mask [R], kd [R], lm [R] -> out */
ds_status ds_kd_loss_finish(const ds_kd_loss_config *cfg, int64_t R, const uint8_t *mask, const double *kd,
                            const double *lm, ds_kd_loss_result *out) {
  DS_TRY(ds_kd_loss_config_check(cfg, 0));
  const int want_kd = cfg->kd_loss_alpha > 0.0, want_lm = cfg->kd_loss_alpha < 1.0;
  if (!out || R < 0 || (R > 0 && (!mask || (want_kd && !kd) || (want_lm && !lm))))
    return DS_FAIL(DS_ERR_ARG, "kd loss finish: NULL mask, per-row values or output (or R %lld < 0)", (long long)R);
  double skd = 0.0, slm = 0.0;
  int64_t tokens = 0;
  for (int64_t r = 0; r < R; r++) {
    if (!mask[r]) continue; /* selected out: nothing of the row is read */
    tokens++;
    if (want_kd) skd += kd[r];
    if (want_lm) slm += lm[r];
  }
  const double alpha = cfg->kd_loss_alpha;
  memset(out, 0, sizeof *out);
  out->num_tokens = tokens;
  /* a term that is not computed adds nothing (not even 0 * its value) */
  out->numerator = want_kd && want_lm ? (1.0 - alpha) * slm + alpha * skd : want_kd ? skd : slm;
  out->pair[DS_KD_PAIR_LOSS][0] = out->numerator;
  out->pair[DS_KD_PAIR_KD][0] = skd;
  out->pair[DS_KD_PAIR_LM][0] = slm;
  for (int i = 0; i < DS_KD_PAIR_COUNT; i++) out->pair[i][1] = (double)tokens;
  if (!want_kd) out->pair[DS_KD_PAIR_KD][1] = 0.0;
  if (!want_lm) out->pair[DS_KD_PAIR_LM][1] = 0.0;
  out->pair_present[DS_KD_PAIR_LOSS] = 1;
  out->pair_present[DS_KD_PAIR_KD] = want_kd;
  out->pair_present[DS_KD_PAIR_LM] = want_lm;
  return DS_OK;
}

/* in: student [R, V], topk [R, ks], teacher [R, V], labels [R], mask [R]
 *   -> out, kd [R], lm [R], grad [R, V] */
ds_status ds_kd_loss(const ds_kd_loss_config *cfg, int64_t R, int64_t V, const ds_kd_rows_in *in, double grad_scale,
                     ds_kd_loss_result *out, double *kd, double *lm, float *grad) {
  DS_TRY(ds_kd_loss_config_check(cfg, V));
  if (!in || !out) return DS_FAIL(DS_ERR_ARG, "kd loss: inputs or output is NULL");
  if (R < 0 || V < 1 || R > INT64_MAX / V)
    return DS_FAIL(DS_ERR_ARG, "kd loss: need R >= 0 rows and V >= 1 with R * V within 64 bits (got %lld, %lld)",
                   (long long)R, (long long)V);
  if (R > 0 && (!in->student || !in->mask))
    return DS_FAIL(DS_ERR_ARG, "kd loss: the student logits and the loss mask are required");
  size_t n = (size_t)(R > 0 ? R : 1);
  double *own_kd = kd ? NULL : ds_malloc(n * sizeof *own_kd, "kd loss per-row kd");
  double *own_lm = lm ? NULL : ds_malloc(n * sizeof *own_lm, "kd loss per-row lm");
  ds_status st = DS_ERR_NOMEM;
  if ((!kd && !own_kd) || (!lm && !own_lm)) goto done;
  double *kd_all = kd ? kd : own_kd, *lm_all = lm ? lm : own_lm;
  st = DS_OK;
  for (int64_t r0 = 0; r0 < R && st == DS_OK; r0 += cfg->chunk_rows) {
    int64_t c = R - r0 < cfg->chunk_rows ? R - r0 : cfg->chunk_rows;
    ds_kd_rows_in part = *in;
    part.student = in->student + r0 * V;
    part.topk_ids = in->topk_ids ? in->topk_ids + r0 * in->k_stride : NULL;
    part.topk_lp = in->topk_lp ? in->topk_lp + r0 * in->k_stride : NULL;
    part.teacher = in->teacher ? in->teacher + r0 * V : NULL;
    part.labels = in->labels ? in->labels + r0 : NULL;
    part.mask = in->mask + r0;
    st = ds_kd_loss_rows(cfg, r0, c, V, &part, grad_scale, kd_all + r0, lm_all + r0, grad ? grad + r0 * V : NULL);
  }
  if (st == DS_OK) st = ds_kd_loss_finish(cfg, R, in->mask, kd_all, lm_all, out);
done:
  free(own_kd);
  free(own_lm);
  return st;
}

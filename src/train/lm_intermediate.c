/* Intermediate-layer pairs of `dspark distill` (--intermediate S:T[:cosine|mse], kd.md
 * section 3): their checks against the student and the teacher or the cache, the teacher's
 * feature columns (the live teacher captures the needed layers; a cache brings its
 * target_layer_ids), the learned projections (kept in the student's extra params so that the
 * trainer's optimizer, clipping and checkpoint cover them), and per item the pairs' losses,
 * their balance against the logits KD and their gradients at the student's layers.
 *
 * Balance granularity: one item is one micro-batch, and the balancer runs per micro-batch (as
 * a loss function runs per forward in Megatron / Model-Optimizer): scale = |logits_kd| / I of
 * that item, both normalized by the step's global token count, detached. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/dtype.h"
#include "train/lm_objective_internal.h"

/* "[a, b, c]" of the cache's layer list, for messages. */
static void layer_list(const ds_cache_manifest *m, char *buf, size_t n) {
  size_t at = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < m->n_layers && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "%s%d", i ? ", " : "", (int)m->target_layer_ids[i]);
  if (at < n) snprintf(buf + at, n - at, "]");
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

ds_status ds_lm_inter_setup(lm_run *t, const ds_model_config *sc) {
  const ds_lm_train_options *o = t->o;
  t->n_inter = o->n_intermediate;
  if (t->n_inter == 0) return DS_OK;
  if (t->n_inter < 0 || t->n_inter > DS_KD_MAX_INTERMEDIATE)
    return DS_FAIL(DS_ERR_ARG, "--intermediate given %d times: at most %d pairs", t->n_inter, DS_KD_MAX_INTERMEDIATE);
  if (!o->distill) return DS_FAIL(DS_ERR_ARG, "--intermediate needs a teacher: use `dspark distill`");
  if (!(t->cfg.kd_loss_alpha > 0))
    return DS_FAIL(DS_ERR_ARG, "--intermediate needs --kd-loss-alpha > 0: the intermediate losses are balanced into "
                   "the KD term, which --kd-loss-alpha %g switches off (kd.md section 3)", t->cfg.kd_loss_alpha);
  const ds_cache_manifest *m = t->fc ? ds_cache_get_manifest(t->fc) : NULL;
  int64_t Lt;
  if (m) {
    Lt = m->num_hidden_layers;
    t->dt = m->hidden_size;
    if (!m->features)
      return DS_FAIL(DS_ERR_ARG, "%s/manifest.json: field 'features' is false in the cache but --intermediate needs "
                     "the teacher's hidden states: capture again without --no-features, with --target-layer-ids "
                     "listing the teacher layers of the pairs", o->cache_dir);
  } else {
    const ds_model_config *tc = ds_target_config(t->teacher);
    Lt = tc->num_hidden_layers;
    t->dt = tc->hidden_size;
  }
  int64_t Ls = sc->num_hidden_layers, d = sc->hidden_size;
  t->n_proj_floats = 0;
  t->n_tlayers = 0;
  for (int i = 0; i < t->n_inter; i++) {
    const ds_kd_inter_pair *p = &o->intermediate[i];
    long long S = (long long)p->student_layer, T = (long long)p->teacher_layer;
    if (S < -1 || S > Ls - 1)
      return DS_FAIL(DS_ERR_ARG, "--intermediate %lld:%lld: student layer %lld is outside [-1, %lld] (the student has "
                     "%lld layers; -1 = the embedding output)", S, T, S, (long long)(Ls - 1), (long long)Ls);
    if (T < -1 || T > Lt - 2)
      return DS_FAIL(DS_ERR_ARG, "--intermediate %lld:%lld: teacher layer %lld is outside [-1, %lld] (the teacher has "
                     "%lld layers and the output of its last one is final-normed, not a layer's hidden state)", S, T,
                     T, (long long)(Lt - 2), (long long)Lt);
    if (m) {
      int j = 0;
      while (j < m->n_layers && m->target_layer_ids[j] != T) j++;
      if (j == m->n_layers) {
        char list[512];
        layer_list(m, list, sizeof list);
        return DS_FAIL(DS_ERR_ARG, "%s/manifest.json: field 'target_layer_ids' is %s in the cache but --intermediate "
                       "%lld:%lld needs teacher layer %lld: capture again with --target-layer-ids listing it",
                       o->cache_dir, list, S, T, T);
      }
      t->inter_col[i] = j * t->dt;
    } else {
      int have = 0;
      for (int j = 0; j < t->n_tlayers; j++) have |= t->tlayers[j] == (int32_t)T;
      if (!have) t->tlayers[t->n_tlayers++] = (int32_t)T;
    }
    /* a projection only where the sizes differ (kd.md section 3) */
    t->has_proj[i] = d != t->dt;
    t->proj_offset[i] = t->n_proj_floats;
    if (t->has_proj[i]) t->n_proj_floats += (size_t)(t->dt * d);
  }
  if (m) {
    t->feat_stride = m->n_layers * t->dt;
    return DS_OK;
  }
  /* the live teacher captures each needed layer once, in increasing order */
  qsort(t->tlayers, (size_t)t->n_tlayers, sizeof t->tlayers[0], cmp_i32);
  DS_TRY(ds_target_check_capture_layers(t->teacher, t->tlayers, t->n_tlayers));
  for (int i = 0; i < t->n_inter; i++)
    for (int j = 0; j < t->n_tlayers; j++)
      if (t->tlayers[j] == (int32_t)o->intermediate[i].teacher_layer) t->inter_col[i] = j * t->dt;
  t->feat_stride = t->n_tlayers * t->dt;
  return DS_OK;
}

ds_status ds_lm_inter_buffers(lm_run *t) {
  if (t->n_inter == 0) return DS_OK;
  size_t S = (size_t)t->data.seq_len, n = (size_t)t->n_inter, dt = (size_t)t->dt, d = (size_t)t->d;
  if (t->teacher && !t->fc) {
    t->tcaptured = ds_malloc_aligned(S * (size_t)t->feat_stride * sizeof(float), "teacher hidden states");
    if (!t->tcaptured) return DS_ERR_NOMEM;
  }
  t->inter_out = ds_malloc_aligned(n * S * dt * sizeof(float), "intermediate projections");
  t->inter_dh = ds_malloc_aligned(n * S * d * sizeof(float), "intermediate gradients");
  t->inter_dy = ds_malloc_aligned(S * dt * sizeof(float), "intermediate gradients");
  t->inter_rows = ds_malloc(S * sizeof(double), "intermediate rows");
  return t->inter_out && t->inter_dh && t->inter_dy && t->inter_rows ? DS_OK : DS_ERR_NOMEM;
}

static void proj_name(char *buf, size_t n, int i) { snprintf(buf, n, "intermediate.%d.proj.weight", i); }

ds_status ds_lm_inter_params(lm_run *t, const ds_safetensors *ck) {
  if (t->n_proj_floats == 0) return DS_OK;
  DS_TRY(ds_student_set_extra_params(t->student, t->n_proj_floats));
  float *x = ds_student_extra_params(t->student);
  int64_t dt = t->dt, d = t->d;
  for (int i = 0; i < t->n_inter; i++) {
    if (!t->has_proj[i]) continue;
    float *w = x + t->proj_offset[i];
    if (!ck) { /* the rectangular identity: the pair starts as the plain comparison */
      for (int64_t r = 0; r < dt; r++)
        for (int64_t c = 0; c < d; c++) w[r * d + c] = r == c ? 1.0f : 0.0f;
      continue;
    }
    char name[64];
    proj_name(name, sizeof name, i);
    const ds_tensor_view *v = ds_st_find(ck, name);
    if (!v || v->ndim != 2 || v->shape[0] != dt || v->shape[1] != d)
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' %s (--intermediate pair %d needs a [%lld, %lld] projection): "
                     "the checkpoint was not written with these --intermediate pairs", ds_st_path(ck), name,
                     v ? "has another shape" : "is missing", i, (long long)dt, (long long)d);
    ds_status st = ds_convert_to_f32(w, v->data, v->dtype, (size_t)v->numel);
    if (st != DS_OK) return ds_error_wrap(st, "%s: tensor '%s'", ds_st_path(ck), name);
  }
  return DS_OK;
}

ds_status ds_lm_inter_save(lm_run *t, ds_st_writer *w) {
  const float *x = ds_student_extra_params(t->student);
  for (int i = 0; i < t->n_inter; i++) {
    if (!t->has_proj[i]) continue;
    char name[64];
    proj_name(name, sizeof name, i);
    int64_t shape[2] = {t->dt, t->d};
    DS_TRY(ds_st_writer_add(w, name, DS_F32, 2, shape, x + t->proj_offset[i]));
  }
  return DS_OK;
}

ds_status ds_lm_inter_item(lm_run *t, int64_t T, double alpha, double lm_sum, double kd_sum, double norm,
                           double grad_scale, lm_inter_item *out) {
  memset(out, 0, sizeof *out);
  int n = t->n_inter;
  if (n == 0) return DS_OK;
  const ds_backend *be = ds_student_backend(t->student);
  int64_t S = t->data.seq_len, d = t->d, dt = t->dt;
  float *proj = ds_student_extra_params(t->student), *dproj = ds_student_extra_grads(t->student);
  ds_kd_inter_in in[DS_KD_MAX_INTERMEDIATE];
  double inter[DS_KD_MAX_INTERMEDIATE];
  for (int i = 0; i < n; i++) {
    const ds_kd_inter_pair *p = &t->o->intermediate[i];
    in[i] = (ds_kd_inter_in){p->kind, T, d, dt, ds_student_hidden(t->student, p->student_layer),
                             t->cur_tfeat + t->inter_col[i], t->feat_stride,
                             t->has_proj[i] ? proj + t->proj_offset[i] : NULL, t->mask};
    double sum;
    ds_status st = ds_kd_inter_forward(be, &in[i], t->inter_out + i * S * dt, t->inter_rows, &sum);
    if (st != DS_OK)
      return ds_error_wrap(st, "--intermediate %lld:%lld", (long long)p->student_layer, (long long)p->teacher_layer);
    inter[i] = sum / norm;
  }
  ds_kd_balance bal;
  DS_TRY(ds_kd_balance_losses(alpha, lm_sum / norm, kd_sum / norm, inter, n, &bal));
  out->mean_sum = bal.intermediate * norm;
  out->balanced = out->mean_sum * bal.scale;
  if (grad_scale <= 0) return DS_OK;
  /* d total / d (pair sum) = w_intermediate / W: the balancer's weight on the normalized loss */
  for (int i = 0; i < n; i++) {
    float *dh = t->inter_dh + i * S * d;
    memset(dh, 0, (size_t)(T * d) * sizeof(float));
    ds_kd_inter_backward(be, &in[i], t->inter_out + i * S * dt, bal.w_intermediate * grad_scale, t->inter_dy, dh,
                         t->has_proj[i] ? dproj + t->proj_offset[i] : NULL);
    out->extra[i] = (ds_student_hidden_grad){t->o->intermediate[i].student_layer, dh};
  }
  out->n_extra = n;
  return DS_OK;
}

void ds_lm_inter_free(lm_run *t) {
  ds_free_aligned(t->tcaptured);
  ds_free_aligned(t->inter_out);
  ds_free_aligned(t->inter_dh);
  ds_free_aligned(t->inter_dy);
  free(t->inter_rows);
}

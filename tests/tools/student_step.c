/* One plain training step of a student, for tests/conformance/test_student_torch.py:
 *
 *   student_step (--dir MODEL_DIR | --config CONFIG_JSON [--seed N]) --in IN --out OUT
 *                [--chunk C] [--hidden-layer L --hidden-weight W] [--sgd LR] [--export DIR]
 *
 * IN (safetensors): input_ids [B, T] I32, optional lengths [B] I64 (tokens of each sequence).
 * The student runs forward over the batch, then the loss
 *     loss = (sum over every sequence b and t < len_b - 1 of CE(logits[b, t], ids[b, t+1])) / N
 *            + W * (sum of h_L^2) / rows         (only with --hidden-layer)
 * with N the number of predicted tokens and h_L = ds_student_hidden(L), computed on the full
 * logits (small V) row chunk by row chunk (C rows, default 5) through the training hooks,
 * then the backward. OUT gets loss [1], logits [rows, V] and hidden.L [rows, d] (before any
 * update), grad.NAME for every tensor (HF names), all F32. --sgd LR then applies
 * params -= LR * grads; --export DIR writes the student (after the update) in HF layout, and
 * OUT also gets logits_after [rows, V] of the updated student on the same batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/safetensors.h"
#include "dspark/student.h"

static int fail(const char *what) {
  fprintf(stderr, "student_step: %s%s%s\n", what, ds_last_error()[0] ? ": " : "", ds_last_error());
  return 1;
}

/* logits [rows, V] of the whole batch through the chunk hook. */
static float *all_logits(ds_student *s, int64_t chunk) {
  int64_t rows = ds_student_rows(s), V = ds_student_config(s)->vocab_size;
  float *logits = malloc((size_t)(rows * V) * sizeof(float));
  for (int64_t r0 = 0; logits && r0 < rows; r0 += chunk)
    ds_student_rows_logits(s, r0, rows - r0 < chunk ? rows - r0 : chunk, logits + r0 * V);
  return logits;
}

int main(int argc, char **argv) {
  const char *dir = NULL, *config = NULL, *in_path = NULL, *out_path = NULL, *export_dir = NULL;
  uint64_t seed = 0;
  int64_t chunk = 5, hidden_layer = -2;
  double hidden_weight = 0, lr = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) { fprintf(stderr, "student_step: %s needs a value\n", a); return 2; }
    i++;
    if (!strcmp(a, "--dir")) dir = v;
    else if (!strcmp(a, "--config")) config = v;
    else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--in")) in_path = v;
    else if (!strcmp(a, "--out")) out_path = v;
    else if (!strcmp(a, "--chunk")) chunk = atoll(v);
    else if (!strcmp(a, "--hidden-layer")) hidden_layer = atoll(v);
    else if (!strcmp(a, "--hidden-weight")) hidden_weight = atof(v);
    else if (!strcmp(a, "--sgd")) lr = atof(v);
    else if (!strcmp(a, "--export")) export_dir = v;
    else { fprintf(stderr, "student_step: unknown option %s\n", a); return 2; }
  }
  if (!(dir || config) || !in_path || !out_path || chunk < 1) {
    fprintf(stderr, "usage: student_step (--dir MODEL_DIR | --config CONFIG_JSON [--seed N]) --in IN --out OUT "
                    "[--chunk C] [--hidden-layer L --hidden-weight W] [--sgd LR] [--export DIR]\n");
    return 2;
  }
  ds_student *s = NULL;
  if (dir ? ds_student_load_hf(dir, NULL, &s) : ds_student_new_from_file(config, seed, NULL, &s)) return fail("load");
  ds_safetensors *in = NULL;
  if (ds_st_open(in_path, &in) != DS_OK) return fail("input");
  const ds_tensor_view *ids = ds_st_find(in, "input_ids"), *lens = ds_st_find(in, "lengths");
  if (!ids || ids->dtype != DS_I32 || ids->ndim != 2 || (lens && (lens->dtype != DS_I64 || lens->ndim != 1 ||
                                                                 lens->shape[0] != ids->shape[0]))) {
    fprintf(stderr, "student_step: input_ids must be [B, T] I32 (lengths [B] I64)\n");
    return 1;
  }
  int64_t B = ids->shape[0], T = ids->shape[1];
  int32_t *id = malloc((size_t)(B * T) * sizeof(int32_t));
  int64_t *len = malloc((size_t)B * sizeof(int64_t));
  memcpy(id, ids->data, (size_t)(B * T) * sizeof(int32_t));
  for (int64_t b = 0; b < B; b++) len[b] = T;
  if (lens) memcpy(len, lens->data, (size_t)B * sizeof(int64_t));
  ds_student_batch batch = {id, B, T, len};
  if (ds_student_forward(s, &batch) != DS_OK) return fail("forward");

  const ds_model_config *c = ds_student_config(s);
  int64_t rows = ds_student_rows(s), V = c->vocab_size, d = c->hidden_size;
  const int64_t *off = ds_student_seq_offsets(s);
  int64_t n_pred = rows - B;
  /* target of each row (-1: the last token of its sequence predicts nothing) */
  int32_t *target = malloc((size_t)rows * sizeof(int32_t));
  for (int64_t b = 0; b < B; b++)
    for (int64_t r = off[b]; r < off[b + 1]; r++) target[r] = r + 1 < off[b + 1] ? id[b * T + (r - off[b]) + 1] : -1;
  float *logits = all_logits(s, chunk), *dlogits = malloc((size_t)(chunk * V) * sizeof(float));
  float *dh = calloc((size_t)(rows * d), sizeof(float));
  double loss = 0;
  ds_student_zero_grads(s);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) { /* CE in double, its gradient chunk by chunk */
    int64_t cn = rows - r0 < chunk ? rows - r0 : chunk;
    for (int64_t i = 0; i < cn; i++) {
      const float *x = logits + (r0 + i) * V;
      float *g = dlogits + i * V;
      int32_t y = target[r0 + i];
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < V; j++) mx = fmax(mx, x[j]);
      for (int64_t j = 0; j < V; j++) sum += exp(x[j] - mx);
      for (int64_t j = 0; j < V; j++) g[j] = y < 0 ? 0.0f : (float)((exp(x[j] - mx) / sum - (j == y)) / (double)n_pred);
      if (y >= 0) loss += (mx + log(sum) - x[y]) / (double)n_pred;
    }
    ds_student_rows_logits_backward(s, r0, cn, dlogits, dh + r0 * d);
  }
  float *hidden = NULL, *hgrad = NULL;
  ds_student_hidden_grad extra = {hidden_layer, NULL};
  if (hidden_layer >= -1) {
    const float *h = ds_student_hidden(s, hidden_layer);
    if (!h) { fprintf(stderr, "student_step: --hidden-layer %lld out of range\n", (long long)hidden_layer); return 1; }
    hidden = malloc((size_t)(rows * d) * sizeof(float));
    hgrad = malloc((size_t)(rows * d) * sizeof(float));
    memcpy(hidden, h, (size_t)(rows * d) * sizeof(float));
    for (int64_t i = 0; i < rows * d; i++) {
      loss += hidden_weight * (double)h[i] * h[i] / (double)rows;
      hgrad[i] = (float)(2.0 * hidden_weight * h[i] / (double)rows);
    }
    extra.grad = hgrad;
  }
  if (ds_student_backward(s, dh, hidden ? &extra : NULL, hidden ? 1 : 0) != DS_OK) return fail("backward");

  ds_st_writer *w = ds_st_writer_new();
  float loss_f = (float)loss;
  int64_t one = 1, lshape[2] = {rows, V}, hshape[2] = {rows, d};
  ds_st_writer_add(w, "loss", DS_F32, 1, &one, &loss_f);
  ds_st_writer_add(w, "logits", DS_F32, 2, lshape, logits);
  char hname[64];
  snprintf(hname, sizeof hname, "hidden.%lld", (long long)hidden_layer);
  if (hidden) ds_st_writer_add(w, hname, DS_F32, 2, hshape, hidden);
  size_t nt = ds_student_tensor_count(s);
  char **gnames = calloc(nt, sizeof(char *));
  for (size_t i = 0; i < nt; i++) {
    const ds_student_tensor *t = ds_student_tensor_at(s, i);
    gnames[i] = malloc(strlen(t->name) + 6);
    sprintf(gnames[i], "grad.%s", t->name);
    ds_st_writer_add(w, gnames[i], DS_F32, t->ndim, t->shape, t->grad);
  }
  float *after = NULL;
  if (lr != 0) {
    float *p = ds_student_params(s);
    const float *g = ds_student_grads(s);
    for (size_t i = 0; i < ds_student_num_params(s); i++) p[i] -= (float)lr * g[i];
  }
  if (export_dir) {
    if (ds_student_export_hf(s, export_dir) != DS_OK) return fail("export");
    if (ds_student_forward(s, &batch) != DS_OK) return fail("forward after the update");
    after = all_logits(s, chunk);
    ds_st_writer_add(w, "logits_after", DS_F32, 2, lshape, after);
  }
  if (ds_st_writer_write(w, out_path) != DS_OK) return fail("write");
  ds_st_writer_free(w);
  for (size_t i = 0; i < nt; i++) free(gnames[i]);
  free(gnames); free(after); free(hidden); free(hgrad); free(dh); free(dlogits); free(logits); free(target);
  free(id); free(len);
  ds_st_close(in);
  ds_student_free(s);
  return 0;
}

/* The trainer core (include/dspark/trainer.h) driven by a toy objective that knows nothing of
 * drafts: a weighted least-squares fit of a vector p to per-item targets y_i,
 *   loss = sum_i w_i |p - y_i|^2 / sum_i w_i      (the step's GLOBAL weight sum),
 * so every gradient is known in closed form. Checked: the global denominator over
 * micro-batches, stop + resume equal to an uninterrupted run (checkpoint bytes, metrics),
 * the run-directory rules (existing run refused, --overwrite, the lock, stale temp files),
 * checkpoint verification (a flipped tensor byte, an edited field, a negative second moment, a
 * NaN moment, a forged position), the resume check of options (a 64-bit seed included), the
 * non-finite policy (1-based step numbers, skip), torn and lost metrics records, and metrics
 * write errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dspark/backend.h"
#include "dspark/fileio.h"
#include "dspark/progress.h"
#include "dspark/trainer.h"
#include "test_util.h"

enum { P = 6, N_ITEMS = 10, N_EVAL = 2 };

typedef struct {
  float p[P], g[P];
  float y[N_ITEMS][P];
  double w[N_ITEMS];
  int nan_item;       /* an item whose input is non-finite (-1: none) */
  int seen_zero_w;    /* micro_step saw W_step == 0 */
} toy;

static const char *const k_pairs[2] = {"loss", "dist"};

static ds_status toy_setup(void *self, ds_objective *obj) {
  (void)self;
  obj->n_train = N_ITEMS - N_EVAL;
  obj->n_eval = N_EVAL;
  obj->train_config = "{\"objective\": \"toy\", \"dim\": 6}";
  obj->run_info = "{\"note\": \"toy\"}";
  obj->data_label = "toy data";
  return DS_OK;
}

static ds_status toy_init(void *self, uint64_t seed) {
  toy *t = self;
  for (int k = 0; k < P; k++) t->p[k] = (float)((seed % 7) + k) * 0.1f;
  return DS_OK;
}

static ds_status toy_load(void *self, const ds_safetensors *ck) {
  toy *t = self;
  const ds_tensor_view *v = ds_st_find(ck, "toy.p");
  if (!v || v->dtype != DS_F32 || v->numel != P) return DS_FAIL(DS_ERR_FORMAT, "toy.p missing");
  memcpy(t->p, v->data, sizeof t->p);
  return ds_check_finite_tensor(ds_st_path(ck), "toy.p", t->p, P);
}

static ds_status toy_start(void *self, const ds_trainer *core) {
  (void)self;
  (void)core;
  return DS_OK;
}

static float *toy_params(void *self) { return ((toy *)self)->p; }
static float *toy_grads(void *self) { return ((toy *)self)->g; }
static size_t toy_num_params(void *self) { (void)self; return P; }
static void toy_zero_grads(void *self) { memset(((toy *)self)->g, 0, sizeof ((toy *)self)->g); }

static ds_status toy_weight(void *self, const ds_step_item *it, double *w) {
  *w = ((toy *)self)->w[it->index];
  return DS_OK;
}

static void toy_loss(toy *t, int64_t i, double scale, int with_grad, ds_report *r) {
  double sq = 0, dist = 0;
  for (int k = 0; k < P; k++) {
    double d = (double)t->p[k] - t->y[i][k];
    sq += d * d;
    dist += fabs(d);
    if (with_grad) t->g[k] += (float)(2.0 * t->w[i] * d * scale);
  }
  r->numerator += t->w[i] * sq;
  r->W += t->w[i];
  r->num_tokens += 1;
  r->seen_tokens += 10;
  r->pair[0][0] += t->w[i] * sq, r->pair[0][1] += t->w[i], r->pair_present[0] = 1;
  r->pair[1][0] += dist, r->pair[1][1] += 1, r->pair_present[1] = 1;
  r->vec[i % 3][0] += dist, r->vec[i % 3][1] += 1;
}

static ds_status toy_micro_step(void *self, const ds_step_item *it, double W, ds_report *r) {
  toy *t = self;
  if (W <= 0) { t->seen_zero_w = 1; return DS_OK; }
  if (it->index == t->nan_item) return DS_FAIL(DS_ERR_NUMERIC, "toy item %lld: input is NaN", (long long)it->index);
  toy_loss(t, it->index, 1.0 / W, 1, r);
  return DS_OK;
}

static ds_status toy_eval_item(void *self, int64_t e, ds_report *r) {
  toy_loss(self, N_ITEMS - N_EVAL + e, 0, 0, r);
  return DS_OK;
}

static ds_status toy_save(void *self, ds_st_writer *w) {
  int64_t n = P;
  DS_TRY(ds_st_writer_add(w, "toy.p", DS_F32, 1, &n, ((toy *)self)->p));
  return ds_st_writer_set_metadata(w, "toy_config", "{\"dim\": 6}");
}

static const ds_objective_ops k_toy_ops = {
    .name = "toy", .checkpoint_format = "toy-checkpoint", .pair_names = k_pairs, .n_pairs = 2,
    .progress_pair = 1, .progress_label = "dist", .vec_name = "dist_per_slot", .vec_pair = 1, .vec_len = 3,
    .setup = toy_setup, .init = toy_init, .load = toy_load, .start = toy_start, .params = toy_params,
    .grads = toy_grads, .num_params = toy_num_params, .zero_grads = toy_zero_grads, .weight = toy_weight,
    .micro_step = toy_micro_step, .eval_item = toy_eval_item, .save = toy_save,
};

static void toy_data(toy *t) {
  memset(t, 0, sizeof *t);
  t->nan_item = -1;
  for (int i = 0; i < N_ITEMS; i++) {
    t->w[i] = (double)(1 + (i * 5) % 4);     /* uneven weights: a mean of means would differ */
    for (int k = 0; k < P; k++) t->y[i][k] = (float)sin(1.0 + i * 0.7 + k * 1.3);
  }
}

static ds_status run_toy(toy *t, const ds_loop_options *o) {
  ds_objective obj = {&k_toy_ops, t, 0, 0, NULL, NULL, NULL};
  return ds_trainer_run(&obj, o);
}

static char g_root[400];

static void dir_of(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", g_root, name);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", buf);
  if (system(cmd) != 0) fprintf(stderr, "cannot clear %s\n", buf);
}

static ds_loop_options base_options(const char *dir) {
  ds_loop_options o;
  ds_loop_options_default(&o);
  o.out_dir = dir;
  o.steps = 6;
  o.batch_items = 3;
  o.lr = 0.05;
  o.warmup_frac = 0;
  o.save_every = 2;
  o.eval_every = 3;
  o.seed = 5;
  o.quiet = 1;
  return o;
}

static char *slurp(const char *dir, const char *name, size_t *len) {
  char *p = ds_path_join(dir, name), *text = NULL;
  size_t n = 0;
  if (ds_read_file(p, &text, &n) != DS_OK) text = NULL;
  free(p);
  if (len) *len = n;
  return text;
}

/* metrics.jsonl with the timing fields (elapsed, rate, memory) cut off each line */
static char *metrics_sans_timing(const char *dir) {
  char *m = slurp(dir, "metrics.jsonl", NULL);
  if (!m) return NULL;
  char *out = calloc(strlen(m) + 1, 1), *o = out;
  for (char *line = m; *line;) {
    char *nl = strchr(line, '\n');
    size_t l = nl ? (size_t)(nl - line) : strlen(line);
    char *cut = strstr(line, ",\"tokens_per_s\"");
    if (!cut || cut > line + l) cut = strstr(line, ",\"elapsed_s\"");
    size_t keep = cut && cut < line + l ? (size_t)(cut - line) : l;
    memcpy(o, line, keep);
    o += keep;
    *o++ = '\n';
    line += l + (nl ? 1 : 0);
  }
  free(m);
  return out;
}

static int same_file(const char *a_dir, const char *b_dir, const char *name) {
  size_t la, lb;
  char *a = slurp(a_dir, name, &la), *b = slurp(b_dir, name, &lb);
  int same = a && b && la == lb && !memcmp(a, b, la);
  free(a), free(b);
  return same;
}

static void test_global_denominator(void) {
  char dir[512];
  dir_of(dir, sizeof dir, "denominator");
  toy t;
  toy_data(&t);
  ds_loop_options o = base_options(dir);
  o.steps = 1;
  o.grad_clip = 0;
  o.eval_every = 0;
  float p0[P];
  toy_init(&t, o.seed);
  memcpy(p0, t.p, sizeof p0);
  EXPECT_OK(run_toy(&t, &o));
  /* The gradient left by the one step is the full-batch gradient of its three items. Which
   * three the seeded order chose is the core's business: some 3-subset must match the global
   * normalization, and none the mean of the micro-batches' own means. */
  int matched = 0, mean_of_means_matched = 0;
  for (int a = 0; a < N_ITEMS - N_EVAL; a++)
    for (int b = 0; b < N_ITEMS - N_EVAL; b++)
      for (int c = 0; c < N_ITEMS - N_EVAL; c++) {
        if (a == b || b == c || a == c) continue;
        int idx[3] = {a, b, c};
        double W = t.w[a] + t.w[b] + t.w[c], err = 0, err_mm = 0;
        for (int k = 0; k < P; k++) {
          double g = 0, mm = 0;
          for (int q = 0; q < 3; q++) {
            g += 2.0 * t.w[idx[q]] * ((double)p0[k] - t.y[idx[q]][k]) / W;
            mm += 2.0 * ((double)p0[k] - t.y[idx[q]][k]) / 3.0;
          }
          err = fmax(err, fabs(g - t.g[k]));
          err_mm = fmax(err_mm, fabs(mm - t.g[k]));
        }
        matched |= err < 1e-5;
        mean_of_means_matched |= err_mm < 1e-5;
      }
  EXPECT(matched);
  EXPECT(!mean_of_means_matched);
}

static void test_resume_identical(void) {
  char a[512], b[512];
  dir_of(a, sizeof a, "uninterrupted");
  dir_of(b, sizeof b, "stopped");
  toy t;
  toy_data(&t);
  ds_loop_options o = base_options(a);
  EXPECT_OK(run_toy(&t, &o));
  toy_data(&t);
  o = base_options(b);
  o.stop_after = 4; /* past the checkpoint at 4 and the evaluation at 3 */
  EXPECT_OK(run_toy(&t, &o));
  o.stop_after = 0;
  o.resume = 1;
  toy_data(&t);
  EXPECT_OK(run_toy(&t, &o));
  EXPECT(same_file(a, b, "checkpoint.safetensors"));
  char *ma = metrics_sans_timing(a), *mb = metrics_sans_timing(b);
  EXPECT(ma && mb && !strcmp(ma, mb));
  free(ma), free(mb);
  /* Resuming a finished run changes nothing. */
  toy_data(&t);
  EXPECT_OK(run_toy(&t, &o));
  EXPECT(same_file(a, b, "checkpoint.safetensors"));
}

static void test_run_directory(void) {
  char d[512];
  dir_of(d, sizeof d, "existing/nested/run"); /* missing parents are created */
  toy t;
  toy_data(&t);
  ds_loop_options o = base_options(d);
  o.steps = 2;
  EXPECT_OK(run_toy(&t, &o));
  EXPECT(run_toy(&t, &o) == DS_ERR_ARG); /* an existing run without --resume / --overwrite */
  EXPECT(strstr(ds_last_error(), "--overwrite") != NULL);
  o.overwrite = 1;
  EXPECT_OK(run_toy(&t, &o));
  o.overwrite = 0;
  /* a second writer is refused by name */
  ds_dir_lock lock;
  EXPECT_OK(ds_dir_lock_acquire(d, "run directory", &lock));
  o.resume = 1;
  EXPECT(run_toy(&t, &o) == DS_ERR_IO);
  EXPECT(strstr(ds_last_error(), "in use by another dspark process") != NULL);
  ds_dir_unlock(&lock);
  /* stale temp files of a killed writer are removed */
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s/checkpoint.safetensors.tmp.4242", d);
  FILE *f = fopen(tmp, "w");
  if (f) fclose(f);
  EXPECT_OK(run_toy(&t, &o));
  EXPECT(!ds_file_exists(tmp));
}

/* Rewrites a checkpoint with one change; checksums recomputed (as a careful forger would)
 * unless keep_old_sums, in which case the old ones are copied (an edit by hand). */
static void rewrite_checkpoint(const char *path, const char *edit_tensor, int64_t at, float value,
                               const char *edit_key, const char *edit_val, int keep_old_sums) {
  ds_safetensors *st;
  if (ds_st_open(path, &st) != DS_OK) { EXPECT(0); return; }
  ds_st_writer *w = ds_st_writer_new();
  float *copies[16] = {0};
  size_t nc = 0;
  for (size_t i = 0; i < ds_st_count(st) && nc < 16; i++) {
    const ds_tensor_view *v = ds_st_tensor(st, i);
    float *c = malloc(v->nbytes);
    memcpy(c, v->data, v->nbytes);
    if (edit_tensor && !strcmp(v->name, edit_tensor)) c[at] = value;
    copies[nc++] = c;
    ds_st_writer_add(w, v->name, v->dtype, v->ndim, v->shape, c);
  }
  for (size_t i = 0; i < ds_st_metadata_count(st); i++) {
    const char *k = ds_st_metadata_key(st, i);
    if (!keep_old_sums && (!strcmp(k, "checksums") || !strcmp(k, "metadata_xxh64"))) continue;
    ds_st_writer_set_metadata(w, k, edit_key && !strcmp(k, edit_key) ? edit_val : ds_st_metadata(st, k));
  }
  if (!keep_old_sums) ds_st_writer_add_checksums(w);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.edit", path);
  EXPECT_OK(ds_st_writer_write(w, tmp));
  ds_st_writer_free(w);
  ds_st_close(st);
  for (size_t i = 0; i < nc; i++) free(copies[i]);
  EXPECT(rename(tmp, path) == 0);
}

static void expect_resume_refused(const char *dir, const char *ckpt_backup, const char *what) {
  toy t;
  toy_data(&t);
  ds_loop_options o = base_options(dir);
  o.resume = 1;
  ds_status st = run_toy(&t, &o);
  EXPECT(st != DS_OK);
  if (st == DS_OK || !strstr(ds_last_error(), what))
    fprintf(stderr, "  expected an error mentioning '%s', got: %s\n", what, st ? ds_last_error() : "success");
  /* restore */
  char *p = ds_path_join(dir, "checkpoint.safetensors");
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", ckpt_backup, p);
  EXPECT(system(cmd) == 0);
  free(p);
}

static void test_checkpoint_verification(void) {
  char d[512];
  dir_of(d, sizeof d, "verify");
  toy t;
  toy_data(&t);
  ds_loop_options o = base_options(d);
  o.stop_after = 2;
  EXPECT_OK(run_toy(&t, &o));
  char *ck = ds_path_join(d, "checkpoint.safetensors"), backup[600];
  snprintf(backup, sizeof backup, "%s/backup.safetensors", g_root);
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", ck, backup);
  EXPECT(system(cmd) == 0);
  /* a flipped bit in a tensor */
  size_t len;
  char *bytes = slurp(d, "checkpoint.safetensors", &len);
  if (bytes && len > 8) {
    bytes[len - 3] ^= 0x10;
    EXPECT_OK(ds_write_file_atomic(ck, bytes, len));
  }
  free(bytes);
  expect_resume_refused(d, backup, "fails its checksum");
  /* an edited field (step) with the old checksums */
  rewrite_checkpoint(ck, NULL, 0, 0, "step", "1", 1);
  expect_resume_refused(d, backup, "metadata fails its checksum");
  /* forged consistently: a position that cannot be */
  rewrite_checkpoint(ck, NULL, 0, 0, "optim_step", "5", 0);
  expect_resume_refused(d, backup, "inconsistent position");
  /* a negative second moment, and a NaN moment, with valid checksums */
  rewrite_checkpoint(ck, "optim.v", 2, -1.0f, NULL, NULL, 0);
  expect_resume_refused(d, backup, "negative second moment");
  rewrite_checkpoint(ck, "optim.m", 1, NAN, NULL, NULL, 0);
  expect_resume_refused(d, backup, "optim.m");
  rewrite_checkpoint(ck, "toy.p", 0, NAN, NULL, NULL, 0);
  expect_resume_refused(d, backup, "toy.p");
  /* a changed option; a 64-bit seed that a double cannot tell apart */
  o = base_options(d);
  o.resume = 1;
  o.lr = 0.01;
  EXPECT(run_toy(&t, &o) == DS_ERR_ARG && strstr(ds_last_error(), "'lr'"));
  char d2[512];
  dir_of(d2, sizeof d2, "seed53");
  o = base_options(d2);
  o.seed = (1ull << 53);
  o.stop_after = 1;
  EXPECT_OK(run_toy(&t, &o));
  o.seed = (1ull << 53) + 1;
  o.stop_after = 0;
  o.resume = 1;
  EXPECT(run_toy(&t, &o) == DS_ERR_ARG && strstr(ds_last_error(), "'seed'"));
  free(ck);
}

static void test_nonfinite(void) {
  char d[512];
  dir_of(d, sizeof d, "nan");
  toy t;
  toy_data(&t);
  ds_loop_options o = base_options(d);
  o.save_every = 1;
  o.inject_nan_step = 3;
  EXPECT(run_toy(&t, &o) == DS_ERR_NUMERIC);
  EXPECT(strstr(ds_last_error(), "step 3 ") != NULL); /* 1-based, as the progress line counts */
  /* the last good checkpoint is step 2 */
  ds_safetensors *st;
  char *ck = ds_path_join(d, "checkpoint.safetensors");
  EXPECT_OK(ds_st_open(ck, &st));
  if (st) {
    EXPECT(!strcmp(ds_st_metadata(st, "step"), "2"));
    ds_st_close(st);
  }
  free(ck);
  /* a non-finite input is skipped under the policy, counted, and the run goes on */
  dir_of(d, sizeof d, "nan-skip");
  toy_data(&t);
  t.nan_item = 0;
  o = base_options(d);
  o.skip_nonfinite = 1;
  EXPECT_OK(run_toy(&t, &o));
  char *m = slurp(d, "metrics.jsonl", NULL);
  EXPECT(m && strstr(m, "\"kind\":\"train\",\"step\":6") != NULL);
  int skipped = 0;
  for (char *q = m; q && (q = strstr(q, "\"skipped_steps\":")); q++) skipped = atoi(q + 16);
  EXPECT(skipped >= 1);
  free(m);
  /* without the policy the same input stops the run, naming the item */
  dir_of(d, sizeof d, "nan-stop");
  toy_data(&t);
  t.nan_item = 0;
  o = base_options(d);
  EXPECT(run_toy(&t, &o) == DS_ERR_NUMERIC && strstr(ds_last_error(), "toy item 0"));
}

static void test_metrics_recovery(void) {
  char a[512], b[512];
  dir_of(a, sizeof a, "metrics-ref");
  dir_of(b, sizeof b, "metrics-torn");
  toy t;
  toy_data(&t);
  ds_loop_options o = base_options(a);
  EXPECT_OK(run_toy(&t, &o));
  char *ref = metrics_sans_timing(a);
  /* killed mid-write of a record (torn line), and killed during the evaluation of step 3
   * after its checkpoint: the evaluation record is lost */
  o = base_options(b);
  o.save_every = 3;
  o.stop_after = 3;
  toy_data(&t);
  EXPECT_OK(run_toy(&t, &o));
  char *m = slurp(b, "metrics.jsonl", NULL);
  char *last_eval = m ? strstr(m, "{\"kind\":\"eval\",\"step\":3") : NULL;
  EXPECT(last_eval != NULL);
  if (last_eval) {
    strcpy(last_eval, "{\"kind\":\"train\",\"st"); /* the eval record gone, a torn line in its place */
    char *p = ds_path_join(b, "metrics.jsonl");
    EXPECT_OK(ds_write_file_atomic(p, m, strlen(m)));
    free(p);
  }
  free(m);
  o.stop_after = 0;
  o.resume = 1;
  toy_data(&t);
  EXPECT_OK(run_toy(&t, &o));
  char *got = metrics_sans_timing(b);
  EXPECT(ref && got && !strcmp(ref, got));
  if (ref && got && strcmp(ref, got)) fprintf(stderr, "  expected:\n%s  got:\n%s", ref, got);
  free(ref), free(got);
  /* a metrics write error (full disk) is an error naming the file, not a silent exit 0 */
  char d[512];
  dir_of(d, sizeof d, "metrics-full");
  EXPECT_OK(ds_mkdir_p(d));
  char *p = ds_path_join(d, "metrics.jsonl");
  EXPECT(symlink("/dev/full", p) == 0);
  o = base_options(d);
  o.resume = 1; /* the symlink counts as a run file; there is no checkpoint, so this starts fresh */
  toy_data(&t);
  EXPECT(run_toy(&t, &o) == DS_ERR_IO && strstr(ds_last_error(), "metrics.jsonl"));
  free(p);
}

static void test_zero_weight_step(void) {
  char d[512];
  dir_of(d, sizeof d, "zero-w");
  toy t;
  toy_data(&t);
  for (int i = 0; i < N_ITEMS; i++) t.w[i] = 0;
  ds_loop_options o = base_options(d);
  o.steps = 2;
  float p0[P];
  toy_init(&t, o.seed);
  memcpy(p0, t.p, sizeof p0);
  EXPECT_OK(run_toy(&t, &o));
  EXPECT(t.seen_zero_w);
  EXPECT(!memcmp(p0, t.p, sizeof p0)); /* nothing supervised: no update */
}

/* The ETA extrapolates this process's pace: a run resumed at step 10 of 20 that took 2 s for
 * its first 2 steps has 10 s to go (not 2 s, which dividing by the global step would say). */
static void test_progress_eta(void) {
  char buf[256] = {0};
  FILE *f = fmemopen(buf, sizeof buf, "w");
  if (!f) { EXPECT(0); return; }
  ds_progress_line(f, "step", 12, 20, 2, 2.0, 5.0, "tok/s", "loss 1.0");
  fclose(f);
  EXPECT(strstr(buf, "step 12/20 loss 1.0") != NULL);
  EXPECT(strstr(buf, "ETA 8s") != NULL);
  if (!strstr(buf, "ETA 8s")) fprintf(stderr, "  got: %s", buf);
}

int main(void) {
  const char *tmp = getenv("DSPARK_TEST_TMP") ? getenv("DSPARK_TEST_TMP") : "/tmp";
  snprintf(g_root, sizeof g_root, "%s/trainer-core", tmp);
  if (ds_mkdir_p(g_root) != DS_OK) return 1;
  ds_set_num_threads(1);
  TEST_RUN(test_global_denominator);
  TEST_RUN(test_resume_identical);
  TEST_RUN(test_run_directory);
  TEST_RUN(test_checkpoint_verification);
  TEST_RUN(test_nonfinite);
  TEST_RUN(test_metrics_recovery);
  TEST_RUN(test_zero_weight_step);
  TEST_RUN(test_progress_eta);
  return TEST_RESULT();
}

/* dspark capture: one pass of the target over the training sequences writes the DSpark
 * features and/or the sparse KD log-probs into a cache (include/dspark/cache.h), resumably.
 *
 * The sequences are exactly the trainer's (ds_dataset_load with the same seq_len, EOS and
 * minimum length) and each is run alone through a KV cache of capacity seq_len, as the online
 * trainer does, so an f32 cache holds the very bits online training computes.
 *
 * With several ranks (o->comm) the shards are split between them (capture_shards_ranks); the
 * files are the ones a single process writes. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "capture/capture_size.h"
#include "dspark/capture.h"
#include "dspark/kd_select.h"
#include "dspark/progress.h"
#include "dspark/dataset.h"
#include "dspark/draft.h"
#include "dspark/dtype.h"
#include "dspark/fileio.h"
#include "dspark/ggml_quant.h"
#include "dspark/safetensors.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"


void ds_capture_options_default(ds_capture_options *o) {
  memset(o, 0, sizeof *o);
  o->n_target_layers = 5;
  o->dtype = DS_BF16;
  o->seq_len = 512;
  o->shard_size = 64;
  o->features = 1;
  o->top_p = 1.0;
  o->temperature = 1.0;
  o->min_k = 1;
  o->enable_thinking = -1;
}

typedef struct {
  const ds_capture_options *o;
  ds_target *target;
  ds_tokenizer *tok;
  ds_dataset data;
  char *config_text, *tok_text;
  size_t config_len, tok_len;
  ds_cache_manifest m;
  ds_kv_cache *kv;
  int64_t S, d, md, K, V, n_shards_total;
  float *ctx, *last;          /* (S, m*d), (S, d): one sample, fp32 */
  float *logits, *scratch;    /* (DS_KD_TEACHER_ROWS, V) each */
  int32_t *kd_ids;            /* (S, K) */
  float *kd_lp;               /* (S, K) */
  ds_shard_buf buf[2];        /* shard k fills buf[k % 2] while shard k - 1 is written */
  /* seconds in the target (with the KD logits), in the KD selection, writing shards (in the
   * background) and waiting for those writes */
  double t_forward, t_select, t_write, t_wait;
  int64_t bytes_written;
  ds_cache_size size;         /* what the whole cache takes (ds_cache_estimate) */
  int weights_as_before;      /* the target holds its weights as a capture before --weights did */
} capture;

/* ---------------------------------------------------------------- setup */

/* A text of the source copied (the cache keeps its own copy of config.json and tokenizer.json). */
static ds_status copy_text(ds_model_source *src, ds_model_file f, char **text, size_t *len) {
  const char *t;
  DS_TRY(ds_model_source_text(src, f, 1, &t, len));
  *text = ds_malloc(*len + 1, ds_model_source_label(src, f));
  if (!*text) return DS_ERR_NOMEM;
  memcpy(*text, t, *len + 1);
  return DS_OK;
}

/* A frozen table [V, d] as target_weights.safetensors stores it: in the target's dtype (F32,
 * BF16, F16), a quantized one (--weights as-stored) dequantized to fp32, the exact values the
 * target multiplies by (a draft's replicas are never quantized). */
static ds_dtype table_dtype(ds_weight w) { return ds_dtype_is_quantized(w.dtype) ? DS_F32 : w.dtype; }

/* *out: w itself, or its fp32 values in *copy (the caller frees it with ds_free_aligned). */
static ds_status stored_table(ds_weight w, int64_t V, int64_t d, ds_weight *out, float **copy) {
  *out = w;
  *copy = NULL;
  if (!ds_dtype_is_quantized(w.dtype)) return DS_OK;
  float *f = ds_malloc_aligned((size_t)(V * d) * sizeof *f, "target_weights.safetensors");
  if (!f) return DS_ERR_NOMEM;
  size_t rb = ds_quant_row_bytes(w.dtype, d);
  for (int64_t r = 0; r < V; r++)
    ds_ggml_dequantize_row((uint32_t)ds_dtype_ggml_type(w.dtype), (const unsigned char *)w.data + (size_t)r * rb,
                           f + r * d, d);
  *out = (ds_weight){f, DS_F32};
  *copy = f;
  return DS_OK;
}

static ds_status load_inputs(capture *c, ds_model_source *src) {
  const ds_capture_options *o = c->o;
  DS_TRY(ds_model_source_check_positions(src, o->seq_len, "--seq-len"));
  /* an estimate needs no hash of the weights (it reads them all); the hash is taken from the
   * checkpoint the target loads */
  int hash = !o->forward_only && !o->estimate;
  DS_TRY(ds_target_load_source(src, ds_backend_cpu(), hash ? &c->m.target_weights_xxh64 : NULL, &c->target));
  const ds_model_config *tc = ds_target_config(c->target);
  /* how it holds its weights (--weights): the features are those of the target as it runs */
  snprintf(c->m.target_weights, sizeof c->m.target_weights, "%s",
           ds_weights_mode_name(ds_target_weights_held(c->target)));
  c->weights_as_before = ds_target_weights_as_before(c->target);
  DS_TRY(copy_text(src, DS_MODEL_CONFIG, &c->config_text, &c->config_len));
  DS_TRY(copy_text(src, DS_MODEL_TOKENIZER, &c->tok_text, &c->tok_len));
  DS_TRY(ds_tokenizer_load_memory(c->tok_text, c->tok_len, ds_model_source_label(src, DS_MODEL_TOKENIZER), &c->tok));
  DS_TRY(ds_target_check_tokenizer(tc, c->tok, ds_model_source_label(src, DS_MODEL_CONFIG),
                                   ds_model_source_label(src, DS_MODEL_TOKENIZER)));
  ds_status st;

  ds_cache_manifest *m = &c->m;
  m->format_version = DS_CACHE_FORMAT_VERSION;
  m->vocab_size = tc->vocab_size;
  m->hidden_size = tc->hidden_size;
  m->num_hidden_layers = tc->num_hidden_layers;
  snprintf(m->target_architecture, sizeof m->target_architecture, "%s", tc->architecture);
  /* The captured layers: the same default as `dspark train` (ds_draft_config_default). */
  if (o->n_explicit_layers) {
    m->n_layers = o->n_explicit_layers;
    memcpy(m->target_layer_ids, o->target_layer_ids, sizeof(int32_t) * (size_t)o->n_explicit_layers);
  } else {
    ds_draft_config dc;
    DS_TRY(ds_draft_config_default(tc, 1, o->n_target_layers, &dc));
    m->n_layers = dc.n_target_layers;
    memcpy(m->target_layer_ids, dc.target_layer_ids, sizeof(int32_t) * (size_t)dc.n_target_layers);
  }
  DS_TRY(ds_target_check_capture_layers(c->target, m->target_layer_ids, m->n_layers));
  DS_TRY(ds_kd_select_check(o->topk, 1, o->top_p, o->min_k, o->temperature, tc->vocab_size));

  m->eos_token_id = tc->n_eos ? tc->eos_token_ids[0] : -1;
  m->min_length = 2;
  ds_chat_template *tmpl = NULL;
  DS_TRY(ds_model_source_chat_template(src, o->chat_template, &tmpl));
  int thinking = o->enable_thinking;
  ds_data_options dopt = {.format = o->data_format, .skip_bad_lines = o->skip_bad_lines,
                          .max_line_bytes = o->max_line_bytes};
  st = ds_dataset_read(o->data_path, &dopt, c->tok, tmpl, thinking, o->seq_len, (int32_t)m->eos_token_id,
                       m->min_length, &c->data);
  /* the manifest names the template the sequences were rendered with (and enable_thinking) */
  snprintf(m->chat_template, sizeof m->chat_template, "%s",
           !tmpl ? DS_CACHE_CHAT_TEMPLATE : thinking < 0 ? "jinja" : thinking ? "jinja thinking" : "jinja no-thinking");
  m->chat_template_xxh64 = tmpl ? ds_chat_template_hash(tmpl) : ds_cache_hash_string(DS_CACHE_CHAT_TEMPLATE);
  ds_chat_template_free(tmpl);
  if (st != DS_OK) return st;
  m->dtype = o->dtype;
  m->seq_length = o->seq_len;
  m->num_samples = c->data.n_seqs;
  for (int64_t i = 0; i < c->data.n_seqs; i++) m->num_tokens += c->data.lengths[i];
  m->shard_size = o->shard_size;
  m->data_xxh64 = c->data.source_hash;
  m->target_config_xxh64 = XXH64(c->config_text, c->config_len, 0);
  m->tokenizer_xxh64 = XXH64(c->tok_text, c->tok_len, 0);
  m->seed = o->seed;
  m->features = o->features;
  m->kd_topk = o->topk;
  m->kd_top_p = o->topk ? o->top_p : 1.0;
  m->kd_min_k = o->topk ? o->min_k : 1;
  m->kd_temperature = o->topk ? o->temperature : 1.0;
  m->target_path = ds_malloc(strlen(o->target_dir) + 1, "path");
  m->data_path = ds_malloc(strlen(o->data_path) + 1, "path");
  if (!m->target_path || !m->data_path) return DS_ERR_NOMEM;
  strcpy(m->target_path, o->target_dir);
  strcpy(m->data_path, o->data_path);

  c->S = o->seq_len;
  c->d = tc->hidden_size;
  c->md = c->d * m->n_layers;
  c->K = o->topk;
  c->V = tc->vocab_size;
  c->n_shards_total = (m->num_samples + m->shard_size - 1) / m->shard_size;
  return ds_cache_estimate(m, table_dtype(ds_target_embed(c->target)), table_dtype(ds_target_lm_head(c->target)),
                           (int64_t)c->config_len, (int64_t)c->tok_len, &c->size);
}

static ds_status alloc_buffers(capture *c) {
  int64_t S = c->S, n = c->o->shard_size;
  DS_TRY(ds_kv_cache_new_typed(c->target, S, DS_F32, &c->kv)); /* a prefill's cache: fp32 */
  c->ctx = ds_malloc_aligned((size_t)(S * c->md) * sizeof(float), "captured features");
  c->last = ds_malloc_aligned((size_t)(S * c->d) * sizeof(float), "captured features");
  if (!c->ctx || !c->last) return DS_ERR_NOMEM;
  if (c->K) {
    c->logits = ds_malloc_aligned((size_t)(DS_KD_TEACHER_ROWS * c->V) * sizeof(float), "KD logits");
    c->scratch = ds_malloc_aligned((size_t)(DS_KD_TEACHER_ROWS * c->V) * sizeof(float), "KD scratch");
    c->kd_ids = ds_malloc((size_t)(S * c->K) * sizeof(int32_t), "KD ids");
    c->kd_lp = ds_malloc((size_t)(S * c->K) * sizeof(float), "KD log-probs");
    if (!c->logits || !c->scratch || !c->kd_ids || !c->kd_lp) return DS_ERR_NOMEM;
  }
  if (c->o->forward_only) return DS_OK;
  DS_TRY(ds_shard_buf_alloc(&c->buf[0], &c->m, n));
  if (c->n_shards_total > 1) DS_TRY(ds_shard_buf_alloc(&c->buf[1], &c->m, n));
  return DS_OK;
}

static void free_capture(capture *c) {
  ds_kv_cache_free(c->kv);
  ds_target_free(c->target);
  ds_tokenizer_free(c->tok);
  ds_dataset_free(&c->data);
  free(c->config_text);
  free(c->tok_text);
  ds_cache_manifest_free(&c->m);
  ds_free_aligned(c->ctx);
  ds_free_aligned(c->last);
  ds_free_aligned(c->logits);
  ds_free_aligned(c->scratch);
  free(c->kd_ids);
  free(c->kd_lp);
  ds_shard_buf_free(&c->buf[0]);
  ds_shard_buf_free(&c->buf[1]);
}

/* ---------------------------------------------------------------- one sample */

/* The target over sample i (alone, from position 0), then the KD selection of every row. */
static ds_status run_sample(capture *c, int64_t i) {
  int64_t len = c->data.lengths[i];
  double t0 = ds_time_sec();
  DS_TRY(ds_kv_cache_crop(c->kv, 0));
  ds_target_seq seq = {c->data.ids + i * c->S, len, c->kv};
  ds_target_outputs out = {c->m.target_layer_ids, c->m.n_layers, c->m.features ? c->ctx : NULL, c->last, NULL, 0, NULL};
  ds_status st = ds_target_forward(c->target, &seq, 1, &out);
  if (st == DS_OK) st = ds_target_check_finite(c->target, &out, len); /* never write a NaN into the cache */
  if (st != DS_OK) return ds_error_wrap(st, "%s: sample %lld", c->o->data_path, (long long)i);
  c->t_forward += ds_time_sec() - t0;
  if (c->K) /* the teacher's logits in the products a live teacher computes too (kd_select.h) */
    ds_kd_teacher_select(c->last, len, c->d, ds_target_lm_head(c->target), c->V, c->m.kd_temperature, c->K,
                         c->m.kd_top_p, c->m.kd_min_k, c->logits, c->scratch, c->o->forward_only ? NULL : c->kd_ids,
                         c->kd_lp, &c->t_forward, &c->t_select); /* the teacher's logits count as its forward */
  return DS_OK;
}

/* ---------------------------------------------------------------- files */

static ds_status write_manifest(capture *c) {
  char *text = ds_cache_manifest_json(&c->m), *path = ds_path_join(c->o->out_dir, "manifest.json");
  ds_status st = text && path ? ds_write_file_atomic(path, text, strlen(text)) : DS_FAIL(DS_ERR_NOMEM, "manifest");
  free(text);
  free(path);
  return st;
}

static ds_status write_target_weights(capture *c) {
  char *path = ds_path_join(c->o->out_dir, "target_weights.safetensors");
  ds_st_writer *w = NULL;
  ds_weight embed, head;
  float *embed_copy = NULL, *head_copy = NULL;
  ds_status st = path ? stored_table(ds_target_embed(c->target), c->V, c->d, &embed, &embed_copy) : DS_ERR_NOMEM;
  if (st == DS_OK && ds_target_lm_head(c->target).data == ds_target_embed(c->target).data) head = embed; /* tied */
  else if (st == DS_OK) st = stored_table(ds_target_lm_head(c->target), c->V, c->d, &head, &head_copy);
  if (st == DS_OK) st = ds_cache_target_weights_writer(embed, head, c->V, c->d, &w);
  if (st == DS_OK) st = ds_st_writer_write(w, path);
  if (st == DS_OK) st = ds_cache_hash_file(path, &c->m.target_weights_file_xxh64);
  ds_st_writer_free(w);
  ds_free_aligned(embed_copy);
  ds_free_aligned(head_copy);
  free(path);
  return st;
}

static ds_status write_copy(capture *c, const char *name, const char *text, size_t len) {
  char *path = ds_path_join(c->o->out_dir, name);
  ds_status st = path ? ds_write_file_atomic(path, text, len) : DS_ERR_NOMEM;
  free(path);
  return st;
}

/* ---------------------------------------------------------------- resume */

/* Reads an existing manifest: it must describe the same capture; keeps the contiguous prefix
 * of listed shards whose checksums verify. *done = 1 when the cache is already complete. */
/* 1 when the cache's copy `name` exists and hashes to `want`; else says it will be rewritten. */
static int copy_ok(const capture *c, const char *name, uint64_t want) {
  char *p = ds_path_join(c->o->out_dir, name);
  uint64_t h = 0;
  int ok = p && ds_cache_hash_file(p, &h) == DS_OK && h == want;
  free(p);
  if (!ok && !c->o->quiet) fprintf(stderr, "capture: %s in the cache is missing or changed: rewriting it\n", name);
  return ok;
}

static ds_status resume_state(capture *c, int64_t *kept, int *weights_ok, int *done) {
  *kept = 0;
  *weights_ok = *done = 0;
  char *path = ds_path_join(c->o->out_dir, "manifest.json"), *text = NULL;
  if (!path) return DS_ERR_NOMEM;
  if (!ds_file_exists(path)) { free(path); return DS_OK; }
  size_t len;
  ds_cache_manifest old;
  ds_status st = ds_read_file(path, &text, &len);
  if (st == DS_OK) st = ds_cache_manifest_parse(text, len, path, &old);
  free(text);
  if (st != DS_OK) {
    free(path);
    return ds_error_wrap(st, "cannot resume the capture in %s (use a new --out, or delete that directory)",
                         c->o->out_dir);
  }
  /* a cache from before --weights records none: it is resumed by a capture that holds the
   * weights as that one did */
  if (!old.target_weights[0] && c->weights_as_before)
    memcpy(old.target_weights, c->m.target_weights, sizeof old.target_weights);
  st = ds_cache_manifest_same_capture(&old, &c->m, path);
  free(path);
  if (st != DS_OK) {
    ds_cache_manifest_free(&old);
    return ds_error_wrap(st, "%s holds a different capture (use a new --out, or delete that directory)", c->o->out_dir);
  }
  for (int64_t i = 0; i < old.n_shards; i++) {
    char *p = ds_path_join(c->o->out_dir, old.shards[i].file);
    uint64_t h = 0;
    int ok = p && ds_file_exists(p) && ds_cache_hash_file(p, &h) == DS_OK && h == old.shards[i].xxh64;
    free(p);
    if (!ok) break;
    c->m.shards[i] = old.shards[i];
    (*kept)++;
  }
  if (old.target_weights_file_xxh64) {
    char *p = ds_path_join(c->o->out_dir, "target_weights.safetensors");
    uint64_t h = 0;
    *weights_ok = p && ds_file_exists(p) && ds_cache_hash_file(p, &h) == DS_OK && h == old.target_weights_file_xxh64;
    if (*weights_ok) c->m.target_weights_file_xxh64 = h;
    free(p);
  }
  /* the copies are verified too: "already complete" means every file of the cache checked */
  int copies_ok = copy_ok(c, "target_config.json", old.target_config_xxh64);
  copies_ok &= copy_ok(c, "tokenizer.json", old.tokenizer_xxh64);
  *done = old.complete && *kept == old.n_shards && *weights_ok && copies_ok;
  if (!c->o->quiet && *kept < old.n_shards)
    fprintf(stderr, "capture: shard %lld of the earlier run is missing or corrupt: rewriting from there\n",
            (long long)*kept);
  ds_cache_manifest_free(&old);
  ds_error_clear();
  return DS_OK;
}

/* ---------------------------------------------------------------- the loop */

/* Rewritten in place on a terminal after every sample; one line per shard otherwise. */
static void progress(const capture *c, int64_t done, int64_t first, double elapsed, double tokens, int shard_done) {
  int tty = isatty(fileno(stderr));
  if (c->o->quiet || tty == (shard_done != 0)) return; /* every sample on a terminal, every shard otherwise */
  char extra[64];
  snprintf(extra, sizeof extra, "(shard %lld/%lld)", (long long)((done + c->m.shard_size - 1) / c->m.shard_size),
           (long long)c->n_shards_total);
  ds_progress_line(stderr, "capture: sample", done, c->m.num_samples, done - first, elapsed,
                   elapsed > 0 ? tokens / elapsed : 0, "tok/s", extra);
}

static void summary(const capture *c, int64_t samples, double tokens, double loop_s, int64_t first_shard) {
  printf("{\"samples\": %lld, \"tokens\": %.0f, \"loop_s\": %.6f, \"forward_s\": %.6f, \"kd_select_s\": %.6f, "
         "\"write_s\": %.6f, \"write_wait_s\": %.6f, \"tokens_per_s\": %.3f, \"bytes\": %lld, \"resumed_from_shard\": %lld, "
         "\"forward_only\": %s, \"data_bad_lines_skipped\": %lld}\n",
         (long long)samples, tokens, loop_s, c->t_forward, c->t_select, c->t_write, c->t_wait, loop_s > 0 ? tokens / loop_s : 0.0,
         (long long)c->bytes_written, (long long)first_shard, c->o->forward_only ? "true" : "false",
         (long long)c->data.bad_lines);
  fflush(stdout);
}

static ds_status forward_only(capture *c) {
  double t0 = ds_time_sec(), tokens = 0;
  for (int64_t i = 0; i < c->m.num_samples; i++) {
    DS_TRY(run_sample(c, i));
    tokens += (double)c->data.lengths[i];
  }
  summary(c, c->m.num_samples, tokens, ds_time_sec() - t0, 0);
  return DS_OK;
}

/* ---------------------------------------------------------------- background shard writes */

/* Shard k is written (file, checksum, then the manifest listing it) by a thread while the
 * target computes shard k + 1; at most one write is in flight, so at most one shard of work
 * is lost to an error, and the manifest on disk always lists exactly the committed shards. */
typedef struct {
  capture *c;
  int64_t k, n;
  int busy;             /* started and not joined */
  pthread_t thread;
  ds_status st;
  char error[2048];     /* the writer thread's message */
  double seconds;
} shard_job;

static void *write_job(void *arg) {
  shard_job *j = arg;
  capture *c = j->c;
  double t0 = ds_time_sec();
  char name[32];
  ds_cache_shard_name(j->k, name, sizeof name);
  char *path = ds_path_join(c->o->out_dir, name);
  uint64_t h = 0;
  int64_t bytes = 0;
  ds_status st = path ? ds_shard_write(&c->buf[j->k % 2], &c->m, j->n, path, &h, &bytes) : DS_ERR_NOMEM;
  free(path);
  if (st == DS_OK) {
    ds_cache_shard_info *s = &c->m.shards[j->k];
    snprintf(s->file, sizeof s->file, "%s", name);
    s->num_samples = j->n;
    s->xxh64 = h;
    c->m.n_shards = j->k + 1;
    c->bytes_written += bytes;
    st = write_manifest(c);
  }
  if (st != DS_OK) snprintf(j->error, sizeof j->error, "%s", ds_last_error());
  j->st = st;
  j->seconds = ds_time_sec() - t0;
  return NULL;
}

static ds_status join_job(capture *c, shard_job *j) {
  if (!j->busy) return DS_OK;
  double t0 = ds_time_sec();
  pthread_join(j->thread, NULL);
  j->busy = 0;
  c->t_wait += ds_time_sec() - t0;
  c->t_write += j->seconds;
  return j->st == DS_OK ? DS_OK : DS_FAIL(j->st, "%s", j->error);
}

static void start_job(shard_job *j, int64_t k, int64_t n) {
  j->k = k;
  j->n = n;
  j->st = DS_OK;
  j->busy = pthread_create(&j->thread, NULL, write_job, j) == 0;
  if (!j->busy) write_job(j); /* no thread: write in place */
}

static ds_status resumable(ds_status st, const capture *c, int64_t kept_samples) {
  return ds_error_wrap(st,
                       "capture stopped by an error; the cache in %s is resumable (complete: false, %lld of %lld samples "
                       "safely written): fix the cause (e.g. free disk space) and rerun the same command",
                       c->o->out_dir, (long long)kept_samples, (long long)c->m.num_samples);
}

/* Computes shard k into buf[k % 2], then hands it to the writer once shard k - 1 is committed. */
static ds_status shard_loop(capture *c, shard_job *job, int64_t first_shard, double t0, double *tokens) {
  int64_t first_sample = first_shard * c->m.shard_size;
  for (int64_t k = first_shard; k < c->n_shards_total; k++) {
    int64_t base = k * c->m.shard_size, left = c->m.num_samples - base;
    int64_t n = left < c->m.shard_size ? left : c->m.shard_size;
    ds_shard_buf *b = &c->buf[k % 2];
    for (int64_t j = 0; j < n; j++) {
      int64_t i = base + j;
      DS_TRY(run_sample(c, i));
      DS_TRY(ds_shard_store(b, &c->m, j, c->data.lengths[i], c->data.ids + i * c->S, c->data.loss_mask + i * c->S,
                            c->ctx, c->last, c->kd_ids, c->kd_lp));
      *tokens += (double)c->data.lengths[i];
      progress(c, i + 1, first_sample, ds_time_sec() - t0, *tokens, 0);
    }
    ds_status st = join_job(c, job);
    if (st != DS_OK) return resumable(st, c, (k - 1) * c->m.shard_size);
    if (k > first_shard) progress(c, base, first_sample, ds_time_sec() - t0, *tokens, 1);
    if (c->o->throttle_ms > 0 && k > first_shard) {
      struct timespec ts = {c->o->throttle_ms / 1000, (c->o->throttle_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    start_job(job, k, n);
  }
  return DS_OK;
}

static ds_status capture_shards(capture *c, int64_t first_shard) {
  double t0 = ds_time_sec(), tokens = 0;
  shard_job job;
  memset(&job, 0, sizeof job);
  job.c = c;
  ds_status st = shard_loop(c, &job, first_shard, t0, &tokens);
  ds_status wst = join_job(c, &job); /* never leave the writer running */
  if (st != DS_OK) return st;
  if (wst != DS_OK) return resumable(wst, c, job.k * c->m.shard_size);
  progress(c, c->m.num_samples, first_shard * c->m.shard_size, ds_time_sec() - t0, tokens, 1);
  c->m.complete = 1;
  st = write_manifest(c);
  if (st != DS_OK) return resumable(st, c, c->m.num_samples);
  summary(c, c->m.num_samples - first_shard * c->m.shard_size, tokens, ds_time_sec() - t0, first_shard);
  return DS_OK;
}

/* ---------------------------------------------------------------- several ranks */

/* What a rank tells the others about the shard it wrote (k < 0: none this round). */
typedef struct {
  int64_t k, n, bytes;
  uint64_t xxh64;
} shard_note;

/* Rounds of `world` shards: shard first + q * world + r is rank r's. Each rank computes and
 * writes its own shard file, then every rank's note goes to all (one broadcast per rank) and
 * rank 0 lists the round's shards in the manifest, in order. The manifest lists a contiguous
 * prefix of committed shards, as with one process, so a failed job resumes with any number of
 * ranks. (No background writer here: each rank writes one shard per round.) */
static ds_status capture_shards_ranks(capture *c, int64_t first_shard) {
  ds_comm *comm = c->o->comm;
  int rank = ds_comm_rank(comm), world = ds_comm_size(comm);
  double t0 = ds_time_sec(), all_tokens = 0;
  for (int64_t round = first_shard; round < c->n_shards_total; round += world) {
    shard_note note = {-1, 0, 0, 0};
    int64_t k = round + rank;
    if (k < c->n_shards_total) {
      int64_t base = k * c->m.shard_size, left = c->m.num_samples - base;
      int64_t n = left < c->m.shard_size ? left : c->m.shard_size;
      for (int64_t j = 0; j < n; j++) {
        int64_t i = base + j;
        DS_TRY(run_sample(c, i));
        DS_TRY(ds_shard_store(&c->buf[0], &c->m, j, c->data.lengths[i], c->data.ids + i * c->S,
                              c->data.loss_mask + i * c->S, c->ctx, c->last, c->kd_ids, c->kd_lp));
      }
      char name[32];
      ds_cache_shard_name(k, name, sizeof name);
      char *path = ds_path_join(c->o->out_dir, name);
      double tw = ds_time_sec();
      ds_status st = path ? ds_shard_write(&c->buf[0], &c->m, n, path, &note.xxh64, &note.bytes) : DS_ERR_NOMEM;
      free(path);
      c->t_write += ds_time_sec() - tw;
      if (st != DS_OK) return resumable(st, c, round * c->m.shard_size);
      note.k = k;
      note.n = n;
    }
    for (int r = 0; r < world; r++) {
      shard_note got = note;
      DS_TRY(ds_comm_broadcast(comm, &got, sizeof got, r));
      if (got.k < 0) continue;
      ds_cache_shard_info *s = &c->m.shards[got.k];
      ds_cache_shard_name(got.k, s->file, sizeof s->file);
      s->num_samples = got.n;
      s->xxh64 = got.xxh64;
      c->m.n_shards = got.k + 1;
      c->bytes_written += got.bytes;
      for (int64_t i = got.k * c->m.shard_size; i < got.k * c->m.shard_size + got.n; i++)
        all_tokens += (double)c->data.lengths[i];
    }
    if (rank == 0) {
      ds_status st = write_manifest(c);
      if (st != DS_OK) return resumable(st, c, round * c->m.shard_size);
      int64_t done = c->m.n_shards * c->m.shard_size < c->m.num_samples ? c->m.n_shards * c->m.shard_size
                                                                        : c->m.num_samples;
      progress(c, done, first_shard * c->m.shard_size, ds_time_sec() - t0, all_tokens, 1);
    }
  }
  if (rank != 0) return DS_OK;
  c->m.complete = 1;
  ds_status st = write_manifest(c);
  if (st != DS_OK) return resumable(st, c, c->m.num_samples);
  summary(c, c->m.num_samples - first_shard * c->m.shard_size, all_tokens, ds_time_sec() - t0, first_shard);
  return DS_OK;
}

static ds_status prepare_locked(capture *c, int64_t *kept, int *done);

/* Rank 0 takes the lock and prepares the directory (resume state, copies, target weights) as
 * one process would; the others learn where to start from it. */
static ds_status run_capture_ranks(capture *c) {
  const ds_capture_options *o = c->o;
  int64_t start[2] = {0, 0}; /* the first shard to write, and whether the cache is complete */
  ds_dir_lock lock;
  int locked = 0;
  if (ds_comm_rank(o->comm) == 0) {
    DS_TRY(ds_mkdir_p(o->out_dir));
    DS_TRY(ds_dir_lock_acquire(o->out_dir, "cache", &lock));
    locked = 1;
    int done = 0;
    ds_status st = prepare_locked(c, &start[0], &done);
    start[1] = done;
    if (st != DS_OK) {
      ds_dir_unlock(&lock);
      return st;
    }
  }
  ds_status st = ds_comm_broadcast(o->comm, start, sizeof start, 0);
  if (st == DS_OK && !start[1]) st = capture_shards_ranks(c, start[0]);
  if (locked) ds_dir_unlock(&lock);
  return st;
}

static ds_status capture_locked(capture *c);

static ds_status run_capture(capture *c) {
  const ds_capture_options *o = c->o;
  ds_model_source *src;
  DS_TRY(ds_model_source_open(o->target_dir, &src));
  ds_status loaded = load_inputs(c, src);
  ds_model_source_close(src);
  DS_TRY(loaded);
  if (o->estimate) { /* nothing allocated, created or written */
    capture_print_estimate(&c->size, &c->m, o->out_dir, o->quiet);
    return DS_OK;
  }
  DS_TRY(alloc_buffers(c));
  if (o->forward_only) return forward_only(c);
  c->m.shards = ds_calloc((size_t)c->n_shards_total + 1, sizeof *c->m.shards, "manifest shards");
  if (!c->m.shards) return DS_ERR_NOMEM;
  /* A new cache is checked before its directory is created (a resumed one, under the lock,
   * against what is still to be written: prepare_locked). */
  char *manifest = ds_path_join(o->out_dir, "manifest.json");
  int fresh = manifest && !ds_file_exists(manifest);
  free(manifest);
  if (fresh && !o->no_space_check) DS_TRY(capture_check_space(&c->size, o->out_dir, 0, 0));
  if (ds_comm_size(o->comm) > 1) return run_capture_ranks(c);
  DS_TRY(ds_mkdir_p(o->out_dir));
  /* One writer per cache: a second capture into the directory is refused by name (it would
   * mix files, and its stale-temp cleanup would delete this one's live temp files). */
  ds_dir_lock lock;
  DS_TRY(ds_dir_lock_acquire(o->out_dir, "cache", &lock));
  ds_status st = capture_locked(c);
  ds_dir_unlock(&lock);
  return st;
}

/* run_capture's part under the cache's lock. */
static ds_status capture_locked(capture *c) {
  int64_t kept;
  int done;
  DS_TRY(prepare_locked(c, &kept, &done));
  return done ? DS_OK : capture_shards(c, kept);
}

/* Under the lock, before any shard: the resume state, the manifest and the copies. *kept is
 * the first shard to write; *done says the cache is already complete (and said so). */
static ds_status prepare_locked(capture *c, int64_t *kept_out, int *done_out) {
  const ds_capture_options *o = c->o;
  DS_TRY(ds_remove_stale_temps(o->out_dir, NULL)); /* no live writer owns one: we hold the lock */
  int64_t kept;
  int weights_ok, done;
  DS_TRY(resume_state(c, &kept, &weights_ok, &done));
  *kept_out = kept;
  *done_out = done;
  /* before the first file: what is still to be written must fit (with several ranks, only the
   * check before the directory is made: every rank makes it alike, none waits for a refusal) */
  if (!done && !o->no_space_check && ds_comm_size(o->comm) == 1)
    DS_TRY(capture_check_space(&c->size, o->out_dir, kept, weights_ok));
  if (done) {
    if (!o->quiet)
      fprintf(stderr, "capture: %s is already complete (every checksum verified: the manifest, every shard, "
              "target_weights.safetensors, target_config.json, tokenizer.json)\n", o->out_dir);
    summary(c, 0, 0, 0, kept);
    return DS_OK;
  }
  c->m.n_shards = kept;
  if (!o->quiet && kept)
    fprintf(stderr, "capture: resuming %s at shard %lld of %lld\n", o->out_dir, (long long)kept,
            (long long)c->n_shards_total);
  ds_status st = write_manifest(c);
  if (st == DS_OK) st = write_copy(c, "target_config.json", c->config_text, c->config_len);
  if (st == DS_OK) st = write_copy(c, "tokenizer.json", c->tok_text, c->tok_len);
  if (st == DS_OK && !weights_ok) st = write_target_weights(c);
  if (st == DS_OK) st = write_manifest(c);
  if (st != DS_OK) return resumable(st, c, kept * c->m.shard_size);
  return DS_OK;
}

ds_status ds_capture_run(const ds_capture_options *o) {
  if (!o->target_dir || !o->data_path || !o->out_dir)
    return DS_FAIL(DS_ERR_ARG, "capture: the target, the data and the output directory are required");
  if (!o->features && o->topk <= 0)
    return DS_FAIL(DS_ERR_ARG, "capture: --no-features without --topk would capture nothing");
  if (o->dtype != DS_BF16 && o->dtype != DS_F16 && o->dtype != DS_F32 && o->dtype != DS_I8)
    return DS_FAIL(DS_ERR_ARG, "capture: dtype must be bf16, f16, f32 or int8");
  if (o->dtype == DS_I8 && !o->features)
    return DS_FAIL(DS_ERR_ARG, "capture: --dtype int8 quantizes the features; a cache without features (--no-features) "
                   "keeps its KD log-probs in bf16, f16 or f32: give one of those");
  if (o->seq_len < 2 || o->shard_size < 1 || o->seed > (UINT64_C(1) << 53))
    return DS_FAIL(DS_ERR_ARG, "capture: invalid option (seq_len >= 2, shard_size >= 1, seed <= 2^53)");
  DS_TRY(ds_kd_select_check(o->topk, 1, o->top_p, o->min_k, o->temperature, 0));
  if (o->threads > 0) ds_set_num_threads(o->threads);
  capture c;
  memset(&c, 0, sizeof c);
  c.o = o;
  ds_status st = run_capture(&c);
  free_capture(&c);
  return st;
}

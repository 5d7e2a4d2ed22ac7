/* The draft objective's offline feature source: the cache checked strictly against the run,
 * its sequences and frozen tables in place of the target's, and the features streamed by a
 * prefetch thread in exactly the order the training loop will ask for them (the trainer
 * core's plan, ds_trainer_plan_next, replays the loop's order from where this process
 * begins: evaluations, then the batch sequences of each step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/draft.h"
#include "dspark/fileio.h"
#include "dspark/model_source.h"
#include "dspark/progress.h"
#include "train/draft_objective_internal.h"

/* ---------------------------------------------------------------- setup */


static void ids_text(const int32_t *ids, int n, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && at < cap; i++) at += (size_t)snprintf(buf + at, cap - at, "%s%d", i ? "," : "", ids[i]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* --draft-vocab from a cache: the ids the capture's chat template emits in an assistant turn.
 * The manifest names the template (ChatML, or a Jinja text by its hash) but does not hold its
 * text: a Jinja template is taken from --target (or the capture's recorded target path, when it
 * still holds the same template) and used only when its hash is the manifest's; otherwise S
 * gets the stop / eos ids alone, and stderr says so. */
static ds_status cache_template_ids(draft_run *t, const ds_cache_manifest *m) {
  const ds_draft_train_options *o = t->o;
  /* the enable_thinking the capture rendered with (capture.c names it), not this run's */
  int thinking;
  if (!strcmp(m->chat_template, "jinja")) thinking = -1;
  else if (!strcmp(m->chat_template, "jinja thinking")) thinking = 1;
  else if (!strcmp(m->chat_template, "jinja no-thinking")) thinking = 0;
  else return ds_draft_run_template_ids(t, NULL, -1); /* ChatML */
  const char *dirs[2] = {o->target_dir, m->target_path};
  for (int i = 0; i < 2; i++) {
    int exists = 0;
    if (!dirs[i] || ds_path_probe(dirs[i], &exists) != DS_OK || !exists) continue;
    /* a model directory or a GGUF file (whose template is in its metadata) */
    ds_model_source *src = NULL;
    ds_chat_template *tmpl = NULL;
    if (ds_model_source_open(dirs[i], &src) != DS_OK ||
        ds_model_source_chat_template(src, o->chat_template, &tmpl) != DS_OK || !tmpl) {
      ds_chat_template_free(tmpl);
      ds_model_source_close(src);
      ds_error_clear();
      continue;
    }
    ds_status st = DS_OK;
    int same = ds_chat_template_hash(tmpl) == m->chat_template_xxh64;
    if (same) st = ds_draft_run_template_ids(t, tmpl, thinking);
    ds_chat_template_free(tmpl);
    ds_model_source_close(src);
    if (same) return st;
  }
  ds_note("--draft-vocab: the cache's chat template (Jinja, xxh64 %016llx) is not at hand (pass --target with the "
          "captured model): the draft vocabulary holds the stop / eos ids but not the template's own assistant-turn ids",
          (unsigned long long)m->chat_template_xxh64);
  return DS_OK;
}

ds_status ds_draft_cache_setup(draft_run *t) {
  ds_draft_train_options *o = &t->opt;
  ds_cache_expect e;
  ds_cache_expect_any(&e);
  e.need_features = 1;
  if (o->seq_len > 0) e.seq_length = o->seq_len;
  if (o->n_explicit_layers) {
    e.n_layers = o->n_explicit_layers;
    memcpy(e.layer_ids, o->target_layer_ids, sizeof(int32_t) * (size_t)o->n_explicit_layers);
  }
  char *tok_text = NULL;
  size_t tok_len = 0, len;
  snprintf(t->config_label, sizeof t->config_label, "%s/target_config.json", o->cache_dir);
  snprintf(t->tokenizer_label, sizeof t->tokenizer_label, "%s/tokenizer.json", o->cache_dir);
  if (o->target_dir) { /* the target named too (a directory or a GGUF file): it must be the captured one */
    ds_model_source *src;
    DS_TRY(ds_model_source_open(o->target_dir, &src));
    const char *text = NULL;
    ds_status st = ds_model_source_weights_hash(src, &e.target_weights_xxh64);
    if (st == DS_OK) st = ds_draft_target_texts(t, src);
    if (st == DS_OK) st = ds_model_source_text(src, DS_MODEL_TOKENIZER, 1, &text, &tok_len);
    if (st == DS_OK && (tok_text = ds_malloc(tok_len + 1, t->tokenizer_label))) memcpy(tok_text, text, tok_len + 1);
    else if (st == DS_OK) st = DS_ERR_NOMEM;
    ds_model_source_close(src);
    if (st != DS_OK) return st;
    e.target_config_xxh64 = t->config_xxh64;
    e.tokenizer_xxh64 = t->tokenizer_xxh64;
    e.check_weights = e.check_config = e.check_tokenizer = 1;
  }
  if (o->data_path) {
    DS_TRY(ds_data_hash(o->data_path, o->max_line_bytes, &e.data_xxh64));
    e.check_data = 1;
  }
  ds_status st = ds_cache_open(o->cache_dir, &e, &t->fc);
  if (st != DS_OK) {
    free(tok_text);
    return st;
  }
  const ds_cache_manifest *m = ds_cache_get_manifest(t->fc);
  if (!t->target_config) st = ds_cache_read_target_config(t->fc, &t->target_config, &len);
  if (st == DS_OK && !tok_text) st = ds_cache_read_tokenizer(t->fc, &tok_text, &tok_len);
  if (st == DS_OK) st = ds_tokenizer_load_memory(tok_text, tok_len, t->tokenizer_label, &t->tok);
  free(tok_text);
  if (st != DS_OK) return st;

  /* The cache's shapes must be the target config's. */
  ds_model_config tc;
  DS_TRY(ds_config_parse(t->target_config, strlen(t->target_config), t->config_label, &tc));
  if (tc.vocab_size != m->vocab_size || tc.hidden_size != m->hidden_size || tc.num_hidden_layers != m->num_hidden_layers)
    return DS_FAIL(DS_ERR_FORMAT, "%s: manifest sizes (vocab %lld, hidden %lld, layers %lld) disagree with the target "
                   "config.json (vocab %lld, hidden %lld, layers %lld)", o->cache_dir, (long long)m->vocab_size,
                   (long long)m->hidden_size, (long long)m->num_hidden_layers, (long long)tc.vocab_size,
                   (long long)tc.hidden_size, (long long)tc.num_hidden_layers);
  /* Layers: explicit ids were checked at open; a count must give the cache's ids; none = the cache's. */
  if (!o->n_explicit_layers && o->n_target_layers > 0) {
    ds_draft_config dc;
    DS_TRY(ds_draft_config_default(&tc, 1, o->n_target_layers, &dc));
    if (dc.n_target_layers != m->n_layers ||
        memcmp(dc.target_layer_ids, m->target_layer_ids, sizeof(int32_t) * (size_t)m->n_layers)) {
      char a[512], b[512];
      ids_text(m->target_layer_ids, m->n_layers, a, sizeof a);
      ids_text(dc.target_layer_ids, dc.n_target_layers, b, sizeof b);
      return DS_FAIL(DS_ERR_ARG, "%s/manifest.json: field 'target_layer_ids' is %s in the cache but %s in this run "
                     "(--target-layers %d)", o->cache_dir, a, b, o->n_target_layers);
    }
  }
  o->n_explicit_layers = m->n_layers;
  memcpy(o->target_layer_ids, m->target_layer_ids, sizeof(int32_t) * (size_t)m->n_layers);
  o->n_target_layers = m->n_layers;
  o->seq_len = m->seq_length;
  t->cfg_target = m->target_path;
  t->cfg_data = m->data_path;
  t->feature_dtype = m->dtype == DS_F32 ? NULL : ds_cache_dtype_label(m->dtype);
  snprintf(t->cache_weights, sizeof t->cache_weights, "%s", m->target_weights);
  t->weights_xxh64 = m->target_weights_xxh64; /* as the online run computes them */
  t->config_xxh64 = m->target_config_xxh64;
  t->tokenizer_xxh64 = m->tokenizer_xxh64;
  DS_TRY(ds_cache_take_tokens(t->fc, &t->data));
  if (o->draft_vocab > 0) DS_TRY(cache_template_ids(t, m));
  /* The frozen tables: a resumed run takes them from its checkpoint instead, but for the
   * teacher of a reduced vocabulary, the target's whole lm_head, which no draft holds. */
  char *ck = ds_path_join(o->loop.out_dir, "checkpoint.safetensors");
  int resuming = 0;
  ds_status st2 = ck ? (o->loop.resume ? ds_path_probe(ck, &resuming) : DS_OK) : DS_ERR_NOMEM;
  free(ck);
  if (st2 != DS_OK) return st2;
  if (!resuming || o->draft_vocab > 0) DS_TRY(ds_cache_load_target_weights(t->fc, &t->embed, &t->lm_head));
  if (resuming) { /* the checkpoint holds the draft's embedding */
    ds_free_aligned((void *)t->embed.data);
    t->embed = (ds_weight){NULL, DS_F32};
  }
  return DS_OK;
}

/* ---------------------------------------------------------------- the stream */

static ds_status top_up(draft_run *t) {
  int64_t idx;
  while (ds_cache_stream_space(t->stream) > 0 && ds_trainer_plan_next(&t->plan, &idx))
    DS_TRY(ds_cache_stream_push(t->stream, idx));
  return DS_OK;
}

ds_status ds_draft_cache_start(draft_run *t) {
  const ds_cache_manifest *m = ds_cache_get_manifest(t->fc);
  int64_t n = t->data.n_seqs, S = m->seq_length, d = m->hidden_size, md = d * m->n_layers;
  if (t->o->cache_preload) {
    t->pre_ctx = ds_malloc_aligned((size_t)(n * S * md) * sizeof(float), "preloaded features");
    t->pre_last = ds_malloc_aligned((size_t)(n * S * d) * sizeof(float), "preloaded features");
    if (!t->pre_ctx || !t->pre_last) return DS_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++)
      DS_TRY(ds_cache_read_sample(t->fc, i, t->pre_ctx + i * S * md, t->pre_last + i * S * d, NULL, NULL));
    return DS_OK;
  }
  DS_TRY(ds_trainer_plan_begin(t->core, &t->plan));
  int depth = t->o->cache_prefetch >= 2 ? t->o->cache_prefetch : 2;
  DS_TRY(ds_cache_stream_start(t->fc, depth, 0, &t->stream));
  return top_up(t);
}

ds_status ds_draft_cache_features(draft_run *t, int64_t idx) {
  if (t->pre_ctx) {
    const ds_cache_manifest *m = ds_cache_get_manifest(t->fc);
    int64_t S = m->seq_length, d = m->hidden_size;
    t->cur_ctx = t->pre_ctx + idx * S * d * m->n_layers;
    t->cur_last = t->pre_last + idx * S * d;
    return DS_OK;
  }
  ds_cache_sample s;
  DS_TRY(ds_cache_stream_next(t->stream, &s));
  if (s.index != idx)
    return DS_FAIL(DS_ERR_INTERNAL, "cache stream out of order: the loop wants sample %lld, the plan gave %lld",
                   (long long)idx, (long long)s.index);
  t->cur_ctx = s.ctx;
  t->cur_last = s.last;
  return top_up(t);
}

void ds_draft_cache_free(draft_run *t) {
  ds_cache_stream_free(t->stream);
  t->stream = NULL;
  ds_cache_close(t->fc);
  t->fc = NULL;
  ds_trainer_plan_free(&t->plan);
  ds_free_aligned(t->pre_ctx);
  ds_free_aligned(t->pre_last);
  ds_free_aligned((void *)t->embed.data);
  ds_free_aligned((void *)t->lm_head.data);
}

/* The causal-LM objectives' setup (include/dspark/lm_trainer.h): the student's shapes, the
 * tokenizer, the data (a corpus packed as `dspark train` packs it, or an offline KD cache's
 * sequences), the live teacher, every option checked naming it, train_config (content hashes,
 * so a moved file resumes and a changed one is refused), buffers and the cache stream. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/json_util.h"
#include "dspark/fileio.h"
#include "dspark/kd_select.h"
#include "train/lm_objective_internal.h"

static ds_status read_text(const char *path, char **text, size_t *len) { return ds_read_file(path, text, len); }

static void add_hex(cJSON *j, const char *key, uint64_t h) {
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  cJSON_AddStringToObject(j, key, hex);
}


/* The student's config (shapes) before the model exists: a fresh config, or the model's (a
 * directory or a GGUF file); label names that config in messages. */
static ds_status student_shapes(lm_run *t, ds_model_config *sc, uint64_t *source_hash, char *label, size_t cap) {
  const ds_lm_train_options *o = t->o;
  if (!o->student_dir == !o->student_config)
    return DS_FAIL(DS_ERR_ARG, "give exactly one of --student DIR and --student-config FILE");
  size_t len;
  if (o->student_config) {
    snprintf(label, cap, "%s", o->student_config);
    DS_TRY(read_text(o->student_config, &t->student_json, &len));
    *source_hash = XXH64(t->student_json, len, 0);
    return ds_config_parse(t->student_json, len, o->student_config, sc);
  }
  ds_model_source *src;
  DS_TRY(ds_model_source_open(o->student_dir, &src));
  const char *text;
  snprintf(label, cap, "%s", ds_model_source_label(src, DS_MODEL_CONFIG));
  ds_status st = ds_model_source_text(src, DS_MODEL_CONFIG, 1, &text, &len);
  if (st == DS_OK) st = ds_config_parse(text, len, label, sc);
  if (st == DS_OK) st = ds_model_source_weights_hash(src, source_hash);
  ds_model_source_close(src);
  return st;
}

/* The tokenizer (and, without a cache, the chat template) of a model: a directory or a GGUF
 * file. With required = 0, a model without tokenizer.json leaves *found 0. */
static ds_status tokenizer_of_model(lm_run *t, const char *model, int required, int *found) {
  const ds_lm_train_options *o = t->o;
  ds_model_source *src;
  DS_TRY(ds_model_source_open(model, &src));
  const char *text = NULL;
  ds_status st = ds_model_source_text(src, DS_MODEL_TOKENIZER, required, &text, &t->tok_len);
  *found = text != NULL;
  if (st == DS_OK && text && !(t->tok_text = ds_malloc(t->tok_len + 1, "tokenizer.json"))) st = DS_ERR_NOMEM;
  if (st == DS_OK && text) {
    memcpy(t->tok_text, text, t->tok_len + 1);
    st = ds_tokenizer_load_memory(t->tok_text, t->tok_len, ds_model_source_label(src, DS_MODEL_TOKENIZER), &t->tok);
  }
  /* chat data is rendered with --chat-template, else the template that ships with this tokenizer */
  if (st == DS_OK && text && !t->fc) st = ds_model_source_chat_template(src, o->chat_template, &t->chat);
  ds_model_source_close(src);
  return st;
}

static ds_status load_tokenizer(lm_run *t) {
  const ds_lm_train_options *o = t->o;
  int found = 0;
  if (!o->tokenizer_path && o->student_dir) { /* the student's own, else the teacher's */
    DS_TRY(tokenizer_of_model(t, o->student_dir, !o->teacher_dir, &found));
    if (!found) DS_TRY(tokenizer_of_model(t, o->teacher_dir, 1, &found));
    return DS_OK;
  }
  if (!o->tokenizer_path && t->fc) {
    char *path = ds_path_join(o->cache_dir, "tokenizer.json");
    ds_status st = path ? ds_cache_read_tokenizer(t->fc, &t->tok_text, &t->tok_len) : DS_ERR_NOMEM;
    if (st == DS_OK) st = ds_tokenizer_load_memory(t->tok_text, t->tok_len, path, &t->tok);
    free(path);
    return st;
  }
  if (!o->tokenizer_path && o->teacher_dir) return tokenizer_of_model(t, o->teacher_dir, 1, &found);
  if (!o->tokenizer_path) return DS_FAIL(DS_ERR_ARG, "no tokenizer: pass --tokenizer tokenizer.json");
  const char *path = o->tokenizer_path;
  DS_TRY(read_text(path, &t->tok_text, &t->tok_len));
  DS_TRY(ds_tokenizer_load_memory(t->tok_text, t->tok_len, path, &t->tok));
  /* chat data is rendered with --chat-template, else the template that ships beside this tokenizer */
  return t->fc ? DS_OK : ds_chat_template_load(path, o->chat_template, &t->chat);
}

static ds_status open_cache(lm_run *t, const ds_model_config *sc) {
  const ds_lm_train_options *o = t->o;
  ds_cache_expect e;
  ds_cache_expect_any(&e);
  e.need_kd = 1;
  if (o->seq_len > 0) e.seq_length = o->seq_len;
  e.vocab_size = sc->vocab_size;
  if (o->teacher_dir) {
    ds_model_source *src;
    DS_TRY(ds_model_source_open(o->teacher_dir, &src));
    ds_status st = ds_model_source_weights_hash(src, &e.target_weights_xxh64);
    ds_model_source_close(src);
    DS_TRY(st);
    e.check_weights = 1;
  }
  if (o->data_path) {
    DS_TRY(ds_data_hash(o->data_path, o->max_line_bytes, &e.data_xxh64));
    e.check_data = 1;
  }
  DS_TRY(ds_cache_open(o->cache_dir, &e, &t->fc));
  const ds_cache_manifest *m = ds_cache_get_manifest(t->fc);
  if (t->cfg.top_k == 0)
    return DS_FAIL(DS_ERR_ARG, "--topk 0 (the dense KL) needs the live teacher (--teacher), not a cache");
  if (t->cfg.top_k > m->kd_topk)
    return DS_FAIL(DS_ERR_ARG, "%s/manifest.json: field 'kd.topk' is %lld in the cache but this run asks --topk %lld; "
                   "capture again with --topk %lld or ask for fewer", o->cache_dir, (long long)m->kd_topk,
                   (long long)t->cfg.top_k, (long long)t->cfg.top_k);
  if (m->kd_temperature != t->cfg.temperature)
    return DS_FAIL(DS_ERR_ARG, "%s/manifest.json: field 'kd.temperature' is %g in the cache but this run asks "
                   "--temperature %g (the cached log-probs are at the capture's temperature)", o->cache_dir,
                   m->kd_temperature, t->cfg.temperature);
  t->k_stride = m->kd_topk;
  t->opt.seq_len = m->seq_length;
  return ds_cache_take_tokens(t->fc, &t->data);
}

/* How the teacher held its weights (the live one's, or the cache's capture's: provenance, as the
 * cache's other capture settings; "" when a cache from before --weights records none), and
 * whether train_config carries it: a live teacher held otherwise than before --weights, so a run
 * is never resumed on a teacher held otherwise; run.json names it in every other case, and older
 * runs resume. */
typedef struct {
  const char *mode;
  int in_config;
} teacher_weights;

static ds_status config_texts(lm_run *t, uint64_t student_hash, uint64_t teacher_hash, teacher_weights tw) {
  const ds_lm_train_options *o = t->o;
  cJSON *j = cJSON_CreateObject();
  if (!j) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  cJSON_AddStringToObject(j, "objective", o->distill ? "distill" : "pretrain");
  add_hex(j, o->student_dir ? "student_weights_xxh64" : "student_config_xxh64", student_hash);
  add_hex(j, "tokenizer_xxh64", XXH64(t->tok_text, t->tok_len, 0));
  add_hex(j, "data_xxh64", t->data.source_hash);
  add_hex(j, "sequences_xxh64", ds_dataset_hash(&t->data));
  if (o->distill) add_hex(j, "teacher_weights_xxh64", teacher_hash);
  if (tw.in_config) cJSON_AddStringToObject(j, "teacher_weights", tw.mode);
  cJSON_AddNumberToObject(j, "seq_len", (double)t->opt.seq_len);
  cJSON_AddNumberToObject(j, "eval_seqs", (double)o->eval_seqs);
  cJSON_AddNumberToObject(j, "kd_loss_alpha", t->cfg.kd_loss_alpha);
  if (o->distill) {
    cJSON_AddNumberToObject(j, "temperature", t->cfg.temperature);
    cJSON_AddNumberToObject(j, "topk", (double)t->cfg.top_k);
    cJSON_AddNumberToObject(j, "top_p", t->cfg.top_p);
    cJSON_AddNumberToObject(j, "min_k", (double)t->cfg.min_k);
    cJSON_AddBoolToObject(j, "reverse", t->cfg.reverse);
    if (t->cfg.no_ghost) cJSON_AddBoolToObject(j, "no_ghost", 1); /* absent when off: older runs resume */
  }
  if (t->n_inter) { /* the pairs define the trajectory (and the checkpoint's projections) */
    cJSON *pairs = cJSON_AddArrayToObject(j, "intermediate");
    for (int i = 0; pairs && i < t->n_inter; i++) {
      char spec[96];
      const ds_kd_inter_pair *p = &o->intermediate[i];
      snprintf(spec, sizeof spec, "%lld:%lld:%s", (long long)p->student_layer, (long long)p->teacher_layer,
               ds_kd_inter_kind_name(p->kind));
      cJSON_AddItemToArray(pairs, cJSON_CreateString(spec));
    }
  }
  cJSON_AddNumberToObject(j, "chunk_rows", (double)t->cfg.chunk_rows);
  t->train_config = cJSON_Print(j);
  cJSON_Delete(j);
  j = cJSON_CreateObject();
  if (j) {
    cJSON_AddStringToObject(j, "student", o->student_dir ? o->student_dir : o->student_config);
    if (o->teacher_dir) cJSON_AddStringToObject(j, "teacher", o->teacher_dir);
    if (!tw.in_config && tw.mode[0]) cJSON_AddStringToObject(j, "teacher_weights", tw.mode);
    if (o->cache_dir) cJSON_AddStringToObject(j, "cache", o->cache_dir);
    if (o->data_path) cJSON_AddStringToObject(j, "data", o->data_path);
    if (o->data_path && o->skip_bad_lines) /* how many lines the sequences lack */
      cJSON_AddNumberToObject(j, "data_bad_lines_skipped", (double)t->data.bad_lines);
    if (o->data_path) { /* what renders the data's conversations */
      char desc[600];
      if (t->chat)
        snprintf(desc, sizeof desc, "%s (xxh64 %016llx)", ds_chat_template_label(t->chat),
                 (unsigned long long)ds_chat_template_hash(t->chat));
      else
        snprintf(desc, sizeof desc, "ChatML");
      cJSON_AddStringToObject(j, "chat_template", desc);
    }
  }
  t->run_info = j ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  return t->train_config && t->run_info ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "out of memory");
}

ds_status ds_lm_setup(lm_run *t) {
  const ds_lm_train_options *o = t->o;
  ds_model_config sc;
  uint64_t student_hash = 0, teacher_hash = 0;
  teacher_weights tw = {"", 0};
  char student_label[1100];
  DS_TRY(student_shapes(t, &sc, &student_hash, student_label, sizeof student_label));
  t->V = sc.vocab_size;
  t->d = sc.hidden_size;
  /* --topk is the user's here (the cache's or the teacher's K is checked against it below) */
  DS_TRY(ds_kd_select_check(t->cfg.top_k, 1, t->cfg.top_p, t->cfg.min_k, t->cfg.temperature, t->V));
  DS_TRY(ds_kd_loss_config_check(&t->cfg, t->V));
  if (o->distill && !o->teacher_dir && !o->cache_dir)
    return DS_FAIL(DS_ERR_ARG, "distill needs the teacher: --teacher DIR or --cache CACHE");
  if (!o->distill && (o->teacher_dir || o->cache_dir || t->cfg.kd_loss_alpha != 0))
    return DS_FAIL(DS_ERR_ARG, "pretrain trains the LM loss alone: use `dspark distill` for a teacher");
  if (o->cache_dir && (o->chat_template || o->enable_thinking >= 0))
    return DS_FAIL(DS_ERR_ARG, "--chat-template / --enable-thinking apply to --data: the cache %s brings its "
                   "sequences already rendered", o->cache_dir);
  if (o->cache_dir) {
    DS_TRY(open_cache(t, &sc));
    teacher_hash = ds_cache_get_manifest(t->fc)->target_weights_xxh64;
    tw.mode = ds_cache_get_manifest(t->fc)->target_weights;
    t->data_label = o->cache_dir;
  }
  if (o->teacher_dir && !o->cache_dir) {
    ds_model_source *src;
    DS_TRY(ds_model_source_open(o->teacher_dir, &src));
    ds_status st = ds_model_source_check_positions(src, o->seq_len, "--seq-len"); /* before the weights */
    if (st == DS_OK) st = ds_target_load_source(src, ds_backend_cpu(), &teacher_hash, &t->teacher);
    ds_model_source_close(src);
    DS_TRY(st);
    tw.mode = ds_weights_mode_name(ds_target_weights_held(t->teacher));
    tw.in_config = !ds_target_weights_as_before(t->teacher);
    const ds_model_config *tc = ds_target_config(t->teacher);
    if (tc->vocab_size != t->V)
      return DS_FAIL(DS_ERR_ARG, "the teacher %s has a vocabulary of %lld, the student %lld: they must share it",
                     o->teacher_dir, (long long)tc->vocab_size, (long long)t->V);
  }
  DS_TRY(ds_lm_inter_setup(t, &sc));
  DS_TRY(load_tokenizer(t));
  DS_TRY(ds_target_check_tokenizer(&sc, t->tok, student_label, "the tokenizer"));
  if (!o->cache_dir) {
    if (!o->data_path) return DS_FAIL(DS_ERR_ARG, "training needs --data (or --cache)");
    DS_TRY(ds_config_check_positions(&sc, student_label, o->seq_len, "--seq-len"));
    int32_t eos = sc.n_eos ? (int32_t)sc.eos_token_ids[0] : -1;
    ds_data_options dopt = {.format = o->data_format, .skip_bad_lines = o->skip_bad_lines,
                            .max_line_bytes = o->max_line_bytes};
    DS_TRY(ds_dataset_read(o->data_path, &dopt, t->tok, t->chat, o->enable_thinking, o->seq_len, eos, 2, &t->data));
    t->data_label = o->data_path;
  }
  if (o->eval_seqs >= t->data.n_seqs)
    return DS_FAIL(DS_ERR_ARG, "--eval-seqs %lld leaves no training sequence: %s gives %lld sequences (at most %lld "
                   "can be held out)", (long long)o->eval_seqs, t->data_label, (long long)t->data.n_seqs,
                   (long long)(t->data.n_seqs - 1));
  t->n_eval = o->eval_seqs;
  t->n_train = t->data.n_seqs - t->n_eval;
  int64_t sup = 0;
  for (int64_t i = 0; i < t->n_train; i++)
    for (int64_t r = 1; r < t->data.lengths[i]; r++) sup += t->data.loss_mask[i * t->data.seq_len + r] != 0;
  if (sup == 0)
    return DS_FAIL(DS_ERR_ARG, "%s: the %lld training sequences have no supervised token", t->data_label,
                   (long long)t->n_train);
  if (t->teacher) DS_TRY(ds_kv_cache_new_typed(t->teacher, t->data.seq_len, DS_F32, &t->kv)); /* prefills: fp32 */
  return config_texts(t, student_hash, teacher_hash, tw);
}

ds_status ds_lm_buffers(lm_run *t) {
  int64_t S = t->data.seq_len, V = t->V, c = t->cfg.chunk_rows < S ? t->cfg.chunk_rows : S, K = t->cfg.top_k;
  t->logits = ds_malloc_aligned((size_t)(c * V) * sizeof(float), "logits chunk");
  t->dh = ds_malloc_aligned((size_t)(S * t->d) * sizeof(float), "hidden gradient");
  t->kd_rows = ds_malloc((size_t)S * sizeof(double), "loss rows");
  t->lm_rows = ds_malloc((size_t)S * sizeof(double), "loss rows");
  t->labels = ds_malloc((size_t)S * sizeof(int32_t), "labels");
  t->mask = ds_malloc((size_t)S, "labels");
  if (!t->logits || !t->dh || !t->kd_rows || !t->lm_rows || !t->labels || !t->mask) return DS_ERR_NOMEM;
  if (t->teacher) {
    int64_t dt = ds_target_config(t->teacher)->hidden_size;
    t->thidden = ds_malloc_aligned((size_t)(S * dt) * sizeof(float), "teacher rows");
    /* sparse: the capture's products (DS_KD_TEACHER_ROWS rows) and every row's top-K; dense: a chunk */
    int64_t tr = K ? DS_KD_TEACHER_ROWS : c;
    t->tlogits = ds_malloc_aligned((size_t)(tr * V) * sizeof(float), "teacher logits");
    t->topk_ids = ds_malloc((size_t)(S * (K ? K : 1)) * sizeof(int32_t), "teacher top-K");
    t->topk_lp = ds_malloc((size_t)(S * (K ? K : 1)) * sizeof(float), "teacher top-K");
    t->select_scratch = ds_malloc_aligned((size_t)((K ? tr : 1) * V) * sizeof(float), "top-K scratch");
    if (!t->thidden || !t->tlogits || !t->topk_ids || !t->topk_lp || !t->select_scratch) return DS_ERR_NOMEM;
  }
  DS_TRY(ds_lm_inter_buffers(t));
  return ds_trainer_is_writer(t->core) ? ds_lm_write_tokenizer(t) : DS_OK; /* rank 0 writes the run directory */
}

ds_status ds_lm_cache_start(lm_run *t) {
  DS_TRY(ds_trainer_plan_begin(t->core, &t->plan));
  DS_TRY(ds_cache_stream_start(t->fc, 4, 1, &t->stream));
  int64_t idx;
  while (ds_cache_stream_space(t->stream) > 0 && ds_trainer_plan_next(&t->plan, &idx))
    DS_TRY(ds_cache_stream_push(t->stream, idx));
  return DS_OK;
}

ds_status ds_lm_cache_features(lm_run *t, int64_t idx) {
  ds_cache_sample s;
  DS_TRY(ds_cache_stream_next(t->stream, &s));
  if (s.index != idx)
    return DS_FAIL(DS_ERR_INTERNAL, "cache stream out of order: the loop wants sample %lld, the plan gave %lld",
                   (long long)idx, (long long)s.index);
  t->cur_topk_ids = s.topk_ids;
  t->cur_topk_lp = s.topk_logprobs;
  t->cur_tfeat = s.ctx; /* the captured layers (intermediate pairs) */
  int64_t next;
  while (ds_cache_stream_space(t->stream) > 0 && ds_trainer_plan_next(&t->plan, &next))
    DS_TRY(ds_cache_stream_push(t->stream, next));
  return DS_OK;
}

ds_status ds_lm_write_tokenizer(lm_run *t) {
  char *path = ds_path_join(t->o->loop.out_dir, "tokenizer.json");
  ds_status st = path ? ds_write_file_atomic(path, t->tok_text, t->tok_len) : DS_ERR_NOMEM;
  free(path);
  return st;
}

void ds_lm_free(lm_run *t) {
  ds_cache_stream_free(t->stream);
  ds_cache_close(t->fc);
  ds_trainer_plan_free(&t->plan);
  ds_lm_inter_free(t);
  ds_student_free(t->student);
  ds_target_free(t->teacher);
  ds_kv_cache_free(t->kv);
  ds_tokenizer_free(t->tok);
  ds_chat_template_free(t->chat);
  ds_dataset_free(&t->data);
  free(t->student_json);
  free(t->saved_config);
  free(t->tok_text);
  free(t->train_config);
  free(t->run_info);
  float *a[] = {t->logits, t->dh, t->thidden, t->tlogits};
  for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) ds_free_aligned(a[i]);
  free(t->kd_rows);
  free(t->lm_rows);
  free(t->labels);
  free(t->mask);
  free(t->topk_ids);
  free(t->topk_lp);
  ds_free_aligned(t->select_scratch);
}

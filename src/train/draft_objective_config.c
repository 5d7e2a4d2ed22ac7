/* The draft objective's configuration: the options checked against the target and the data
 * (every limit named), the mask token, the draft config the run trains, train_config (what
 * defines the trajectory, compared on resume) and run_info (paths, for run.json), and the
 * check of a checkpoint's draft config against the options. See draft_objective.c. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/json_util.h"
#include "dspark/fileio.h"
#include "dspark/dataset.h"
#include "dspark/model_source.h"
#include "train/draft_objective_internal.h"

static const char *k_mask_candidates[] = {"<|mask|>", "<mask>", "<|MASK|>", "[MASK]", "<|mask_token|>"};

/* 1 when id occurs in any sequence of the data (training and held-out). */
static int data_contains(const ds_dataset *ds, int32_t id) {
  for (int64_t i = 0; i < ds->n_seqs; i++) {
    const int32_t *ids = ds->ids + i * ds->seq_len;
    for (int64_t k = 0; k < ds->lengths[i]; k++)
      if (ids[k] == id) return 1;
  }
  return 0;
}

/* The mask token: --mask-token-id, else a reserved mask token of the tokenizer, else (a target
 * that reserves none, as SmolLM2 and Llama) the special added token of highest id that is no
 * bos / eos / stop token and occurs nowhere in the data: the chat template and the target's own
 * answers never produced it, so the draft's mask input cannot be confused with a real token. */
ds_status ds_draft_run_mask_token(const draft_run *t, int32_t *out) {
  if (t->o->mask_token_id >= 0) {
    if (t->o->mask_token_id >= t->tc.vocab_size)
      return DS_FAIL(DS_ERR_ARG, "--mask-token-id %d is outside the target's vocabulary (vocab_size %lld)",
                     t->o->mask_token_id, (long long)t->tc.vocab_size);
    *out = t->o->mask_token_id;
    return DS_OK;
  }
  for (size_t i = 0; i < sizeof k_mask_candidates / sizeof k_mask_candidates[0]; i++) {
    int32_t id = ds_tokenizer_token_to_id(t->tok, k_mask_candidates[i]);
    if (id >= 0) {
      *out = id;
      return DS_OK;
    }
  }
  int64_t top = ds_tokenizer_vocab_size(t->tok);
  if (top > t->tc.vocab_size) top = t->tc.vocab_size;
  for (int64_t id = top - 1; id >= 0; id--) {
    if (!ds_tokenizer_is_special(t->tok, (int32_t)id) || id == t->tc.bos_token_id) continue;
    int eos = ds_config_is_stop_token(&t->tc, id);
    for (int k = 0; k < t->tc.n_eos; k++) eos |= t->tc.eos_token_ids[k] == id;
    if (eos || data_contains(&t->data, (int32_t)id)) continue;
    fprintf(stderr, "mask token: %s (id %lld), the last special token the data never contains (the tokenizer "
            "reserves no mask token; --mask-token-id chooses another)\n",
            ds_tokenizer_id_to_token(t->tok, (int32_t)id), (long long)id);
    *out = (int32_t)id;
    return DS_OK;
  }
  return DS_FAIL(DS_ERR_ARG,
                 "%s has no reserved mask token (looked for <|mask|>, <mask>, <|MASK|>, [MASK], <|mask_token|>) and "
                 "no special token that the data never contains; pass --mask-token-id with an id the target never "
                 "produces", t->tokenizer_label);
}

/* Supervised positions that can anchor a block (mask[a] and mask[a+1]) in the training split. */
static int64_t trainable_positions(const ds_dataset *ds, int64_t n_train) {
  int64_t n = 0;
  for (int64_t i = 0; i < n_train; i++) {
    const uint8_t *m = ds->loss_mask + i * ds->seq_len;
    for (int64_t a = 0; a + 1 < ds->lengths[i]; a++) n += m[a] && m[a + 1];
  }
  return n;
}

ds_status ds_draft_run_config(draft_run *t) {
  const ds_draft_train_options *o = t->o;
  const ds_model_config *tc = &t->tc;
  const char *data = t->cfg_data;
  /* The split: explicit requests are never silently reduced. */
  if (o->eval_seqs >= t->data.n_seqs)
    return DS_FAIL(DS_ERR_ARG, "--eval-seqs %lld leaves no training sequence: %s gives %lld sequences of up to %lld "
                   "tokens (at most %lld can be held out)", (long long)o->eval_seqs, data, (long long)t->data.n_seqs,
                   (long long)o->seq_len, (long long)(t->data.n_seqs - 1));
  t->n_eval = o->eval_seqs;
  t->n_train = t->data.n_seqs - t->n_eval;
  if (trainable_positions(&t->data, t->n_train) == 0)
    return DS_FAIL(DS_ERR_ARG, "%s: the %lld training sequences have no supervised token that a block could be "
                   "anchored at (two consecutive supervised tokens): chat data needs assistant turns with content",
                   data, (long long)t->n_train);
  /* The objective: at least one term on. */
  int teacher = !o->no_teacher, conf = teacher && o->confidence_head;
  double active = o->loss.alpha_ce + (teacher ? o->loss.alpha_l1 : 0) + (conf ? o->loss.alpha_conf : 0);
  if (!(active > 0))
    return DS_FAIL(DS_ERR_ARG, "the loss is identically 0: --alpha-ce%s%s are all 0%s", teacher ? ", --alpha-l1" : "",
                   conf ? ", --alpha-conf" : "", teacher ? "" : " (--ce-only trains the CE term alone)");
  /* The draft. */
  ds_draft_config *dc = &t->dc;
  DS_TRY(ds_draft_config_default(tc, o->draft_layers, o->n_target_layers, dc));
  if (o->n_explicit_layers) {
    dc->n_target_layers = o->n_explicit_layers;
    memcpy(dc->target_layer_ids, o->target_layer_ids, sizeof(int32_t) * (size_t)o->n_explicit_layers);
  } else if (o->target_layers_given && dc->n_target_layers < o->n_target_layers) {
    return DS_FAIL(DS_ERR_ARG, "--target-layers %d: a %lld-layer target offers %d capturable layers (ids 1..L-2, "
                   "or the last but one for shallow targets)", o->n_target_layers, (long long)tc->num_hidden_layers,
                   dc->n_target_layers);
  }
  if (o->markov_rank > tc->vocab_size)
    return DS_FAIL(DS_ERR_ARG, "--markov-rank %lld exceeds the vocabulary size %lld (a rank above V adds parameters "
                   "and no capacity)", (long long)o->markov_rank, (long long)tc->vocab_size);
  dc->block_size = o->block_size;
  dc->markov_type = o->markov_type;
  dc->markov_rank = o->markov_type == DS_MARKOV_NONE ? 0 : o->markov_rank;
  dc->enable_confidence_head = o->confidence_head;
  dc->confidence_head_with_markov = o->confidence_head && o->confidence_with_markov && dc->markov_rank > 0;
  dc->num_anchors = o->num_anchors;
  DS_TRY(ds_draft_run_mask_token(t, &dc->mask_token_id));
  if (o->draft_vocab > 0) {
    /* the stop set where decoding ends: generation_config.json's when the target directory is at hand */
    ds_model_config from_dir;
    const ds_model_config *stops = &t->tc;
    if (t->target) stops = ds_target_config(t->target);
    else if (o->target_dir) { /* a model directory or a GGUF file */
      ds_model_source *src = NULL;
      ds_status st = ds_model_source_open(o->target_dir, &src);
      if (st == DS_OK) st = ds_model_source_config(src, &from_dir);
      ds_model_source_close(src);
      DS_TRY(st);
      stops = &from_dir;
    }
    DS_TRY(ds_draft_run_vocab(t, stops));
  }
  return ds_draft_config_check(dc);
}

static void add_hex(cJSON *j, const char *key, uint64_t h) {
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  cJSON_AddStringToObject(j, key, hex);
}

/* Every option that defines the trajectory. The target and the data enter by content (the
 * hashes the cache records too), not by path: a run resumes after its files moved, and is
 * refused when they changed. feature_dtype appears only when the features were rounded
 * (bf16 / f16 / int8): an f32 cache gives the online trajectory bit for bit, so its configuration
 * is the same. */
static cJSON *train_config_obj(const draft_run *t) {
  const ds_draft_train_options *o = t->o;
  const ds_draft_config *dc = &t->dc;
  cJSON *j = cJSON_CreateObject();
  add_hex(j, "target_weights_xxh64", t->weights_xxh64);
  add_hex(j, "target_config_xxh64", t->config_xxh64);
  add_hex(j, "tokenizer_xxh64", t->tokenizer_xxh64);
  add_hex(j, "data_xxh64", t->data.source_hash);
  add_hex(j, "sequences_xxh64", t->sequences_xxh64);
  if (t->feature_dtype) cJSON_AddStringToObject(j, "feature_dtype", t->feature_dtype);
  cJSON_AddNumberToObject(j, "seq_len", (double)o->seq_len);
  cJSON_AddNumberToObject(j, "eval_seqs", (double)o->eval_seqs);
  cJSON_AddNumberToObject(j, "draft_layers", (double)dc->num_layers);
  cJSON_AddNumberToObject(j, "block_size", (double)dc->block_size);
  cJSON_AddItemToObject(j, "target_layer_ids", cJSON_CreateIntArray(dc->target_layer_ids, dc->n_target_layers));
  cJSON_AddNumberToObject(j, "mask_token_id", dc->mask_token_id);
  cJSON_AddStringToObject(j, "markov_head_type", ds_markov_type_name(dc->markov_type));
  cJSON_AddNumberToObject(j, "markov_rank", (double)dc->markov_rank);
  cJSON_AddBoolToObject(j, "confidence_head", dc->enable_confidence_head);
  cJSON_AddBoolToObject(j, "confidence_head_with_markov", dc->confidence_head_with_markov);
  cJSON_AddNumberToObject(j, "num_anchors", (double)o->num_anchors);
  cJSON_AddNumberToObject(j, "alpha_ce", o->loss.alpha_ce);
  cJSON_AddNumberToObject(j, "alpha_l1", o->loss.alpha_l1);
  cJSON_AddNumberToObject(j, "alpha_conf", o->loss.alpha_conf);
  cJSON_AddNumberToObject(j, "decay_gamma", o->loss.decay_gamma);
  cJSON_AddStringToObject(j, "decay", o->loss.decay == DS_DSPARK_DECAY_PAPER ? "paper" : "deepspec");
  cJSON_AddNumberToObject(j, "chunk_rows", (double)o->loss.chunk_rows);
  cJSON_AddBoolToObject(j, "no_teacher", o->no_teacher);
  if (dc->draft_vocab_size > 0) { /* absent for a full vocabulary: older runs resume as they were */
    cJSON_AddNumberToObject(j, "draft_vocab_size", (double)dc->draft_vocab_size);
    add_hex(j, "draft_vocab_xxh64", t->vocab_xxh64);
  }
  return j;
}


ds_status ds_draft_run_config_texts(draft_run *t) {
  t->sequences_xxh64 = ds_dataset_hash(&t->data);
  cJSON *j = train_config_obj(t);
  t->train_config = j ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  j = cJSON_CreateObject();
  if (j) {
    cJSON_AddStringToObject(j, "objective", "draft");
    cJSON_AddStringToObject(j, "target", t->cfg_target ? t->cfg_target : "");
    cJSON_AddStringToObject(j, "data", t->cfg_data ? t->cfg_data : "");
    if (t->o->cache_dir) cJSON_AddStringToObject(j, "cache", t->o->cache_dir);
    else cJSON_AddStringToObject(j, "data_format", ds_data_format_name(t->o->data_format));
    if (t->cache_weights[0]) /* how the target held its weights when the cache was captured */
      cJSON_AddStringToObject(j, "target_weights", t->cache_weights);
    if (!t->o->cache_dir && t->o->skip_bad_lines) /* how many lines the sequences lack */
      cJSON_AddNumberToObject(j, "data_bad_lines_skipped", (double)t->data.bad_lines);
    if (t->chat_template[0]) cJSON_AddStringToObject(j, "chat_template", t->chat_template);
    if (t->vocab_ids) cJSON_AddNumberToObject(j, "draft_vocab_coverage", t->vocab_coverage);
  }
  t->run_info = j ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  return t->train_config && t->run_info ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "out of memory");
}

#define SAME_FIELD(field, fmt, cast)                                                                          \
  do {                                                                                                        \
    if (saved->field != want->field)                                                                          \
      return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' has %s = " fmt " but this run's options give " \
                     fmt "; the checkpoint does not belong to this run", ckpt_path, #field, (cast)saved->field,    \
                     (cast)want->field);                                                                      \
  } while (0)

ds_status ds_draft_run_check_loaded(const draft_run *t, const ds_draft_config *saved, const char *ckpt_path) {
  const ds_draft_config *want = &t->dc;
  SAME_FIELD(vocab_size, "%lld", long long);
  SAME_FIELD(hidden_size, "%lld", long long);
  SAME_FIELD(intermediate_size, "%lld", long long);
  SAME_FIELD(num_attention_heads, "%lld", long long);
  SAME_FIELD(num_key_value_heads, "%lld", long long);
  SAME_FIELD(head_dim, "%lld", long long);
  SAME_FIELD(num_layers, "%lld", long long);
  SAME_FIELD(block_size, "%lld", long long);
  SAME_FIELD(n_target_layers, "%d", int);
  SAME_FIELD(mask_token_id, "%d", int);
  SAME_FIELD(markov_type, "%d", int);
  SAME_FIELD(markov_rank, "%lld", long long);
  SAME_FIELD(enable_confidence_head, "%d", int);
  SAME_FIELD(confidence_head_with_markov, "%d", int);
  SAME_FIELD(num_anchors, "%lld", long long);
  SAME_FIELD(draft_vocab_size, "%lld", long long);
  for (int i = 0; i < want->n_target_layers; i++)
    if (saved->target_layer_ids[i] != want->target_layer_ids[i])
      return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' has target_layer_ids[%d] = %d but this run's options "
                     "give %d; the checkpoint does not belong to this run", ckpt_path, i, saved->target_layer_ids[i],
                     want->target_layer_ids[i]);
  return DS_OK;
}

ds_status ds_draft_target_texts(draft_run *t, ds_model_source *src) {
  const char *cfg;
  size_t len;
  DS_TRY(ds_model_source_text(src, DS_MODEL_CONFIG, 1, &cfg, &len));
  if (!(t->target_config = ds_malloc(len + 1, "the target's config.json"))) return DS_ERR_NOMEM;
  memcpy(t->target_config, cfg, len + 1);
  t->config_xxh64 = XXH64(cfg, len, 0);
  DS_TRY(ds_model_source_hash(src, DS_MODEL_TOKENIZER, &t->tokenizer_xxh64));
  snprintf(t->config_label, sizeof t->config_label, "%s", ds_model_source_label(src, DS_MODEL_CONFIG));
  snprintf(t->tokenizer_label, sizeof t->tokenizer_label, "%s", ds_model_source_label(src, DS_MODEL_TOKENIZER));
  return DS_OK;
}

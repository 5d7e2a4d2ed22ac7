/* The draft trainer's configuration: the mask token, the run's configuration JSON (what
 * defines the trajectory), the resume check against a checkpoint's, and the metrics trim on
 * resume. See draft_trainer.c. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/fileio.h"
#include "core/json_util.h"
#include "train/draft_trainer_internal.h"

static const char *k_mask_candidates[] = {"<|mask|>", "<mask>", "<|MASK|>", "[MASK]", "<|mask_token|>"};

ds_status ds_trainer_resolve_mask_token(const trainer *t, int32_t *out) {
  if (t->o->mask_token_id >= 0) {
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
  return DS_FAIL(DS_ERR_ARG,
                 "%s has no reserved mask token (looked for <|mask|>, <mask>, <|MASK|>, [MASK], "
                 "<|mask_token|>); pass --mask-token-id with an id the target never produces", t->tokenizer_label);
}

/* Every option that defines the trajectory. A cache run records the capture's target and data
 * (the same sequences), and feature_dtype only when the features were rounded (bf16 / f16):
 * an f32 cache gives the online trajectory bit for bit, so its configuration is the same. */
static cJSON *train_config_obj(const trainer *t, const ds_draft_config *dc, uint64_t data_hash) {
  const ds_train_options *o = t->o;
  cJSON *j = cJSON_CreateObject();
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)data_hash);
  cJSON_AddStringToObject(j, "target", t->cfg_target);
  cJSON_AddStringToObject(j, "data", t->cfg_data);
  if (t->feature_dtype) cJSON_AddStringToObject(j, "feature_dtype", t->feature_dtype);
  cJSON_AddStringToObject(j, "data_hash", hash);
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
  cJSON_AddNumberToObject(j, "steps", (double)o->steps);
  cJSON_AddNumberToObject(j, "batch_seqs", (double)o->batch_seqs);
  cJSON_AddNumberToObject(j, "lr", o->lr);
  cJSON_AddNumberToObject(j, "warmup_frac", o->warmup_frac);
  cJSON_AddNumberToObject(j, "weight_decay", o->weight_decay);
  cJSON_AddNumberToObject(j, "grad_clip", o->grad_clip);
  cJSON_AddNumberToObject(j, "seed", (double)o->seed);
  cJSON_AddBoolToObject(j, "skip_nonfinite", o->skip_nonfinite);
  return j;
}

/* train_config (checkpoint metadata; resume compares it) and run.json (the same plus the
 * cache it was trained from, which does not change the trajectory). */
ds_status ds_trainer_config_texts(trainer *t, const ds_draft_config *dc, uint64_t data_hash) {
  cJSON *j = train_config_obj(t, dc, data_hash);
  t->train_config = j ? cJSON_Print(j) : NULL;
  if (j && t->o->cache_dir) cJSON_AddStringToObject(j, "cache", t->o->cache_dir);
  t->run_config = j ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  return t->train_config && t->run_config ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "out of memory");
}

/* A resumed run must be the same run: every field equal, or an error naming it. */
ds_status ds_trainer_check_same_config(const char *saved, const char *now, const char *ckpt_path) {
  ds_status st;
  cJSON *a = ds_json_parse(saved, strlen(saved), ckpt_path, &st), *b = NULL;
  if (!a) return st;
  b = ds_json_parse(now, strlen(now), "current options", &st);
  if (!b) { cJSON_Delete(a); return st; }
  st = DS_OK;
  const cJSON *it;
  cJSON_ArrayForEach(it, b) {
    const cJSON *other = cJSON_GetObjectItemCaseSensitive(a, it->string);
    if (!other || !cJSON_Compare(it, other, 1)) {
      char *x = other ? cJSON_PrintUnformatted(other) : NULL, *y = cJSON_PrintUnformatted(it);
      st = DS_FAIL(DS_ERR_ARG, "cannot resume from %s: option '%s' was %s, now %s", ckpt_path, it->string,
                   x ? x : "(absent)", y ? y : "?");
      free(x);
      free(y);
      break;
    }
  }
  cJSON_ArrayForEach(it, a) {
    if (st != DS_OK) break;
    if (!cJSON_GetObjectItemCaseSensitive(b, it->string)) {
      char *x = cJSON_PrintUnformatted(it);
      st = DS_FAIL(DS_ERR_ARG, "cannot resume from %s: option '%s' was %s, now (absent)", ckpt_path, it->string,
                   x ? x : "?");
      free(x);
    }
  }
  cJSON_Delete(a);
  cJSON_Delete(b);
  return st;
}

/* On resume, metrics of steps after the checkpoint (logged before the run was killed) are
 * dropped so the file reads as one uninterrupted run. */
ds_status ds_trainer_trim_metrics(const char *path, int64_t last_step) {
  if (!ds_file_exists(path)) return DS_OK;
  char *text;
  size_t len;
  DS_TRY(ds_read_file(path, &text, &len));
  char *out = ds_malloc(len + 1, "metrics");
  if (!out) { free(text); return DS_ERR_NOMEM; }
  size_t n = 0;
  for (char *line = text; line < text + len;) {
    char *nl = memchr(line, '\n', (size_t)(text + len - line));
    size_t l = nl ? (size_t)(nl - line) + 1 : (size_t)(text + len - line);
    const char *sp = strstr(line, "\"step\":");
    long long step = sp && sp < line + l ? atoll(sp + 7) : 0;
    if (step <= last_step) {
      memcpy(out + n, line, l);
      n += l;
    }
    line += l;
  }
  ds_status st = ds_write_file_atomic(path, out, n);
  free(text);
  free(out);
  return st;
}


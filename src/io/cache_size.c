/* What a capture will write, in bytes, before it writes anything (`dspark capture --estimate`
 * and its free-space check): the shard files and target_weights.safetensors sized exactly by
 * their safetensors writers, the copies and the manifest as their text. See cache.h. */
#include <stdlib.h>
#include <string.h>

#include "dspark/cache.h"

ds_status ds_cache_target_weights_writer(ds_weight embed, ds_weight lm_head, int64_t V, int64_t d,
                                         ds_st_writer **out) {
  int64_t shape[2] = {V, d};
  ds_st_writer *w = ds_st_writer_new();
  ds_status st = w ? DS_OK : DS_ERR_NOMEM;
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "format", "dspark-cache-target-weights");
  /* In the target's dtype: a bf16 target's tables stay bf16 (the draft keeps them so). */
  if (st == DS_OK) st = ds_st_writer_add(w, "embed_tokens.weight", embed.dtype, 2, shape, embed.data);
  if (st == DS_OK) st = ds_st_writer_add(w, "lm_head.weight", lm_head.dtype, 2, shape, lm_head.data);
  if (st != DS_OK) {
    ds_st_writer_free(w);
    return st;
  }
  *out = w;
  return DS_OK;
}

static void add_tensor(ds_cache_size *z, const char *name, int64_t per_position) {
  z->tensor[z->n_tensors] = name;
  z->per_position[z->n_tensors++] = per_position;
  z->position_bytes += per_position;
}

/* The manifest of the finished cache: every shard listed, every checksum set. */
static ds_status manifest_bytes(const ds_cache_manifest *m, int64_t n_shards, int64_t *bytes) {
  ds_cache_manifest full = *m;
  full.complete = 1;
  full.target_weights_file_xxh64 = full.manifest_xxh64 = UINT64_MAX; /* hex widths are fixed; any value */
  full.n_shards = n_shards;
  full.shards = ds_calloc((size_t)n_shards + 1, sizeof *full.shards, "manifest estimate");
  if (!full.shards) return DS_ERR_NOMEM;
  for (int64_t k = 0; k < n_shards; k++) {
    ds_cache_shard_name(k, full.shards[k].file, sizeof full.shards[k].file);
    int64_t left = m->num_samples - k * m->shard_size;
    full.shards[k].num_samples = left < m->shard_size ? left : m->shard_size;
    full.shards[k].xxh64 = UINT64_MAX;
  }
  char *text = ds_cache_manifest_json(&full);
  free(full.shards);
  if (!text) return DS_FAIL(DS_ERR_NOMEM, "manifest estimate");
  *bytes = (int64_t)strlen(text);
  free(text);
  return DS_OK;
}

ds_status ds_cache_estimate(const ds_cache_manifest *m, ds_dtype embed_dtype, ds_dtype lm_head_dtype,
                            int64_t config_bytes, int64_t tokenizer_bytes, ds_cache_size *out) {
  ds_cache_size z;
  memset(&z, 0, sizeof z);
  int64_t S = m->seq_length, d = m->hidden_size, nl = m->n_layers, K = m->kd_topk;
  int64_t es = (int64_t)ds_dtype_size(m->dtype), les = (int64_t)ds_dtype_size(ds_cache_logprob_dtype(m->dtype));
  add_tensor(&z, "input_ids", 4);
  add_tensor(&z, "loss_mask", 1);
  if (m->features) {
    add_tensor(&z, "target_hidden_states", nl * d * es);
    if (m->dtype == DS_I8) add_tensor(&z, "target_hidden_states_scale", nl * 4);
    add_tensor(&z, "target_last_hidden_states", d * es);
    if (m->dtype == DS_I8) add_tensor(&z, "target_last_hidden_states_scale", 4);
  }
  if (K) {
    add_tensor(&z, "topk_ids", K * 4);
    add_tensor(&z, "topk_logprobs", K * les);
  }
  z.samples = m->num_samples;
  z.tokens = m->num_tokens;
  z.positions = m->num_samples * S;
  z.n_shards = m->shard_size > 0 ? (m->num_samples + m->shard_size - 1) / m->shard_size : 0;
  if (z.n_shards > 0) {
    int64_t last_n = m->num_samples - (z.n_shards - 1) * m->shard_size;
    DS_TRY(ds_cache_shard_file_bytes(m, m->shard_size, &z.full_shard_bytes));
    DS_TRY(ds_cache_shard_file_bytes(m, last_n, &z.last_shard_bytes));
    z.shard_bytes = (z.n_shards - 1) * z.full_shard_bytes + z.last_shard_bytes;
  }
  static int64_t never_read; /* sizes only: the writer is never written */
  ds_weight we = {&never_read, embed_dtype}, wh = {&never_read, lm_head_dtype};
  ds_st_writer *wr = NULL;
  DS_TRY(ds_cache_target_weights_writer(we, wh, m->vocab_size, d, &wr));
  uint64_t wb = 0;
  ds_status st = ds_st_writer_file_size(wr, &wb);
  ds_st_writer_free(wr);
  if (st != DS_OK) return st;
  z.weights_bytes = (int64_t)wb;
  int64_t mb = 0;
  DS_TRY(manifest_bytes(m, z.n_shards, &mb));
  z.other_bytes = config_bytes + tokenizer_bytes + mb;
  z.total_bytes = z.shard_bytes + z.weights_bytes + z.other_bytes;
  *out = z;
  return DS_OK;
}

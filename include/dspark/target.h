/* A frozen target LLM (Llama / Qwen2 / Qwen3): fp32 inference with a croppable KV cache,
 * batched prefill, capture of selected decoder layers' outputs and of the final-normed
 * hidden state, and logits only for the rows asked for.
 *
 * Weights: the matrices a checkpoint stores in BF16 or F16 (q/k/v, o, gate/up, down,
 * embed_tokens, lm_head) stay in that dtype, used where they lie in the checkpoint's memory
 * mapping (no copy: a bf16 model holds about half the bytes of its fp32 form, and loads as
 * fast as its pages can be read), and are multiplied by the backend's linear_w (exact
 * conversion, fp32 accumulation: activations stay fp32). A group that feeds one matmul (q/k/v,
 * gate/up) stays in 16 bits only when all its tensors do. Everything else (F32 / F64
 * tensors, every norm and bias) is converted to fp32 once at load into one contiguous buffer,
 * where q/k/v and gate/up are fused so each is one matmul; an fp32 checkpoint computes
 * exactly as before. The checkpoint stays open (mapped) as long as the target uses it. */
#ifndef DSPARK_TARGET_H
#define DSPARK_TARGET_H

#include "dspark/backend.h"
#include "dspark/common.h"
#include "dspark/hfconfig.h"
#include "dspark/model_source.h"
#include "dspark/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_target ds_target;
typedef struct ds_kv_cache ds_kv_cache;

/* Loads a model source's config.json (with generation_config.json's stop set:
 * ds_model_source_config) and its weights (a directory's safetensors, single file or sharded
 * index; a GGUF file's tensors dequantized to fp32, whose image is freed once converted). Tied
 * embeddings follow transformers: with tie_word_embeddings a stored lm_head.weight is used as the
 * head (and a checkpoint with only lm_head.weight ties the embedding to it). A forward past
 * max_position_embeddings is an error naming the limit and the model. weights_xxh64 (may be
 * NULL) receives the weights' hash as caches record it (ds_cache_hash_checkpoint of
 * ds_model_source_weights: the same under every --weights), taken from the checkpoint the target
 * loads when that is the fp32 one (a GGUF is then not converted twice), from a conversion of its
 * own when the target holds a GGUF's weights otherwise. The source may be closed after. */
ds_status ds_target_load_source(ds_model_source *src, const ds_backend *backend, uint64_t *weights_xxh64,
                                ds_target **out);
/* The same from a path (a model directory or a .gguf file). */
ds_status ds_target_load(const char *model, const ds_backend *backend, ds_target **out);
void ds_target_free(ds_target *m);
const ds_model_config *ds_target_config(const ds_target *m);
/* The frozen tables [V, d] in their dtype (F32 when converted at load, else the checkpoint's
 * BF16 / F16 in its mapping), valid while the target lives; lm_head is embed (the same data)
 * when the model ties them. */
ds_weight ds_target_embed(const ds_target *m);
ds_weight ds_target_lm_head(const ds_target *m);
/* The weight bytes the target holds: *f32_bytes converted to fp32 at load, *mapped_bytes used
 * in place in the checkpoint's mapping (a tied table counted once), in *mapped_dtype (BF16 or
 * F16; DS_F32 when nothing is mapped). Each pointer may be NULL. */
void ds_target_weight_memory(const ds_target *m, size_t *f32_bytes, size_t *mapped_bytes, ds_dtype *mapped_dtype);
/* The bytes of those used in place that are in dtype dt (BF16, F16, or a quantized type). */
size_t ds_target_mapped_bytes(const ds_target *m, ds_dtype dt);
/* The weights the target runs with, as caches and runs record them ("target_weights",
 * ds_weights_mode_name): DS_WEIGHTS_F32 when it holds every matrix in fp32 (whatever was asked:
 * its numbers are --weights f32's), DS_WEIGHTS_BF16 for a GGUF dequantized to bf16,
 * DS_WEIGHTS_AS_STORED when some matrix is used in the checkpoint's own type (a GGUF's quantized,
 * F16 or BF16 ones; a directory's BF16 / F16 ones, which --weights bf16 also keeps). */
ds_weights_mode ds_target_weights_held(const ds_target *m);
/* 1 when the target holds its weights as DS_WEIGHTS_DEQUANTIZED (what every command did before
 * --weights: a GGUF in fp32, a directory's 16-bit matrices in place) holds them, so it computes
 * what a cache or run that records no weights computed. */
int ds_target_weights_as_before(const ds_target *m);
/* 1 when lm_head is the embedding table itself (tied and not stored separately). */
int ds_target_head_is_embedding(const ds_target *m);

/* The precision of the KV caches made from now on, for the whole process (dspark --kv-cache):
 * DS_F32 or DS_F16, half the bytes a cached token (keys and values rounded to nearest even, as
 * llama.cpp's default cache holds them; read back exactly), on a backend with
 * attention_causal_f16 (the cpu one). Anything else is refused naming the type. Unset (the
 * default, or after ds_unset_kv_cache_dtype), a target whose matrices are held quantized as
 * stored gets f16 caches where its backend has them, every other target fp32 ones:
 * ds_kv_cache_dtype(m) says which m's next cache holds. */
ds_status ds_set_kv_cache_dtype(ds_dtype dt);
void ds_unset_kv_cache_dtype(void);
ds_dtype ds_kv_cache_dtype(const ds_target *m);
/* A cache of m for capacity positions, in ds_kv_cache_dtype(m); _typed in the dtype given (DS_F32
 * or DS_F16): the prefill-only stages (capture, training against the live target, a live
 * teacher) keep fp32 caches whatever the process's default, their cache living for one
 * sequence. */
ds_status ds_kv_cache_new(const ds_target *m, int64_t capacity, ds_kv_cache **out);
ds_status ds_kv_cache_new_typed(const ds_target *m, int64_t capacity, ds_dtype dtype, ds_kv_cache **out);
void ds_kv_cache_free(ds_kv_cache *c);
int64_t ds_kv_cache_len(const ds_kv_cache *c);
int64_t ds_kv_cache_capacity(const ds_kv_cache *c);
/* Keeps the first len positions (len <= current length): rejected speculative tokens vanish. */
ds_status ds_kv_cache_crop(ds_kv_cache *c, int64_t len);

/* One sequence's new tokens; they take positions cache_len .. cache_len + n - 1 and the
 * cache grows by n. */
typedef struct {
  const int32_t *ids; /* [n] */
  int64_t n;
  ds_kv_cache *cache;
} ds_target_seq;

/* What to keep from a forward. Rows are the new tokens of all sequences, concatenated in
 * order (R = sum of n). Every output pointer may be NULL. */
typedef struct {
  const int32_t *capture_layers; /* layer ids; -1 = embedding output, l = output of layer l */
  int n_capture;
  float *captured;               /* [R, n_capture * d] */
  float *final_hidden;           /* [R, d] final-normed hidden state */
  const int64_t *logit_rows;     /* rows wanting logits; NULL = every row */
  int64_t n_logit_rows;
  float *logits;                 /* [n_logit_rows (or R), V] */
} ds_target_outputs;

/* Runs the new tokens through the model, appending their keys and values to each sequence's
 * cache. More than 512 rows run in passes of 512 (a sequence split between passes reads its earlier
 * rows from its cache), so the activations stay bounded whatever the prompt's length. A failed
 * forward leaves every cache's length as it was. */
ds_status ds_target_forward(ds_target *m, const ds_target_seq *seqs, int n_seqs, ds_target_outputs *out);
/* logits [n, V] = hidden [n, d] @ lm_head^T for final-normed hidden states a forward gave
 * (final_hidden): the forward's vocabulary product, for rows whose logits are wanted only later
 * (speculation verifies proposals left to right and stops reading at the first rejection). Host
 * memory in and out, the forward's numbers (the same product on the same rows). */
ds_status ds_target_logits(ds_target *m, const float *hidden, int64_t n, float *logits);

/* Validates a capture layer list against the model: strictly increasing, within
 * [-1, L-2] (the last layer's HF output is already final-normed). */
ds_status ds_target_check_capture_layers(const ds_target *m, const int32_t *ids, int n);

/* After ds_target_forward(m, ..., out) over `rows` rows: every captured value and every final
 * hidden value must be finite. A NaN or infinity is a DS_ERR_NUMERIC naming where the target
 * went wrong: the lowest captured layer that holds one ("target layer 3 (HF
 * hidden_states[4])", or the embedding output), else the final-normed hidden state, with the
 * row and the feature, so that a bad target is blamed there and not later as "draft logits
 * hold NaN". Callers add their context (data file, sequence, step) with ds_error_wrap. The
 * logits are not checked. */
ds_status ds_target_check_finite(const ds_target *m, const ds_target_outputs *out, int64_t rows);

/* Checks a tokenizer against the model's config.json before any text is processed: every
 * tokenizer id must have a row in the model (tokenizer vocabulary <= vocab_size; a larger
 * model vocabulary, padded, is fine), and every eos_token_id must be inside vocab_size and a
 * token of the tokenizer. The labels name the two files in the error (NULL: "config.json",
 * "tokenizer.json"). */
ds_status ds_target_check_tokenizer(const ds_model_config *cfg, const ds_tokenizer *tok, const char *config_label,
                                    const char *tokenizer_label);

#ifdef __cplusplus
}
#endif
#endif

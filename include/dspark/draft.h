/* The DSpark draft (spec/dspark.md sections 1-3): context projection fc + hidden_norm over
 * the concatenated captured target layers, n_d Qwen3-style layers whose keys/values cover
 * [context ; block], a final norm, frozen replicas of the target's embed_tokens and lm_head,
 * a sequential (Markov) head (vanilla / gated / rnn, or none at rank 0) and a confidence head.
 *
 * Trainable parameters live in one fp32 buffer and their gradients in a second buffer of the
 * same layout, so zeroing, clipping, AdamW and all-reduce are flat loops. */
#ifndef DSPARK_DRAFT_H
#define DSPARK_DRAFT_H

#include "dspark/backend.h"
#include "dspark/common.h"
#include "dspark/hfconfig.h"
#include "dspark/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DS_MARKOV_NONE = 0, DS_MARKOV_VANILLA, DS_MARKOV_GATED, DS_MARKOV_RNN } ds_markov_type;

enum { DS_MAX_TARGET_LAYERS = 64 };

typedef struct {
  /* shapes shared with the target */
  int64_t vocab_size, hidden_size, intermediate_size;
  int64_t num_attention_heads, num_key_value_heads, head_dim;
  double rms_norm_eps;
  /* the target's rope (the draft's positions are the target's) */
  ds_model_config rope_source;
  /* draft */
  int64_t num_layers;        /* n_d */
  int64_t block_size;        /* g */
  int64_t num_target_layers; /* L_T of the target, recorded for export */
  int32_t target_layer_ids[DS_MAX_TARGET_LAYERS];
  int n_target_layers;       /* m */
  int32_t mask_token_id;
  ds_markov_type markov_type;
  int64_t markov_rank;       /* r; 0 <=> DS_MARKOV_NONE */
  int enable_confidence_head;
  int confidence_head_with_markov;
  int64_t num_anchors;       /* anchors per sequence in training (recorded for export) */
  /* A reduced draft vocabulary (spec section 4a): N > 0 target ids S, strictly increasing, that
   * the draft predicts over: lm_head and Markov W2 are [N, .], every draft logit row is [N]
   * (column j is target id S[j]), and the draft carries S as the tensors d2t (I64 [N],
   * d2t[j] = S[j] - j, as EAGLE-3 / speculators / vLLM read it) and t2d (BOOL [V], v in S).
   * The input side stays the target's: embed_tokens [V, d] and Markov W1 [V, r] (the previous
   * token, e.g. the anchor, may be any target id; vLLM's DSpark head has W1 over the target's
   * vocabulary and W2 over the draft's). 0: the whole vocabulary, no map (N = V in effect). */
  int64_t draft_vocab_size;
} ds_draft_config;

const char *ds_markov_type_name(ds_markov_type t);
/* "none", "vanilla", "gated", "rnn"; an unknown name is an error naming it. */
ds_status ds_markov_type_parse(const char *name, ds_markov_type *out);
/* Validates a config (ranks, ids, sizes) with messages naming the option. */
ds_status ds_draft_config_check(const ds_draft_config *c);
/* Default draft config for a target: spec defaults (g 7, r 256, vanilla, confidence head with
 * Markov input, m target layers spread evenly over [1, L-2], n_d layers). */
ds_status ds_draft_config_default(const ds_model_config *target, int64_t num_layers, int n_target_layers,
                                  ds_draft_config *out);

typedef struct ds_draft ds_draft;

/* N, the rows of the draft's logits: cfg->draft_vocab_size, or vocab_size without a reduced vocabulary. */
int64_t ds_draft_config_vocab_rows(const ds_draft_config *c);

/* Creates a draft with seeded random trainable weights (normal(0, 0.02) matrices, ones for
 * norms, zeros for biases) and COPIES of the given frozen tables embed/lm_head [V, d], kept in
 * the dtype given (F32, BF16 or F16): the target's own, so a bf16 target's tables cost the
 * draft half of what fp32 replicas would, and compute exactly as the target's do (the
 * backend's linear_w / embedding_w). A table whose data is NULL is created zero, in its dtype
 * (for a draft whose tables are then read from a file). Trainable parameters are fp32. */
ds_status ds_draft_new(const ds_draft_config *cfg, ds_weight embed, ds_weight lm_head, uint64_t seed,
                       const ds_backend *backend, ds_draft **out);
/* The same for a reduced vocabulary (cfg->draft_vocab_size = N > 0): vocab_ids [N] is S
 * (strictly increasing ids in [0, V), else DS_ERR_ARG naming the entry), lm_head is still the
 * target's [V, d] table, of which the draft copies the rows S. vocab_ids NULL: exactly
 * ds_draft_new (which refuses a config with N > 0). */
ds_status ds_draft_new_vocab(const ds_draft_config *cfg, ds_weight embed, ds_weight lm_head, const int32_t *vocab_ids,
                             uint64_t seed, const ds_backend *backend, ds_draft **out);
void ds_draft_free(ds_draft *d);
const ds_draft_config *ds_draft_get_config(const ds_draft *d);

/* Flat trainable parameters and gradients (same layout). */
float *ds_draft_params(ds_draft *d);
float *ds_draft_grads(ds_draft *d);
size_t ds_draft_num_params(const ds_draft *d);
void ds_draft_zero_grads(ds_draft *d);
/* The frozen replicas, in their dtype: embed [V, d], lm_head [N, d] (the target's rows S). */
ds_weight ds_draft_embed(const ds_draft *d);
ds_weight ds_draft_lm_head(const ds_draft *d);
/* N: the width of every draft logit row (V without a reduced vocabulary). */
int64_t ds_draft_vocab_size(const ds_draft *d);
/* S [N] (strictly increasing target ids; draft column j is target id S[j]) and its inverse
 * [V] (the column of a target id, -1 outside S); both NULL without a reduced vocabulary. */
const int32_t *ds_draft_vocab_ids(const ds_draft *d);
const int32_t *ds_draft_vocab_index(const ds_draft *d);

/* Named views of every tensor (trainable and frozen) with its HF export name and shape, in
 * export order; used by checkpoints and export. */
typedef struct {
  const char *name; /* e.g. "layers.0.self_attn.q_proj.weight" */
  void *data;       /* float * when dtype is F32 (every trainable tensor) */
  float *grad;      /* NULL for frozen tensors */
  int ndim;
  int64_t shape[2];
  ds_dtype dtype;   /* F32, or a frozen table's BF16 / F16, or the reduced vocabulary's d2t (I64) / t2d (BOOL) */
} ds_draft_tensor;
size_t ds_draft_tensor_count(const ds_draft *d);
const ds_draft_tensor *ds_draft_tensor_at(const ds_draft *d, size_t i);
/* What tells one trained draft from another, for files fitted or measured on it (a calibration):
 * xxh64 of its block size, mask token, target layers, head types and every trainable tensor
 * (name, dtype, shape, bytes). The frozen embedding / lm_head copies, the target's, are left out:
 * hashing them would cost a pass over the vocabulary tables for nothing the trained weights do
 * not already tell. The same weights give the same value from a run directory or its export. */
uint64_t ds_draft_identity(const ds_draft *d);

/* One training sequence with its anchors. Rows of the block batch are b*g + k. */
typedef struct {
  int64_t T;
  const float *ctx;          /* [T, m*d] captured target layers (feature order = target_layer_ids) */
  const float *last;         /* [T, d] target final-normed hidden state; NULL: no teacher (CE only) */
  const int32_t *ids;        /* [T] */
  int64_t n_blocks;
  const int64_t *anchors;    /* [n_blocks] anchor positions in [0, T-2] */
  const uint8_t *block_keep; /* [n_blocks] 0 = dropped (dummy) block */
  const uint8_t *eval_mask;  /* [n_blocks * g] supervision prefix per block (spec section 5) */
  ds_weight teacher_head;    /* [V, d] the target's lm_head for the teacher logits lm_head(last); data NULL:
                                the draft's own replica, which only a full-vocabulary draft has whole */
} ds_draft_seq;

/* Runs the draft over the blocks of one sequence with teacher forcing and writes
 * logits [n_blocks*g, N] (base logits plus the Markov bias of the teacher-forced previous
 * token) and, when the confidence head is on, conf_logits [n_blocks*g]. Either may be NULL.
 * Inference only (no activations kept). Memory: the caller's logits buffer is the only
 * [rows, V] tensor. */
ds_status ds_draft_forward_blocks(ds_draft *d, const ds_draft_seq *seq, float *logits, float *conf_logits);

/* ---- Training hooks: what a loss over the draft's block logits composes (the DSpark loss in
 * src/loss/draft_loss.c). Rows are b*g + k, R = n_blocks * g. ---- */

/* Forward over the blocks of seq with teacher forcing, keeping the activations the backward
 * needs (in the draft, until the next call). */
ds_status ds_draft_forward_train(ds_draft *d, const ds_draft_seq *seq);
/* Views into the last ds_draft_forward_train: final-normed h (R, d); confidence logits (R),
 * NULL without the confidence head. */
const float *ds_draft_final_hidden(const ds_draft *d);
const float *ds_draft_conf_logits(const ds_draft *d);
const ds_backend *ds_draft_backend(const ds_draft *d);
/* Brackets the row-chunk calls below: the draft's weights do not change in between, so its
 * backend may convert the trainable vocabulary matrix (Markov W2, read by every chunk) once
 * (operand_hold). Every rows_begin needs its rows_end, on error paths too. */
void ds_draft_rows_begin(ds_draft *d);
void ds_draft_rows_end(ds_draft *d);
/* logits (c, N) of rows [r0, r0+c): h @ lm_head^T plus the Markov bias z @ W2^T of the
 * teacher-forced previous token; scratch (c, N) (unused at rank 0). */
void ds_draft_rows_logits(ds_draft *d, int64_t r0, int64_t c, float *logits, float *scratch);
/* Backward of those logits: dlogits (c, N) in; dh (c, d) += through the frozen lm_head;
 * dz (c, r) += through W2 (may be NULL at rank 0), whose gradient accumulates. */
void ds_draft_rows_logits_backward(ds_draft *d, int64_t r0, int64_t c, const float *dlogits, float *dh, float *dz);
/* Backward through the heads (dz (R, r) or NULL, dconf (R) or NULL; both add into dh (R, d),
 * which is modified) and the layers; every trainable gradient ACCUMULATES. */
ds_status ds_draft_backward_train(ds_draft *d, const ds_draft_seq *seq, float *dh, float *dz, const float *dconf);
/* A grow-only scratch buffer owned by the draft (64-byte aligned; NULL when out of memory):
 * a training step allocates nothing once it has grown. */
void *ds_draft_workspace(ds_draft *d, size_t bytes);

/* ---- Decoding weights: the matrices the decoder below reads (fc, every layer's projections,
 * lm_head, the vanilla Markov head's W2) may be read from copies in a smaller dtype. A decoding
 * step on a CPU streams them from memory (a 1-layer draft of a d = 576 target over 8192 ids
 * holds 40 MB of fp32 matrices, 40% of the 4-bit target's bytes per token), so a copy in
 * DS_BF16 or DS_Q8_0 (ggml's blocks; a matrix whose row length is not a multiple of 32 stays
 * fp32) cuts the draft's share of a round. The copies are made from the weights as they are
 * now and dropped by ds_draft_forward_train (a trained step would leave them stale); DS_F32
 * drops them. Speculation stays lossless in any dtype (the target verifies every token); the
 * proposals and confidences are those of the rounded weights. Training never reads them. */
ds_status ds_draft_set_decode_weights(ds_draft *d, ds_dtype dtype);
ds_dtype ds_draft_decode_weights(const ds_draft *d); /* DS_F32 without copies */
/* "f32", "bf16", "q8_0" <-> the dtype; 0 for another name */
int ds_draft_weights_parse(const char *name, ds_dtype *out);
const char *ds_draft_weights_name(ds_dtype dtype);

/* ---- Decoding (spec section 8): per request, a state holding every draft layer's context
 * K/V for the committed positions; then per round one block and the head slot by slot. ---- */
typedef struct ds_draft_state ds_draft_state;

/* A state for up to capacity context positions. */
ds_status ds_draft_state_new(const ds_draft *d, int64_t capacity, ds_draft_state **out);
void ds_draft_state_free(ds_draft_state *s);
int64_t ds_draft_state_len(const ds_draft_state *s);
/* Keeps the first len context positions (rejected tokens' rows vanish). */
ds_status ds_draft_state_crop(ds_draft_state *s, int64_t len);
/* Appends the target's captured rows ctx [n, m*d] (target_layer_ids order) of the next n
 * committed positions: H_ctx = hidden_norm(fc(ctx)), then each layer's k (normed, roped at
 * its position) and v. */
ds_status ds_draft_state_append(ds_draft *d, ds_draft_state *s, const float *ctx, int64_t n);
/* One backbone pass over [anchor, M, ..., M] at positions len .. len+g-1, seeing the whole
 * cached context and the block: h_out [g, d] final-normed; base_logits [g, N] = h @ lm_head^T
 * (may be NULL; column j is target id S[j] with a reduced vocabulary). Resets the sequential
 * head's state (s_0 = 0). The anchor is a target id. */
ds_status ds_draft_block(ds_draft *d, ds_draft_state *s, int32_t anchor, float *h_out, float *base_logits);
/* The sequential head at one slot, left to right: prev is the token chosen for the slot
 * before (the anchor for slot 0) as a TARGET id (S[j] for draft column j), h_k that slot's row
 * of h_out. logits [N] (the slot's base logits) += its Markov bias; *conf_logit = the confidence head's logit (NAN without it).
 * The rnn head's state advances. Either output may be NULL. */
ds_status ds_draft_head_step(ds_draft *d, ds_draft_state *s, const float *h_k, int32_t prev, float *logits,
                             float *conf_logit);

/* Writes the HF draft layout of spec section 7 into out_dir: config.json (the target's
 * config.json object, target_config_json, plus the draft keys) and model.safetensors (F32,
 * the frozen tables in their own dtype, names without a "model." prefix; metadata format = "pt" and DS_EXPORT_MARKER_KEY = "1").
 * Both files are written atomically, model.safetensors first. It writes whatever out_dir
 * holds: callers that take out_dir from a user check it with ds_draft_export_dir_check. */
ds_status ds_draft_export_hf(const ds_draft *d, const char *target_config_json, const char *out_dir);
#define DS_EXPORT_MARKER_KEY "dspark_export"
/* Writes the draft as llama.cpp serves it (--spec-type draft-dspark): a GGUF of architecture
 * "dflash" with the Markov (markov_w1, markov_w2) and confidence (conf_proj) tensors, the file
 * llama.cpp's convert_hf_to_gguf.py makes of ds_draft_export_hf's directory with the target's
 * directory as --target-model-dir (same keys, values, tensor names, shapes, types and bytes;
 * docs/gguf-export.md lists the conventions). draft_config_json is as for
 * ds_draft_hf_config_json; target is the target's GGUF, whose tokenizer.* keys are copied
 * (its token count must be the draft's vocab_size), or its Hugging Face directory, from whose
 * tokenizer files the keys are built as the converter builds them (ds_hf_vocab_gguf,
 * dspark/gguf_model.h); dtype (F32, F16, BF16 or Q8_0: rows of whole blocks, others F16) stores the
 * matrices, 1-D tensors and norms stay F32; name gives general.name (as the converter titles
 * a directory name). Only the vanilla Markov head is accepted: llama.cpp implements no other
 * (gated, rnn and no head are refused naming that limit). Written atomically. */
ds_status ds_draft_export_gguf(const ds_draft *d, const char *draft_config_json, const char *target,
                               ds_dtype dtype, const char *name, const char *out_path);
/* Whether out_dir may receive an export. It may when it does not exist, is empty, or is a
 * previous export: every entry is config.json, model.safetensors or a temp file of theirs
 * (NAME.tmp.PID), and config.json's architectures is ["Qwen3DSparkModel"] (or, when
 * config.json is absent, an export interrupted between its two files, model.safetensors
 * carries the DS_EXPORT_MARKER_KEY metadata). Anything else (a target model, other files) is
 * refused naming what was found, unless overwrite; then *foreign (may be NULL) counts the
 * entries other than the export's files, which the export leaves in place. */
ds_status ds_draft_export_dir_check(const char *out_dir, int overwrite, int *foreign);
/* The exported config.json text (malloc'd): the target's config plus the draft keys.
 * target_config_json may itself be an exported config (a checkpoint's draft_config): the draft
 * keys are replaced, so the result is the same. */
ds_status ds_draft_hf_config_json(const ds_draft *d, const char *target_config_json, char **out);
/* Loads such a directory (ours, or any writer of the same layout). */
ds_status ds_draft_load_hf(const char *dir, const ds_backend *backend, ds_draft **out);
/* Reads every tensor of the draft (trainable and frozen) from st, named prefix + export name;
 * shapes must match exactly and every value be finite. An F32 tensor of the draft takes any
 * float dtype (converted); a BF16 / F16 table must be stored in its own dtype. A reduced
 * vocabulary's d2t (and t2d, which may be absent) must equal the draft's own. */
ds_status ds_draft_read_tensors(ds_draft *d, const ds_safetensors *st, const char *prefix);
/* A draft of config cfg with every tensor read from st (ds_draft_read_tensors); its frozen
 * tables take the dtype st stores them in (BF16 and F16 kept, anything else read as F32), so
 * a checkpoint or export loads as it was written. With cfg->draft_vocab_size = N > 0, S comes
 * from the tensor d2t (I64 or I32 [N]; S[j] = j + d2t[j] must lie in [0, V) and strictly
 * increase, else an error naming the tensor and the index), and t2d, when present, must mark
 * exactly S; a file whose config says N = V and that has no d2t is a full-vocabulary draft. */
ds_status ds_draft_load_tensors(const ds_draft_config *cfg, const ds_safetensors *st, const char *prefix,
                                const ds_backend *backend, ds_draft **out);
/* The draft keys of the exported config.json, parsed back (target fields included). */
ds_status ds_draft_config_from_json(const char *json, size_t len, const char *label, ds_draft_config *out);

#ifdef __cplusplus
}
#endif
#endif


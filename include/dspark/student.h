/* A trainable causal LM of the Llama / Qwen2 / Qwen3 families (the distillation student, or a
 * model pretrained from scratch): exactly the architecture the target (dspark/target.h) runs,
 * with a full backward.
 *
 * Supported, as the target reads them (dspark/hfconfig.h): tied or untied head (a tied head
 * is one table whose gradient collects both uses), GQA, Qwen2 q/k/v biases, Llama
 * attention_bias (q/k/v/o) and mlp_bias (gate/up/down), Qwen3 q/k norms (and its
 * attention_bias), rope types default / linear / llama3, every family's config defaults.
 * pad_token_id behaves as torch's nn.Embedding padding_idx: its row is zeroed at init and the
 * embedding lookup sends it no gradient (a tied head still does).
 *
 * Memory: parameters live in one fp32 buffer and their gradients in a second buffer of the
 * same layout (zeroing, clipping, AdamW and all-reduce are flat loops), described by a table
 * of named tensors in HF names and shapes (ds_student_tensor_at). The forward keeps the
 * activations the backward needs in a grow-only arena; the [rows, V] logits are never
 * materialized here: a loss asks for them in row chunks (the training hooks below).
 *
 * A training step (what the trainer's pretrain / distill objectives do):
 *   ds_student_forward(s, &batch);                        -- rows = ds_student_rows(s)
 *   for each chunk [r0, r0+c):                             -- c x V buffers only
 *     ds_student_rows_logits(s, r0, c, logits);
 *     ... loss over the chunk, dlogits = dL/dlogits ...
 *     ds_student_rows_logits_backward(s, r0, c, dlogits, dh + r0 * d);  -- head grad accumulates
 *   ds_student_backward(s, dh, extra, n_extra);           -- every other grad accumulates
 * Gradients ACCUMULATE: zero them (ds_student_zero_grads) once per optimizer step. */
#ifndef DSPARK_STUDENT_H
#define DSPARK_STUDENT_H

#include "dspark/backend.h"
#include "dspark/common.h"
#include "dspark/hfconfig.h"
#include "dspark/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_student ds_student;

/* ---- construction */

/* A fresh student from a config.json text (label names it in errors): the family, sizes,
 * rope and biases as ds_config_parse reads them (class defaults included), weights drawn as
 * transformers' _init_weights draws them, from our seeded stream: every Linear weight and the
 * embedding normal(0, initializer_range) (config.json's, else 0.02), biases 0, RMSNorm weights
 * (q/k norms included) 1, the pad_token_id row of the embedding 0. The same seed gives the
 * same weights. */
ds_status ds_student_new(const char *config_json, size_t len, const char *label, uint64_t seed,
                         const ds_backend *backend, ds_student **out);
/* The same from a config.json file. */
ds_status ds_student_new_from_file(const char *config_path, uint64_t seed, const ds_backend *backend,
                                   ds_student **out);
/* An HF checkpoint directory (config.json + model.safetensors or a sharded index; F32, BF16
 * or F16, converted to fp32), or a GGUF file (include/dspark/model_source.h), read as the target
 * reads it. Tying follows transformers 5.x:
 * with tie_word_embeddings, a checkpoint holding only one of the two tables ties the other to
 * it, one holding both ties them when they are equal and keeps them apart (untied, and
 * exported with tie_word_embeddings false) when they differ. */
ds_status ds_student_load_hf(const char *model_dir, const ds_backend *backend, ds_student **out);
void ds_student_free(ds_student *s);

const ds_model_config *ds_student_config(const ds_student *s);
/* 1 when the head is the embedding table (one tensor, one gradient). */
int ds_student_is_tied(const ds_student *s);
/* config.json's pad_token_id, -1 when none. */
int64_t ds_student_pad_token_id(const ds_student *s);
const ds_backend *ds_student_backend(const ds_student *s);

/* ---- parameters */

/* Flat trainable parameters and their gradients (same layout, ds_student_num_params floats);
 * every tensor of the model is trainable, followed by the extra floats below (if any). */
float *ds_student_params(ds_student *s);
float *ds_student_grads(ds_student *s);
size_t ds_student_num_params(const ds_student *s);
void ds_student_zero_grads(ds_student *s);

/* n extra trainable floats after the model's tensors in both flat buffers: a loss's own
 * parameters (the intermediate-layer projections of distillation), so that the trainer's one
 * optimizer, clipping and checkpointed optimizer state cover them with the model. The buffers
 * move (the model's values and gradients are kept, the tensor views follow; earlier pointers
 * from ds_student_params / grads / tensor_at are stale); new floats are 0. The extras are
 * not in the tensor table: export and ds_student_read_tensors ignore them. NULL when n = 0. */
ds_status ds_student_set_extra_params(ds_student *s, size_t n);
float *ds_student_extra_params(ds_student *s);
float *ds_student_extra_grads(ds_student *s);

/* Named views of every tensor, in HF names ("model.embed_tokens.weight",
 * "model.layers.0.self_attn.q_proj.weight", ..., "model.norm.weight", "lm_head.weight" when
 * untied) and shapes, in the order of the flat buffers (data and grad point into them). What
 * checkpoints save (under a prefix) and export writes. */
typedef struct {
  const char *name;
  float *data;  /* (shape) inside ds_student_params */
  float *grad;  /* (shape) inside ds_student_grads */
  int ndim;     /* 1 or 2 */
  int64_t shape[2];
} ds_student_tensor;
size_t ds_student_tensor_count(const ds_student *s);
const ds_student_tensor *ds_student_tensor_at(const ds_student *s, size_t i);
/* Reads every tensor from st, named prefix + HF name (e.g. a checkpoint's "student."), shapes
 * exactly as the table's, any float dtype; a missing tensor, another shape or a non-finite
 * value is an error naming the file and the tensor. */
ds_status ds_student_read_tensors(ds_student *s, const ds_safetensors *st, const char *prefix);

/* ---- training forward and its hooks */

/* A batch: n_seqs sequences, ids [n_seqs, seq_len] row-major; sequence b has lengths[b]
 * tokens (1 .. seq_len; only those are read), or seq_len each when lengths is NULL. The
 * forward's rows are the real tokens concatenated: token t of sequence b is row
 * ds_student_seq_offsets(s)[b] + t (b * seq_len + t when lengths is NULL). Positions restart
 * at 0 in each sequence, and a token attends to its own sequence's earlier tokens only. */
typedef struct {
  const int32_t *ids;
  int64_t n_seqs, seq_len;
  const int64_t *lengths;
} ds_student_batch;

/* Runs the model over the batch, keeping in the student what the backward needs (until the
 * next forward). Refused, naming the sequence and position: an id outside [0, vocab_size),
 * a length outside [1, seq_len], a sequence longer than max_position_embeddings. */
ds_status ds_student_forward(ds_student *s, const ds_student_batch *batch);
/* Rows of the last forward, and its sequence offsets [n_seqs + 1] (offsets[0] = 0). */
int64_t ds_student_rows(const ds_student *s);
const int64_t *ds_student_seq_offsets(const ds_student *s);
/* The last forward's final-normed hidden state h [rows, d] (HF's last_hidden_state). */
const float *ds_student_final_hidden(const ds_student *s);
/* The residual stream after decoder layer `layer` [rows, d]: -1 = the embedding output (HF
 * hidden_states[0]), l = HF hidden_states[l + 1] for l < L - 1; l = L - 1 is the last layer's
 * output BEFORE the final norm (HF's hidden_states[L] is final-normed: that is
 * ds_student_final_hidden). NULL outside [-1, L-1]. */
const float *ds_student_hidden(const ds_student *s, int64_t layer);
/* logits [c, V] of rows [r0, r0 + c) = h[r0 .. r0+c) @ head^T. */
/* Brackets a loop of the row-chunk calls: the weights do not change in between, so the backend
 * may convert the lm_head (read by every chunk) once (operand_hold). Each begin needs its end,
 * on error paths too. */
void ds_student_rows_begin(ds_student *s);
void ds_student_rows_end(ds_student *s);
void ds_student_rows_logits(ds_student *s, int64_t r0, int64_t c, float *logits);
/* Backward of those logits: dlogits [c, V] in; dh [c, d] (the chunk's rows of the caller's
 * [rows, d] buffer) += dlogits @ head; the head's gradient (the embedding's when tied) +=
 * dlogits^T @ h[r0 .. r0+c). */
void ds_student_rows_logits_backward(ds_student *s, int64_t r0, int64_t c, const float *dlogits, float *dh);

/* The gradient of a loss on an intermediate hidden state (ds_student_hidden(s, layer)), for
 * intermediate-layer KD: grad [rows, d]. */
typedef struct {
  int64_t layer; /* -1 .. L-1, as ds_student_hidden */
  const float *grad;
} ds_student_hidden_grad;

/* Backward of the last forward from dh [rows, d] (the gradient of the final-normed hidden
 * state; NULL: zero) plus the n_extra intermediate gradients (which may name a layer more
 * than once: they add); every parameter gradient ACCUMULATES. The forward's activations are
 * kept (a second backward of the same forward is allowed). */
ds_status ds_student_backward(ds_student *s, const float *dh, const ds_student_hidden_grad *extra, int n_extra);

/* A grow-only scratch buffer owned by the student (64-byte aligned; NULL when out of memory),
 * for a loss's chunk buffers: a training step allocates nothing once it has grown. */
void *ds_student_workspace(ds_student *s, size_t bytes);

/* ---- export */

/* The student's config.json text (malloc'd): the source config.json (the fresh config, or the
 * loaded directory's) with architectures, model_type, every size as resolved
 * (vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, head_dim, max_position_embeddings, rms_norm_eps, initializer_range),
 * tie_word_embeddings as the student is, the bias flags of the family and dtype "float32";
 * other keys (rope, ids) as written there. ds_student_new of this text rebuilds the same
 * shapes (a checkpoint records it). */
ds_status ds_student_config_json(const ds_student *s, char **out);
/* Writes out_dir/config.json (ds_student_config_json) and out_dir/model.safetensors (F32, the
 * HF names of ds_student_tensor_at; metadata format "pt"), both atomically, model first;
 * creates out_dir. transformers' AutoModelForCausalLM and ds_target_load read the result. It
 * writes whatever out_dir holds: a command taking out_dir from a user checks it first. */
ds_status ds_student_export_hf(const ds_student *s, const char *out_dir);

#ifdef __cplusplus
}
#endif
#endif

/* Internals shared by the draft's forward (draft.c), backward (draft_backward.c), heads
 * (markov_head.c) and the training hooks (draft_train.c). */
#ifndef DSPARK_MODEL_DRAFT_INTERNAL_H
#define DSPARK_MODEL_DRAFT_INTERNAL_H

#include "dspark/draft.h"

typedef struct {
  float *wq, *wk, *wv, *wo;       /* (q_dim, d) (kv_dim, d) (kv_dim, d) (d, q_dim) */
  float *q_norm, *k_norm;         /* (head_dim) */
  float *w_gate, *w_up, *w_down;  /* (I, d) (I, d) (d, I) */
  float *in_norm, *post_norm;     /* (d) */
} draft_layer;

/* The same layout twice: values and gradients. */
typedef struct {
  float *fc;          /* (d, m*d) */
  float *hidden_norm; /* (d) */
  float *norm;        /* (d) final */
  draft_layer *layers;
  float *markov_w1;   /* (V, r) embedding of the previous token */
  float *markov_w2;   /* (N, r) r -> the draft's vocabulary, no bias (N = V without a reduced vocabulary) */
  float *gate_w;      /* gated: (r, d + r) over [h ; e] */
  float *gate_b;      /* (r) */
  float *joint_w;     /* rnn: (3r, 2r + d) over [s ; e ; h], outputs (a | c | o) */
  float *joint_b;     /* (3r) */
  float *conf_w;      /* (1, d [+ r]) over [h ; e] */
  float *conf_b;      /* (1) */
} draft_weights;

/* Activations of one sequence's forward, kept for the backward. R = n_blocks * g rows,
 * T context rows. Per layer pointers index into one grow-only arena. */
typedef struct {
  float *h_in;     /* (R, d) layer input (residual) */
  float *hn;       /* (R, d) input_layernorm output */
  float *rstd_in;  /* (R) */
  float *q_pre;    /* (R, q_dim) q_proj output before q_norm */
  float *q_rstd;   /* (R * Hq) */
  float *q;        /* (R, q_dim) normed + roped */
  float *kb_pre;   /* (R, kv_dim) block keys before k_norm */
  float *kb_rstd;  /* (R * Hkv) */
  float *kb;       /* (R, kv_dim) */
  float *vb;       /* (R, kv_dim) */
  float *kc_pre;   /* (T, kv_dim) context keys before k_norm */
  float *kc_rstd;  /* (T * Hkv) */
  float *kc;       /* (T, kv_dim) */
  float *vc;       /* (T, kv_dim) */
  float *attn;     /* (R, q_dim) */
  float *lse;      /* (R * Hq) */
  float *h_mid;    /* (R, d) after the attention residual */
  float *hp;       /* (R, d) post_attention_layernorm output */
  float *rstd_post;/* (R) */
  float *gu;       /* (R, 2I) gate | up */
  float *act;      /* (R, I) */
} layer_acts;

typedef struct {
  int64_t R, T;        /* sizes the arena holds */
  float *arena;
  size_t arena_floats;
  float *fc_out;       /* (T, d) ctx @ fc^T */
  float *hctx_rstd;    /* (T) */
  float *hctx;         /* (T, d) H_ctx = hidden_norm(fc_out) */
  layer_acts *layers;
  float *h_last;       /* (R, d) residual after the last layer */
  float *h;            /* (R, d) final-normed */
  float *rstd_final;   /* (R) */
  int64_t *pos_blk;    /* (R) a + k */
  int64_t *pos_ctx;    /* (T) 0 .. T-1 */
  int64_t *ctx_len;    /* (n_blocks) a, or -1 for a dropped block */
  int32_t *prev_ids;   /* (R) teacher-forced previous token of each slot */
  /* heads */
  float *e;            /* (R, r) W1[prev] */
  float *z;            /* (R, r) the vector W2 multiplies: e, gate*e or tanh(o) */
  float *gate;         /* (R, r) gated: sigmoid(pre) */
  float *rnn_s;        /* (R, r) rnn: state s_k after slot k */
  float *rnn_aco;      /* (R, 3r) rnn: pre-activations (a | c | o) */
  float *conf;         /* (R) confidence logits */
} draft_acts;

typedef struct {
  const char *name;
  int64_t rows, cols; /* cols 0 for a vector */
  int trainable;
  int init;           /* 0 normal(0, 0.02), 1 ones, 2 zeros */
  size_t offset;      /* in the params (trainable: floats) or frozen buffer (bytes) */
  float **slot;       /* trainable: where the value pointer goes */
  float **grad_slot;  /* trainable: where the gradient pointer goes */
  ds_weight *table;   /* frozen: the table it is (data and dtype set at creation); NULL for d2t / t2d */
  ds_dtype dtype;     /* F32 for trainables; a frozen table's own dtype; I64 d2t, BOOL t2d */
} tensor_spec;

/* ds_draft_set_decode_weights' copies (data NULL: the decoder reads the fp32 value). */
typedef struct {
  ds_weight wq, wk, wv, wo, w_gu, w_down; /* w_gu: w_gate and w_up, one (2I, d) matrix */
} decode_layer;
typedef struct {
  ds_dtype dtype; /* DS_F32: no copies */
  ds_weight fc, lm_head, markov_w2;
  decode_layer *layers;
  void *mem;
} decode_copies;
void draft_decode_copies_free(ds_draft *d);

struct ds_draft {
  ds_draft_config cfg;
  const ds_backend *be;
  int64_t q_dim, kv_dim;
  float *params;   /* trainable, flat */
  float *grads;    /* same layout */
  size_t n_params;
  void *frozen;    /* embed (V, d) then lm_head (N, d), each in its own dtype; then d2t (N) I64, t2d (V) BOOL */
  ds_safetensors *tables_file; /* the checkpoint whose mapping holds embed and lm_head in place, or NULL */
  ds_weight embed, lm_head; /* F32 replicas of an fp32 target's tables, BF16 / F16 of a 16-bit one's */
  int64_t n_vocab;    /* N: rows of lm_head and W2, width of every logit row */
  int32_t *vocab_ids; /* (N) S, or NULL without a reduced vocabulary */
  int32_t *vocab_index; /* (V) column of a target id, -1 outside S; NULL without */
  int64_t *d2t;       /* (N) S[j] - j: the tensor "d2t" (in the frozen buffer) */
  uint8_t *t2d;       /* (V) v in S: the tensor "t2d" (in the frozen buffer) */
  draft_weights w, g; /* values and gradients */
  float *inv_freq;    /* (head_dim / 2) */
  tensor_spec *specs;
  size_t n_specs;
  ds_draft_tensor *tensors;
  draft_acts acts;
  float *dscratch;    /* backward scratch arena */
  size_t dscratch_floats;
  void *workspace;    /* ds_draft_workspace: the fused loss pass's buffers, grow-only: a step
                         allocates nothing, so the allocator cannot inflate the peak */
  size_t workspace_bytes;
  decode_copies dec; /* ds_draft_set_decode_weights */
};

/* ds_draft_new_vocab; init 0 leaves every trainable value and a table given without data
 * unset, for a caller that fills all of them next (a checkpoint's reader): the random init of
 * the parameters was a third of loading a draft to decode. */
ds_status draft_new(const ds_draft_config *cfg, ds_weight embed, ds_weight lm_head, const int32_t *vocab_ids,
                    uint64_t seed, int init, const ds_backend *backend, ds_draft **out);
ds_status draft_forward(ds_draft *d, const ds_draft_seq *seq);
/* Heads on the final-normed h: fills acts.e / z / gate / rnn_* / conf. */
void markov_head_forward(ds_draft *d, int64_t R);
/* logits[c, N] = h[r0 .. r0+c) @ lm_head^T + z[...] @ W2^T; scratch [c, N] (unused at rank 0). */
void draft_block_logits(ds_draft *d, int64_t r0, int64_t c, float *logits, float *scratch);
/* Backward of the heads: dz (R, r) and dconf (R) in; accumulates into dh (R, d) and the
 * head parameter gradients. dz may be NULL (no Markov head). */
void markov_head_backward(ds_draft *d, int64_t R, float *dz, const float *dconf, float *dh);
/* Backward of the layers from dh (R, d) (gradient of the final-normed output); accumulates
 * every trainable gradient. */
ds_status draft_backward(ds_draft *d, const ds_draft_seq *seq, const float *dh);

#endif

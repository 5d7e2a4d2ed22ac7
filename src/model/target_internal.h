/* Internals shared by the target's loading (target_load.c) and its forward and KV cache
 * (target.c). Loading calls into target.c (the workspace), never the other way. */
#ifndef DSPARK_MODEL_TARGET_INTERNAL_H
#define DSPARK_MODEL_TARGET_INTERNAL_H

#include "dspark/gguf.h"
#include "dspark/safetensors.h"
#include "dspark/target.h"

/* One linear layer's weight [rows, in] as the matmuls read it: its output rows in 1 to 3
 * consecutive row segments. A group converted to fp32 at load is one fused segment (q|k|v,
 * gate|up: one matmul); a group kept in the checkpoint's BF16 / F16 has one segment per
 * checkpoint tensor, used where it lies in the mapping. */
typedef struct {
  ds_weight seg[3];
  int64_t seg_rows[3];
  int n_seg;
  int mapped; /* 1: the segments are the checkpoint's 16-bit tensors; 2: a GGUF's quantized ones */
  /* per segment: 0, or the heads of a llama GGUF's q / k rows used in the file's order (in each
   * head, file row 2i + j is HF row j hd / 2 + i), the product's columns put back in HF order */
  int64_t seg_pair_heads[3];
} target_linear;

typedef struct {
  target_linear qkv;     /* (q_dim + 2 kv_dim, d)  rows: q | k | v */
  float *bqkv;           /* (q_dim + 2 kv_dim) or NULL */
  float *q_norm;         /* (head_dim) or NULL */
  float *k_norm;         /* (head_dim) or NULL */
  target_linear wo;      /* (d, q_dim) */
  float *bo;             /* (d) or NULL */
  target_linear gate_up; /* (2 I, d)  rows: gate | up */
  float *b_gate_up;      /* (2 I) or NULL */
  target_linear down;    /* (d, I) */
  float *b_down;         /* (d) or NULL */
  float *in_norm;        /* (d) */
  float *post_norm;      /* (d) */
} layer_weights;

/* Grow-only scratch for one forward; R = rows of the largest forward so far. */
typedef struct {
  int64_t rows;
  float *h;       /* (R, d) residual stream */
  float *x;       /* (R, d) normed input of a sub-block */
  float *tmp;     /* (R, d) a sub-block's output: x's memory (x is read before it is written) */
  /* one buffer `mix` for what the sub-blocks hold in turn: the attention's qkv and attn, then
   * the MLP's gu and act (each dead before the other is written) */
  float *mix;
  float *qkv;     /* (R, q_dim + 2 kv_dim) in mix */
  float *attn;    /* (R, q_dim) in mix, after qkv */
  float *gu;      /* (R, 2 I) in mix */
  float *act;     /* (R, I) in mix, after gu */
  int64_t *pos;   /* (R), host memory (the backends take positions from the host) */
  /* device backends only (ds_backend.device_memory): outputs the caller wants on the host are
   * computed here, then copied */
  float *logits;  /* (logit_rows, V) backend memory */
  int64_t logit_rows;
  float *stage;   /* (R, d) host memory: the residual stream of a captured layer */
  float *picked;  /* (picked_rows, d) backend memory: the normed rows whose logits a forward of
                   * several passes asks for, gathered across its passes */
  int64_t picked_rows;
} workspace;

struct ds_target {
  ds_model_config cfg;
  char *dir;      /* the model (a directory or a GGUF file) as given, for messages */
  char *config_label; /* its config.json as messages name it ("DIR/config.json", "FILE.gguf (config.json)") */
  int own_head;   /* lm_head has its own weights (untied, or tied in config.json but stored: transformers unties) */
  const ds_backend *be;
  int64_t q_dim, kv_dim, qkv_dim;
  float *params;  /* one buffer holding every weight converted to fp32 */
  size_t n_params;
  ds_checkpoint *ck;   /* open while a weight is used where it lies in its mapping, else NULL */
  void **owned;        /* 16-bit tensors copied out of the mapping (unaligned there), freed with the target */
  int n_owned;
  int ck_mapped;       /* 1 when a weight lies in ck's mapping (ck stays open) */
  ds_gguf *gguf;       /* --weights as-stored on a GGUF: the file mapped again for the quantized
                        * weights used in place, NULL otherwise */
  size_t mapped_bytes; /* bytes of the 16-bit or quantized weights used in place (a tied table once) */
  ds_dtype mapped_dtype; /* their dtype (DS_F32 when there is none; the first one when mixed) */
  size_t mapped_of[DS_DTYPE_COUNT]; /* mapped_bytes by dtype */
  int n_quant_mapped;                /* quantized tensors taken from the GGUF */
  int from_gguf;       /* loaded from a GGUF file */
  int converted16;     /* a 16-bit matrix DS_WEIGHTS_DEQUANTIZED keeps in place was converted to fp32 */
  ds_weights_mode held; /* ds_target_weights_held */
  ds_weight embed;   /* (V, d) */
  ds_weight lm_head; /* (V, d), the same data as embed when tied */
  float *norm;       /* (d) */
  layer_weights *layers;
  float *inv_freq; /* (head_dim / 2) */
  void **dev_weights; /* device backends: the weight buffers uploaded at load (params first) */
  int n_dev_weights;
  workspace ws;
};

struct ds_kv_cache {
  const ds_backend *be; /* k and v live in its memory */
  int64_t len, cap;
  int64_t n_layers, n_kv_heads, head_dim;
  float *k; /* (L, n_kv_heads, cap, head_dim); NULL in an f16 cache */
  float *v; /* (L, n_kv_heads, cap, head_dim) */
  uint16_t *k16, *v16; /* the same in f16 bits (ds_set_kv_cache_dtype(DS_F16)); NULL in an fp32 cache */
};

/* Frees the forward's scratch (target.c). */
void target_workspace_free(const ds_backend *be, workspace *ws);

#endif

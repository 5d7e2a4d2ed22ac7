/* Internals shared by the student's construction (student.c), forward and training hooks
 * (student_forward.c), backward (student_backward.c) and HF I/O (student_io.c). */
#ifndef DSPARK_MODEL_STUDENT_INTERNAL_H
#define DSPARK_MODEL_STUDENT_INTERNAL_H

#include "dspark/student.h"

/* One decoder layer's tensors; NULL where the family has none. gate and up are adjacent in
 * the buffers (one (2I, d) matmul), and so are their biases. */
typedef struct {
  float *wq, *wk, *wv, *wo;        /* (q_dim, d) (kv_dim, d) (kv_dim, d) (d, q_dim) */
  float *bq, *bk, *bv, *bo;        /* (q_dim) (kv_dim) (kv_dim) (d): attention_bias / o_proj_bias */
  float *q_norm, *k_norm;          /* (head_dim): Qwen3 */
  float *w_gate, *w_up, *w_down;   /* (I, d) (I, d) (d, I) */
  float *b_gate, *b_up, *b_down;   /* (I) (I) (d): mlp_bias */
  float *in_norm, *post_norm;      /* (d) */
} student_layer;

/* The same layout twice: values and gradients. */
typedef struct {
  float *embed;   /* (V, d) */
  float *norm;    /* (d) final */
  float *lm_head; /* (V, d); == embed when tied */
  student_layer *layers;
} student_weights;

/* Activations of one decoder layer, kept for the backward (R rows). */
typedef struct {
  float *h_in;      /* (R, d) residual input (layer 0: the embedding output) */
  float *hn;        /* (R, d) input_layernorm output */
  float *rstd_in;   /* (R) */
  float *q_pre;     /* (R, q_dim) q_proj output before q_norm (qk_norm only) */
  float *q_rstd;    /* (R * Hq) (qk_norm only) */
  float *q;         /* (R, q_dim) normed and roped */
  float *k_pre;     /* (R, kv_dim) (qk_norm only) */
  float *k_rstd;    /* (R * Hkv) (qk_norm only) */
  float *k;         /* (R, kv_dim) normed and roped */
  float *v;         /* (R, kv_dim) */
  float *attn;      /* (R, q_dim) */
  float *lse;       /* (R, Hq) */
  float *h_mid;     /* (R, d) after the attention residual */
  float *hp;        /* (R, d) post_attention_layernorm output */
  float *rstd_post; /* (R) */
  float *gu;        /* (R, 2I) gate | up */
  float *act;       /* (R, I) */
} student_layer_acts;

typedef struct {
  int64_t R;             /* rows the arena holds */
  int64_t n_seqs_cap;    /* sequences seq_off holds */
  float *arena;
  student_layer_acts *layers;
  float *h_last;         /* (R, d) residual after the last layer */
  float *h;              /* (R, d) final-normed */
  float *rstd_final;     /* (R) */
  int32_t *ids;          /* (R) the forward's tokens */
  int64_t *pos;          /* (R) positions within their sequence */
  int64_t *seq_off;      /* (n_seqs + 1) */
  /* the last forward */
  int64_t rows, n_seqs;
  int valid;
} student_acts;

typedef struct {
  const char *name;
  int64_t rows, cols; /* cols 0 for a vector */
  int init;           /* 0 normal(0, initializer_range), 1 ones, 2 zeros */
  size_t offset;      /* in the flat buffers */
  float **slot, **grad_slot;
} student_spec;

struct ds_student {
  ds_model_config cfg;
  char *config_json;        /* the source config.json text (export starts from it) */
  double initializer_range; /* config.json's, else 0.02 */
  int64_t pad_token_id;     /* -1: none */
  int tied;
  const ds_backend *be;
  int64_t q_dim, kv_dim;
  float *params, *grads;
  size_t n_params;          /* the model's own tensors */
  size_t n_extra;           /* trailing extra trainable floats (ds_student_set_extra_params) */
  student_weights w, g;
  float *inv_freq;          /* (head_dim / 2) */
  student_spec *specs;
  ds_student_tensor *tensors;
  size_t n_specs;
  student_acts acts;
  float *dscratch;          /* backward scratch, grow-only */
  size_t dscratch_floats;
  void *workspace;          /* ds_student_workspace */
  size_t workspace_bytes;
};

/* Builds a student of the given config (tied or not) with every tensor 0; config_json is
 * copied. student.c. */
ds_status student_create(const ds_model_config *cfg, const char *config_json, int tied, double init_range,
                         int64_t pad_token_id, const ds_backend *be, ds_student **out);
/* The fields of config.json the config parser does not keep: initializer_range (0.02 when
 * absent or null, as transformers' `or 0.02`) and pad_token_id (-1 when absent or null). */
ds_status student_config_extras(const char *json, size_t len, const char *label, const ds_model_config *cfg,
                                double *init_range, int64_t *pad_token_id);
/* Frees the activation arena. student_forward.c. */
void student_acts_free(student_acts *a);

#endif

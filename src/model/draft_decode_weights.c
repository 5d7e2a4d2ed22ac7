/* The decoder's copies of the draft's matrices in a smaller dtype (include/dspark/draft.h,
 * "Decoding weights"). Shapes: fc (d, m*d); per layer wq (q_dim, d), wk and wv (kv_dim, d),
 * wo (d, q_dim), gate|up (2I, d), down (d, I); lm_head (N, d); vanilla W2 (N, r). */
#include <stdlib.h>
#include <string.h>

#include "dspark/dtype.h"
#include "dspark/ggml_quant.h"
#include "model/draft_internal.h"

int ds_draft_weights_parse(const char *name, ds_dtype *out) {
  if (!strcmp(name, "f32")) *out = DS_F32;
  else if (!strcmp(name, "bf16")) *out = DS_BF16;
  else if (!strcmp(name, "q8_0")) *out = DS_Q8_0;
  else return 0;
  return 1;
}

const char *ds_draft_weights_name(ds_dtype dtype) {
  return dtype == DS_BF16 ? "bf16" : dtype == DS_Q8_0 ? "q8_0" : "f32";
}

ds_dtype ds_draft_decode_weights(const ds_draft *d) { return d->dec.dtype; }

void draft_decode_copies_free(ds_draft *d) {
  if (d->dec.mem) ds_release_packed_weights(); /* packed copies keyed by the addresses freed below */
  ds_free_aligned(d->dec.mem);
  free(d->dec.layers);
  memset(&d->dec, 0, sizeof d->dec);
  d->dec.dtype = DS_F32;
}

/* A matrix to copy: rows x in values, from fp32 (src) or from a frozen table (table, any
 * dtype embedding_w reads), into *dst. */
typedef struct {
  const float *src;
  ds_weight table;
  int64_t rows, in;
  ds_weight *dst;
} matrix;

/* The copy's dtype: Q8_0 needs rows of whole blocks; else the matrix stays fp32 (DS_F32). */
static ds_dtype copy_dtype(ds_dtype want, int64_t in) { return want == DS_Q8_0 && in % 32 ? DS_F32 : want; }

static size_t copy_bytes(ds_dtype dt, int64_t rows, int64_t in) {
  size_t b = dt == DS_Q8_0 ? ds_quant_row_bytes(DS_Q8_0, in) * (size_t)rows
             : dt == DS_BF16 ? (size_t)(rows * in) * 2
                             : 0;
  return (b + 63) & ~(size_t)63;
}

/* One row of m in fp32 into buf (in values). */
static void row_f32(const ds_draft *d, const matrix *m, int64_t r, float *buf) {
  if (m->src) {
    memcpy(buf, m->src + r * m->in, (size_t)m->in * sizeof(float));
  } else {
    int32_t id = (int32_t)r;
    d->be->embedding_w(buf, &id, m->table, 1, m->in);
  }
}

static void fill(const ds_draft *d, const matrix *m, ds_dtype dt, unsigned char *out, float *buf) {
  size_t rb = dt == DS_Q8_0 ? ds_quant_row_bytes(DS_Q8_0, m->in) : (size_t)m->in * 2;
  for (int64_t r = 0; r < m->rows; r++) {
    row_f32(d, m, r, buf);
    unsigned char *o = out + (size_t)r * rb;
    if (dt == DS_Q8_0) ds_ggml_quantize_q8_0(buf, o, m->in);
    else (void)ds_convert_from_f32(o, DS_BF16, buf, (size_t)m->in); /* to bf16 it cannot fail */
  }
  *m->dst = (ds_weight){out, dt};
}

ds_status ds_draft_set_decode_weights(ds_draft *d, ds_dtype dtype) {
  if (dtype != DS_F32 && dtype != DS_BF16 && dtype != DS_Q8_0)
    return DS_FAIL(DS_ERR_ARG, "draft decoding weights: %s is not one of f32, bf16, q8_0", ds_dtype_name(dtype));
  draft_decode_copies_free(d);
  if (dtype == DS_F32) return DS_OK;
  const ds_draft_config *c = &d->cfg;
  int64_t dm = c->hidden_size, I = c->intermediate_size, L = c->num_layers, N = d->n_vocab;
  d->dec.layers = ds_calloc((size_t)L, sizeof *d->dec.layers, "draft decoding weights");
  int64_t n = 3 + 6 * L;
  matrix *ms = ds_calloc((size_t)n, sizeof *ms, "draft decoding weights");
  if (!d->dec.layers || !ms) {
    free(ms);
    draft_decode_copies_free(d);
    return DS_ERR_NOMEM;
  }
  int64_t k = 0;
  ms[k++] = (matrix){d->w.fc, {0}, dm, c->n_target_layers * dm, &d->dec.fc};
  for (int64_t l = 0; l < L; l++) {
    const draft_layer *w = &d->w.layers[l];
    decode_layer *o = &d->dec.layers[l];
    ms[k++] = (matrix){w->wq, {0}, d->q_dim, dm, &o->wq};
    ms[k++] = (matrix){w->wk, {0}, d->kv_dim, dm, &o->wk};
    ms[k++] = (matrix){w->wv, {0}, d->kv_dim, dm, &o->wv};
    ms[k++] = (matrix){w->wo, {0}, dm, d->q_dim, &o->wo};
    ms[k++] = (matrix){w->w_gate, {0}, 2 * I, dm, &o->w_gu};
    ms[k++] = (matrix){w->w_down, {0}, dm, I, &o->w_down};
  }
  /* a 16-bit table already is a bf16 / f16 copy: it stays as it is unless Q8_0 is asked */
  if (dtype == DS_Q8_0 || d->lm_head.dtype == DS_F32) ms[k++] = (matrix){NULL, d->lm_head, N, dm, &d->dec.lm_head};
  if (c->markov_type == DS_MARKOV_VANILLA && c->markov_rank > 0)
    ms[k++] = (matrix){d->w.markov_w2, {0}, N, c->markov_rank, &d->dec.markov_w2};
  size_t total = 0;
  int64_t widest = 0;
  for (int64_t i = 0; i < k; i++) {
    total += copy_bytes(copy_dtype(dtype, ms[i].in), ms[i].rows, ms[i].in);
    if (ms[i].in > widest) widest = ms[i].in;
  }
  d->dec.mem = ds_malloc_huge(total ? total : 64, "draft decoding weights");
  float *buf = ds_malloc_aligned((size_t)widest * sizeof(float), "draft decoding weights");
  if (!d->dec.mem || !buf) {
    ds_free_aligned(buf);
    free(ms);
    draft_decode_copies_free(d);
    return DS_ERR_NOMEM;
  }
  unsigned char *at = d->dec.mem;
  for (int64_t i = 0; i < k; i++) {
    ds_dtype dt = copy_dtype(dtype, ms[i].in);
    if (dt == DS_F32) continue; /* the decoder reads the fp32 value */
    fill(d, &ms[i], dt, at, buf);
    /* the cpu kernels read a Q8_0 matrix from an 8-row packed copy made on its first product:
     * made here, it is load time, not the first drafting round's (4-22 ms on SmolLM2's draft) */
    d->be->prepare_weight(*ms[i].dst, ms[i].rows, ms[i].in);
    at += copy_bytes(dt, ms[i].rows, ms[i].in);
  }
  ds_free_aligned(buf);
  free(ms);
  d->dec.dtype = dtype;
  /* a table used in place in its checkpoint's mapping: the pages the copy read go back */
  if (d->dec.lm_head.data) ds_release_mapped_pages(d->lm_head.data, (size_t)N * (size_t)dm * ds_dtype_size(d->lm_head.dtype));
  return DS_OK;
}

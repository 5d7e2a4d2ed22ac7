/* The GEMM-based attention every large attention call of the CUDA backend runs
 * (cuda_attn_gemm.cu): the products QK^T, PV and the backward's four through cuBLAS
 * strided-batched GEMMs, the scores materialized one chunk of query rows at a time, and small
 * kernels for the masked softmax (lse saved), dS = P * (dP - D) and the gather / scatter of
 * rows. Not a public header.
 *
 * A chunk is R query rows that share one range of context keys 0 .. Lc-1 (each row r sees keys
 * lo[r] .. vis[r]-1 of them: a causal prefix, or its own sequence's part of several short ones
 * packed in one chunk, or a block's ctx_len; vis < 0 marks a dropped block's row) and, when g > 0, the g keys of its own block (block attention). Its queries are gathered
 * head-major, Qh [n_heads, R, hd], so that the n_heads / n_kv_heads query heads of one kv head
 * are one [group * R, hd] matrix: every product is one GEMM batched over the kv heads (GQA
 * needs no loop). Scores S [n_heads, R, ld] with ld >= Lc + g: columns 0 .. Lc-1 the context
 * keys (GEMM), Lc .. Lc+g-1 the block's own keys (a small kernel: g x g per block, too small
 * for a GEMM).
 *
 * Chunk sizes are the callers' (cuda_attention.cu, cuda_block_attention.cu): scores within
 * ds_attn_score_budget() bytes and each [n_heads, R, hd] buffer within DS_ATTN_ROW_BYTES.
 * Deterministic: cuBLAS GEMMs (no atomics; chunks accumulate into dk / dv in order) and
 * kernels that sum in a fixed order.
 *
 * bf16 mode (ds_cuda_set_bf16_gemm): every GEMM operand in bf16 (Qh, dOh, the context keys
 * and values copied head-major, P and dS rounded after the fp32 softmax), fp32 accumulation;
 * softmax, lse, D and the block keys' part stay fp32. */
#ifndef DSPARK_NN_CUDA_ATTN_GEMM_H
#define DSPARK_NN_CUDA_ATTN_GEMM_H

#include "nn/cuda/cuda_internal.h"

/* Bytes of one [n_heads, R, hd] buffer at most (Qh, dOh, Oh): caps R. */
constexpr int64_t DS_ATTN_ROW_BYTES = (int64_t)64 << 20;

/* Bytes of scores a chunk may hold (S, and dP, P16, dS16 where used): 256 MiB, or
 * DSPARK_CUDA_ATTN_SCORE_BYTES from the environment (read per call; the kernel checker sets
 * it small to make several chunks at test sizes). */
int64_t ds_attn_score_budget(void);
/* Bytes per score element: forward S (+ P16), backward S and dP (+ P16 and dS16). */
static inline int64_t ds_attn_score_elem_bytes(int bf16, int backward) {
  return (backward ? 8 : 4) + (bf16 ? (backward ? 4 : 2) : 0);
}
/* The row stride of the scores: Lc + g rounded up to 8 (aligned rows for the GEMMs). */
static inline int64_t ds_attn_ld(int64_t Lc, int64_t g) { return (Lc + g + 7) / 8 * 8; }

/* A key (or value) tensor as the GEMMs read it: key t of kv head j at element t * row + j *
 * head of p, in dtype dt (F32, or BF16 in the bf16 mode). */
struct ds_attn_keys {
  const void *p;
  ds_dtype dt;
  int64_t row, head;
};

/* Keys 0 .. rows-1 of an fp32 tensor (key t of kv head j at k + t * row_stride + j *
 * head_stride) ready for the GEMMs: the tensor itself in the fp32 mode; in the bf16 mode a
 * head-major bf16 copy [n_kv, rows, hd] in scratch slot `slot`. */
ds_attn_keys ds_attn_keys_ready(const float *k, int64_t rows, int64_t row_stride, int64_t head_stride, int64_t n_kv,
                                int64_t hd, int bf16, int slot);

/* What the chunks of one call share. */
struct ds_attn_job {
  const float *q;         /* query row r, head h: q + r * q_stride + h * hd */
  int64_t q_stride;
  const float *kb, *vb;   /* block keys [rows, n_kv * hd] (g > 0); key j of row r's block: row r/g*g + j */
  int64_t g;              /* block size; 0: no block keys */
  int64_t n_heads, n_kv, hd;
  float scale;
  int bf16;
  /* forward */
  float *out;             /* [rows, n_heads * hd], overwritten */
  float *lse;             /* [rows, n_heads] or NULL */
  /* backward (ADD rule; NULL skips) */
  const float *dout;      /* [rows, n_heads * hd] */
  const float *lse_in;    /* [rows, n_heads] */
  const float *D;         /* [rows, n_heads]: rowsum(dout * out) */
  float *dq;              /* [rows, n_heads * hd] */
  float *dkb, *dvb;       /* the block keys' gradients, layout of kb */
  int64_t dk_row, dk_head; /* the context keys' gradient layout (as the fp32 keys) */
};

/* One chunk: device arrays row[R] (global query rows), lo[R] and vis[R] (context keys seen:
 * lo .. vis-1; lo NULL: from 0). */
struct ds_attn_chunk {
  const int64_t *row, *lo, *vis;
  int64_t R;
  ds_attn_keys k, v; /* key 0 of the chunk's context */
  int64_t Lc;        /* context keys 0 .. Lc-1 (>= every vis) */
  float *dk, *dv;    /* backward: gradient rows of keys 0 .. Lc-1 (NULL skips) */
};

/* A job over queries q [rows, n_heads * hd] against keys of layout [rows, n_kv * hd] (the
 * training and block layouts), in the current GEMM mode; no block keys, no outputs set yet. */
ds_attn_job ds_attn_job_make(const float *q, int64_t n_heads, int64_t n_kv, int64_t hd, float scale);

/* out rows of the chunk = softmax(scale * q k^T) v over what each row sees; lse when set. */
void ds_attn_gemm_forward(const ds_attn_job *job, const ds_attn_chunk *c);
/* dq, dk, dv, dkb, dvb += the chunk's share (no dropped rows here). */
void ds_attn_gemm_backward(const ds_attn_job *job, const ds_attn_chunk *c);

/* D[rows, n_heads] = sum over the head's dims of dout * out, in scratch (DS_CUDA_SLOT_ROWSUM). */
float *ds_cuda_attn_rowsum(const float *dout, const float *out, int64_t rows, int64_t n_heads, int64_t hd);

#endif

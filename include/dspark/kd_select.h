/* Sparse KD targets of one position (spec/kd.md section 1): the teacher's top-K ids with their
 * FULL-vocabulary log-probs, the optional top-p prefix and its min_k floor. Used by capture to
 * write the cache, and by the KD loss to apply top-p / min_k at training time. The cache's
 * documentation (dspark/cache.h) gives the exact rule. */
#ifndef DSPARK_KD_SELECT_H
#define DSPARK_KD_SELECT_H

#include <stdint.h>

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One position: logits x[V] -> ids[K] and full-vocabulary log-probs lp[K], sorted descending
 * (ties: the smaller id first; temperature T > 0, 1 <= K <= V, top_p in (0, 1]: 1 keeps all K).
 * Entries past the kept prefix are the sentinels id -1, log-prob -inf. scratch: V floats.
 * Returns the number of entries kept. */
int64_t ds_kd_select(const float *x, int64_t V, double temperature, int64_t K, double top_p, int64_t min_k,
                     float *scratch, int32_t *ids, float *lp);

/* The teacher's logits are computed this many rows at a time, from row 0 of a sequence, by
 * ds_kd_teacher_select: a product's bits depend on its row count (the GEMM library and blocking
 * it picks), so the capture and a live teacher, both going through it, give the same targets. */
enum { DS_KD_TEACHER_ROWS = 32 };

/* The sparse KD targets of n rows: logits = hidden[n, d] @ head[V, d]^T, DS_KD_TEACHER_ROWS rows
 * at a time, each row through ds_kd_select (rows in parallel: same bits) into ids[n, K] and
 * lp[n, K]. logits, scratch: [DS_KD_TEACHER_ROWS, V]. ids == NULL: the products only (a timing of
 * the forward). t_product / t_select (may be NULL): seconds added to them. */
void ds_kd_teacher_select(const float *hidden, int64_t n, int64_t d, ds_weight head, int64_t V, double temperature,
                          int64_t K, double top_p, int64_t min_k, float *logits, float *scratch, int32_t *ids,
                          float *lp, double *t_product, double *t_select);

/* The top-p rule with its min_k floor on n entries lp[0 .. n-1] (full-vocabulary log-probs, in
 * the order given: descending as captured): entry i is kept iff
 * (sum_{j<i} exp lp[j]) < top_p or i < max(min_k, 1), a prefix. Returns its length (n when
 * top_p >= 1; 0 only when n = 0). The partial sums are in double. ds_kd_select applies it at
 * capture, the KD loss (dspark/kd_loss.h) again at training time on what the capture kept. */
int64_t ds_kd_top_p_count(const float *lp, int64_t n, double top_p, int64_t min_k);

/* The selection options as commands take them, one check for capture, distill and kd-loss (each
 * refusal, DS_ERR_ARG, names the option as the CLI spells it): --temperature finite and > 0;
 * --top-p in (0, 1], below 1 only with a top-K (top_k >= 1); --min-k >= 1 and, where K is the
 * user's --topk (k_is_option: capture, distill), at most K: kd-loss reads K from its input's
 * width, where a floor above K keeps all K; --topk in [0, vocab] (vocab <= 0: not known yet).
 * NaN is outside every range. */
ds_status ds_kd_select_check(int64_t top_k, int k_is_option, double top_p, int64_t min_k, double temperature,
                             int64_t vocab);

#ifdef __cplusplus
}
#endif
#endif

/* The DSpark loss applied to the draft (include/dspark/draft_loss.h): one training micro-step
 * of the draft on one sequence through the draft's training hooks (dspark/draft.h): forward,
 * then the DSpark loss fused with the vocabulary matmuls in row chunks, then the heads' and
 * the layers' backward.
 * Per chunk of c rows: draft logits (c, N) = h @ lm_head^T + z @ W2^T, teacher logits
 * (c, V) = last[a+k] @ the target's lm_head^T, the loss core turns the draft logits into their
 * gradient in place, which flows to dh (through the frozen lm_head) and to dz and W2. N = V
 * for a full-vocabulary draft; with a reduced vocabulary (spec 4a) the draft's matmuls run
 * over its N rows only, and the teacher's over the full V (the exact TV needs p's full
 * normalizer). Peak extra memory is two (c, N) buffers and one (c, V), independent of the
 * number of blocks. Overlapping blocks share positions (anchors 3 apart share 4 of 7), and the
 * teacher's logits depend on the position alone: each chunk computes them once per distinct
 * supervised position and copies them to the rows that share it. With a memo of the teacher's
 * full-vocabulary stats per position (ds_draft_loss_seq_memo) a reduced draft's teacher runs
 * over V only for positions the memo lacks, and over the N rows S for the rest: its exact TV
 * needs no more of the full row than its max, normalizer and mass outside S. */
#include <math.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/draft_loss.h"

typedef struct {
  float *logits, *teacher, *scratch; /* (c, N), (c, V), (c, N) */
  float *last_rows;                  /* (c, d) gathered teacher hidden states, one per distinct position */
  float *miss_rows;                  /* (c, d) those whose teacher stats the memo lacks */
  int32_t *row_src;                  /* (c) the teacher row of each chunk row; -1: unsupervised */
  int32_t *teach_pos;                /* (c) the position of each distinct teacher row */
  int32_t *miss_src;                 /* (c) the distinct row of each miss row */
  uint8_t *miss_bad;                 /* (c) a miss row's logits not finite */
  ds_dspark_teacher_stat *tstat;     /* (c) each chunk row's teacher stats (memo path) */
  int32_t *pos_row;                  /* (T) the teacher row of each position in this chunk; -1: none */
  int32_t *ids;                      /* (R) target ids x*_{a+k+1} */
  uint8_t *sup;                      /* (R) */
  double *w;                         /* (R) */
  double *stats;                     /* (4 R) ce, l1, accept, bce */
  uint8_t *ce_on;                    /* (R) CE term on (x* in the draft's vocabulary) */
  float *dh;                         /* (R, d) */
  float *dz;                         /* (R, r) */
  float *dconf;                      /* (R) */
} train_buffers;

/* Carves the buffers from the draft's grow-only loss arena (64-byte aligned pieces); with
 * base NULL only counts the bytes. */
static size_t layout_buffers(train_buffers *b, char *base, int64_t R, int64_t c, int64_t N, int64_t V, int64_t dm,
                             int64_t r, int64_t T) {
  size_t off = 0;
#define TAKE(ptr, bytes)                                  \
  do {                                                    \
    if (base) (ptr) = (void *)(base + off);               \
    off += ((size_t)(bytes) + 63) & ~(size_t)63;          \
  } while (0)
  TAKE(b->logits, (size_t)(c * N) * sizeof(float));
  TAKE(b->teacher, (size_t)(c * V) * sizeof(float));
  TAKE(b->scratch, (size_t)(c * N) * sizeof(float));
  TAKE(b->last_rows, (size_t)(c * dm) * sizeof(float));
  TAKE(b->miss_rows, (size_t)(c * dm) * sizeof(float));
  TAKE(b->row_src, (size_t)c * sizeof(int32_t));
  TAKE(b->teach_pos, (size_t)c * sizeof(int32_t));
  TAKE(b->miss_src, (size_t)c * sizeof(int32_t));
  TAKE(b->miss_bad, (size_t)c);
  TAKE(b->tstat, (size_t)c * sizeof(ds_dspark_teacher_stat));
  TAKE(b->pos_row, (size_t)(T > 0 ? T : 1) * sizeof(int32_t));
  TAKE(b->ids, (size_t)R * sizeof(int32_t));
  TAKE(b->sup, (size_t)R);
  TAKE(b->w, (size_t)R * sizeof(double));
  TAKE(b->stats, (size_t)(4 * R) * sizeof(double));
  TAKE(b->ce_on, (size_t)R);
  TAKE(b->dh, (size_t)(R * dm) * sizeof(float));
  TAKE(b->dz, (size_t)(R * (r ? r : 1)) * sizeof(float));
  TAKE(b->dconf, (size_t)R * sizeof(float));
#undef TAKE
  return off;
}

static ds_status buffers_alloc(ds_draft *d, train_buffers *b, int64_t R, int64_t c, int64_t N, int64_t V, int64_t dm,
                               int64_t r, int64_t T) {
  memset(b, 0, sizeof *b);
  size_t need = layout_buffers(b, NULL, R, c, N, V, dm, r, T);
  char *base = ds_draft_workspace(d, need);
  if (!base) return DS_ERR_NOMEM;
  layout_buffers(b, base, R, c, N, V, dm, r, T);
  for (int64_t t = 0; t < T; t++) b->pos_row[t] = -1;
  memset(b->dh, 0, (size_t)(R * dm) * sizeof(float));
  memset(b->dz, 0, (size_t)(R * (r ? r : 1)) * sizeof(float));
  memset(b->dconf, 0, (size_t)R * sizeof(float));
  return DS_OK;
}

/* The teacher's hidden states of chunk rows [r0, r0 + n), one per distinct supervised position,
 * into b->last_rows; b->row_src[i] = its row there (-1: unsupervised, never read). Returns the
 * number of distinct rows. Leaves b->pos_row all -1 again. */
static int64_t gather_teacher_rows(const ds_draft_seq *s, int64_t g, int64_t r0, int64_t n, int64_t dm,
                                   train_buffers *b) {
  int64_t u = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t row = r0 + i;
    b->row_src[i] = -1;
    if (!b->sup[row]) continue;
    int64_t t = s->anchors[row / g] + row % g; /* supervised: kept, and t + 1 < T (ids checked) */
    if (b->pos_row[t] < 0) {
      b->teach_pos[u] = (int32_t)t;
      b->pos_row[t] = (int32_t)u;
      memcpy(b->last_rows + u * dm, s->last + t * dm, (size_t)dm * sizeof(float));
      u++;
    }
    b->row_src[i] = b->pos_row[t];
  }
  for (int64_t i = 0; i < n; i++)
    if (b->row_src[i] >= 0) b->pos_row[s->anchors[(r0 + i) / g] + (r0 + i) % g] = -1;
  return u;
}

/* Spreads the u distinct teacher rows (rows 0 .. u - 1 of teacher) to the chunk's n rows. Row
 * i's source is at most i (sources are numbered in order of first use), so going down from the
 * last row never overwrites a source a lower row still needs. */
static void spread_teacher_rows(float *teacher, int64_t V, int64_t n, const int32_t *row_src) {
  for (int64_t i = n - 1; i >= 0; i--)
    if (row_src[i] >= 0 && row_src[i] != i)
      memcpy(teacher + i * V, teacher + (int64_t)row_src[i] * V, (size_t)V * sizeof(float));
}

/* The memo path's teacher for the u distinct rows in b->last_rows: the full-vocabulary product
 * and its stats for the positions memo lacks (stored there), then the S columns of all u rows
 * into b->teacher [u, N] (the draft's lm_head holds the target's rows S) and their stats into
 * b->tstat [u]. */
static ds_status teacher_s_rows(ds_draft *d, const ds_dspark_vocab *vb, ds_weight teacher_head, ds_dspark_teacher_stat *memo,
                                int64_t u, int64_t V, int64_t dm, train_buffers *b) {
  const ds_backend *be = ds_draft_backend(d);
  int64_t miss = 0;
  for (int64_t j = 0; j < u; j++)
    if (isnan(memo[b->teach_pos[j]].lse)) {
      memcpy(b->miss_rows + miss * dm, b->last_rows + j * dm, (size_t)dm * sizeof(float));
      b->miss_src[miss++] = (int32_t)j;
    }
  if (miss) {
    be->linear_w(b->teacher, V, b->miss_rows, teacher_head, NULL, miss, dm, V);
#ifdef DSPARK_USE_OPENMP
#pragma omp parallel for schedule(dynamic, 1) if (miss > 1)
#endif
    for (int64_t i = 0; i < miss; i++) {
      ds_dspark_teacher_stat *m = &memo[b->teach_pos[b->miss_src[i]]];
      b->miss_bad[i] = ds_dspark_teacher_stats(b->teacher + i * V, V, vb, m) != DS_OK;
      if (b->miss_bad[i]) m->lse = NAN;
    }
    for (int64_t i = 0; i < miss; i++)
      if (b->miss_bad[i])
        return DS_FAIL(DS_ERR_NUMERIC, "draft loss: the teacher's logits at position %d hold NaN or +inf, or no "
                       "finite value", b->teach_pos[b->miss_src[i]]);
  }
  be->linear_w(b->teacher, vb->n, b->last_rows, ds_draft_lm_head(d), NULL, u, dm, vb->n);
  for (int64_t j = 0; j < u; j++) b->tstat[j] = memo[b->teach_pos[j]];
  return DS_OK;
}

ds_status ds_draft_loss_seq(ds_draft *d, const ds_draft_seq *s, const ds_dspark_loss_config *loss_in,
                            double grad_scale, int with_backward, ds_dspark_loss_result *result, double *pos_accept,
                            double *pos_count) {
  return ds_draft_loss_seq_memo(d, s, NULL, loss_in, grad_scale, with_backward, result, pos_accept, pos_count);
}

ds_status ds_draft_loss_seq_memo(ds_draft *d, const ds_draft_seq *s, ds_dspark_teacher_stat *memo,
                                 const ds_dspark_loss_config *loss_in, double grad_scale, int with_backward,
                                 ds_dspark_loss_result *result, double *pos_accept, double *pos_count) {
  const ds_draft_config *c = ds_draft_get_config(d);
  int64_t g = c->block_size, R = s->n_blocks * g, V = c->vocab_size, dm = c->hidden_size, r = c->markov_rank;
  int64_t N = ds_draft_vocab_size(d);
  ds_dspark_loss_config lc = *loss_in;
  lc.has_teacher = s->last != NULL;
  lc.has_conf = lc.has_teacher && c->enable_confidence_head;
  DS_TRY(ds_dspark_loss_config_check(&lc));
  int64_t chunk = lc.chunk_rows < R ? lc.chunk_rows : R;
  /* A reduced vocabulary: the draft's columns S; the teacher is the target's whole lm_head. */
  const ds_dspark_vocab vocab = {N, ds_draft_vocab_ids(d), ds_draft_vocab_index(d)};
  const ds_dspark_vocab *vb = vocab.ids ? &vocab : NULL;
  ds_weight teacher_head = s->teacher_head.data ? s->teacher_head : ds_draft_lm_head(d);
  if (lc.has_teacher && vb && !s->teacher_head.data)
    return DS_FAIL(DS_ERR_ARG, "draft loss: a draft over a reduced vocabulary (%lld of %lld ids) needs the target's "
                   "whole lm_head for the teacher's distribution", (long long)N, (long long)V);

  int use_memo = memo && vb && lc.has_teacher; /* a full-vocabulary teacher has no cheaper product */
  DS_TRY(ds_draft_forward_train(d, s));
  const float *conf = lc.has_conf ? ds_draft_conf_logits(d) : NULL;
  train_buffers b;
  DS_TRY(buffers_alloc(d, &b, R, chunk, N, V, dm, r, s->T));
  ds_status st = DS_OK;
  for (int64_t blk = 0; blk < s->n_blocks; blk++)
    for (int64_t k = 0; k < g; k++) {
      /* a dropped block's anchor may be anything: it is never read (nor added to) */
      int64_t t = s->block_keep[blk] ? s->anchors[blk] + k + 1 : s->T;
      b.ids[blk * g + k] = t < s->T ? s->ids[t] : -1; /* -1: unsupervised there */
    }
  if ((st = ds_dspark_loss_weights(&lc, s->n_blocks, g, s->eval_mask, s->block_keep, b.sup, b.w)) != DS_OK) goto done;
  if ((st = ds_dspark_loss_check_ids(0, g, R, V, b.ids, b.sup)) != DS_OK) goto done;

  ds_dspark_row_stats rows = {b.stats, b.stats + R, b.stats + 2 * R, b.stats + 3 * R, vb ? b.ce_on : NULL};
  ds_draft_rows_begin(d);
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    int64_t n = R - r0 < chunk ? R - r0 : chunk;
    int any = 0;
    for (int64_t i = 0; i < n; i++) any |= b.sup[r0 + i];
    if (!any) { /* nothing supervised: no matmul, zero stats */
      for (int64_t i = 0; i < n; i++) {
        rows.ce[r0 + i] = rows.l1[r0 + i] = rows.accept[r0 + i] = rows.bce[r0 + i] = 0.0;
        if (rows.ce_on) rows.ce_on[r0 + i] = 0;
      }
      continue;
    }
    ds_draft_rows_logits(d, r0, n, b.logits, b.scratch);
    if (lc.has_teacher) {
      int64_t u = gather_teacher_rows(s, g, r0, n, dm, &b);
      if (use_memo) {
        if ((st = teacher_s_rows(d, vb, teacher_head, memo, u, V, dm, &b)) != DS_OK) break;
        spread_teacher_rows(b.teacher, N, n, b.row_src);
        for (int64_t i = n - 1; i >= 0; i--)
          if (b.row_src[i] >= 0) b.tstat[i] = b.tstat[b.row_src[i]];
      } else {
        ds_draft_backend(d)->linear_w(b.teacher, V, b.last_rows, teacher_head, NULL, u, dm, V);
        spread_teacher_rows(b.teacher, V, n, b.row_src);
      }
    }
    ds_dspark_row_stats chunk_rows = {rows.ce + r0, rows.l1 + r0, rows.accept + r0, rows.bce + r0,
                                      rows.ce_on ? rows.ce_on + r0 : NULL};
    if (use_memo)
      st = ds_dspark_loss_rows_stats(&lc, vb, r0, g, n, V, b.logits, b.teacher, b.tstat, b.ids + r0, b.sup + r0,
                                     b.w + r0, conf ? conf + r0 : NULL, grad_scale, &chunk_rows, b.logits,
                                     lc.has_conf ? b.dconf + r0 : NULL);
    else
      st = ds_dspark_loss_rows_vocab(&lc, vb, r0, g, n, V, b.logits, lc.has_teacher ? b.teacher : NULL, b.ids + r0,
                                     b.sup + r0, b.w + r0, conf ? conf + r0 : NULL, grad_scale, &chunk_rows, b.logits,
                                     lc.has_conf ? b.dconf + r0 : NULL);
    if (st != DS_OK) break;
    if (!with_backward) continue;
    /* b.logits now holds d(loss)/d(logits): through lm_head (frozen) to h, through W2 to z. */
    ds_draft_rows_logits_backward(d, r0, n, b.logits, b.dh + r0 * dm, r > 0 ? b.dz + r0 * r : NULL);
  }
  ds_draft_rows_end(d);
  if (st != DS_OK) goto done;
  ds_dspark_loss_result res;
  double pa[64], pc[64]; /* g <= 64 (ds_draft_config_check) */
  if ((st = ds_dspark_loss_finish(&lc, s->n_blocks, g, b.sup, b.w, &rows, &res, pa, pc)) != DS_OK) goto done;
  ds_dspark_loss_result_add(result, &res);
  for (int64_t k = 0; pos_accept && k < g; k++) pos_accept[k] += pa[k];
  for (int64_t k = 0; pos_count && k < g; k++) pos_count[k] += pc[k];

  if (with_backward) {
    st = ds_draft_backward_train(d, s, b.dh, r > 0 ? b.dz : NULL, lc.has_conf ? b.dconf : NULL);
  }
done:
  return st;
}

/* The DSpark loss (dspark/dspark_loss.h) applied to the draft (dspark/draft.h): the fused,
 * row-chunked training pass of one sequence. */
#ifndef DSPARK_DRAFT_LOSS_H
#define DSPARK_DRAFT_LOSS_H

#include "dspark/draft.h"
#include "dspark/dspark_loss.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One training micro-step on one sequence: forward, the DSpark loss fused with the lm_head
 * matmul in row chunks of loss->chunk_rows (never a [rows, V] tensor for the whole batch),
 * and, when with_backward, backward. Gradients ACCUMULATE into ds_draft_grads, scaled by
 * grad_scale (pass 1 / global W over the whole step). The loss result and the per-position acceptance sums
 * pos_accept[g] / pos_count[g] (may be NULL) ACCUMULATE too. seq->last == NULL trains CE
 * only. A supervised target id outside the vocabulary is an error naming the position. */
ds_status ds_draft_loss_seq(ds_draft *d, const ds_draft_seq *seq, const ds_dspark_loss_config *loss,
                            double grad_scale, int with_backward, ds_dspark_loss_result *result, double *pos_accept,
                            double *pos_count);

/* ds_draft_loss_seq keeping the teacher's per-position stats of this sequence in memo [seq->T]
 * (lse NaN: not yet known; filled here): with a reduced vocabulary a position's full-vocabulary
 * teacher product runs the first time the position is supervised, and only its S columns after
 * that (the stats depend on the target alone, so a trainer keeps memo across steps). memo NULL,
 * or a full-vocabulary draft: exactly ds_draft_loss_seq. */
ds_status ds_draft_loss_seq_memo(ds_draft *d, const ds_draft_seq *seq, ds_dspark_teacher_stat *memo,
                                 const ds_dspark_loss_config *loss, double grad_scale, int with_backward,
                                 ds_dspark_loss_result *result, double *pos_accept, double *pos_count);

#ifdef __cplusplus
}
#endif
#endif

/* The draft's training hooks (include/dspark/draft.h): what a loss over the draft's block
 * logits needs to run the forward, produce logits for row chunks, and send their gradient
 * back through the heads and the layers. The DSpark loss composes them in
 * src/loss/draft_loss.c. */
#include <string.h>

#include "model/draft_internal.h"

ds_status ds_draft_forward_train(ds_draft *d, const ds_draft_seq *seq) {
  if (d->dec.dtype != DS_F32) draft_decode_copies_free(d); /* a training step would leave them stale */
  return draft_forward(d, seq);
}

const float *ds_draft_final_hidden(const ds_draft *d) { return d->acts.h; }

const float *ds_draft_conf_logits(const ds_draft *d) { return d->cfg.enable_confidence_head ? d->acts.conf : NULL; }

const ds_backend *ds_draft_backend(const ds_draft *d) { return d->be; }

void ds_draft_rows_begin(ds_draft *d) {
  if (d->cfg.markov_rank > 0) d->be->operand_hold(d->w.markov_w2, (size_t)(d->n_vocab * d->cfg.markov_rank));
}

void ds_draft_rows_end(ds_draft *d) {
  if (d->cfg.markov_rank > 0) d->be->operand_release(d->w.markov_w2);
}

void ds_draft_rows_logits(ds_draft *d, int64_t r0, int64_t c, float *logits, float *scratch) {
  draft_block_logits(d, r0, c, logits, scratch);
}

void ds_draft_rows_logits_backward(ds_draft *d, int64_t r0, int64_t c, const float *dlogits, float *dh, float *dz) {
  int64_t dm = d->cfg.hidden_size, r = d->cfg.markov_rank, V = d->n_vocab; /* the draft's N columns */
  d->be->operand_hold(dlogits, (size_t)(c * V)); /* read by up to three products: converted once */
  d->be->linear_w_backward(dh, dlogits, d->lm_head, c, dm, V);
  if (r > 0 && dz) d->be->linear_backward(dz, d->g.markov_w2, NULL, dlogits, d->acts.z + r0 * r, d->w.markov_w2, c, r, V);
  d->be->operand_release(dlogits);
}

ds_status ds_draft_backward_train(ds_draft *d, const ds_draft_seq *seq, float *dh, float *dz, const float *dconf) {
  markov_head_backward(d, seq->n_blocks * d->cfg.block_size, dz, dconf, dh);
  return draft_backward(d, seq, dh);
}

void *ds_draft_workspace(ds_draft *d, size_t bytes) {
  if (bytes > d->workspace_bytes) {
    ds_free_aligned(d->workspace);
    d->workspace = ds_malloc_aligned(bytes, "draft workspace");
    d->workspace_bytes = d->workspace ? bytes : 0;
  }
  return d->workspace;
}

/* This machine's costs for the prefix scheduler (include/dspark/spec_schedule.h): the time of
 * a target pass verifying B tokens after a cached context, and of one draft block with L head
 * steps. The passes are the decoder's own (ds_target_forward with a KV cache, ds_draft_block,
 * ds_draft_head_step), so the table prices what speculation actually runs. */
#include <stdlib.h>
#include <string.h>

#include "dspark/sampling.h"
#include "dspark/spec_schedule.h"


enum { PROFILE_MAX_REPS = 64 };

/* Deterministic token ids that look like text to no one: the cost does not depend on them. */
static void fill_ids(int32_t *ids, int64_t n, int64_t V) {
  for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 31 + 7) % V);
}

ds_status ds_spec_profile_verify(ds_target *t, int64_t context, int64_t max_tokens, int64_t step, int reps,
                                 const int32_t *capture_layers, int n_capture, double *seconds, double *head) {
  const ds_model_config *c = ds_target_config(t);
  if (context < 1 || max_tokens < 1 || step < 1 || reps < 1 || reps > PROFILE_MAX_REPS)
    return DS_FAIL(DS_ERR_ARG, "profile: context %lld, tokens %lld, step %lld and repetitions %d must be >= 1 "
                   "(repetitions <= %d)", (long long)context, (long long)max_tokens, (long long)step, reps,
                   PROFILE_MAX_REPS);
  int64_t V = c->vocab_size, n = context + max_tokens;
  int32_t *ids = ds_malloc((size_t)n * sizeof(int32_t), "profile ids");
  float *logits = ds_malloc_aligned((size_t)(max_tokens * V) * sizeof(float), "profile logits");
  float *hidden = ds_malloc_aligned((size_t)(max_tokens * c->hidden_size) * sizeof(float), "profile hidden states");
  float *captured = n_capture > 0 ? ds_malloc_aligned((size_t)(n * n_capture * c->hidden_size) * sizeof(float),
                                                      "profile captured rows") : NULL;
  ds_kv_cache *kv = NULL;
  ds_status st = ids && logits && hidden && (n_capture <= 0 || captured) ? DS_OK : DS_ERR_NOMEM;
  if (st == DS_OK) st = ds_kv_cache_new(t, n, &kv);
  if (st == DS_OK) {
    fill_ids(ids, n, V);
    ds_target_seq seq = {ids, context, kv};
    int64_t last = context - 1;
    ds_target_outputs out = {capture_layers, n_capture, captured, NULL, &last, 1, logits};
    st = ds_target_forward(t, &seq, 1, &out);
  }
  /* Rounds over every timed count, repeated, rather than each count's timings back to back: a
   * host whose speed moves by 20-40% from minute to minute (a shared one) bent the table where a
   * slow stretch fell on a few consecutive counts (3 rows at 1.30x the cost of one in a run, 1.06x
   * in the next), and the scheduler's proposals followed the bend. Round -1 is the warm-up. */
  double *times = ds_malloc((size_t)(2 * max_tokens * PROFILE_MAX_REPS) * sizeof(double), "profile timings");
  if (!times && st == DS_OK) st = DS_ERR_NOMEM;
  double *vt = times, *ht = times ? times + max_tokens * PROFILE_MAX_REPS : NULL; /* [count][rep] */
  for (int rep = -1; rep < reps && st == DS_OK; rep++) {
    for (int64_t B = 1; B <= max_tokens && st == DS_OK; B++) {
      if (!ds_spec_table_timed(B, step, max_tokens)) continue;
      ds_target_seq seq = {ids + context, B, kv};
      int64_t first = 0; /* speculation's pass: the first row's logits, the others' hidden states */
      ds_target_outputs out = {capture_layers, n_capture, captured, hidden, &first, 1, logits};
      double t0 = ds_time_sec();
      st = ds_target_forward(t, &seq, 1, &out);
      if (rep >= 0) vt[(B - 1) * PROFILE_MAX_REPS + rep] = ds_time_sec() - t0;
      if (st == DS_OK) st = ds_kv_cache_crop(kv, context);
    }
    for (int64_t n_rows = 1; head && n_rows < max_tokens && st == DS_OK; n_rows++) {
      if (!ds_spec_table_timed(n_rows, step, max_tokens - 1)) continue;
      double t0 = ds_time_sec();
      st = ds_target_logits(t, hidden, n_rows, logits);
      if (rep >= 0) ht[(n_rows - 1) * PROFILE_MAX_REPS + rep] = ds_time_sec() - t0;
    }
  }
  for (int64_t B = 1; B <= max_tokens && st == DS_OK; B++)
    if (ds_spec_table_timed(B, step, max_tokens)) seconds[B - 1] = ds_median(vt + (B - 1) * PROFILE_MAX_REPS, reps);
  for (int64_t n_rows = 1; head && n_rows < max_tokens && st == DS_OK; n_rows++)
    if (ds_spec_table_timed(n_rows, step, max_tokens - 1)) head[n_rows - 1] = ds_median(ht + (n_rows - 1) * PROFILE_MAX_REPS, reps);
  free(times);
  if (st == DS_OK) {
    ds_spec_table_fill(seconds, max_tokens, step);
    if (head) ds_spec_table_fill(head, max_tokens - 1, step);
  }
  ds_kv_cache_free(kv);
  free(ids);
  ds_free_aligned(hidden);
  ds_free_aligned(logits);
  ds_free_aligned(captured);
  return st;
}

ds_status ds_spec_profile_quick(ds_target *t, const ds_draft *d, int64_t requests, int64_t draft_len, double **verify,
                                double **head, int64_t *n) {
  const ds_draft_config *dc = ds_draft_get_config(d);
  int64_t per = draft_len + 1;
  *n = requests * per < 64 ? requests * per : 64;
  *verify = malloc((size_t)*n * sizeof **verify);
  *head = malloc((size_t)*n * sizeof **head);
  ds_status st = *verify && *head ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "out of memory for the verification costs");
  if (st == DS_OK)
    st = ds_spec_profile_verify(t, 64, *n, per, 3, dc->target_layer_ids, dc->n_target_layers, *verify, *head);
  if (st != DS_OK) {
    free(*verify), free(*head);
    *verify = *head = NULL;
  }
  return st;
}

ds_status ds_spec_profile_draft(ds_target *t, ds_draft *d, int64_t context, int reps, double *seconds) {
  const ds_draft_config *dc = ds_draft_get_config(d);
  if (context < 1 || reps < 1 || reps > PROFILE_MAX_REPS)
    return DS_FAIL(DS_ERR_ARG, "profile: context %lld and repetitions %d must be >= 1 (repetitions <= %d)",
                   (long long)context, reps, PROFILE_MAX_REPS);
  DS_TRY(ds_target_check_capture_layers(t, dc->target_layer_ids, dc->n_target_layers));
  int64_t V = dc->vocab_size, N = ds_draft_vocab_size(d), g = dc->block_size, dm = dc->hidden_size;
  int64_t md = dc->n_target_layers * dm;
  const int32_t *vocab_ids = ds_draft_vocab_ids(d); /* a reduced vocabulary's S: column -> target id */
  int32_t *ids = ds_malloc((size_t)context * sizeof(int32_t), "profile ids");
  float *ctx = ds_malloc_aligned((size_t)(context * md) * sizeof(float), "profile captured rows");
  float *h = ds_malloc_aligned((size_t)(g * dm) * sizeof(float), "profile draft block");
  float *logits = ds_malloc_aligned((size_t)(g * V) * sizeof(float), "profile draft logits");
  ds_kv_cache *kv = NULL;
  ds_draft_state *ds = NULL;
  ds_status st = ids && ctx && h && logits ? DS_OK : DS_ERR_NOMEM;
  if (st == DS_OK) st = ds_kv_cache_new(t, context + 1, &kv);
  if (st == DS_OK) st = ds_draft_state_new(d, context + g, &ds);
  if (st == DS_OK) {
    fill_ids(ids, context, V);
    ds_target_seq seq = {ids, context, kv};
    int64_t last = context - 1;
    ds_target_outputs out = {dc->target_layer_ids, dc->n_target_layers, ctx, NULL, &last, 1, logits};
    st = ds_target_forward(t, &seq, 1, &out);
  }
  if (st == DS_OK) st = ds_draft_state_append(d, ds, ctx, context);
  for (int64_t L = 1; L <= g && st == DS_OK; L++) {
    double times[PROFILE_MAX_REPS];
    for (int rep = -1; rep < reps && st == DS_OK; rep++) {
      /* as in decoding, a target pass before the block: it evicts the draft's weights from the
       * caches (timed back to back, the draft would read them from the cache: half its cost) */
      int64_t row0 = 0;
      ds_target_seq one = {ids + context - 1, 1, kv};
      ds_target_outputs pass = {.logit_rows = &row0, .n_logit_rows = 1, .logits = logits};
      st = ds_target_forward(t, &one, 1, &pass);
      if (st == DS_OK) st = ds_kv_cache_crop(kv, context);
      if (st != DS_OK) break;
      double t0 = ds_time_sec();
      int32_t prev = ids[context - 1];
      st = ds_draft_block(d, ds, prev, h, logits);
      for (int64_t k = 0; k < L && st == DS_OK; k++) { /* the decoder's per-slot work: bias, confidence, argmax */
        float conf;
        st = ds_draft_head_step(d, ds, h + k * dm, prev, logits + k * N, &conf);
        prev = ds_argmax(logits + k * N, N);
        if (vocab_ids) prev = vocab_ids[prev];
      }
      if (rep >= 0) times[rep] = ds_time_sec() - t0;
    }
    if (st == DS_OK) seconds[L - 1] = ds_median(times, reps);
  }
  ds_draft_state_free(ds);
  ds_kv_cache_free(kv);
  free(ids);
  ds_free_aligned(ctx);
  ds_free_aligned(h);
  ds_free_aligned(logits);
  return st;
}

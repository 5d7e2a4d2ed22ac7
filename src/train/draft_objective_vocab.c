/* The reduced draft vocabulary of `train --draft-vocab N` (spec/dspark.md section 4a): which N
 * target ids the draft predicts over. S holds every mandatory id (the ids the run's chat
 * template emits in an assistant turn, and the stop / eos ids), then the most frequent other
 * ids among the supervised target tokens of the training split, ties by lower id; S is kept
 * sorted by target id. See docs/training.md, "A reduced draft vocabulary". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dspark/progress.h"
#include "train/draft_objective_internal.h"

typedef struct {
  int64_t count;
  int32_t id;
} id_count;

/* count descending, then id ascending */
static int by_count(const void *a, const void *b) {
  const id_count *x = a, *y = b;
  if (x->count != y->count) return x->count > y->count ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

static int by_id(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return x < y ? -1 : x > y;
}

ds_status ds_draft_vocab_select(const int64_t *counts, int64_t V, int64_t N, const int32_t *mandatory,
                                int64_t n_mandatory, int32_t *out) {
  if (V < 1 || N < 1 || N > V)
    return DS_FAIL(DS_ERR_ARG, "--draft-vocab %lld: a draft vocabulary has 1 .. %lld ids (the target's vocabulary "
                   "size)", (long long)N, (long long)V);
  uint8_t *in = ds_calloc((size_t)V, 1, "draft vocabulary");
  id_count *rest = ds_malloc((size_t)V * sizeof *rest, "draft vocabulary");
  if (!in || !rest) {
    free(in), free(rest);
    return DS_ERR_NOMEM;
  }
  int64_t m = 0;
  for (int64_t i = 0; i < n_mandatory; i++) {
    int32_t id = mandatory[i];
    if (id < 0 || id >= V) {
      free(in), free(rest);
      return DS_FAIL(DS_ERR_ARG, "draft vocabulary: mandatory id %d outside the vocabulary [0, %lld)", id, (long long)V);
    }
    if (!in[id]) in[id] = 1, m++;
  }
  if (m > N) {
    free(in), free(rest);
    return DS_FAIL(DS_ERR_ARG, "--draft-vocab %lld is below the %lld ids every draft vocabulary holds (the chat "
                   "template's assistant-turn ids and the stop / eos ids)", (long long)N, (long long)m);
  }
  m = 0;
  int64_t n_rest = 0;
  for (int64_t v = 0; v < V; v++) {
    if (in[v]) out[m++] = (int32_t)v;
    else rest[n_rest++] = (id_count){counts ? counts[v] : 0, (int32_t)v};
  }
  qsort(rest, (size_t)n_rest, sizeof *rest, by_count);
  for (int64_t i = 0; m < N; i++) out[m++] = rest[i].id;
  qsort(out, (size_t)N, sizeof *out, by_id);
  free(in), free(rest);
  return DS_OK;
}

ds_status ds_draft_run_template_ids(draft_run *t, const ds_chat_template *tmpl, int thinking) {
  /* A probe conversation whose answer is empty: what the loss mask supervises of it is what the
   * template itself emits in an assistant turn (its end-of-turn tokens, an empty thinking block). */
  const ds_chat_message msgs[2] = {{"user", "Hi", 0, NULL, 0}, {"assistant", "", 0, NULL, 0}};
  ds_chat_options opt = {0, thinking};
  ds_ids ids = {0}, mask = {0};
  ds_status st = ds_chat_encode(t->tok, tmpl, msgs, 2, &opt, &ids, &mask);
  for (size_t i = 0; st == DS_OK && i < ids.len; i++)
    if (mask.ids[i]) st = ds_ids_push(&t->vocab_mandatory, ids.ids[i]);
  ds_ids_free(&ids);
  ds_ids_free(&mask);
  return st == DS_OK ? DS_OK : ds_error_wrap(st, "--draft-vocab: rendering an assistant turn with the chat template");
}

ds_status ds_draft_run_vocab(draft_run *t, const ds_model_config *stops) {
  int64_t V = t->tc.vocab_size, N = t->o->draft_vocab;
  if (N <= 0) return DS_OK;
  /* the stop set (where decoding ends) and config.json's eos ids */
  for (int i = 0; i < stops->n_stop; i++) DS_TRY(ds_ids_push(&t->vocab_mandatory, (int32_t)stops->stop_token_ids[i]));
  for (int i = 0; i < stops->n_eos; i++)
    if (stops->eos_token_ids[i] >= 0 && stops->eos_token_ids[i] < V)
      DS_TRY(ds_ids_push(&t->vocab_mandatory, (int32_t)stops->eos_token_ids[i]));
  /* distinct, in id order (the count the messages give) */
  ds_ids *mand = &t->vocab_mandatory;
  qsort(mand->ids, mand->len, sizeof *mand->ids, by_id);
  size_t n_distinct = 0;
  for (size_t i = 0; i < mand->len; i++)
    if (!n_distinct || mand->ids[i] != mand->ids[n_distinct - 1]) mand->ids[n_distinct++] = mand->ids[i];
  mand->len = n_distinct;
  /* the supervised target tokens x* of the training split */
  int64_t *counts = ds_calloc((size_t)V, sizeof *counts, "draft vocabulary counts");
  t->vocab_ids = ds_malloc((size_t)N * sizeof *t->vocab_ids, "draft vocabulary");
  if (!counts || !t->vocab_ids) {
    free(counts);
    return DS_ERR_NOMEM;
  }
  const ds_dataset *ds = &t->data;
  int64_t total = 0;
  for (int64_t i = 0; i < t->n_train; i++) {
    const int32_t *ids = ds->ids + i * ds->seq_len;
    const uint8_t *m = ds->loss_mask + i * ds->seq_len;
    for (int64_t k = 1; k < ds->lengths[i]; k++) /* position 0 is never a predicted token */
      if (m[k] && ids[k] >= 0 && ids[k] < V) counts[ids[k]]++, total++;
  }
  ds_status st = ds_draft_vocab_select(counts, V, N, t->vocab_mandatory.ids, (int64_t)t->vocab_mandatory.len,
                                       t->vocab_ids);
  if (st == DS_OK) {
    int64_t covered = 0;
    for (int64_t j = 0; j < N; j++) covered += counts[t->vocab_ids[j]];
    t->vocab_coverage = total > 0 ? (double)covered / (double)total : 1.0;
    t->vocab_xxh64 = XXH64(t->vocab_ids, (size_t)N * sizeof *t->vocab_ids, 0);
    t->dc.draft_vocab_size = N;
    if (!t->o->loop.quiet) {
      char list[200];
      size_t at = 0;
      list[0] = 0;
      for (size_t i = 0; i < mand->len && at + 16 < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", i ? " " : "", mand->ids[i]);
      if (at + 16 >= sizeof list) snprintf(list + at, sizeof list - at, " ...");
      ds_note("draft vocabulary: %lld of %lld target ids, covering %.2f%% of the training split's %lld supervised "
              "tokens; %zu mandatory (the chat template's assistant-turn ids and the stop / eos ids): %s", (long long)N,
              (long long)V, 100.0 * t->vocab_coverage, (long long)total, mand->len, list);
    }
  }
  free(counts);
  return st;
}

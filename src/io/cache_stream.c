/* The prefetching cache stream: one background thread converts pushed samples, in push
 * order, into a ring of fp32 slots while the consumer trains on the previous ones.
 *
 * Counters only grow: pushed >= processed >= consumed. Slot k % depth holds request k. The
 * consumer holds at most one slot (the last one next returned) until its next call, so the
 * slots in use are (pushed - consumed) waiting plus `held`. See include/dspark/cache.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/cache.h"

typedef struct {
  int64_t index;
  ds_status st;
  char *error;      /* the worker's message when st != DS_OK */
  float *ctx;       /* [S, m*d] */
  float *last;      /* [S, d] */
  int32_t *kd_ids;  /* [S, K] */
  float *kd_lp;     /* [S, K] */
} slot;

struct ds_cache_stream {
  ds_cache *c;
  int depth, want_kd, features;
  slot *slots;
  int64_t pushed, processed, consumed; /* consumed: handed to the consumer (the last may be held) */
  int held;
  int stop;
  double wait_s;
  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

static void *worker(void *arg) {
  ds_cache_stream *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->stop && s->processed == s->pushed) pthread_cond_wait(&s->cv, &s->mu);
    if (s->stop) break;
    slot *sl = &s->slots[s->processed % s->depth];
    pthread_mutex_unlock(&s->mu);
    ds_status st = ds_cache_read_sample(s->c, sl->index, s->features ? sl->ctx : NULL, s->features ? sl->last : NULL,
                                        s->want_kd ? sl->kd_ids : NULL, s->want_kd ? sl->kd_lp : NULL);
    free(sl->error);
    sl->error = NULL;
    if (st != DS_OK) {
      const char *msg = ds_last_error();
      sl->error = malloc(strlen(msg) + 1);
      if (sl->error) strcpy(sl->error, msg);
    }
    sl->st = st;
    pthread_mutex_lock(&s->mu);
    s->processed++;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

ds_status ds_cache_stream_start(ds_cache *c, int depth, int want_kd, ds_cache_stream **out) {
  *out = NULL;
  const ds_cache_manifest *m = ds_cache_get_manifest(c);
  if (depth < 2) return DS_FAIL(DS_ERR_ARG, "cache stream: depth %d must be at least 2", depth);
  if (want_kd && !m->kd_topk) return DS_FAIL(DS_ERR_ARG, "%s: the cache holds no KD data", ds_cache_path(c));
  ds_cache_stream *s = ds_calloc(1, sizeof *s, "cache stream");
  if (!s) return DS_ERR_NOMEM;
  s->c = c;
  s->depth = depth;
  s->want_kd = want_kd;
  s->features = m->features;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->slots = ds_calloc((size_t)depth, sizeof *s->slots, "cache stream slots");
  if (!s->slots) { ds_cache_stream_free(s); return DS_ERR_NOMEM; }
  int64_t S = m->seq_length, d = m->hidden_size, md = d * m->n_layers, K = m->kd_topk;
  for (int i = 0; i < depth; i++) {
    slot *sl = &s->slots[i];
    if (s->features) {
      sl->ctx = ds_malloc_aligned((size_t)(S * md) * sizeof(float), "prefetch slot");
      sl->last = ds_malloc_aligned((size_t)(S * d) * sizeof(float), "prefetch slot");
      if (!sl->ctx || !sl->last) { ds_cache_stream_free(s); return DS_ERR_NOMEM; }
    }
    if (want_kd) {
      sl->kd_ids = ds_malloc_aligned((size_t)(S * K) * sizeof(int32_t), "prefetch slot");
      sl->kd_lp = ds_malloc_aligned((size_t)(S * K) * sizeof(float), "prefetch slot");
      if (!sl->kd_ids || !sl->kd_lp) { ds_cache_stream_free(s); return DS_ERR_NOMEM; }
    }
  }
  if (pthread_create(&s->thread, NULL, worker, s) != 0) {
    ds_cache_stream_free(s);
    return DS_FAIL(DS_ERR_INTERNAL, "cache stream: cannot start the prefetch thread");
  }
  s->thread_started = 1;
  *out = s;
  return DS_OK;
}

int ds_cache_stream_space(const ds_cache_stream *s) {
  ds_cache_stream *w = (ds_cache_stream *)s; /* the lock is not part of the logical state */
  pthread_mutex_lock(&w->mu);
  int64_t busy = s->pushed - s->consumed + s->held;
  pthread_mutex_unlock(&w->mu);
  return (int)(s->depth - busy);
}

ds_status ds_cache_stream_push(ds_cache_stream *s, int64_t index) {
  pthread_mutex_lock(&s->mu);
  if (s->pushed - s->consumed + s->held >= s->depth) {
    pthread_mutex_unlock(&s->mu);
    return DS_FAIL(DS_ERR_INTERNAL, "cache stream: push with no free slot");
  }
  s->slots[s->pushed % s->depth].index = index;
  s->pushed++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return DS_OK;
}

ds_status ds_cache_stream_next(ds_cache_stream *s, ds_cache_sample *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&s->mu);
  s->held = 0; /* the previous sample is released */
  if (s->consumed == s->pushed) {
    pthread_mutex_unlock(&s->mu);
    return DS_FAIL(DS_ERR_INTERNAL, "cache stream: next with nothing pushed");
  }
  if (s->processed == s->consumed) {
    double t0 = ds_time_sec();
    while (s->processed == s->consumed) pthread_cond_wait(&s->cv, &s->mu);
    s->wait_s += ds_time_sec() - t0;
  }
  slot *sl = &s->slots[s->consumed % s->depth];
  s->consumed++;
  s->held = 1;
  pthread_mutex_unlock(&s->mu);
  if (sl->st != DS_OK) return DS_FAIL(sl->st, "%s", sl->error ? sl->error : "cache stream: read failed");
  const ds_cache_manifest *m = ds_cache_get_manifest(s->c);
  out->index = sl->index;
  out->length = ds_cache_sample_length(s->c, sl->index);
  out->ctx = m->features ? sl->ctx : NULL;
  out->last = m->features ? sl->last : NULL;
  out->topk_ids = s->want_kd ? sl->kd_ids : NULL;
  out->topk_logprobs = s->want_kd ? sl->kd_lp : NULL;
  return DS_OK;
}

double ds_cache_stream_wait_s(const ds_cache_stream *s) { return s->wait_s; }

void ds_cache_stream_free(ds_cache_stream *s) {
  if (!s) return;
  if (s->thread_started) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
  }
  for (int i = 0; s->slots && i < s->depth; i++) {
    ds_free_aligned(s->slots[i].ctx);
    ds_free_aligned(s->slots[i].last);
    ds_free_aligned(s->slots[i].kd_ids);
    ds_free_aligned(s->slots[i].kd_lp);
    free(s->slots[i].error);
  }
  free(s->slots);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

/* Regeneration (include/dspark/regenerate.h): the output file, the order of the turns and the
 * lines. A turn's prompt and answer are regen_turns.c's; the files regen_io.c's. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "decode/regen_internal.h"
#include "dspark/draft.h"
#include "dspark/progress.h"
#include "dspark/rng.h"
#include "dspark/spec_schedule.h"

/* The test hook DSPARK_REGENERATE_KILL_AFTER=N: after N lines written by this process, half
 * of the next one is written and the process SIGKILLs itself (a kill mid-write, on cue). */
static int64_t kill_after(void) {
  const char *e = getenv("DSPARK_REGENERATE_KILL_AFTER");
  return e && *e ? strtoll(e, NULL, 10) : -1;
}

ds_status ds_regen_open(const ds_regen_options *o, const ds_tokenizer *tok, const ds_chat_template *tmpl,
                        int64_t max_positions, ds_regen **out) {
  *out = NULL;
  if (o->batch < 1 || o->max_new < 1)
    return DS_FAIL(DS_ERR_ARG, "regenerate: batch %lld and max_new %lld must be at least 1", (long long)o->batch,
                   (long long)o->max_new);
  ds_regen *g = ds_calloc(1, sizeof *g, "regeneration");
  if (!g) return DS_ERR_NOMEM;
  g->o = *o;
  g->tok = tok;
  g->tmpl = o->completion ? NULL : tmpl;
  g->max_pos = max_positions;
  g->kill_at = kill_after();
  ds_status st = regen_input_read(o->data, o->completion, o->skip_bad, o->max_line_bytes, &g->in);
  if (st == DS_OK) regen_settings(g);
  /* one writer per output: the lock is taken before the file is checked or cut */
  int fd = -1;
  if (st == DS_OK && (fd = open(o->out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0)
    st = DS_FAIL(DS_ERR_IO, "--out %s: cannot open for appending: %s", o->out, strerror(errno));
  if (st == DS_OK && flock(fd, LOCK_EX | LOCK_NB) != 0)
    st = DS_FAIL(DS_ERR_IO, "%s is being written by another dspark regenerate", o->out);
  if (st == DS_OK) st = regen_resume_scan(o->out, &g->in, g->sum.settings, &g->next, &g->sum.lines_kept);
  if (st == DS_OK && !(g->f = fdopen(fd, "ab"))) st = DS_FAIL(DS_ERR_IO, "%s: %s", o->out, strerror(errno));
  if (st != DS_OK) {
    if (fd >= 0) close(fd);
    ds_regen_close(g);
    return st;
  }
  g->sum.resumed_after = g->next;
  if (g->sum.lines_kept > 0) {
    char source[1100];
    ds_note("regenerate: %s holds %lld lines of this run: resuming after conversation %lld (%s)", o->out,
            (long long)g->sum.lines_kept, (long long)g->next - 1, regen_source(&g->in, g->next - 1, source,
                                                                                sizeof source));
  }
  *out = g;
  return DS_OK;
}

int64_t ds_regen_remaining(const ds_regen *g) { return g->in.n - g->next; }

void ds_regen_get_summary(const ds_regen *g, ds_regen_summary *s) {
  *s = g->sum;
  s->files = g->in.files_read;
  s->conversations = g->in.n;
  s->bad += g->in.bad;
  s->bad_lines = g->in.bad;
}

void ds_regen_close(ds_regen *g) {
  if (!g) return;
  if (g->f) fclose(g->f);
  regen_input_free(&g->in);
  free(g);
}

static void conv_free(regen_conv *c) {
  cJSON_Delete(c->obj);
  cJSON_Delete(c->tokens);
  cJSON_Delete(c->finish);
  ds_ids_free(&c->prompt);
  memset(c, 0, sizeof *c);
}

/* Conversation k loaded into c; a conversation without messages is complete (skipped) at once. */
static ds_status conv_load(ds_regen *g, regen_conv *c, int64_t k) {
  memset(c, 0, sizeof *c);
  c->index = k;
  DS_TRY(regen_conversation(&g->in, k, &c->obj));
  c->tokens = cJSON_CreateArray();
  c->finish = cJSON_CreateArray();
  if (!c->tokens || !c->finish) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  c->turns = regen_turns(c->obj, g->o.completion);
  if (c->turns == 0) {
    char label[1100];
    ds_note("regenerate: %s: no messages: conversation skipped", regen_conv_label(g, c, label, sizeof label));
    c->skipped = 1;
    c->complete = 1;
  }
  return DS_OK;
}

static ds_status write_line(ds_regen *g, const regen_conv *c) {
  cJSON *r = cJSON_CreateObject();
  if (!r) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  char source[1100];
  cJSON_AddNumberToObject(r, "index", (double)c->index);
  cJSON_AddStringToObject(r, "source", regen_source(&g->in, c->index, source, sizeof source));
  cJSON_AddStringToObject(r, "settings", g->sum.settings);
  cJSON_AddItemReferenceToObject(r, "tokens", c->tokens);
  cJSON_AddItemReferenceToObject(r, "finish", c->finish);
  cJSON_DeleteItemFromObjectCaseSensitive(c->obj, "regenerated");
  cJSON_AddItemToObject(c->obj, "regenerated", r);
  char *s = cJSON_PrintUnformatted(c->obj);
  if (!s) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  size_t n = strlen(s);
  if (g->sum.lines_written == g->kill_at) {
    fwrite(s, 1, n / 2, g->f);
    fflush(g->f);
    raise(SIGKILL);
  }
  int ok = fwrite(s, 1, n, g->f) == n && fputc('\n', g->f) != EOF;
  free(s);
  if (!ok) return DS_FAIL(DS_ERR_IO, "%s: write failed (disk full?)", g->o.out);
  g->sum.lines_written++;
  return DS_OK;
}

static ds_status sync_out(ds_regen *g) {
  if (fflush(g->f) != 0 || fsync(fileno(g->f)) != 0)
    return DS_FAIL(DS_ERR_IO, "%s: flushing to disk failed (disk full?)", g->o.out);
  return DS_OK;
}

/* A complete conversation: its line (or its skip counted). */
static ds_status emit(ds_regen *g, const regen_conv *c) {
  if (c->skipped) {
    *(c->skipped == 2 ? &g->sum.bad : &g->sum.skipped) += 1;
    return DS_OK;
  }
  return write_line(g, c);
}

typedef struct {
  ds_regen *g;
  double t0, shown;
} progress;

static void show(progress *p, int64_t done, int last) {
  ds_regen *g = p->g;
  double el = ds_time_sec() - p->t0;
  if (!last && el - p->shown < (isatty(fileno(stderr)) ? 0.2 : 5.0)) return;
  p->shown = el;
  char extra[96];
  snprintf(extra, sizeof extra, "conversations (%lld turns, %lld tokens)", (long long)g->sum.turns,
           (long long)g->sum.tokens);
  ds_progress_line(stderr, "regenerate", g->sum.resumed_after + done, g->in.n, done, el,
                   el > 0 ? (double)g->sum.tokens / el : 0, "tokens/s", extra);
}

/* ---- plain decoding, batched continuously (ds_generate_stream) ---- */

/* The conversations from first on, in a window: slot k - first holds conversation k from its
 * first turn until its line is written (lines leave in input order). */
typedef struct {
  ds_regen *g;
  progress *p;
  regen_conv *win;       /* [n] */
  int64_t first, n;      /* conversations [first, first + n) are in the window */
  int64_t loaded;        /* the next conversation to start */
  int64_t answered;      /* conversations complete, written or not: the progress line's count (the
                          * head of the window may wait on one long answer while the rest finish) */
  int64_t *ready;        /* conversations whose next turn waits for a place, FIFO */
  int64_t n_ready, cap_ready;
  ds_status feed;        /* an error inside next(), which can only say "no request" */
} stream;

static regen_conv *at(stream *s, int64_t k) { return &s->win[k - s->first]; }

/* Writes the complete conversations at the head of the window and slides it. */
static ds_status flush(stream *s) {
  int64_t before = s->first;
  while (s->first < s->loaded && s->win[0].complete) {
    DS_TRY(emit(s->g, &s->win[0]));
    conv_free(&s->win[0]);
    memmove(s->win, s->win + 1, (size_t)(s->n - 1) * sizeof *s->win);
    memset(&s->win[s->n - 1], 0, sizeof *s->win);
    s->first++;
  }
  if (s->first > before) DS_TRY(sync_out(s->g));
  show(s->p, s->answered, s->first > before && s->first == s->g->in.n);
  return DS_OK;
}

/* Prepares turn c->turn: queued when it is to be decoded, else the conversation is complete. */
static ds_status queue_turn(stream *s, regen_conv *c) {
  int decode = 0;
  if (c->turn < c->turns && !c->skipped) DS_TRY(regen_turn_prompt(s->g, c, &decode));
  if (!decode) {
    c->complete = 1;
    s->answered++;
    return DS_OK;
  }
  if (s->n_ready == s->cap_ready) {
    int64_t cap = s->cap_ready ? 2 * s->cap_ready : 64;
    int64_t *v = realloc(s->ready, (size_t)cap * sizeof *v);
    if (!v) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
    s->ready = v;
    s->cap_ready = cap;
  }
  s->ready[s->n_ready++] = c->index;
  return DS_OK;
}

/* Grows the window to hold conversation k. */
static ds_status reserve(stream *s, int64_t k) {
  if (k - s->first < s->n) return DS_OK;
  int64_t n = s->n ? 2 * s->n : 64;
  while (k - s->first >= n) n *= 2;
  regen_conv *w = realloc(s->win, (size_t)n * sizeof *w);
  if (!w) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  memset(w + s->n, 0, (size_t)(n - s->n) * sizeof *w);
  s->win = w;
  s->n = n;
  return DS_OK;
}

static int stream_next(void *user, const int32_t **prompt, int64_t *n_prompt, uint64_t *seed, int64_t *tag) {
  stream *s = user;
  ds_regen *g = s->g;
  while (s->n_ready == 0 && s->loaded < g->in.n) { /* a conversation's next turn first, then a new one */
    ds_status st = reserve(s, s->loaded);
    regen_conv *c = st == DS_OK ? at(s, s->loaded) : NULL;
    if (st == DS_OK && (st = conv_load(g, c, s->loaded)) == DS_OK) {
      s->loaded++;
      if (!c->complete) st = queue_turn(s, c);
      else s->answered++;
    }
    if (st == DS_OK) st = flush(s);
    if (st != DS_OK) {
      s->feed = st;
      return 0;
    }
  }
  if (s->n_ready == 0) return 0;
  int64_t k = s->ready[0];
  memmove(s->ready, s->ready + 1, (size_t)(--s->n_ready) * sizeof *s->ready);
  regen_conv *c = at(s, k);
  *prompt = c->prompt.ids;
  *n_prompt = (int64_t)c->prompt.len;
  *seed = ds_seed_mix(ds_seed_mix((uint64_t)g->o.seed, (uint64_t)c->index), (uint64_t)c->turn);
  *tag = k;
  return 1;
}

static ds_status stream_done(void *user, int64_t tag, ds_spec_result *r) {
  stream *s = user;
  regen_conv *c = at(s, tag);
  ds_status st = regen_apply_answer(s->g, c, r);
  ds_spec_result_free(r);
  ds_ids_free(&c->prompt);
  if (st != DS_OK) return st;
  c->turn++;
  DS_TRY(queue_turn(s, c));
  return flush(s);
}

static ds_status run_stream(ds_regen *g, ds_target *target, const ds_spec_options *so, progress *p) {
  stream s = {.g = g, .p = p, .first = g->next, .loaded = g->next};
  ds_gen_stream gs = {stream_next, stream_done, &s};
  ds_status st = ds_generate_stream(target, (int)g->o.batch, so, &gs);
  if (st == DS_OK) st = s.feed;
  if (st == DS_OK) st = flush(&s); /* conversations skipped whole at the end of the input */
  for (int64_t i = 0; i < s.n; i++) conv_free(&s.win[i]);
  free(s.win);
  free(s.ready);
  return st;
}

/* ---- speculative decoding: groups of `batch` conversations, one round per turn index ---- */

/* Round r of a group: every conversation with a turn r still to decode, as one batch. */
static ds_status decode_round(ds_regen *g, ds_target *target, ds_draft *draft, const ds_spec_options *o,
                              regen_conv *cs, int nc, int r, int *any) {
  const int32_t **pv = calloc((size_t)nc, sizeof *pv);
  int64_t *pn = calloc((size_t)nc, sizeof *pn);
  uint64_t *seeds = calloc((size_t)nc, sizeof *seeds);
  ds_spec_result *res = calloc((size_t)nc, sizeof *res);
  int *who = calloc((size_t)nc, sizeof *who), R = 0;
  ds_status st = pv && pn && seeds && res && who ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "out of memory");
  for (int i = 0; st == DS_OK && i < nc; i++) {
    regen_conv *c = &cs[i];
    int decode = 0;
    if (c->skipped || r >= c->turns) continue;
    c->turn = r;
    if ((st = regen_turn_prompt(g, c, &decode)) != DS_OK || !decode) continue;
    pv[R] = c->prompt.ids;
    pn[R] = (int64_t)c->prompt.len;
    seeds[R] = ds_seed_mix(ds_seed_mix((uint64_t)g->o.seed, (uint64_t)c->index), (uint64_t)r);
    who[R++] = i;
  }
  *any = R > 0;
  if (st == DS_OK && R > 0) {
    ds_spec_options so = *o;
    so.seeds = seeds;
    st = ds_speculate_batch(target, draft, pv, pn, R, &so, res);
    for (int k = 0; st == DS_OK && k < R; k++) st = regen_apply_answer(g, &cs[who[k]], &res[k]);
    for (int k = 0; k < R; k++) ds_spec_result_free(&res[k]);
  }
  for (int i = 0; i < nc; i++) ds_ids_free(&cs[i].prompt);
  free(pv);
  free(pn);
  free(seeds);
  free(res);
  free(who);
  return st;
}

/* Decodes conversations [g0, g1) and writes those from g->next on (a resumed group's earlier
 * lines are already in the file). */
static ds_status run_group(ds_regen *g, ds_target *target, ds_draft *draft, const ds_spec_options *o, int64_t g0,
                           int64_t g1) {
  int nc = (int)(g1 - g0);
  regen_conv *cs = calloc((size_t)nc, sizeof *cs);
  if (!cs) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  ds_status st = DS_OK;
  int max_turns = 0;
  for (int i = 0; st == DS_OK && i < nc; i++) {
    st = conv_load(g, &cs[i], g0 + i);
    if (cs[i].turns > max_turns) max_turns = cs[i].turns;
  }
  for (int r = 0, any = 1; st == DS_OK && r < max_turns && any; r++)
    st = decode_round(g, target, draft, o, cs, nc, r, &any);
  for (int i = 0; st == DS_OK && i < nc; i++)
    if (cs[i].index >= g->next) st = emit(g, &cs[i]);
  if (st == DS_OK) st = sync_out(g);
  for (int i = 0; i < nc; i++) conv_free(&cs[i]);
  free(cs);
  return st;
}

ds_status ds_regen_run(ds_regen *g, ds_target *target, ds_draft *draft) {
  ds_spec_options so;
  ds_spec_options_default(&so);
  so.max_new_tokens = g->o.max_new;
  so.temperature = g->o.temperature;
  so.top_p = g->o.top_p;
  so.ignore_eos = g->o.ignore_eos;
  progress p = {g, ds_time_sec(), -1e9};
  ds_status st = DS_OK;
  if (ds_regen_remaining(g) == 0) {
    /* the output is complete: nothing to decode */
  } else if (!target) {
    st = DS_FAIL(DS_ERR_ARG, "regenerate: %lld conversations remain and no target was given",
                 (long long)ds_regen_remaining(g));
  } else if (!draft) {
    st = run_stream(g, target, &so, &p);
  } else {
    int64_t B = g->o.batch, n = g->in.n;
    /* Greedy, the prefix scheduler picks each round's lengths, as `speculate` does by default: a
     * draft that is rarely right then costs next to nothing, and the bytes are the target's
     * whatever it picks. Sampled, its picks (from measured times) would change the draws, and a
     * resumed run must write an uninterrupted one's bytes: the fixed length stays. Its
     * verification costs are this machine's, timed once here at one request's counts and their
     * multiples; the draft's cost is measured as it runs. */
    double *verify = NULL, *head = NULL;
    int64_t nv = 0;
    if (!(so.temperature > 0)) {
      st = ds_spec_profile_quick(target, draft, B, ds_draft_get_config(draft)->block_size, &verify, &head, &nv);
      so.policy = DS_SPEC_SCHEDULER;
      so.verify_s = verify, so.n_verify = nv, so.head_s = head, so.n_head = nv - 1;
    }
    for (int64_t g0 = g->next / B * B; st == DS_OK && g0 < n; g0 += B) {
      int64_t g1 = g0 + B < n ? g0 + B : n;
      st = run_group(g, target, draft, &so, g0, g1);
      show(&p, g1 - g->next, g1 == n);
    }
    free(verify);
    free(head);
  }
  g->sum.seconds = ds_time_sec() - p.t0;
  if (st == DS_OK) {
    g->next = g->in.n;
    if (fclose(g->f) != 0) st = DS_FAIL(DS_ERR_IO, "%s: closing failed", g->o.out);
    g->f = NULL;
  }
  return st;
}

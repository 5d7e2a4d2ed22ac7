/* dspark regenerate: replaces each conversation's assistant turns by the target's own answers
 * (docs/speculative-decoding.md "Regenerating answers with the target"), so a draft trains on what its target says.
 *
 * Conversations are taken in fixed groups of --batch (conversations [g*B, (g+1)*B) of the
 * input): round r decodes the r-th assistant turn of every conversation of the group that has
 * one, in one batch (plain decoding, or speculative with --draft: the same output when
 * greedy). A turn's prompt is the conversation up to it, its earlier answers already
 * regenerated, rendered by the target's chat template with the generation prompt. Turn r of
 * conversation k (its index in the reader's order) samples with the seed mix(mix(S, k), r), so
 * neither the batch nor a resume changes a byte. The group's lines are appended in input order and
 * fsync'd; a rerun after a kill checks the lines written and redoes the group it stopped in
 * (regen_io.h), so the file ends byte for byte as an uninterrupted run writes it. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/prompt.h"
#include "cli/regen_io.h"
#include "cli/spec_io.h"
#include "dspark/backend.h"
#include "dspark/checkpoint.h"
#include "dspark/fileio.h"
#include "dspark/progress.h"
#include "dspark/rng.h"
#include "dspark/speculate.h"
#include "text/chat_json.h"
#include "text/chat_reasoning.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark regenerate --target MODEL --data FILE|DIR|GLOB --out FILE.jsonl [options]\n"
          "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
          "Replaces every assistant turn of each conversation by the target's own answer (a conversation\n"
          "ending with a user turn gets one appended) and appends it to --out, one line per conversation.\n"
          "  --data INPUTS         read as `dspark train --data` reads them (a file, a directory, a glob; .gz /\n"
          "                        .zst): JSONL {\"messages\": [{\"role\", \"content\"[, \"reasoning_content\"]}, ...]},\n"
          "                        ShareGPT {\"conversations\": [{\"from\", \"value\"}, ...]} (written out as\n"
          "                        \"messages\"), or {\"text\": TEXT} / {\"prompt\": TEXT} as a single user turn; a\n"
          "                        plain-text file: one user turn per non-blank line\n"
          "  --out FILE            the output (JSONL); when it exists the run resumes after its last complete\n"
          "                        line, after checking every line against --data and these settings\n"
          "  --max-new-tokens N    tokens per answer at most (default 256)\n"
          "  --temperature T       0 = greedy (default 0)\n"
          "  --top-p P             nucleus sampling mass (default 1.0 = off)\n"
          "  --seed S              turn r of conversation k samples with mix(mix(S, k), r) (default 0)\n"
          "  --thinking on|off|keep  on/off: enable_thinking passed to the template (Qwen3); keep: a source turn\n"
          "                        with reasoning keeps it, as the start of the answer, and only the content\n"
          "                        after it is generated; one without is generated with thinking off. Default:\n"
          "                        the template's own default. A generated <think>..</think> block becomes the\n"
          "                        turn's reasoning_content when the template renders reasoning.\n"
          "  --chat-template FILE  this Jinja template instead of the target's\n"
          "  --completion          no chat template: each {\"text\"} / {\"prompt\"} (or plain-text line) is\n"
          "                        continued as text; the output's \"text\" is the prompt plus the continuation\n"
          "  --ignore-eos          generate --max-new-tokens every time\n"
          "  --skip-bad-lines      a malformed line, or a conversation the chat template refuses, is skipped\n"
          "                        (named on stderr, counted in the summary) instead of ending the run\n"
          CLI_MAX_LINE_HELP
          "  --draft DIR           decode speculatively with this DSpark draft (greedy: the same output)\n"
          "  --batch N             conversations decoded together (default 16)\n"
          "  --summary FILE        the run's summary (JSON) there instead of stdout\n"
          "  --threads N\n"
          "Answers stop on the target's stop tokens (generation_config.json's eos_token_id, as `dspark\n"
          "generate`), or after --max-new-tokens. Each line gets \"regenerated\": {\"index\", \"source\":\n"
          "\"FILE:LINE\", \"settings\", \"tokens\": [per turn], \"finish\": [\"eos\" | \"length\" per turn]}.\n"
          "A conversation whose prompt plus --max-new-tokens exceeds max_position_embeddings is skipped\n"
          "(named on stderr, counted); a run that skips every conversation fails.\n");
}

enum { THINK_DEFAULT, THINK_ON, THINK_OFF, THINK_KEEP };

typedef struct {
  const char *target_dir, *draft_dir, *data, *out, *summary, *chat_template;
  double temperature, top_p;
  int64_t max_new, seed, batch, threads;
  int thinking, completion, ignore_eos, skip_bad;
  size_t max_line_bytes;
} regen_options;

typedef struct {
  const regen_options *o;
  const regen_input *in;
  ds_tokenizer *tok;
  cli_chat cc;
  ds_target *target;
  ds_draft *draft;
  int64_t max_pos;
  int split_reasoning; /* the template renders reasoning: split a generated <think> block */
  char settings[17];
  int64_t turns, tokens, eos, length, skipped, bad, written;
} regen;

/* One conversation of the group being decoded. */
typedef struct {
  int64_t index;
  cJSON *obj, *tokens, *finish; /* the output object; its per-turn counts */
  int turns, skipped;            /* skipped: 1 too long or empty, 2 a bad conversation (--skip-bad-lines) */
  int kept;                     /* the current turn keeps the source's reasoning */
} conv;

static const char k_sentinel[] = "DSPARK-REGENERATE-CONTENT-3f9c1a";

static const char *line_label(const regen *g, const conv *c, char *buf, size_t n) {
  return regen_source(g->in, c->index, buf, n);
}

/* Message index of turn r (the messages' count for an appended turn). */
static int turn_message(const cJSON *msgs, int r) {
  int i = 0, seen = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") && seen++ == r) return i;
    i++;
  }
  return i;
}

/* The prompt of turn r of c: the messages before it with the generation prompt, or (keep)
 * the template's rendering of the turn up to where its content starts. */
static ds_status turn_prompt(regen *g, conv *c, int r, ds_ids *ids) {
  char label[1100];
  line_label(g, c, label, sizeof label);
  c->kept = 0;
  if (g->o->completion) {
    const char *text = cJSON_GetObjectItemCaseSensitive(c->obj, "text")->valuestring;
    return ds_tokenizer_encode(g->tok, text, strlen(text), 1, ids);
  }
  ds_chat_message *m = NULL;
  size_t n = 0;
  DS_TRY(tk_chat_messages(cJSON_GetObjectItemCaseSensitive(c->obj, "messages"), label, &m, &n));
  size_t a = (size_t)turn_message(cJSON_GetObjectItemCaseSensitive(c->obj, "messages"), r);
  int source_reasoning = a < n && m[a].reasoning != NULL;
  ds_chat_options opt = {1, g->o->thinking == THINK_ON ? 1 : g->o->thinking == THINK_DEFAULT ? -1 : 0};
  ds_status st = DS_OK;
  if (g->o->thinking == THINK_KEEP && source_reasoning) c->kept = 1;
  if (c->kept && g->cc.tmpl) {
    m[a].content = k_sentinel;
    m[a].content_len = 0;
    ds_chat_options whole = {0, -1};
    char *text = NULL;
    size_t len = 0;
    st = ds_chat_template_render(g->cc.tmpl, m, a + 1, &whole, &text, &len, NULL);
    char *at = st == DS_OK ? strstr(text, k_sentinel) : NULL;
    if (st == DS_OK && (!at || strstr(at + 1, k_sentinel)))
      st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: --thinking keep: the template %s does not render an assistant content "
                   "verbatim once, so where the answer starts after the kept reasoning is unknown", label,
                   ds_chat_template_label(g->cc.tmpl));
    if (st == DS_OK) st = ds_tokenizer_encode(g->tok, text, (size_t)(at - text), 0, ids);
    free(text);
  } else {
    ds_ids mask = {0};
    st = ds_chat_encode(g->tok, g->cc.tmpl, m, a, &opt, ids, &mask);
    ds_ids_free(&mask);
  }
  free(m);
  if (st != DS_OK) ds_error_wrap(st, "%s: turn %d", label, r + 1);
  return st;
}

static ds_status set_string(cJSON *obj, const char *key, const char *text, size_t len) {
  char *s = strndup(text, len);
  cJSON *v = s ? cJSON_CreateString(s) : NULL;
  free(s);
  if (!v) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  if (cJSON_GetObjectItemCaseSensitive(obj, key)) cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v);
  else cJSON_AddItemToObject(obj, key, v);
  return DS_OK;
}

/* Writes the answer of turn r (ids, stopped) into c. */
static ds_status apply_answer(regen *g, conv *c, int r, const ds_spec_result *res) {
  char *text = NULL;
  size_t len = 0;
  int64_t n = res->n - (res->stopped ? 1 : 0); /* the stop token ends the turn; the template writes its own */
  DS_TRY(ds_tokenizer_decode(g->tok, res->ids, (size_t)n, 1, &text, &len));
  ds_status st = DS_OK;
  if (g->o->completion) {
    const char *p = cJSON_GetObjectItemCaseSensitive(c->obj, "text")->valuestring;
    size_t pl = strlen(p);
    char *all = malloc(pl + len + 1);
    if (!all) st = DS_FAIL(DS_ERR_NOMEM, "out of memory");
    else {
      memcpy(all, p, pl);
      memcpy(all + pl, text, len + 1);
      st = set_string(c->obj, "text", all, pl + len);
      free(all);
    }
  } else {
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c->obj, "messages");
    int a = turn_message(msgs, r);
    cJSON *msg = cJSON_GetArrayItem(msgs, a);
    if (!msg) {
      msg = cJSON_CreateObject();
      if (!msg || !cJSON_AddStringToObject(msg, "role", "assistant")) {
        cJSON_Delete(msg);
        st = DS_FAIL(DS_ERR_NOMEM, "out of memory");
      } else {
        cJSON_AddItemToArray(msgs, msg);
      }
    }
    size_t ro, rl, co, cl;
    if (st == DS_OK && c->kept) {
      st = set_string(msg, "content", text, len); /* the source's reasoning stays as it was */
    } else if (st == DS_OK) {
      static const char *const aliases[] = {"reasoning_content", "thinking", "reasoning"};
      for (int k = 0; k < 3; k++) cJSON_DeleteItemFromObjectCaseSensitive(msg, aliases[k]);
      if (g->split_reasoning && tk_split_reasoning(text, len, &ro, &rl, &co, &cl)) {
        st = set_string(msg, "content", text + co, cl);
        if (st == DS_OK) st = set_string(msg, "reasoning_content", text + ro, rl);
      } else {
        st = set_string(msg, "content", text, len);
      }
    }
  }
  free(text);
  if (st == DS_OK) {
    cJSON_AddItemToArray(c->tokens, cJSON_CreateNumber((double)res->n));
    cJSON_AddItemToArray(c->finish, cJSON_CreateString(res->stopped ? "eos" : "length"));
  }
  return st;
}

/* Round r of a group: every unskipped conversation with a turn r, decoded as one batch. */
static ds_status decode_round(regen *g, conv *cs, int nc, int r, int *any) {
  const int32_t **pv = calloc((size_t)nc, sizeof *pv);
  int64_t *pn = calloc((size_t)nc, sizeof *pn);
  uint64_t *seeds = calloc((size_t)nc, sizeof *seeds);
  ds_ids *prompts = calloc((size_t)nc, sizeof *prompts);
  ds_spec_result *res = calloc((size_t)nc, sizeof *res);
  int *who = calloc((size_t)nc, sizeof *who), R = 0;
  ds_status st = pv && pn && seeds && prompts && res && who ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "out of memory");
  for (int i = 0; st == DS_OK && i < nc; i++) {
    conv *c = &cs[i];
    if (c->skipped || r >= c->turns) continue;
    if ((st = turn_prompt(g, c, r, &prompts[R])) != DS_OK) {
      /* a conversation the template refuses (its raise_exception, an unsupported construct) */
      if (!g->o->skip_bad || (st != DS_ERR_ARG && st != DS_ERR_FORMAT && st != DS_ERR_UNSUPPORTED)) break;
      ds_note("regenerate: %s; conversation skipped (--skip-bad-lines)", ds_last_error());
      ds_error_clear();
      ds_ids_free(&prompts[R]);
      c->skipped = 2;
      st = DS_OK;
      continue;
    }
    char label[1100];
    if (prompts[R].len == 0 || (int64_t)prompts[R].len + g->o->max_new > g->max_pos) {
      ds_note("regenerate: %s: turn %d's prompt (%zu tokens) plus --max-new-tokens %lld %s: conversation skipped",
              line_label(g, c, label, sizeof label), r + 1, prompts[R].len, (long long)g->o->max_new,
              prompts[R].len ? "exceeds max_position_embeddings" : "(an empty prompt)");
      c->skipped = 1;
      ds_ids_free(&prompts[R]);
      continue;
    }
    pv[R] = prompts[R].ids;
    pn[R] = (int64_t)prompts[R].len;
    seeds[R] = ds_seed_mix(ds_seed_mix((uint64_t)g->o->seed, (uint64_t)c->index), (uint64_t)r);
    who[R++] = i;
  }
  *any = R > 0;
  if (st == DS_OK && R > 0) {
    ds_spec_options so;
    ds_spec_options_default(&so);
    so.max_new_tokens = g->o->max_new;
    so.temperature = g->o->temperature;
    so.top_p = g->o->top_p;
    so.ignore_eos = g->o->ignore_eos;
    so.seeds = seeds;
    st = g->draft ? ds_speculate_batch(g->target, g->draft, pv, pn, R, &so, res)
                  : ds_generate_batch(g->target, pv, pn, R, &so, res);
    for (int k = 0; st == DS_OK && k < R; k++) {
      st = apply_answer(g, &cs[who[k]], r, &res[k]);
      g->turns++;
      g->tokens += res[k].n;
      g->eos += res[k].stopped;
      g->length += !res[k].stopped;
    }
    for (int k = 0; k < R; k++) ds_spec_result_free(&res[k]);
  }
  for (int k = 0; prompts && k < nc; k++) ds_ids_free(&prompts[k]);
  free(pv);
  free(pn);
  free(seeds);
  free(prompts);
  free(res);
  free(who);
  return st;
}

/* The test hook DSPARK_REGENERATE_KILL_AFTER=N: after N lines written by this process, half
 * of the next one is written and the process SIGKILLs itself (a kill mid-write, on cue). */
static int64_t kill_after(void) {
  const char *e = getenv("DSPARK_REGENERATE_KILL_AFTER");
  return e && *e ? strtoll(e, NULL, 10) : -1;
}

static ds_status write_line(regen *g, FILE *f, const conv *c, int64_t kill_at) {
  cJSON *r = cJSON_CreateObject();
  if (!r) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  char source[1100];
  cJSON_AddNumberToObject(r, "index", (double)c->index);
  cJSON_AddStringToObject(r, "source", regen_source(g->in, c->index, source, sizeof source));
  cJSON_AddStringToObject(r, "settings", g->settings);
  cJSON_AddItemReferenceToObject(r, "tokens", c->tokens);
  cJSON_AddItemReferenceToObject(r, "finish", c->finish);
  cJSON_DeleteItemFromObjectCaseSensitive(c->obj, "regenerated");
  cJSON_AddItemToObject(c->obj, "regenerated", r);
  char *s = cJSON_PrintUnformatted(c->obj);
  if (!s) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  size_t n = strlen(s);
  if (g->written == kill_at) {
    fwrite(s, 1, n / 2, f);
    fflush(f);
    raise(SIGKILL);
  }
  int ok = fwrite(s, 1, n, f) == n && fputc('\n', f) != EOF;
  free(s);
  if (!ok) return DS_FAIL(DS_ERR_IO, "%s: write failed (disk full?)", g->o->out);
  g->written++;
  return DS_OK;
}

/* Decodes conversations [g0, g1) and appends those from `from` on. */
static ds_status run_group(regen *g, FILE *f, int64_t g0, int64_t g1, int64_t from, int64_t kill_at) {
  int nc = (int)(g1 - g0);
  conv *cs = calloc((size_t)nc, sizeof *cs);
  if (!cs) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  ds_status st = DS_OK;
  int max_turns = 0;
  for (int i = 0; st == DS_OK && i < nc; i++) {
    conv *c = &cs[i];
    c->index = g0 + i;
    if ((st = regen_conversation(g->in, c->index, &c->obj)) != DS_OK) break;
    c->tokens = cJSON_CreateArray();
    c->finish = cJSON_CreateArray();
    if (!c->tokens || !c->finish) st = DS_FAIL(DS_ERR_NOMEM, "out of memory");
    c->turns = regen_turns(c->obj, g->o->completion);
    if (c->turns == 0) {
      char label[1100];
      ds_note("regenerate: %s: no messages: conversation skipped", line_label(g, c, label, sizeof label));
      c->skipped = 1;
    }
    if (c->turns > max_turns) max_turns = c->turns;
  }
  for (int r = 0, any = 1; st == DS_OK && r < max_turns && any; r++) st = decode_round(g, cs, nc, r, &any);
  for (int i = 0; st == DS_OK && i < nc; i++) {
    if (cs[i].index < from) continue; /* written by the run that was killed */
    if (cs[i].skipped) *(cs[i].skipped == 2 ? &g->bad : &g->skipped) += 1;
    else st = write_line(g, f, &cs[i], kill_at);
  }
  if (st == DS_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
    st = DS_FAIL(DS_ERR_IO, "%s: flushing to disk failed (disk full?)", g->o->out);
  for (int i = 0; i < nc; i++) {
    cJSON_Delete(cs[i].obj);
    cJSON_Delete(cs[i].tokens);
    cJSON_Delete(cs[i].finish);
  }
  free(cs);
  return st;
}

/* What changes the output's bytes, hashed: a resumed run must have the same. */
static void settings_hash(regen *g) {
  const regen_options *o = g->o;
  uint64_t h = 0x7265676eull, bits;
  int sampled = o->temperature > 0;
  memcpy(&bits, &o->temperature, sizeof bits);
  h = ds_seed_mix(h, bits);
  memcpy(&bits, &o->top_p, sizeof bits);
  h = ds_seed_mix(h, sampled ? bits : 0);
  h = ds_seed_mix(h, sampled ? (uint64_t)o->seed : 0);
  h = ds_seed_mix(h, sampled && o->draft_dir); /* speculative sampling: the same law, other bytes */
  h = ds_seed_mix(h, (uint64_t)o->max_new);
  h = ds_seed_mix(h, (uint64_t)(o->thinking * 4 + o->completion * 2 + o->ignore_eos));
  h = ds_seed_mix(h, o->completion ? 0 : ds_chat_template_hash(g->cc.tmpl));
  snprintf(g->settings, sizeof g->settings, "%016llx", (unsigned long long)h);
}

/* Whether the template renders an assistant's reasoning (then a generated <think> block is
 * split off into reasoning_content, as such datasets store it). */
static int renders_reasoning(const ds_chat_template *t) {
  static const char probe[] = "DSPARK-PROBE-REASONING";
  ds_chat_message m[2] = {{.role = "user", .content = "u"}, {.role = "assistant", .content = "a", .reasoning = probe}};
  ds_chat_options opt = {0, -1};
  char *text = NULL;
  size_t len = 0;
  if (!t || ds_chat_template_render(t, m, 2, &opt, &text, &len, NULL) != DS_OK) {
    ds_error_clear();
    return 0;
  }
  int yes = strstr(text, probe) != NULL;
  free(text);
  return yes;
}

static ds_status summary(const regen *g, int64_t resumed_lines, int64_t next, double seconds) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  cJSON_AddStringToObject(j, "data", g->o->data);
  cJSON_AddStringToObject(j, "out", g->o->out);
  cJSON_AddNumberToObject(j, "files", (double)g->in->files_read);
  cJSON_AddNumberToObject(j, "conversations", (double)g->in->n);
  cJSON_AddNumberToObject(j, "resumed_after", (double)next); /* conversations of the input done before */
  cJSON_AddNumberToObject(j, "lines_kept", (double)resumed_lines);
  cJSON_AddNumberToObject(j, "lines_written", (double)g->written);
  cJSON_AddNumberToObject(j, "skipped", (double)g->skipped);
  cJSON_AddNumberToObject(j, "bad_lines_skipped", (double)(g->in->bad + g->bad));
  cJSON_AddNumberToObject(j, "turns_regenerated", (double)g->turns);
  cJSON_AddNumberToObject(j, "tokens_generated", (double)g->tokens);
  cJSON *fin = cJSON_AddObjectToObject(j, "finish");
  cJSON_AddNumberToObject(fin, "eos", (double)g->eos);
  cJSON_AddNumberToObject(fin, "length", (double)g->length);
  cJSON_AddNumberToObject(j, "seconds", seconds);
  cJSON_AddNumberToObject(j, "tokens_per_s", seconds > 0 ? (double)g->tokens / seconds : 0);
  cJSON_AddStringToObject(j, "decoder", g->draft ? "speculative" : "plain");
  cJSON_AddStringToObject(j, "settings", g->settings);
  if (g->o->summary) return cli_write_json("--summary", g->o->summary, j);
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  if (!s) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  printf("%s\n", s);
  free(s);
  return DS_OK;
}

static int parse_options(int argc, char **argv, regen_options *o) {
  memset(o, 0, sizeof *o);
  o->max_new = 256;
  o->top_p = 1.0;
  o->batch = 16;
  int unused_thinking = -1, taken;
  int64_t n = 0;
  double x = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    else if (!strcmp(a, "--target")) { CLI_VALUE(); o->target_dir = v; }
    else if (!strcmp(a, "--draft")) { CLI_VALUE(); o->draft_dir = v; }
    else if (!strcmp(a, "--data")) { CLI_VALUE(); o->data = v; }
    else if (!strcmp(a, "--out")) { CLI_VALUE(); o->out = v; }
    else if (!strcmp(a, "--summary")) { CLI_VALUE(); o->summary = v; }
    else if (!strcmp(a, "--completion")) o->completion = 1;
    else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
    else if (!strcmp(a, "--skip-bad-lines")) o->skip_bad = 1;
    else if (!strcmp(a, "--max-line-bytes")) { if (cli_max_line_option(argc, argv, &i, &o->max_line_bytes) < 0) return 2; }
    else if (!strcmp(a, "--max-new-tokens")) CLI_INT(1, 1 << 24, o->max_new);
    else if (!strcmp(a, "--seed")) CLI_INT(0, INT64_MAX, o->seed);
    else if (!strcmp(a, "--batch")) CLI_INT(1, 4096, o->batch);
    else if (!strcmp(a, "--threads")) CLI_INT(1, 1024, o->threads);
    else if (!strcmp(a, "--temperature")) CLI_NUM(0, 100, o->temperature);
    else if (!strcmp(a, "--top-p")) CLI_NUM(1e-6, 1, o->top_p);
    else if (!strcmp(a, "--thinking")) {
      CLI_VALUE();
      if (!strcmp(v, "on")) o->thinking = THINK_ON;
      else if (!strcmp(v, "off")) o->thinking = THINK_OFF;
      else if (!strcmp(v, "keep")) o->thinking = THINK_KEEP;
      else {
        fprintf(stderr, "dspark regenerate: --thinking takes on, off or keep, not '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--enable-thinking")) {
      fprintf(stderr, "dspark regenerate: use --thinking on|off|keep\n");
      return 2;
    } else if ((taken = cli_chat_option("regenerate", argc, argv, &i, &o->chat_template, &unused_thinking)) != 0) {
      if (taken < 0) return 2;
    } else {
      fprintf(stderr, "dspark regenerate: %s '%s' (see --help)\n", a[0] == '-' ? "unknown option" : "unexpected argument", a);
      return 2;
    }
  }
  if (!o->target_dir || !o->data || !o->out) {
    fprintf(stderr, "dspark regenerate: --target, --data and --out are required (see --help)\n");
    return 2;
  }
  /* --out is read back on a resume by design: it is an output here, and an input of --summary */
  const ds_input_path inputs[] = {{"--target", o->target_dir}, {"--draft", o->draft_dir}, {"--data", o->data},
                                  {"--chat-template", o->chat_template}, {"--out", o->out}};
  int refused = cli_output_refused("regenerate", "--out", o->out, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs) - 1);
  if (!refused && o->summary)
    refused = cli_output_refused("regenerate", "--summary", o->summary, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  if (o->completion && (o->thinking != THINK_DEFAULT || o->chat_template)) {
    fprintf(stderr, "dspark regenerate: --completion uses no chat template: --thinking / --chat-template do not apply\n");
    return 2;
  }
  return -1;
}

int cmd_regenerate(int argc, char **argv) {
  regen_options o;
  int prc = parse_options(argc, argv, &o);
  if (prc >= 0) return prc;
  ds_set_num_threads((int)o.threads);
  regen g = {.o = &o, .cc = {NULL, -1}};
  regen_input in = {0};
  g.in = &in;
  int rc = 1, fd = -1;
  FILE *f = NULL;
  int64_t next = 0, kept_lines = 0;
  ds_model_source *src = NULL;
  ds_model_config pre;
  if (ds_model_source_open(o.target_dir, &src) != DS_OK || ds_model_source_tokenizer(src, &g.tok) != DS_OK) goto report;
  if (!o.completion && cli_load_chat_template(src, o.chat_template, &g.cc) != DS_OK) goto report;
  /* the tokenizer against config.json, before the weights are loaded */
  const char *cfg_label = ds_model_source_label(src, DS_MODEL_CONFIG);
  if (ds_model_source_config(src, &pre) != DS_OK ||
      ds_target_check_tokenizer(&pre, g.tok, cfg_label, ds_model_source_label(src, DS_MODEL_TOKENIZER)) != DS_OK)
    goto report;
  g.max_pos = pre.max_position_embeddings;
  if (o.max_new >= g.max_pos) { /* every prompt needs a position: each conversation would be skipped */
    fprintf(stderr, "dspark regenerate: %s: max_position_embeddings is %lld, so --max-new-tokens %lld leaves no "
            "position for a prompt; give at most %lld (and fewer than that minus the longest prompt)\n",
            cfg_label, (long long)g.max_pos, (long long)o.max_new, (long long)g.max_pos - 1);
    rc = 2;
    goto done;
  }
  if (regen_input_read(o.data, o.completion, o.skip_bad, o.max_line_bytes, &in) != DS_OK) goto report;
  settings_hash(&g);
  g.split_reasoning = renders_reasoning(g.cc.tmpl);
  /* one writer per output: the lock is taken before the file is checked or cut */
  fd = open(o.out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    DS_FAIL(DS_ERR_IO, "--out %s: cannot open for appending: %s", o.out, strerror(errno));
    goto report;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    DS_FAIL(DS_ERR_IO, "%s is being written by another dspark regenerate", o.out);
    goto report;
  }
  if (regen_resume_scan(o.out, &in, g.settings, &next, &kept_lines) != DS_OK) goto report;
  if (!(f = fdopen(fd, "ab"))) {
    DS_FAIL(DS_ERR_IO, "%s: %s", o.out, strerror(errno));
    goto report;
  }
  fd = -1;
  if (kept_lines > 0) {
    char source[1100];
    ds_note("regenerate: %s holds %lld lines of this run: resuming after conversation %lld (%s)", o.out,
            (long long)kept_lines, (long long)next - 1, regen_source(&in, next - 1, source, sizeof source));
  }
  if (next < in.n) {
    if (ds_target_load_source(src, ds_backend_cpu(), NULL, &g.target) != DS_OK) goto report;
    if (o.draft_dir && ds_draft_open(o.draft_dir, ds_backend_cpu(), &g.draft) != DS_OK) goto report;
  }
  double t0 = ds_time_sec();
  int64_t kill_at = kill_after(), done_here = 0;
  double shown = -1e9; /* progress at most every 5 s off a terminal, and at the end */
  for (int64_t g0 = next / o.batch * o.batch; next < in.n && g0 < in.n; g0 += o.batch) {
    int64_t g1 = g0 + o.batch < in.n ? g0 + o.batch : in.n;
    if (run_group(&g, f, g0, g1, next, kill_at) != DS_OK) goto report;
    done_here += g1 - (g0 > next ? g0 : next);
    double el = ds_time_sec() - t0;
    if (g1 < in.n && el - shown < (isatty(fileno(stderr)) ? 0.2 : 5.0)) continue;
    shown = el;
    char extra[96];
    snprintf(extra, sizeof extra, "conversations (%lld turns, %lld tokens)", (long long)g.turns, (long long)g.tokens);
    ds_progress_line(stderr, "regenerate", g1, in.n, done_here, el, el > 0 ? (double)g.tokens / el : 0, "tokens/s",
                     extra);
  }
  if (fclose(f) != 0) {
    f = NULL;
    DS_FAIL(DS_ERR_IO, "%s: closing failed", o.out);
    goto report;
  }
  f = NULL;
  if (summary(&g, kept_lines, next, ds_time_sec() - t0) != DS_OK) goto report;
  int64_t passed = g.skipped + g.bad + in.bad; /* each was named in a note above */
  if (passed > 0 && g.written + kept_lines == 0) {
    DS_FAIL(DS_ERR_ARG, "nothing was regenerated: all %lld conversations of %s were skipped (%lld too long for "
            "max_position_embeddings %lld with --max-new-tokens %lld, or empty; %lld bad); %s holds no line",
            (long long)(in.n + in.bad), o.data, (long long)g.skipped, (long long)g.max_pos, (long long)o.max_new,
            (long long)(g.bad + in.bad), o.out);
    goto report;
  }
  if (passed > 0)
    ds_note("regenerate: %lld of %lld conversations skipped (%lld too long or empty, %lld bad): see the notes above",
            (long long)passed, (long long)(in.n + in.bad), (long long)g.skipped, (long long)(g.bad + in.bad));
  rc = 0;
  goto done;
report:
  rc = cli_report_error("regenerate");
done:
  if (f) fclose(f);
  if (fd >= 0) close(fd);
  ds_model_source_close(src);
  regen_input_free(&in);
  ds_tokenizer_free(g.tok);
  ds_chat_template_free(g.cc.tmpl);
  ds_draft_free(g.draft);
  ds_target_free(g.target);
  return rc;
}

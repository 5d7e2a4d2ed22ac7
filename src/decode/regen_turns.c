/* A turn's prompt and its answer (decode/regen_internal.h): the conversation rendered by the chat
 * template up to the turn, and the generated text written back as the turn's content (with a
 * generated <think> block as its reasoning_content when the template renders reasoning). */
#include <stdlib.h>
#include <string.h>

#include "decode/regen_internal.h"
#include "dspark/progress.h"
#include "dspark/prompts.h"
#include "dspark/rng.h"
#include "text/chat_json.h"
#include "text/chat_reasoning.h"

static const char k_sentinel[] = "DSPARK-REGENERATE-CONTENT-3f9c1a";

const char *regen_conv_label(const ds_regen *g, const regen_conv *c, char *buf, size_t n) {
  return regen_source(&g->in, c->index, buf, n);
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
static ds_status render_turn(ds_regen *g, regen_conv *c, int r, ds_ids *ids) {
  char label[1100];
  regen_conv_label(g, c, label, sizeof label);
  c->kept = 0;
  if (g->o.completion) {
    const char *text = cJSON_GetObjectItemCaseSensitive(c->obj, "text")->valuestring;
    return ds_tokenizer_encode(g->tok, text, strlen(text), 1, ids);
  }
  ds_chat_message *m = NULL;
  size_t n = 0;
  DS_TRY(tk_chat_messages(cJSON_GetObjectItemCaseSensitive(c->obj, "messages"), label, &m, &n));
  size_t a = (size_t)turn_message(cJSON_GetObjectItemCaseSensitive(c->obj, "messages"), r);
  int source_reasoning = a < n && m[a].reasoning != NULL;
  int thinking = g->o.thinking == DS_THINK_ON ? 1 : g->o.thinking == DS_THINK_DEFAULT ? -1 : 0;
  ds_status st = DS_OK;
  if (g->o.thinking == DS_THINK_KEEP && source_reasoning) c->kept = 1;
  if (c->kept && g->tmpl) {
    m[a].content = k_sentinel;
    m[a].content_len = 0;
    ds_chat_options whole = {0, -1};
    char *text = NULL;
    size_t len = 0;
    st = ds_chat_template_render(g->tmpl, m, a + 1, &whole, &text, &len, NULL);
    char *at = st == DS_OK ? strstr(text, k_sentinel) : NULL;
    if (st == DS_OK && (!at || strstr(at + 1, k_sentinel)))
      st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: --thinking keep: the template %s does not render an assistant content "
                   "verbatim once, so where the answer starts after the kept reasoning is unknown", label,
                   ds_chat_template_label(g->tmpl));
    if (st == DS_OK) st = ds_tokenizer_encode(g->tok, text, (size_t)(at - text), 0, ids);
    free(text);
  } else {
    st = ds_prompt_render(g->tok, g->tmpl, m, a, thinking, ids); /* as generate / speculate render a chat prompt */
  }
  free(m);
  if (st != DS_OK) ds_error_wrap(st, "%s: turn %d", label, r + 1);
  return st;
}

ds_status regen_turn_prompt(ds_regen *g, regen_conv *c, int *decode) {
  int r = c->turn;
  char label[1100];
  *decode = 0;
  ds_ids_free(&c->prompt);
  ds_status st = render_turn(g, c, r, &c->prompt);
  if (st != DS_OK) {
    ds_ids_free(&c->prompt);
    /* a conversation the template refuses (its raise_exception, an unsupported construct) */
    if (!g->o.skip_bad || (st != DS_ERR_ARG && st != DS_ERR_FORMAT && st != DS_ERR_UNSUPPORTED)) return st;
    ds_note("regenerate: %s; conversation skipped (--skip-bad-lines)", ds_last_error());
    ds_error_clear();
    c->skipped = 2;
    return DS_OK;
  }
  if (c->prompt.len == 0 || (int64_t)c->prompt.len + g->o.max_new > g->max_pos) {
    ds_note("regenerate: %s: turn %d's prompt (%zu tokens) plus --max-new-tokens %lld %s: conversation skipped",
            regen_conv_label(g, c, label, sizeof label), r + 1, c->prompt.len, (long long)g->o.max_new,
            c->prompt.len ? "exceeds max_position_embeddings" : "(an empty prompt)");
    c->skipped = 1;
    ds_ids_free(&c->prompt);
    return DS_OK;
  }
  *decode = 1;
  return DS_OK;
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
ds_status regen_apply_answer(ds_regen *g, regen_conv *c, const ds_spec_result *res) {
  int r = c->turn;
  char *text = NULL;
  size_t len = 0;
  int64_t n = res->n - (res->stopped ? 1 : 0); /* the stop token ends the turn; the template writes its own */
  DS_TRY(ds_tokenizer_decode(g->tok, res->ids, (size_t)n, 1, &text, &len));
  ds_status st = DS_OK;
  if (g->o.completion) {
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
    g->sum.turns++;
    g->sum.tokens += res->n;
    g->sum.eos += res->stopped;
    g->sum.length += !res->stopped;
  }
  return st;
}

/* What changes the output's bytes, hashed: a resumed run must have the same. */
static void settings_hash(ds_regen *g) {
  const ds_regen_options *o = &g->o;
  uint64_t h = 0x7265676eull, bits;
  int sampled = o->temperature > 0;
  memcpy(&bits, &o->temperature, sizeof bits);
  h = ds_seed_mix(h, bits);
  memcpy(&bits, &o->top_p, sizeof bits);
  h = ds_seed_mix(h, sampled ? bits : 0);
  h = ds_seed_mix(h, sampled ? (uint64_t)o->seed : 0);
  h = ds_seed_mix(h, sampled && o->speculative); /* speculative sampling: the same law, other bytes */
  h = ds_seed_mix(h, (uint64_t)o->max_new);
  h = ds_seed_mix(h, (uint64_t)(o->thinking * 4 + o->completion * 2 + o->ignore_eos));
  h = ds_seed_mix(h, o->completion ? 0 : ds_chat_template_hash(g->tmpl));
  snprintf(g->sum.settings, sizeof g->sum.settings, "%016llx", (unsigned long long)h);
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

void regen_settings(ds_regen *g) {
  settings_hash(g);
  g->split_reasoning = g->o.completion ? 0 : renders_reasoning(g->tmpl);
}

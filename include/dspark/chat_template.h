/* Chat templates: a model's own Jinja chat template (chat_template.jinja or the
 * chat_template of tokenizer_config.json) rendered as transformers' apply_chat_template
 * renders it, tokenized, with a loss mask over the assistant turns.
 *
 * The renderer is a small interpreter of the Jinja subset chat templates use (src/text/
 * jinja_*.c): {{ }}, {% if/elif/else %}, {% for %} (loop.*, `if` filters, else, break,
 * continue), {% set %} (namespace() attributes and block sets too), {% macro %},
 * {% generation %}, comments, whitespace
 * control with transformers' trim_blocks / lstrip_blocks; literals, attribute / item / slice
 * access, calls, filters, tests, `in`, `~`, arithmetic, comparisons, and/or/not, `x if c else
 * y`. Filters: trim length count tojson string safe lower upper title capitalize replace
 * default first last list reverse join items select reject selectattr rejectattr
 * map(attribute=) int abs. Tests: defined undefined none string number integer float boolean
 * true false mapping iterable sequence callable lower upper even odd divisibleby eq/equalto
 * ne sameas in. Functions: raise_exception namespace strftime_now range dict; string methods
 * startswith endswith split strip lstrip rstrip replace upper lower title capitalize find
 * count; dict methods items keys values get. Anything else ({% include %}, {% call %},
 * unknown filters...) is refused with DS_ERR_UNSUPPORTED and "FILE:LINE: unsupported ...".
 *
 * The loss mask (1 = trained) covers, for each assistant message, the text its template loop
 * iteration emitted after the assistant header: content, thinking block when rendered, and
 * end-of-turn token. The header is the template's own generation prompt (what
 * add_generation_prompt appends, rendered with and without enable_thinking); a template with
 * {% generation %} blocks gets exactly those blocks instead, as transformers'
 * return_assistant_tokens_mask. A token is trained when any of its bytes is. */
#ifndef DSPARK_CHAT_TEMPLATE_H
#define DSPARK_CHAT_TEMPLATE_H

#include "dspark/common.h"
#include "dspark/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_chat_template ds_chat_template;

typedef struct {
  int add_generation_prompt;
  int enable_thinking; /* -1: not passed to the template (its default), 0: false, 1: true */
} ds_chat_options;

/* Parses template text; label names it in errors ("FILE:LINE: ..."). */
ds_status ds_chat_template_parse(const char *text, size_t len, const char *label, ds_chat_template **out);
void ds_chat_template_free(ds_chat_template *t);
/* Adds a special-token variable (bos_token, eos_token, ...) the template can read. */
ds_status ds_chat_template_set_var(ds_chat_template *t, const char *name, const char *value);
const char *ds_chat_template_label(const ds_chat_template *t);
/* xxh64 of the template text (recorded in caches and run configurations). */
uint64_t ds_chat_template_hash(const ds_chat_template *t);

/* The template of the tokenizer at tokenizer_path (a tokenizer.json or a model directory):
 * override_path when given (a Jinja file), else chat_template.jinja beside it, else the
 * chat_template of tokenizer_config.json beside it (a string, or a list of {name, template}
 * from which "default" is taken). The *_token entries of tokenizer_config.json (strings or
 * {"content": ...}) become template variables. *out is NULL when there is no template. A
 * template that does not parse (an unsupported construct) still loads: its error is returned
 * by the first render, so plain-text work with the model is not refused for it. */
ds_status ds_chat_template_load(const char *tokenizer_path, const char *override_path, ds_chat_template **out);

/* The texts the template comes from, each NULL when absent (a model directory's files, or what a
 * GGUF file holds: include/dspark/model_source.h); the labels name them in errors. */
typedef struct {
  const char *config;      /* tokenizer_config.json */
  size_t config_len;
  const char *config_label;
  const char *jinja;       /* chat_template.jinja */
  size_t jinja_len;
  const char *jinja_label;
} ds_chat_template_source;
/* ds_chat_template_load from those texts: override_path (a Jinja file) when given, else the
 * Jinja text, else tokenizer_config.json's chat_template; the same rules and errors. */
ds_status ds_chat_template_load_texts(const ds_chat_template_source *src, const char *override_path,
                                      ds_chat_template **out);

/* Renders msgs; *text (NUL-terminated) and *train (1 per trained byte, may be NULL) are
 * malloc'd; *len excludes the NUL. */
ds_status ds_chat_template_render(const ds_chat_template *t, const ds_chat_message *msgs, size_t n,
                                  const ds_chat_options *opt, char **text, size_t *len, uint8_t **train);

/* Appends the ids of the rendered conversation (as HF's tokenizer(text,
 * add_special_tokens=False)) and the loss mask, one entry per id. t NULL: ChatML
 * (ds_chat_encode_chatml; reasoning is not rendered and enable_thinking is ignored). */
ds_status ds_chat_encode(const ds_tokenizer *tok, const ds_chat_template *t, const ds_chat_message *msgs, size_t n,
                         const ds_chat_options *opt, ds_ids *ids, ds_ids *loss_mask);

#ifdef __cplusplus
}
#endif
#endif

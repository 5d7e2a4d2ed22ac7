/* The Jinja-subset interpreter behind chat templates: expressions, statements and
 * whitespace control against outputs of Jinja2 itself (in transformers' environment:
 * trim_blocks, lstrip_blocks, loopcontrols), error messages that name the construct and the
 * line, the assistant loss mask, and malformed / mutated templates that must fail cleanly
 * (run under ASan/UBSan in the sanitizer build). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/chat_template.h"
#include "dspark/fileio.h"
#include "dspark/rng.h"
#include "test_util.h"

/* Renders tmpl over msgs; the text (malloc'd) or NULL with the error in ds_last_error(). */
static char *render(const char *tmpl, const ds_chat_message *msgs, size_t n, int gen, uint8_t **train, size_t *len) {
  ds_chat_template *t = NULL;
  if (ds_chat_template_parse(tmpl, strlen(tmpl), "t.jinja", &t) != DS_OK) return NULL;
  ds_chat_options opt = {gen, -1};
  char *text = NULL;
  size_t l = 0;
  if (ds_chat_template_set_var(t, "eos_token", "</s>") != DS_OK ||
      ds_chat_template_render(t, msgs, n, &opt, &text, &l, train) != DS_OK)
    text = NULL;
  ds_chat_template_free(t);
  if (len) *len = l;
  return text;
}

static void expect_render(const char *tmpl, const char *want, int line) {
  char *got = render(tmpl, NULL, 0, 0, NULL, NULL);
  if (!got || strcmp(got, want)) {
    fprintf(stderr, "test_jinja.c:%d: template %s\n  rendered %s\n  expected %s\n  (%s)\n", line, tmpl,
            got ? got : "(error)", want, got ? "" : ds_last_error());
    g_test_failures++;
  }
  free(got);
}

/* Expected outputs are Jinja2 3.1's, in transformers' environment. */
static void test_against_jinja2(void) {
  static const char *const cases[][2] = {
      {"a\n  {% if true %}\n  b\n  {% endif %}\nc",
       "a\n  b\nc"},
      {"x {{- ' y ' -}} z\n{# c #}\nw {%- if 1 %} v{% endif +%}\n  t",
       "x y z\nw v\n  t"},
      {"{% for x in ['p','q','r'] %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex0 }}|{% endfor %}",
       "01TrueFalse32|12FalseFalse31|23FalseTrue30|"},
      {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}",
       "21"},
      {"{% set ns = namespace(x=1) %}{% for i in [1,2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}",
       "4"},
      {"{{ 'a</think>b'.split('</think>')[-1] }}|{{ '\\n\\nx\\n'.strip('\\n') }}|{{ ' x '|trim }}|{{ 'abc'[1:] }}|{{ 'abc'[::-1] }}|{{ 'h\xc3""\xa9""llo'[1] }}|{{ 'a,b'.replace(',', ';') }}|{{ 'ab'.startswith('a') }}|{{ ' a  b '.split() }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'xxhixx'.rstrip('x') }}|{{ 'h\xc3""\xa9""llo'|length }}",
       "b|x|x|bc|cba|\xc3""\xa9""|a;b|True|['a', 'b']|hixx|xxhi|5"},
      {"{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ 3 is odd }}{{ y is not defined }}{{ 4 is divisibleby 2 }}{{ [1] is iterable }}{{ {} is mapping }}{{ false is false }}",
       "FalseTrueTrueTrueTrueTrueTrueTrueTrue"},
      {"{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 % 3 }}|{{ 'a' ~ 1 }}|{{ 'b' in 'abc' }}|{{ 1 < 2 < 3 }}|{{ not 1 == 2 }}|{{ 'x' if false else 'y' }}|{{ [1,2] + [3] }}|{{ {'a': 1, 'b': 'c'} }}|{{ 1.5 }}|{{ [1,'a',none,true, 2.0] | tojson }}|{{ 7 / 2 }}|{{ 2 ** 10 }}|{{ none }}|{{ 'it\\'s' }}|{{ ['it\\'s'] }}",
       "7|3|2|a1|True|True|True|y|[1, 2, 3]|{'a': 1, 'b': 'c'}|1.5|[1, \"a\", null, true, 2.0]|3.5|1024|None|it's|[\"it's\"]"},
      {"{{ [1,2,3]|length }}|{{ ['a','b']|join(', ') }}|{{ [{'r':'u'},{'r':'a'},{'r':'u'}]|selectattr('r','equalto','u')|list|length }}|{{ [{'r':'u'},{'r':'a'}]|map(attribute='r')|join }}|{{ [4,5]|first }}{{ [4,5]|last }}|{{ z|default('d') }}|{{ {'k':{'n':[1,2]}}|tojson }}|{{ {'k':[1]}|tojson(indent=2) }}|{{ 'Ab c'|upper }}{{ 'Ab c'|lower }}{{ 'ab cd'|title }}{{ 'aB'|capitalize }}",
       "3|a, b|2|ua|45|d|{\"k\": {\"n\": [1, 2]}}|{\n  \"k\": [\n    1\n  ]\n}|AB Cab cAb CdAb"},
      {"{% for x in [1,2,3,4,5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}|{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}|{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}",
       "13|empty|2242|a=1;b=2;"},
      {"{% if false %}a{% elif 0 %}b{% elif 'x' %}c{% else %}d{% endif %}{{ [1,2,3][-1] }}{{ [1,2,3][5] }}{{ (1, 2)[0] }}{{ 'abc'[-2:] }}{{ [1,2,3,4][1:3] }}{{ {'a':1}.get('b', 'n') }}{{ {'a':1}['a'] }}",
       "c31bc[2, 3]n1"},
      {"{{ [1, {'a': '\xc3""\xa9""\\n\"'}]|tojson(indent=0) }}|{{ 'tab\\there'|tojson }}|{{ 0.1 }}|{{ 1/3 }}|{{ 2.5e-3 }}|{{ -0.0 }}",
       "[\n1,\n{\n\"a\": \"\xc3""\xa9""\\n\\\"\"\n}\n]|\"tab\\there\"|0.1|0.3333333333333333|0.0025|-0.0"},
      {"  {%+ if true %}x{% endif +%}\n{% if true %}\ny{% endif %}\n",
       "  x\ny"},
      {"{{ 'abcdef'[-1:-4:-1] }}|{{ 'abcdef'[::2] }}|{{ [0,1,2,3,4][-2:] }}|{{ 'x'.join(['a','b']) if false else '-' }}|{{ 'h\xc3""\xa9""llo w\xc3""\xb6""rld'.split('\xc3""\xb6""') }}|{{ 'a b'.upper() }}|{{ '  x  '.rstrip() }}|{{ 'aXbX'.split('X', 1) }}",
       "fed|ace|[3, 4]|-|['h\xc3""\xa9""llo w', 'rld']|A B|  x|['a', 'bX']"},
      {"{% set ns = namespace(found=false, n=0) %}{% for m in [{'role':'user'},{'role':'assistant'}] %}{% if m.role == 'assistant' %}{% set ns.found = true %}{% set ns.n = loop.index0 %}{% endif %}{% endfor %}{{ ns.found }}{{ ns.n }}",
       "True1"},
      {"{% for a in [1,2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %}",
       "1x2y1;1x2y2;"},
      {"{{ none is none and not (1 in [2]) }}{{ 'a' not in 'b' }}{{ [] or 'empty' }}{{ 'x' and 'y' }}{{ 0 or none }}",
       "TrueTrueemptyyNone"},
      {"{{ 'A'|lower ~ 'b'|upper }}{{ 3 - 5 }}{{ 2 * 3.5 }}{{ 10 % 4 }}{{ -(3) }}{{ (1 + 2) * 3 }}{{ 'ab' * 2 if false else 'no' }}",
       "aB-27.02-39no"},
      {"{#- comment -#}\n  x  \n{#- c2 #}\ny",
       "xy"},
      {"{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }}|{{ greet('b', '?') }}|{{ greet(punct='.', name='c') }}|{{ greet() }}",
       "Hello a!|Hello b?|Hello c.|Hello !"},
      {"{%- macro render(m) -%}\n  [{{ m.role }}] {{ m.content | trim }}\n{%- endmacro -%}\n{% for m in [{'role': 'u', 'content': ' x '}] %}{{ render(m) }}{% endfor %}",
       "[u] x"},
      {"{% set body %}\n  a{{ 1 + 1 }}\n{% endset %}[{{ body }}]{{ body|length }}",
       "[  a2\n]5"},
      {"{{ none|selectattr('a')|list }}{{ 'x' in undefined_thing }}{{ [] | map(attribute='a') | list }}",
       "[]False[]"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) expect_render(cases[i][0], cases[i][1], __LINE__);
  /* a final newline of the template is dropped, as keep_trailing_newline=False does */
  expect_render("a\n", "a", __LINE__);
  expect_render("a\n\n", "a\n", __LINE__);
  expect_render("", "", __LINE__);
}

static void expect_error(const char *tmpl, const char *want, int line) {
  char *got = render(tmpl, NULL, 0, 0, NULL, NULL);
  if (got || !strstr(ds_last_error(), want)) {
    fprintf(stderr, "test_jinja.c:%d: template %s\n  gave %s\n  expected an error with: %s\n", line, tmpl,
            got ? got : ds_last_error(), want);
    g_test_failures++;
  }
  free(got);
}

static void test_errors(void) {
  expect_error("a\n{% call m() %}{% endcall %}", "t.jinja:2: unsupported construct '{% call %}'", __LINE__);
  expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "macro 'm' takes 1 arguments, 2 given", __LINE__);
  expect_error("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", "macro 'm' has no parameter 'b'", __LINE__);
  expect_error("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "nested too deeply", __LINE__);
  /* macros that double their work at each level: the shared budget stops them */
  char chain[4096];
  size_t at = (size_t)snprintf(chain, sizeof chain, "{%% macro m0() %%}x{%% endmacro %%}");
  for (int i = 1; i < 40; i++)
    at += (size_t)snprintf(chain + at, sizeof chain - at, "{%% macro m%d() %%}{{ m%d() }}{{ m%d() }}{%% endmacro %%}", i,
                           i - 1, i - 1);
  snprintf(chain + at, sizeof chain - at, "{{ m39() }}");
  expect_error(chain, "more than", __LINE__); /* the call budget or the memory limit, whichever comes first */
  expect_error("{% include 'x' %}", "t.jinja:1: unsupported construct '{% include %}'", __LINE__);
  expect_error("\n\n{% set x %}a", "t.jinja:3: '{% set %}' is never closed (expected '{% endset %}')", __LINE__);
  expect_error("{% frobnicate %}", "t.jinja:1: unknown tag '{% frobnicate %}'", __LINE__);
  expect_error("x\n{{ 'a' | frob }}", "t.jinja:2: unsupported filter 'frob'", __LINE__);
  expect_error("{{ 1 is frob }}", "t.jinja:1: unsupported test 'frob'", __LINE__);
  expect_error("{{ nosuch(1) }}", "t.jinja:1: 'nosuch' is undefined (not a function", __LINE__);
  expect_error("{{ x.y }}", "t.jinja:1: 'x' is undefined", __LINE__);
  expect_error("{{ 'a' + 1 }}", "unsupported operand types for +: 'str' and 'int'", __LINE__);
  expect_error("\n{{ raise_exception('Only user and assistant roles') }}",
               "t.jinja:2: the template raised an exception: Only user and assistant roles", __LINE__);
  expect_error("{% if x %}", "t.jinja:1: '{% if %}' is never closed (expected '{% endif %}')", __LINE__);
  expect_error("{% for x in y %}", "'{% for %}' is never closed (expected '{% endfor %}')", __LINE__);
  expect_error("{% endif %}", "unexpected '{% endif %}'", __LINE__);
  expect_error("{{ 'abc }}", "unclosed '{{' tag", __LINE__);
  expect_error("{{ 1 + }}", "unexpected 'end of tag' in an expression", __LINE__);
  expect_error("{% break %}", "'break' outside a for loop", __LINE__);
  expect_error("{% set ns = 1 %}{% set ns.a = 2 %}", "cannot assign attribute on non-namespace object 'ns'", __LINE__);
  expect_error("{{ 1 // 0 }}", "integer division or modulo by zero", __LINE__);
  expect_error("{{ '%s' % 1 }}", "unsupported construct: '%' string formatting", __LINE__);
  expect_error("{% for x in y recursive %}{% endfor %}", "unsupported construct 'recursive' loop", __LINE__);
  expect_error("{{ f(*a) }}", "unsupported construct '*args'", __LINE__);
  /* nesting is bounded, never a stack overflow */
  char deep[2100];
  size_t k = 0;
  k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
  for (int i = 0; i < 1000; i++) deep[k++] = '(';
  deep[k++] = '1';
  for (int i = 0; i < 1000; i++) deep[k++] = ')';
  snprintf(deep + k, sizeof deep - k, " }}");
  expect_error(deep, "nested deeper than", __LINE__);
  expect_error("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", "loop iterations",
               __LINE__);
}

/* A ChatML-like template: the assistant's turn after its header is trained, ending token and
 * newline included; a {% generation %} template trains exactly its blocks. */
static void test_masks(void) {
  const char *chatml =
      "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  ds_chat_message msgs[] = {{.role = "user", .content = "hi"}, {.role = "assistant", .content = "yo"}};
  uint8_t *train = NULL;
  size_t len = 0;
  char *text = render(chatml, msgs, 2, 1, &train, &len);
  EXPECT(text && !strcmp(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>assistant\n"));
  if (text && train) {
    char trained[64] = {0};
    size_t t = 0;
    for (size_t i = 0; i < len && t < 63; i++)
      if (train[i]) trained[t++] = text[i];
    EXPECT(!strcmp(trained, "yo<|im_end|>\n"));
  }
  free(text);
  free(train);
  const char *gen = "{% for m in messages %}{% if m.role == 'assistant' %}[A]{% generation %}{{ m.content }}{{ eos_token }}"
                    "{% endgeneration %}{% else %}[U]{{ m.content }}{% endif %}{% endfor %}";
  text = render(gen, msgs, 2, 0, &train, &len);
  EXPECT(text && !strcmp(text, "[U]hi[A]yo</s>"));
  if (text && train) {
    for (size_t i = 0; i < len; i++) EXPECT(train[i] == (i >= 8)); /* "[U]hi[A]" is 8 bytes */
  }
  free(text);
  free(train);
  /* reasoning reaches the template as reasoning_content (and thinking) */
  ds_chat_message r[] = {{.role = "assistant", .content = "c", .reasoning = "r"}};
  text = render("{{ messages[0].reasoning_content }}{{ messages[0].thinking }}{{ messages[0].content }}", r, 1, 0, NULL, NULL);
  EXPECT(text && !strcmp(text, "rrc"));
  free(text);
}

/* Mutated real templates and random token soup: every outcome is a render or a clean error. */
static void test_malformed(void) {
  char *base = NULL;
  size_t base_len = 0;
  if (ds_read_file("tests/conformance/chat_templates/Qwen-Qwen3-0.6B.jinja", &base, &base_len) != DS_OK) {
    fprintf(stderr, "cannot read the Qwen3 template: %s\n", ds_last_error());
    g_test_failures++;
    return;
  }
  static const char *const pieces[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", "'", "\"", "(", ")", "[", "]",
                                       "{", "}", "if", "endif", "for", "endfor", "else", "elif", "set", "in", "not",
                                       "is", "and", "or", "|", ".", ",", ":", "=", "==", "~", "*", "**", "//", "%",
                                       "loop", "messages", "namespace(", "x", "1", "\\", "\n", " ", "\xff", "\xc3",
                                       "break", "generation", "endgeneration", "raise_exception(", "trim", "length"};
  const size_t n_pieces = sizeof pieces / sizeof *pieces;
  ds_chat_message msgs[] = {{.role = "system", .content = "s"}, {.role = "user", .content = "u"},
                            {.role = "assistant", .content = "<think>\nr\n</think>\n\na", .reasoning = NULL}};
  ds_rng rng;
  ds_rng_seed(&rng, 7);
  char *buf = malloc(base_len + 4096);
  int rendered = 0;
  for (int it = 0; it < 3000 && buf; it++) {
    size_t len;
    if (it % 2 == 0) { /* the real template with a few random edits */
      memcpy(buf, base, base_len);
      len = base_len;
      int edits = 1 + (int)((size_t)ds_rng_next_u64(&rng) % 4);
      for (int e = 0; e < edits && len > 10; e++) {
        size_t at = (size_t)ds_rng_next_u64(&rng) % len, cut = (size_t)ds_rng_next_u64(&rng) % 8;
        if (at + cut > len) cut = len - at;
        const char *p = pieces[(size_t)ds_rng_next_u64(&rng) % n_pieces];
        size_t pl = strlen(p);
        memmove(buf + at + pl, buf + at + cut, len - at - cut);
        memcpy(buf + at, p, pl);
        len = len - cut + pl;
      }
    } else { /* token soup */
      len = 0;
      int count = 1 + (int)((size_t)ds_rng_next_u64(&rng) % 60);
      for (int k = 0; k < count; k++) {
        const char *p = pieces[(size_t)ds_rng_next_u64(&rng) % n_pieces];
        memcpy(buf + len, p, strlen(p));
        len += strlen(p);
      }
    }
    ds_chat_template *t = NULL;
    if (ds_chat_template_parse(buf, len, "fuzz", &t) != DS_OK) {
      EXPECT(strstr(ds_last_error(), "fuzz:") != NULL);
      continue;
    }
    char *text = NULL;
    uint8_t *train = NULL;
    size_t tl;
    ds_chat_options opt = {it % 3 == 0, it % 5 == 0 ? 0 : -1};
    if (ds_chat_template_render(t, msgs, 3, &opt, &text, &tl, &train) == DS_OK) {
      rendered++;
      EXPECT(text != NULL && strlen(text) <= tl);
    } else {
      EXPECT(strstr(ds_last_error(), "fuzz:") != NULL);
    }
    free(text);
    free(train);
    ds_chat_template_free(t);
  }
  EXPECT(rendered > 0);
  free(buf);
  free(base);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) {
    g_test_failures++;
    return;
  }
  fputs(text, f);
  fclose(f);
}

/* Where the template comes from: chat_template.jinja over tokenizer_config.json, the named
 * "default" of a list, special tokens in both spellings, the override, and a template that
 * does not parse failing at its first render only. */
static void test_load(void) {
  const char *tmp = getenv("DSPARK_TEST_TMP");
  char dir[512];
  snprintf(dir, sizeof dir, "%.400s/jinja_load", tmp && *tmp ? tmp : "/tmp");
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
  if (system(cmd) != 0) {
    g_test_failures++;
    return;
  }
  ds_chat_message m[] = {{.role = "user", .content = "u"}};
  ds_chat_options opt = {0, -1};
  char *text = NULL;
  size_t len;
  ds_chat_template *t = NULL;
  char tok[1000];
  snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
  EXPECT_OK(ds_chat_template_load(tok, NULL, &t)); /* nothing there: ChatML */
  EXPECT(t == NULL);
  write_text(dir, "tokenizer_config.json",
             "{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\", \"add_bos_token\": true,"
             " \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
             " {\"name\": \"default\", \"template\": \"{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\"}]}");
  EXPECT_OK(ds_chat_template_load(tok, NULL, &t));
  if (t) {
    EXPECT_OK(ds_chat_template_render(t, m, 1, &opt, &text, &len, NULL));
    EXPECT(text && !strcmp(text, "<s>u</s>"));
    free(text);
    ds_chat_template_free(t);
  }
  write_text(dir, "chat_template.jinja", "J{{ messages[0].content }}\n");
  EXPECT_OK(ds_chat_template_load(dir, NULL, &t)); /* the directory itself works too */
  if (t) {
    EXPECT_OK(ds_chat_template_render(t, m, 1, &opt, &text, &len, NULL));
    EXPECT(text && !strcmp(text, "Ju"));
    free(text);
    ds_chat_template_free(t);
  }
  write_text(dir, "override.jinja", "{{ eos_token }}{% include 'x' %}");
  char over[1000];
  snprintf(over, sizeof over, "%s/override.jinja", dir);
  EXPECT_OK(ds_chat_template_load(tok, over, &t)); /* loads: plain-text work must not fail for it */
  if (t) {
    EXPECT(ds_chat_template_render(t, m, 1, &opt, &text, &len, NULL) == DS_ERR_UNSUPPORTED);
    EXPECT(strstr(ds_last_error(), "override.jinja:1: unsupported construct '{% include %}'") != NULL);
    ds_chat_template_free(t);
  }
  write_text(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"rag\", \"template\": \"x\"}]}");
  snprintf(cmd, sizeof cmd, "rm -f '%s/chat_template.jinja'", dir);
  EXPECT(system(cmd) == 0);
  EXPECT(ds_chat_template_load(tok, NULL, &t) == DS_ERR_NOT_FOUND && t == NULL);
  EXPECT(strstr(ds_last_error(), "none is called \"default\"") != NULL);
  write_text(dir, "tokenizer_config.json", "{\"chat_template\": 3}");
  EXPECT(ds_chat_template_load(tok, NULL, &t) == DS_ERR_FORMAT && t == NULL);
}

int main(void) {
  TEST_RUN(test_against_jinja2);
  TEST_RUN(test_errors);
  TEST_RUN(test_masks);
  TEST_RUN(test_malformed);
  TEST_RUN(test_load);
  return TEST_RESULT();
}

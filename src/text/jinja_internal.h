/* The Jinja subset interpreter behind chat templates (include/dspark/chat_template.h):
 * values, the syntax tree, and the seams between the lexer/parser (jinja_parse.c), the
 * evaluator (jinja_eval.c) and the built-in filters, tests and methods (jinja_builtins.c).
 *
 * Every value of one render lives in one arena freed at its end, so the evaluator never
 * tracks ownership; the syntax tree lives in the template's own arena. */
#ifndef DSPARK_TEXT_JINJA_INTERNAL_H
#define DSPARK_TEXT_JINJA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dspark/common.h"

/* ------------------------------------------------------------------ arena */
typedef struct jarena_block jarena_block;
typedef struct {
  jarena_block *head;
  size_t used_total; /* bytes handed out, to bound runaway templates */
  int over_limit;    /* an allocation failed for the limit, not for the system */
} jarena;

/* The most one render may allocate (its strings, lists, scopes); "more than ..." when hit. */
#define JARENA_LIMIT_MIB 512

void *jarena_alloc(jarena *a, size_t n); /* zeroed; NULL when out of memory */
char *jarena_strdup(jarena *a, const char *s, size_t n); /* NUL-terminated copy */
void jarena_free(jarena *a);

/* ------------------------------------------------------------------ values */
typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC } jv_kind;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jv jv;

struct jv {
  jv_kind kind;
  union {
    int b;
    int64_t i;
    double f;
    struct {
      const char *p;
      size_t n;
    } s;
    jlist *list;
    jdict *dict;
    struct {
      int id;          /* a jfunc_id */
      const jv *self;  /* the object of a bound method, NULL for a global function */
      const struct jnode *macro; /* JF_MACRO: its JN_MACRO node */
    } fn;
  } u;
  const char *name; /* JV_UNDEF: the name that was looked up, for error messages */
};

struct jlist {
  jv *items;
  size_t n, cap;
};

struct jdict {
  const char **keys; /* NUL-terminated; a key holding NUL never matches (chat keys never do) */
  size_t *key_lens;
  jv *vals;
  size_t n, cap;
  int is_namespace; /* namespace(): the only object `set ns.attr = ...` may change */
};

/* Global functions and bound methods a template may call. */
typedef enum {
  JF_RAISE_EXCEPTION, JF_NAMESPACE, JF_STRFTIME_NOW, JF_RANGE, JF_DICT,
  /* string methods */
  JF_STARTSWITH, JF_ENDSWITH, JF_SPLIT, JF_STRIP, JF_LSTRIP, JF_RSTRIP, JF_REPLACE, JF_UPPER, JF_LOWER,
  JF_TITLE, JF_CAPITALIZE, JF_FIND, JF_COUNT,
  /* dict methods */
  JF_ITEMS, JF_KEYS, JF_VALUES, JF_GET,
  JF_MACRO /* a {% macro %} of the template, called by the evaluator itself */
} jfunc_id;

jv jv_undef(const char *name);
jv jv_none(void);
jv jv_bool(int b);
jv jv_int(int64_t i);
jv jv_str(const char *p, size_t n); /* does not copy */
jv jv_list(jlist *l);
int jv_truthy(const jv *v);
int jv_equal(const jv *a, const jv *b);
const char *jv_type_name(const jv *v); /* Python's names: 'str', 'int', 'dict', ... */

jlist *jlist_new(jarena *a);
int jlist_push(jarena *a, jlist *l, jv v); /* 0 on success */
jdict *jdict_new(jarena *a);
int jdict_set(jarena *a, jdict *d, const char *key, size_t klen, jv v);
const jv *jdict_get(const jdict *d, const char *key, size_t klen); /* NULL when absent */

/* ------------------------------------------------------------------ syntax tree */
typedef enum {
  /* expressions */
  JN_LITERAL, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST, JN_NOT, JN_NEG,
  JN_BINOP, JN_COMPARE, JN_AND, JN_OR, JN_COND, JN_LIST, JN_DICT,
  /* statements */
  JN_BODY, JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_BREAK, JN_CONTINUE, JN_GENERATION, JN_MACRO
} jnode_kind;

typedef struct jnode jnode;
struct jnode {
  jnode_kind kind;
  int line;
  int op;           /* JN_BINOP / JN_COMPARE: a jop; JN_TEST: 1 when negated */
  const char *name; /* JN_NAME, JN_ATTR, JN_FILTER, JN_TEST, JN_SET attribute; JN_TEXT bytes */
  size_t name_len;  /* JN_TEXT: its length */
  jv lit;           /* JN_LITERAL */
  jnode *a, *b, *c, *d; /* operands, by kind (see jinja_parse.c) */
  jnode **kids;     /* bodies, argument lists, list items, compare chains, for targets */
  size_t n_kids;
  int *ops;         /* JN_COMPARE: the jop before each of kids */
  const char **kw_names; /* JN_CALL / JN_FILTER keyword arguments: names of the last n_kw kids */
  size_t n_kw;
};

typedef enum {
  JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
  JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOT_IN
} jop;

/* Parses a template; on failure records "LABEL:LINE: message" and returns NULL. */
jnode *jinja_parse(jarena *a, const char *src, size_t len, const char *label, ds_status *st, int *has_generation);

/* ------------------------------------------------------------------ evaluation */
typedef struct jctx jctx;
typedef struct jinja_output jinja_output;

/* A render's bytes (NUL-terminated, malloc'd) and, per byte, the index of the message whose
 * loop iteration emitted it (-1 outside such iterations) and flags: inside a {% generation %}
 * block, first byte of one piece of output (a text or one {{ }}). The caller frees the three
 * arrays. */
enum { JOUT_GENERATION = 1, JOUT_CHUNK_START = 2 };
struct jinja_output {
  char *text;
  int32_t *owner;
  uint8_t *generation;
  size_t len, cap;
};

/* Runs the template with vars as its top-level variables; messages are the conversation's
 * message objects (recognised as loop items by identity for the owner attribution). */
ds_status jinja_render(const jnode *root, jarena *a, const char *label, jdict *vars, const jdict *const *messages,
                       size_t n_messages, jinja_output *out);

/* The state of one render. Defined here so that the value and built-in files (below the
 * evaluator in the call graph) can report errors and allocate without calling back into it. */
struct jctx {
  jarena *a;
  const char *label;
  jdict **frames; /* scopes, innermost last; frames[0] holds the render's variables */
  size_t n_frames, cap_frames;
  jinja_output *out;
  int owner, in_generation; /* attribution of the bytes emitted now */
  const jdict *const *messages; /* the conversation's message objects, by index */
  size_t n_messages;
  size_t steps;
  int depth;
  int flow; /* 1 after break, 2 after continue, until the loop takes it */
  ds_status st;
};

/* Records "LABEL:LINE: message" for the node's line and returns st. */
ds_status jctx_fail(jctx *c, const jnode *at, ds_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* An allocation failed at `at`: the arena's size limit (DS_ERR_RANGE) or out of memory. */
ds_status jctx_nomem(jctx *c, const jnode *at);
jarena *jctx_arena(jctx *c);

/* Text of a value as Jinja prints it ({{ v }} and the string filter): str as is, None,
 * True/False, Python's repr inside lists and dicts. */
ds_status jv_to_text(jctx *c, const jnode *at, const jv *v, jv *out);
ds_status jv_to_json(jctx *c, const jnode *at, const jv *v, int indent, jv *out);

/* Built-ins (jinja_builtins.c). args[0..n) positional, then n_kw keyword values named kw. */
ds_status jinja_filter(jctx *c, const jnode *at, const char *name, const jv *in, const jv *args, size_t n,
                       const char **kw, const jv *kwv, size_t n_kw, jv *out);
ds_status jinja_test(jctx *c, const jnode *at, const char *name, const jv *in, const jv *args, size_t n, int *out);
ds_status jinja_call(jctx *c, const jnode *at, const jv *fn, const jv *args, size_t n, const char **kw,
                     const jv *kwv, size_t n_kw, jv *out);
/* obj.name: a dict's method (items, keys, values, get) or key, a namespace's key, a string's
 * method; undefined when absent. */
ds_status jinja_getattr(jctx *c, const jnode *at, const jv *obj, const char *name, size_t n, jv *out);
jv jinja_global(const char *name, size_t n);
/* Shared string helpers: strip code points in chars (NULL: Python's white space) from the
 * left (which & 1) and right (which & 2); replace old by new_ (count < 0: all); ASCII case
 * mapping (mode 0 upper, 1 lower, 2 title). */
jv jinja_strip(const jv *s, const jv *chars, int which);
ds_status jinja_replace(jctx *c, const jnode *at, const jv *s, const jv *old, const jv *new_, int64_t count, jv *out);
ds_status jinja_map_ascii(jctx *c, const jnode *at, const jv *s, int mode, jv *out); /* raise_exception, namespace, ...; undefined else */

#endif

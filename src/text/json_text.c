/* JSON strings that hold U+0000 (json_text.h).
 *
 * cJSON stores a string without its length, so a decoded NUL cannot be told from the end. The
 * parse therefore runs on a copy in which every "\u0000" escape is replaced by an escape of a
 * stand-in: a noncharacter of U+FDD0..U+FDEF that occurs nowhere in the input (neither as UTF-8
 * nor as an escape), so each of its occurrences after parsing is exactly one former NUL. The
 * escape keeps its six bytes, so error columns are those of the input. Afterwards each string
 * value's stand-ins become NUL bytes and the string's byte length goes into the node's
 * valuedouble, which cJSON leaves unused (0) for strings. */
#include "text/json_text.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { STANDIN_FIRST = 0xFDD0, STANDIN_COUNT = 32 };

void tk_text_line_col(const char *buf, size_t at, size_t *line, size_t *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < at; i++) {
    if (buf[i] == '\n') {
      (*line)++;
      *col = 1;
    } else {
      (*col)++;
    }
  }
}

static int hex4(const char *p, uint32_t *out) {
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) {
    char c = p[k];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return 0;
    v = v << 4 | (uint32_t)d;
  }
  *out = v;
  return 1;
}

/* Backslashes only occur inside strings in JSON, and each one starts an escape: two
 * characters, or "\u" and four hex digits. */
size_t tk_json_find_nul(const char *buf, size_t len) {
  for (size_t i = 0; i + 1 < len; i++) {
    if (buf[i] != '\\') continue;
    uint32_t v;
    if (buf[i + 1] == 'u' && i + 6 <= len && hex4(buf + i + 2, &v) && v == 0) return i;
    i++; /* skip the escaped character */
  }
  return len;
}

/* Bit k set when U+FDD0+k occurs in buf, literally or as an escape. */
static uint32_t standins_used(const char *buf, size_t len) {
  uint32_t used = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)buf[i];
    uint32_t v;
    if (c == 0xEF && i + 2 < len && (unsigned char)buf[i + 1] == 0xB7) {
      unsigned char b = (unsigned char)buf[i + 2];
      if (b >= 0x90 && b <= 0xAF) used |= 1u << (b - 0x90); /* EF B7 90..AF = U+FDD0..U+FDEF */
    } else if (c == '\\' && i + 1 < len) {
      if (buf[i + 1] == 'u' && i + 6 <= len && hex4(buf + i + 2, &v) && v >= STANDIN_FIRST &&
          v < STANDIN_FIRST + STANDIN_COUNT)
        used |= 1u << (v - STANDIN_FIRST);
      i++;
    }
  }
  return used;
}

/* Every string value below node: stand-in (3 UTF-8 bytes) -> NUL, length into valuedouble. */
static void restore_nuls(cJSON *node, const unsigned char standin[3]) {
  for (; node; node = node->next) {
    if (cJSON_IsString(node) && node->valuestring) {
      unsigned char *s = (unsigned char *)node->valuestring;
      size_t n = strlen((char *)s), o = 0;
      for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && s[i] == standin[0] && s[i + 1] == standin[1] && s[i + 2] == standin[2]) {
          s[o++] = 0;
          i += 2;
        } else {
          s[o++] = s[i];
        }
      }
      s[o] = 0;
      node->valuedouble = (double)o;
    }
    if (node->child) restore_nuls(node->child, standin);
  }
}

static ds_status fail_at(const char *buf, size_t len, size_t at, const char *label, const char *what) {
  size_t line, col;
  tk_text_line_col(buf, at, &line, &col);
  if (memchr(buf, '\n', len))
    return DS_FAIL(DS_ERR_FORMAT, "%s: %s at line %zu, column %zu", label, what, line, col);
  return DS_FAIL(DS_ERR_FORMAT, "%s: %s at column %zu", label, what, col);
}

cJSON *tk_json_parse_text(const char *buf, size_t len, const char *label, ds_status *st) {
  const char *raw_nul = memchr(buf, 0, len);
  if (raw_nul) {
    *st = fail_at(buf, len, (size_t)(raw_nul - buf), label, "a raw NUL byte (JSON writes it as \\u0000)");
    return NULL;
  }
  size_t first = tk_json_find_nul(buf, len);
  char *copy = NULL;
  const char *text = buf;
  unsigned char standin[3] = {0, 0, 0};
  if (first < len) {
    uint32_t used = standins_used(buf, len);
    int k = 0;
    while (k < STANDIN_COUNT && (used >> k & 1u)) k++;
    if (k == STANDIN_COUNT) {
      *st = fail_at(buf, len, first, label,
                    "\\u0000 together with all of U+FDD0..U+FDEF in one value is not supported");
      return NULL;
    }
    uint32_t cp = STANDIN_FIRST + (uint32_t)k;
    static const char hexd[] = "0123456789ABCDEF";
    if (!(copy = malloc(len ? len : 1))) {
      *st = DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", label);
      return NULL;
    }
    memcpy(copy, buf, len);
    for (size_t i = first; i + 1 < len; i++) { /* first is at an escape: the scan stays aligned */
      uint32_t v;
      if (copy[i] != '\\') continue;
      if (copy[i + 1] == 'u' && i + 6 <= len && hex4(copy + i + 2, &v) && v == 0) {
        for (int d = 0; d < 4; d++) copy[i + 2 + (size_t)d] = hexd[cp >> (12 - 4 * d) & 15];
        i += 5;
      } else {
        i++;
      }
    }
    standin[0] = (unsigned char)(0xE0 | cp >> 12);
    standin[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    standin[2] = (unsigned char)(0x80 | (cp & 0x3F));
    text = copy;
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
  free(copy);
  if (root) {
    while (at < len && (buf[at] == ' ' || buf[at] == '\t' || buf[at] == '\n' || buf[at] == '\r')) at++;
    if (at == len) {
      if (standin[0]) restore_nuls(root, standin);
      *st = DS_OK;
      return root;
    }
    cJSON_Delete(root);
    *st = fail_at(buf, len, at, label, "content after the end of the JSON value");
    return NULL;
  }
  *st = fail_at(buf, len, at, label, "malformed JSON");
  return NULL;
}

static int cmp_key_ptrs(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

enum { FEW_KEYS = 16 }; /* up to this many keys an object is checked pairwise, without a sort */

/* A key that occurs twice among obj's members, or NULL. */
static const char *twice_in(const cJSON *obj) {
  size_t k = 0;
  for (const cJSON *c = obj->child; c; c = c->next) k++;
  const char **keys = k > FEW_KEYS ? malloc(k * sizeof *keys) : NULL;
  if (!keys) { /* few keys, or no memory for the sort: pairwise */
    for (const cJSON *a = obj->child; a; a = a->next)
      for (const cJSON *b = a->next; b; b = b->next)
        if (a->string && b->string && !strcmp(a->string, b->string)) return a->string;
    return NULL;
  }
  size_t n = 0;
  for (const cJSON *c = obj->child; c; c = c->next)
    if (c->string) keys[n++] = c->string;
  qsort(keys, n, sizeof *keys, cmp_key_ptrs);
  const char *dup = NULL;
  for (size_t i = 1; i < n && !dup; i++)
    if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
  free(keys);
  return dup;
}

static const char *duplicate_below(const cJSON *node, char *where, size_t cap, size_t len) {
  if (cJSON_IsObject(node)) {
    const char *dup = twice_in(node);
    if (dup) return dup;
  }
  size_t i = 0;
  for (const cJSON *c = node->child; c; c = c->next, i++) {
    if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
    int w = cJSON_IsArray(node) ? snprintf(where + len, cap - len, "[%zu]", i)
                                : snprintf(where + len, cap - len, "%s%s", len ? "." : "", c->string ? c->string : "");
    size_t l = w < 0 ? len : len + (size_t)w < cap ? len + (size_t)w : cap - 1; /* a long path is cut, not overrun */
    const char *dup = duplicate_below(c, where, cap, l);
    if (dup) return dup;
    where[len] = 0;
  }
  return NULL;
}

const char *tk_json_duplicate_key(const cJSON *root, char *where, size_t cap) {
  if (!cap) return NULL;
  where[0] = 0;
  return root ? duplicate_below(root, where, cap, 0) : NULL;
}

const char *tk_json_str(const cJSON *v, size_t *len) {
  *len = v->valuedouble > 0 ? (size_t)v->valuedouble : strlen(v->valuestring);
  return v->valuestring;
}

/* JSON strings that hold U+0000. cJSON decodes "\u0000" into a NUL byte inside a
 * NUL-terminated string, so strlen on its value silently cuts the text there. The data reader
 * (dataset.c) and `dspark tokenize --chat` keep the NUL as a character, as Python's json and
 * HF do; the tokenizer.json loader refuses it with the line and column (tk_json_find_nul). */
#ifndef DSPARK_TEXT_JSON_TEXT_H
#define DSPARK_TEXT_JSON_TEXT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "dspark/common.h"

/* Parses buf[0..len) (one JSON value plus optional white space) keeping every "\u0000" of a
 * string VALUE as a NUL byte; read string values with tk_json_str. An object key holding
 * "\u0000" never equals a key without one (it keeps a private stand-in for the NUL). A raw NUL
 * byte in buf is refused (JSON writes it as \u0000). On failure returns NULL with *st set and
 * "LABEL: malformed JSON at column C" (line L, column C when buf spans lines) recorded. */
cJSON *tk_json_parse_text(const char *buf, size_t len, const char *label, ds_status *st);

/* The bytes of a string node from tk_json_parse_text, NULs included; *len excludes the
 * terminating NUL. For any other cJSON string it is the NUL-terminated value. */
const char *tk_json_str(const cJSON *v, size_t *len);

/* Offset in buf of the first "\u0000" escape (a backslash that is itself escaped does not
 * start one), or len when there is none. */
size_t tk_json_find_nul(const char *buf, size_t len);

/* The first object key, root's own or nested, that occurs twice in one object (cJSON keeps
 * both and finds the first, Python's json the last: readers would disagree on the record),
 * or NULL. where (cap bytes) receives the object's place: "" for root, else a path such as
 * messages[1] or a.b. O(k log k) in an object's k keys. */
const char *tk_json_duplicate_key(const cJSON *root, char *where, size_t cap);

/* 1-based line and column (in bytes) of buf[at]. */
void tk_text_line_col(const char *buf, size_t at, size_t *line, size_t *col);

#endif

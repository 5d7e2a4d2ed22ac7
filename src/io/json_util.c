#include "io/json_util.h"

static void line_col(const char *buf, size_t at, size_t *line, size_t *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < at; i++) {
    if (buf[i] == '\n') { (*line)++; *col = 1; }
    else (*col)++;
  }
}

cJSON *ds_json_parse(const char *buf, size_t len, const char *label, ds_status *st) {
  const char *end = NULL;
  /* require_null_terminated = 0: cJSON needs a NUL inside the length otherwise; trailing
   * content is checked below instead. */
  cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
  size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
  if (root) {
    while (at < len && (buf[at] == ' ' || buf[at] == '\t' || buf[at] == '\n' || buf[at] == '\r')) at++;
    if (at == len) {
      *st = DS_OK;
      return root;
    }
    cJSON_Delete(root);
  }
  size_t line, col;
  line_col(buf, at, &line, &col);
  *st = DS_FAIL(DS_ERR_FORMAT, "%s: malformed JSON at line %zu, column %zu%s", label, line, col,
                root ? " (content after the end of the JSON value)" : "");
  return NULL;
}

/* See chat_reasoning.h. */
#include "text/chat_reasoning.h"

#include <string.h>

static const char k_open[] = "<think>", k_close[] = "</think>";

/* Offset of the first (last = 0) or last (last = 1) occurrence of needle in s[0..n), or n. */
static size_t find(const char *s, size_t n, const char *needle, int last) {
  size_t m = strlen(needle), at = n;
  for (size_t i = 0; i + m <= n; i++)
    if (!memcmp(s + i, needle, m)) {
      at = i;
      if (!last) break;
    }
  return at;
}

int tk_split_reasoning(const char *text, size_t len, size_t *r_off, size_t *r_len, size_t *c_off, size_t *c_len) {
  size_t first_close = find(text, len, k_close, 0);
  if (first_close == len) return 0;
  /* content: after the last </think>, leading newlines dropped */
  size_t c = find(text, len, k_close, 1) + strlen(k_close);
  while (c < len && text[c] == '\n') c++;
  /* reasoning: before the first </think> without trailing newlines, after the last <think>
   * there, without leading newlines */
  size_t end = first_close;
  while (end > 0 && text[end - 1] == '\n') end--;
  size_t open = find(text, end, k_open, 1), r = open == end ? 0 : open + strlen(k_open);
  while (r < end && text[r] == '\n') r++;
  *r_off = r;
  *r_len = end - r;
  *c_off = c;
  *c_len = len - c;
  return 1;
}

/* UTF-8 validation, decoding and the lossy repair of HF's ByteLevel decoder. */
#include <string.h>

#include "text/tok_internal.h"

static int is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

/* Bounds of the second byte of a multi-byte sequence, by lead byte: the table of
 * "well-formed UTF-8 byte sequences" in the Unicode standard (excludes overlongs and
 * surrogates). Returns the sequence width, 0 for a byte that cannot start one. */
static int lead_info(unsigned char b, unsigned char *lo, unsigned char *hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) {
    if (b == 0xE0) *lo = 0xA0;
    if (b == 0xED) *hi = 0x9F;
    return 3;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    if (b == 0xF0) *lo = 0x90;
    if (b == 0xF4) *hi = 0x8F;
    return 4;
  }
  return 0;
}

/* Length of the valid sequence at s[i..n): its width, or 0 when invalid or truncated, with
 * *bad the length of the maximal ill-formed prefix (what one U+FFFD replaces). */
static size_t seq_at(const unsigned char *s, size_t n, size_t i, size_t *bad) {
  unsigned char lo, hi;
  int w = lead_info(s[i], &lo, &hi);
  *bad = 1;
  if (!w) return 0;
  if (i + 1 >= n) { *bad = n - i; return 0; }
  if (s[i + 1] < lo || s[i + 1] > hi) return 0;
  for (int k = 2; k < w; k++) {
    if (i + (size_t)k >= n) { *bad = n - i; return 0; }
    if (!is_cont(s[i + (size_t)k])) { *bad = (size_t)k; return 0; }
  }
  return (size_t)w;
}

size_t tk_utf8_valid_prefix(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    /* ASCII runs eight bytes at a time: the common case for code and English text. */
    while (i + 8 <= n) {
      uint64_t v;
      memcpy(&v, s + i, 8);
      if (v & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) { i++; continue; }
    size_t bad, w = seq_at(s, n, i, &bad);
    if (!w) return i;
    i += w;
  }
  return n;
}

uint32_t tk_utf8_decode(const unsigned char *s, size_t *len) {
  unsigned char b = s[0];
  if (b < 0x80) { *len = 1; return b; }
  if (b < 0xE0) { *len = 2; return (uint32_t)(b & 0x1F) << 6 | (s[1] & 0x3F); }
  if (b < 0xF0) {
    *len = 3;
    return (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
  }
  *len = 4;
  return (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
         (s[3] & 0x3F);
}

size_t tk_utf8_encode(uint32_t cp, unsigned char o[4]) {
  if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | cp >> 6);
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | cp >> 12);
    o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | cp >> 18);
  o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

int tk_is_white_space(uint32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return 0;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

ds_status tk_utf8_lossy_append(tk_buf *out, const unsigned char *s, size_t n) {
  static const unsigned char k_fffd[3] = {0xEF, 0xBF, 0xBD};
  size_t i = 0;
  while (i < n) {
    size_t valid = tk_utf8_valid_prefix(s + i, n - i);
    DS_TRY(tk_buf_append(out, s + i, valid));
    i += valid;
    if (i >= n) break;
    size_t bad;
    seq_at(s, n, i, &bad);
    DS_TRY(tk_buf_append(out, k_fffd, 3));
    i += bad;
  }
  return DS_OK;
}

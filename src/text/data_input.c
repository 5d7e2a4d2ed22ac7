/* See data_input.h. */
#define _GNU_SOURCE /* glob's GLOB_BRACE */
#include "text/data_input.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>
#include <zstd.h>

/* ------------------------------------------------------------------ input lists */

static int has_suffix_ci(const char *s, size_t len, const char *suffix) {
  size_t b = strlen(suffix);
  return len >= b && !strncasecmp(s + len - b, suffix, b);
}

size_t tk_data_name_len(const char *path) {
  size_t n = strlen(path);
  if (has_suffix_ci(path, n, ".gz")) return n - 3;
  if (has_suffix_ci(path, n, ".zst")) return n - 4;
  return n;
}

int tk_is_data_name(const char *name) {
  size_t n = tk_data_name_len(name);
  return has_suffix_ci(name, n, ".jsonl") || has_suffix_ci(name, n, ".ndjson") || has_suffix_ci(name, n, ".json") ||
         has_suffix_ci(name, n, ".txt");
}

static ds_status list_push(tk_input_list *l, size_t *cap, const char *path) {
  if (l->n == *cap) {
    size_t c = *cap ? 2 * *cap : 16;
    char **p = realloc(l->paths, c * sizeof *p);
    if (!p) return DS_FAIL(DS_ERR_NOMEM, "out of memory listing data files");
    l->paths = p;
    *cap = c;
  }
  if (!(l->paths[l->n] = strdup(path))) return DS_FAIL(DS_ERR_NOMEM, "out of memory listing data files");
  l->n++;
  return DS_OK;
}

enum { MAX_DIR_DEPTH = 32 }; /* a symlink loop ends here instead of filling the disk's worth of paths */

static ds_status walk_dir(const char *dir, int depth, tk_input_list *l, size_t *cap) {
  if (depth > MAX_DIR_DEPTH)
    return DS_FAIL(DS_ERR_FORMAT, "%s: directories nested more than %d deep (a symlink loop?)", dir, MAX_DIR_DEPTH);
  DIR *d = opendir(dir);
  if (!d) return DS_FAIL(DS_ERR_IO, "%s: cannot read the directory: %s", dir, strerror(errno));
  ds_status st = DS_OK;
  struct dirent *e;
  while (st == DS_OK && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue; /* ., .., and hidden files (editor swap files, .git) */
    char *p = malloc(strlen(dir) + strlen(e->d_name) + 2);
    if (!p) {
      st = DS_FAIL(DS_ERR_NOMEM, "out of memory listing %s", dir);
      break;
    }
    sprintf(p, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", e->d_name);
    struct stat sb;
    if (stat(p, &sb) != 0) st = DS_FAIL(DS_ERR_IO, "%s: cannot stat: %s", p, strerror(errno));
    else if (S_ISDIR(sb.st_mode)) st = walk_dir(p, depth + 1, l, cap);
    else if (S_ISREG(sb.st_mode) && tk_is_data_name(e->d_name)) st = list_push(l, cap, p);
    free(p);
  }
  closedir(d);
  return st;
}

static ds_status add_path(const char *path, tk_input_list *l, size_t *cap) {
  struct stat sb;
  if (stat(path, &sb) != 0) return DS_FAIL(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  if (S_ISDIR(sb.st_mode)) return walk_dir(path, 0, l, cap);
  return list_push(l, cap, path);
}

static int cmp_paths(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

ds_status tk_inputs_expand(const char *spec, tk_input_list *out) {
  memset(out, 0, sizeof *out);
  size_t cap = 0;
  ds_status st = DS_OK;
  struct stat sb;
  int is_dir = 0;
  if (stat(spec, &sb) == 0) {
    is_dir = S_ISDIR(sb.st_mode);
    st = add_path(spec, out, &cap);
  } else if (strpbrk(spec, "*?[{")) {
    glob_t g;
    int rc = glob(spec, GLOB_BRACE | GLOB_TILDE, NULL, &g);
    if (rc == GLOB_NOMATCH) st = DS_FAIL(DS_ERR_IO, "%s: no file matches the pattern", spec);
    else if (rc != 0) st = DS_FAIL(DS_ERR_IO, "%s: the pattern cannot be expanded (glob error %d)", spec, rc);
    for (size_t i = 0; rc == 0 && st == DS_OK && i < g.gl_pathc; i++) st = add_path(g.gl_pathv[i], out, &cap);
    if (rc == 0) globfree(&g);
  } else {
    st = DS_FAIL(DS_ERR_IO, "%s: cannot open: %s", spec, strerror(errno));
  }
  if (st == DS_OK && out->n == 0)
    st = DS_FAIL(DS_ERR_IO, "%s: no data file %s (.jsonl, .ndjson, .json or .txt, optionally .gz or .zst)", spec,
                 is_dir ? "in the directory" : "among the matches");
  if (st != DS_OK) {
    tk_inputs_free(out);
    return st;
  }
  qsort(out->paths, out->n, sizeof *out->paths, cmp_paths);
  size_t k = 0; /* a file named twice (overlapping braces, a dir and its file) is read once */
  for (size_t i = 0; i < out->n; i++) {
    if (k && !strcmp(out->paths[k - 1], out->paths[i])) free(out->paths[i]);
    else out->paths[k++] = out->paths[i];
  }
  out->n = k;
  return DS_OK;
}

void tk_inputs_free(tk_input_list *l) {
  for (size_t i = 0; i < l->n; i++) free(l->paths[i]);
  free(l->paths);
  memset(l, 0, sizeof *l);
}

uint64_t tk_data_hash_combine(const uint64_t *hashes, const uint64_t *sizes, size_t n) {
  if (n == 1) return hashes[0];
  XXH64_state_t *h = XXH64_createState();
  if (!h) return 0;
  XXH64_reset(h, 0);
  for (size_t i = 0; i < n; i++) {
    unsigned char b[16];
    for (int k = 0; k < 8; k++) {
      b[k] = (unsigned char)(hashes[i] >> (8 * k));
      b[8 + k] = (unsigned char)(sizes[i] >> (8 * k));
    }
    XXH64_update(h, b, sizeof b);
  }
  uint64_t d = XXH64_digest(h);
  XXH64_freeState(h);
  return d;
}

/* ------------------------------------------------------------------ streams */

enum { IN_CHUNK = 1 << 16, OUT_CHUNK = 1 << 18 };

struct tk_stream {
  char *path;
  int fd;
  tk_codec codec;
  unsigned char *in;  /* raw bytes read from the file */
  size_t in_len, in_pos;
  int in_eof;
  unsigned char *out; /* decompressed bytes not yet consumed */
  size_t out_len, out_pos;
  int done;           /* no decompressed byte will follow */
  z_stream z;
  int z_ready, z_ended; /* inflateInit2 done; the current gzip member is complete */
  ZSTD_DCtx *zd;
  int zstd_open;      /* inside a zstd frame (not at a frame boundary) */
  XXH64_state_t *hash;
  uint64_t bytes;
  char *line;         /* the current line */
  size_t line_cap;
  size_t max_bytes;   /* tk_stream_limit's bound on a line / the rest (0: none) */
  int json_object;    /* a line is cut at a first byte other than '{' */
  uint64_t lines;     /* lines returned so far */
  int skip_rest;      /* the last line was cut: its rest is still unread */
  size_t cut_len;     /* bytes of that line read so far */
};

const char *tk_codec_name(tk_codec c) { return c == TK_CODEC_GZIP ? "gzip" : c == TK_CODEC_ZSTD ? "zstd" : "plain"; }
tk_codec tk_stream_codec(const tk_stream *s) { return s->codec; }
uint64_t tk_stream_hash(const tk_stream *s) { return XXH64_digest(s->hash); }
uint64_t tk_stream_bytes(const tk_stream *s) { return s->bytes; }

static ds_status read_raw(tk_stream *s) {
  if (s->in_pos < s->in_len) { /* keep what is unread at the front */
    memmove(s->in, s->in + s->in_pos, s->in_len - s->in_pos);
    s->in_len -= s->in_pos;
  } else {
    s->in_len = 0;
  }
  s->in_pos = 0;
  while (s->in_len < IN_CHUNK && !s->in_eof) {
    ssize_t r = read(s->fd, s->in + s->in_len, IN_CHUNK - s->in_len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return DS_FAIL(DS_ERR_IO, "%s: read failed: %s", s->path, strerror(errno));
    if (r == 0) s->in_eof = 1;
    s->in_len += (size_t)r;
    if (r > 0) break; /* one read per call: a pipe or slow disk gives what it has */
  }
  return DS_OK;
}

/* Refills s->out (whose bytes were all consumed) with at least one byte, or sets done. */
static ds_status fill(tk_stream *s) {
  s->out_pos = s->out_len = 0;
  while (!s->out_len && !s->done) {
    if (s->in_pos == s->in_len) DS_TRY(read_raw(s));
    size_t avail = s->in_len - s->in_pos;
    if (s->codec == TK_CODEC_PLAIN) {
      if (!avail) {
        s->done = 1;
        break;
      }
      memcpy(s->out, s->in + s->in_pos, avail);
      s->out_len = avail;
      s->in_pos += avail;
    } else if (s->codec == TK_CODEC_GZIP) {
      if (!avail) {
        if (!s->z_ended) return DS_FAIL(DS_ERR_FORMAT, "%s: the gzip data ends early (a truncated file)", s->path);
        s->done = 1;
        break;
      }
      if (s->z_ended) { /* another member follows (concatenated gzip files, pigz / bgzip output) */
        inflateReset(&s->z);
        s->z_ended = 0;
      }
      s->z.next_in = s->in + s->in_pos;
      s->z.avail_in = (uInt)avail;
      s->z.next_out = s->out;
      s->z.avail_out = OUT_CHUNK;
      int rc = inflate(&s->z, Z_NO_FLUSH);
      s->in_pos = s->in_len - s->z.avail_in;
      s->out_len = OUT_CHUNK - s->z.avail_out;
      if (rc == Z_STREAM_END) s->z_ended = 1;
      else if (rc == Z_BUF_ERROR && s->in_eof && !s->out_len && s->in_pos == s->in_len)
        return DS_FAIL(DS_ERR_FORMAT, "%s: the gzip data ends early (a truncated file)", s->path);
      else if (rc != Z_OK && rc != Z_BUF_ERROR)
        return DS_FAIL(DS_ERR_FORMAT, "%s: corrupt gzip data near byte %llu of the file: %s", s->path,
                       (unsigned long long)s->z.total_in, s->z.msg ? s->z.msg : "inflate failed");
    } else {
      if (!avail) {
        if (s->zstd_open) return DS_FAIL(DS_ERR_FORMAT, "%s: the zstd data ends early (a truncated file)", s->path);
        s->done = 1;
        break;
      }
      ZSTD_inBuffer ib = {s->in + s->in_pos, avail, 0};
      ZSTD_outBuffer ob = {s->out, OUT_CHUNK, 0};
      size_t rc = ZSTD_decompressStream(s->zd, &ob, &ib);
      if (ZSTD_isError(rc))
        return DS_FAIL(DS_ERR_FORMAT, "%s: corrupt zstd data: %s", s->path, ZSTD_getErrorName(rc));
      s->in_pos += ib.pos;
      s->out_len = ob.pos;
      s->zstd_open = rc != 0;
    }
  }
  if (s->out_len) {
    XXH64_update(s->hash, s->out, s->out_len);
    s->bytes += s->out_len;
  }
  return DS_OK;
}

ds_status tk_stream_open(const char *path, tk_stream **out) {
  *out = NULL;
  tk_stream *s = calloc(1, sizeof *s);
  if (!s) return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", path);
  s->fd = -1;
  s->path = strdup(path);
  s->in = malloc(IN_CHUNK);
  s->out = malloc(OUT_CHUNK);
  s->hash = XXH64_createState();
  ds_status st = s->path && s->in && s->out && s->hash ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", path);
  if (st == DS_OK) {
    XXH64_reset(s->hash, 0);
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) st = DS_FAIL(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  while (st == DS_OK && s->in_len < 4 && !s->in_eof) st = read_raw(s); /* enough for the magic */
  if (st == DS_OK) {
    const unsigned char *m = s->in;
    if (s->in_len >= 2 && m[0] == 0x1f && m[1] == 0x8b) s->codec = TK_CODEC_GZIP;
    else if (s->in_len >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) s->codec = TK_CODEC_ZSTD;
    size_t n = strlen(path);
    tk_codec named = has_suffix_ci(path, n, ".gz") ? TK_CODEC_GZIP : has_suffix_ci(path, n, ".zst") ? TK_CODEC_ZSTD
                                                                                                  : TK_CODEC_PLAIN;
    if (named != TK_CODEC_PLAIN && named != s->codec)
      st = DS_FAIL(DS_ERR_FORMAT, "%s: the name says %s but the file does not start with %s's magic bytes (%s)", path,
                   tk_codec_name(named), tk_codec_name(named),
                   s->codec == TK_CODEC_PLAIN ? "misnamed, empty or damaged" : "it is the other compression");
  }
  if (st == DS_OK && s->codec == TK_CODEC_GZIP) {
    /* 15 + 32: a zlib or gzip header, detected */
    if (inflateInit2(&s->z, 15 + 32) != Z_OK) st = DS_FAIL(DS_ERR_NOMEM, "%s: cannot start zlib", path);
    else s->z_ready = 1;
  } else if (st == DS_OK && s->codec == TK_CODEC_ZSTD) {
    if (!(s->zd = ZSTD_createDCtx())) st = DS_FAIL(DS_ERR_NOMEM, "%s: cannot start zstd", path);
  }
  if (st != DS_OK) {
    tk_stream_close(s);
    return st;
  }
  *out = s;
  return DS_OK;
}

void tk_stream_close(tk_stream *s) {
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  if (s->z_ready) inflateEnd(&s->z);
  ZSTD_freeDCtx(s->zd);
  if (s->hash) XXH64_freeState(s->hash);
  free(s->path);
  free(s->in);
  free(s->out);
  free(s->line);
  free(s);
}

void tk_stream_limit(tk_stream *s, size_t max_bytes, int json_object) {
  s->max_bytes = max_bytes;
  s->json_object = json_object;
}

/* "67108864 bytes (64 MiB)": the limit as the option takes it, and readable. */
static const char *limit_text(size_t n, char buf[64]) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) snprintf(buf, 64, "%zu bytes (%zu MiB)", n, n >> 20);
  else if (n >= 1024 && n % 1024 == 0) snprintf(buf, 64, "%zu bytes (%zu KiB)", n, n >> 10);
  else snprintf(buf, 64, "%zu bytes", n);
  return buf;
}

static ds_status line_too_long(const tk_stream *s, uint64_t line) {
  char lim[64];
  return DS_FAIL(DS_ERR_FORMAT, "%s:%llu: the line is longer than the limit of %s; --max-line-bytes N raises it",
                 s->path, (unsigned long long)line, limit_text(s->max_bytes, lim));
}

static ds_status line_reserve(tk_stream *s, size_t need) {
  if (need <= s->line_cap) return DS_OK;
  size_t cap = s->line_cap ? s->line_cap : 4096;
  while (cap < need) cap *= 2;
  if (s->max_bytes && cap > s->max_bytes + 1 && need <= s->max_bytes + 1) cap = s->max_bytes + 1; /* no more than the bound */
  char *p = realloc(s->line, cap);
  if (!p) return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory for a line of %zu bytes", s->path, need);
  s->line = p;
  s->line_cap = cap;
  return DS_OK;
}

/* Reads past the rest of a line cut at its first byte, keeping nothing, bounded as a line. */
static ds_status skip_cut_rest(tk_stream *s) {
  size_t n = s->cut_len;
  for (;;) {
    if (s->out_pos == s->out_len) {
      DS_TRY(fill(s));
      if (s->done && !s->out_len) break;
    }
    const unsigned char *start = s->out + s->out_pos;
    const unsigned char *nl = memchr(start, '\n', s->out_len - s->out_pos);
    size_t take = nl ? (size_t)(nl - start) : s->out_len - s->out_pos;
    if (s->max_bytes && n + take > s->max_bytes) return line_too_long(s, s->lines);
    n += take;
    s->out_pos += take + (nl ? 1 : 0);
    if (nl) break;
  }
  s->skip_rest = 0;
  return DS_OK;
}

static int is_line_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

ds_status tk_stream_line(tk_stream *s, char **line, size_t *len) {
  *line = NULL;
  *len = 0;
  if (s->skip_rest) DS_TRY(skip_cut_rest(s));
  size_t n = 0, scan = 0; /* scan: where the search for the first non-blank byte goes on */
  int any = 0, first_seen = !s->json_object;
  for (;;) {
    if (s->out_pos == s->out_len) {
      DS_TRY(fill(s));
      if (s->done && !s->out_len) break;
    }
    any = 1;
    const unsigned char *start = s->out + s->out_pos;
    const unsigned char *nl = memchr(start, '\n', s->out_len - s->out_pos);
    size_t take = nl ? (size_t)(nl - start) : s->out_len - s->out_pos;
    if (s->max_bytes && n + take > s->max_bytes) return line_too_long(s, s->lines + 1);
    DS_TRY(line_reserve(s, n + take + 1));
    memcpy(s->line + n, start, take);
    n += take;
    s->out_pos += take + (nl ? 1 : 0);
    if (!first_seen) {
      if (scan == 0 && s->lines == 0) { /* a UTF-8 BOM may open the file */
        if (n < 3 && !nl && !memcmp(s->line, "\xEF\xBB\xBF", n)) continue;
        if (n >= 3 && !memcmp(s->line, "\xEF\xBB\xBF", 3)) scan = 3;
      }
      while (scan < n && is_line_blank(s->line[scan])) scan++;
      if (scan < n) {
        first_seen = 1;
        if (s->line[scan] != '{') { /* no JSON object: the line ends at that byte for the caller */
          if (!nl) {
            s->skip_rest = 1;
            s->cut_len = n;
          }
          n = scan + 1;
          break;
        }
      }
    }
    if (nl) break;
  }
  if (!any) return DS_OK;
  DS_TRY(line_reserve(s, n + 1));
  s->line[n] = 0;
  s->lines++;
  *line = s->line;
  *len = n;
  return DS_OK;
}

ds_status tk_stream_drain(tk_stream *s, size_t max_line) {
  size_t run = 0; /* bytes since the last line break: an endless line (/dev/zero) is not data */
  while (!s->done) {
    DS_TRY(fill(s));
    for (const unsigned char *p = s->out, *e = s->out + s->out_len; max_line && p < e;) {
      const unsigned char *nl = memchr(p, '\n', (size_t)(e - p));
      size_t seg = (size_t)((nl ? nl : e) - p);
      if (seg > max_line - run) {
        char lim[64];
        return DS_FAIL(DS_ERR_FORMAT, "%s: more than %s without a line break (the data's line limit); "
                       "--max-line-bytes N raises it", s->path, limit_text(max_line, lim));
      }
      run = nl ? 0 : run + seg;
      p = nl ? nl + 1 : e;
    }
  }
  s->out_pos = s->out_len;
  return DS_OK;
}

ds_status tk_stream_rest(tk_stream *s, char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (s->skip_rest) DS_TRY(skip_cut_rest(s));
  size_t n = 0, cap = 1 << 16;
  char *buf = malloc(cap);
  if (!buf) return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", s->path);
  ds_status st = DS_OK;
  for (;;) {
    if (s->out_pos == s->out_len && ((st = fill(s)) != DS_OK || (s->done && !s->out_len))) break;
    size_t take = s->out_len - s->out_pos;
    if (s->max_bytes && n + take > s->max_bytes) {
      char lim[64];
      st = DS_FAIL(DS_ERR_FORMAT, "%s: the file, read whole as one plain-text document, is longer than the limit of %s; "
                   "--max-line-bytes N raises it", s->path, limit_text(s->max_bytes, lim));
      break;
    }
    if (n + take + 1 > cap) {
      while (n + take + 1 > cap) cap *= 2;
      if (s->max_bytes && cap > s->max_bytes + 1) cap = s->max_bytes + 1;
      char *p = realloc(buf, cap);
      if (!p) {
        st = DS_FAIL(DS_ERR_NOMEM, "%s: out of memory reading %zu bytes", s->path, n + take);
        break;
      }
      buf = p;
    }
    memcpy(buf + n, s->out + s->out_pos, take);
    n += take;
    s->out_pos = s->out_len;
  }
  if (st != DS_OK) {
    free(buf);
    return st;
  }
  buf[n] = 0;
  *out = buf;
  *len = n;
  return DS_OK;
}

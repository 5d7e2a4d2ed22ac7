/* Where training data comes from: an input spec (a file, a directory, or a glob pattern)
 * expanded to a sorted list of files, and each file read as a stream of decompressed bytes
 * and lines (plain, gzip or zstd, told by its suffix and checked by its magic bytes), so that
 * a JSONL file is never held whole in memory and a line costs at most its bound
 * (tk_stream_limit). */
#ifndef DSPARK_TEXT_DATA_INPUT_H
#define DSPARK_TEXT_DATA_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include "dspark/common.h"

typedef struct {
  char **paths;
  size_t n;
} tk_input_list;

/* spec -> the files it names, sorted by path (strcmp, byte order) without duplicates:
 * an existing file is itself; an existing directory gives every data file under it,
 * recursively (tk_is_data_name; entries starting with '.' are skipped); anything else with a
 * glob character (* ? [ {) is a glob(3) pattern with {a,b} braces, whose matched directories
 * are walked the same way. No file at all is an error naming spec. */
ds_status tk_inputs_expand(const char *spec, tk_input_list *out);
void tk_inputs_free(tk_input_list *l);

/* Whether a file name is a data file for directory walks: .jsonl .ndjson .json .txt, any
 * case, optionally followed by .gz or .zst. */
int tk_is_data_name(const char *name);
/* The length of path without a trailing .gz / .zst (any case): where its own suffix ends. */
size_t tk_data_name_len(const char *path);

typedef enum { TK_CODEC_PLAIN = 0, TK_CODEC_GZIP, TK_CODEC_ZSTD } tk_codec;

typedef struct tk_stream tk_stream;

/* Opens path for streaming. The codec is the magic bytes' (gzip 1f 8b, zstd 28 b5 2f fd);
 * a .gz / .zst suffix on a file without that magic is refused (misnamed or damaged). */
ds_status tk_stream_open(const char *path, tk_stream **out);
void tk_stream_close(tk_stream *s);
tk_codec tk_stream_codec(const tk_stream *s);
const char *tk_codec_name(tk_codec c);
/* Bounds what the stream holds whole. max_bytes (0: none): a line, or the rest of the stream
 * read by tk_stream_rest, longer than that is an error naming the file, the line and the limit
 * before more is kept, so that a huge or endless line (a small .gz of one long line, /dev/zero)
 * costs at most the limit. json_object: a line whose first byte after blanks (space, tab, CR,
 * and a UTF-8 BOM on line 1) is not '{' is returned as soon as that byte is read, ending with
 * it, and the rest of it is skipped (never kept, still bounded) only when the next line is
 * asked for, so a caller that stops at the error reads no further. */
void tk_stream_limit(tk_stream *s, size_t max_bytes, int json_object);
/* The next line without its '\n' (a '\r' before it is kept), NUL-terminated; *line is NULL at
 * the end. Valid until the next call. A last line without '\n' is still a line. */
ds_status tk_stream_line(tk_stream *s, char **line, size_t *len);
/* The rest of the stream, whole (for plain-text documents): malloc'd, NUL-terminated. */
ds_status tk_stream_rest(tk_stream *s, char **out, size_t *len);
/* Reads (and hashes) the rest without keeping it. */
ds_status tk_stream_drain(tk_stream *s, size_t max_line);
/* xxh64 and count of the decompressed bytes produced so far (all of them once at the end). */
uint64_t tk_stream_hash(const tk_stream *s);
uint64_t tk_stream_bytes(const tk_stream *s);

/* The data hash of a list of files whose per-file hashes and sizes are known: one file, its
 * own hash; several, the xxh64 of their (hash, size) pairs as little-endian u64s in order. */
uint64_t tk_data_hash_combine(const uint64_t *hashes, const uint64_t *sizes, size_t n);

#endif

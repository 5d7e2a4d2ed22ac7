/* Training data inputs (dspark/dataset.h): every JSONL shape (text, OpenAI messages, ShareGPT
 * conversations with their role names, a top-level system prompt and reasoning fields), the
 * plain-text file, .gz and .zst streams (compressed here with zlib and libzstd, concatenated
 * members, lines longer than the stream's buffers, misnamed and truncated files), directory
 * and glob inputs in their documented order, the data hash, and bad lines: an error naming
 * file:line and the field, or skipped and counted with skip_bad_lines. Run under ASan/UBSan
 * in the sanitizer build. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zlib.h>
#include <zstd.h>

#include "dspark/dataset.h"
#include "dspark/fileio.h"
#include "test_util.h"
#include "text/chat_json.h"
#include "text/data_input.h"

static char g_dir[600];

static const char *path_of(const char *name) {
  static char buf[4][1200];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
  return buf[k];
}

static void write_bytes(const char *name, const void *data, size_t n) {
  FILE *f = fopen(path_of(name), "wb");
  if (!f || fwrite(data, 1, n, f) != n) g_test_failures++;
  if (f) fclose(f);
}

static void write_text(const char *name, const char *text) { write_bytes(name, text, strlen(text)); }

/* One gzip member of data (zlib's deflate with a gzip header). */
static void gzip_append(FILE *f, const char *data, size_t n) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
  size_t cap = deflateBound(&z, (uLong)n) + 64;
  unsigned char *out = malloc(cap);
  z.next_in = (unsigned char *)data;
  z.avail_in = (uInt)n;
  z.next_out = out;
  z.avail_out = (uInt)cap;
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
  fwrite(out, 1, cap - z.avail_out, f);
  deflateEnd(&z);
  free(out);
}

/* data as gzip; split > 0: as two members, cut at byte split (concatenated .gz files). */
static void write_gzip(const char *name, const char *data, size_t split) {
  FILE *f = fopen(path_of(name), "wb");
  if (!f) abort();
  size_t n = strlen(data);
  if (split && split < n) {
    gzip_append(f, data, split);
    gzip_append(f, data + split, n - split);
  } else {
    gzip_append(f, data, n);
  }
  fclose(f);
}

static void write_zstd(const char *name, const char *data) {
  size_t n = strlen(data), cap = ZSTD_compressBound(n);
  void *out = malloc(cap);
  size_t got = ZSTD_compress(out, cap, data, n, 3);
  if (ZSTD_isError(got)) abort();
  write_bytes(name, out, got);
  free(out);
}

/* Every record of inputs as one line of text each ("T:text" or "role=content|..."), with the
 * file's base name and line; NULL with the error recorded when the read fails. */
static char *records_with(const char *inputs, const ds_data_options *opt, ds_data_stats *stats) {
  ds_data_reader *r;
  if (ds_data_reader_open(inputs, opt, &r) != DS_OK) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *out = calloc(1, cap);
  ds_data_record rec;
  int got;
  ds_status st;
  while ((st = ds_data_reader_next(r, &rec, &got)) == DS_OK && got) {
    const char *base = strrchr(rec.file, '/') ? strrchr(rec.file, '/') + 1 : rec.file;
    char item[4096];
    int k = snprintf(item, sizeof item, "%s:%zu ", base, rec.line);
    if (opt->prompt_field) k += snprintf(item + k, sizeof item - (size_t)k, "%s ", rec.field ? rec.field : "-");
    if (rec.text) {
      k += snprintf(item + k, sizeof item - (size_t)k, "T:%.*s", (int)rec.text_len, rec.text);
    } else {
      for (size_t i = 0; i < rec.n_messages; i++) {
        const ds_chat_message *m = &rec.messages[i];
        k += snprintf(item + k, sizeof item - (size_t)k, "%s%s=%.*s", i ? "|" : "", m->role, (int)m->content_len,
                      m->content);
        if (m->reasoning) k += snprintf(item + k, sizeof item - (size_t)k, "{%.*s}", (int)m->reasoning_len, m->reasoning);
      }
    }
    if (n + (size_t)k + 2 > cap) out = realloc(out, cap = 2 * (n + (size_t)k + 2));
    memcpy(out + n, item, (size_t)k);
    n += (size_t)k;
    out[n++] = '\n';
    out[n] = 0;
  }
  if (stats) ds_data_reader_stats(r, stats);
  ds_data_reader_close(r);
  if (st != DS_OK) {
    free(out);
    return NULL;
  }
  return out;
}

static char *records(const char *inputs, int skip, ds_data_stats *stats) {
  ds_data_options opt = {.format = DS_DATA_AUTO, .skip_bad_lines = skip};
  return records_with(inputs, &opt, stats);
}

#define EXPECT_RECORDS(inputs, skip, want)                                                            \
  do {                                                                                                \
    char *got_ = records((inputs), (skip), NULL);                                                     \
    if (!got_ || strcmp(got_, (want))) {                                                              \
      fprintf(stderr, "%s:%d: records of %s:\n%s\nwanted:\n%s\n", __FILE__, __LINE__, (inputs),       \
              got_ ? got_ : ds_last_error(), (want));                                                 \
      g_test_failures++;                                                                              \
    }                                                                                                 \
    free(got_);                                                                                       \
  } while (0)

/* The read fails, and its error holds every listed fragment. */
static void expect_refused(const char *inputs, int skip, const char *a, const char *b) {
  char *got = records(inputs, skip, NULL);
  EXPECT(got == NULL);
  if (got) {
    fprintf(stderr, "  %s was read:\n%s", inputs, got);
    free(got);
    return;
  }
  if ((a && !strstr(ds_last_error(), a)) || (b && !strstr(ds_last_error(), b))) {
    fprintf(stderr, "  %s: error '%s' lacks '%s' / '%s'\n", inputs, ds_last_error(), a, b ? b : "");
    g_test_failures++;
  }
}

static void test_shapes(void) {
  write_text("shapes.jsonl",
             "{\"text\": \"plain doc\"}\n"
             "\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\","
             " \"reasoning_content\": \"r1\"}]}\n"
             "{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, {\"from\": \"gpt\", \"value\": \"a\","
             " \"thinking\": \"r2\"}]}\n"
             "{\"system\": \"S\", \"conversations\": [{\"from\": \"user\", \"value\": \"u\"}, {\"from\": \"chatgpt\","
             " \"value\": \"c\"}, {\"from\": \"bing\", \"value\": \"b\"}, {\"from\": \"bard\", \"value\": \"d\"},"
             " {\"from\": \"assistant\", \"value\": \"e\", \"reasoning\": \"r3\"}, {\"from\": \"tool\", \"value\": \"t\"},"
             " {\"from\": \"observation\", \"value\": \"o\"}]}\n"
             "{\"system\": \"ignored\", \"conversations\": [{\"from\": \"system\", \"value\": \"own\"},"
             " {\"from\": \"human\", \"value\": \"h\"}]}\n"
             "  \r\n"
             "{\"conversations\": []}");
  EXPECT_RECORDS(path_of("shapes.jsonl"), 0,
                 "shapes.jsonl:1 T:plain doc\n"
                 "shapes.jsonl:3 user=q|assistant=a{r1}\n"
                 "shapes.jsonl:4 user=q|assistant=a{r2}\n"
                 "shapes.jsonl:5 system=S|user=u|assistant=c|assistant=b|assistant=d|assistant=e{r3}|tool=t|"
                 "observation=o\n"
                 "shapes.jsonl:6 system=own|user=h\n"
                 "shapes.jsonl:8 \n");
  EXPECT(!strcmp(tk_sharegpt_role("Human"), "Human")); /* case-sensitive, as roles are */
  /* a plain-text file is one document, whole */
  write_text("doc.txt", "line one\nline two\n");
  EXPECT_RECORDS(path_of("doc.txt"), 0, "doc.txt:0 T:line one\nline two\n\n");
}

/* The options of prompt readers (regenerate): a plain-text file's lines, {"prompt"} lines, and
 * the key each record came from. */
static void test_prompt_options(void) {
  ds_data_options opt = {.format = DS_DATA_AUTO, .text_lines = 1, .prompt_field = 1};
  write_text("prompts.txt", "\xEF\xBB\xBF" "first\r\n\n  \nsecond line\nbad \xff\nthird");
  ds_data_stats st;
  char *got = records_with(path_of("prompts.txt"), &opt, &st);
  EXPECT(got == NULL && strstr(ds_last_error(), "prompts.txt:5:5: invalid UTF-8"));
  free(got);
  opt.skip_bad_lines = 1;
  got = records_with(path_of("prompts.txt"), &opt, &st);
  EXPECT(got && !strcmp(got, "prompts.txt:1 - T:first\nprompts.txt:4 - T:second line\nprompts.txt:6 - T:third\n"));
  EXPECT(st.bad_lines == 1 && st.records == 3);
  free(got);
  write_text("prompts.jsonl",
             "{\"prompt\": \"p\", \"id\": 1}\n"
             "{\"prompt\": 3}\n"
             "{\"text\": \"t\", \"prompt\": \"not this\"}\n"
             "{\"text\": null, \"prompt\": \"q\"}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"m\"}]}\n"
             "{\"conversations\": [{\"from\": \"human\", \"value\": \"c\"}]}\n"
             "{\"other\": 1}\n");
  opt.skip_bad_lines = 0;
  got = records_with(path_of("prompts.jsonl"), &opt, &st);
  EXPECT(got == NULL && strstr(ds_last_error(), "prompts.jsonl:2: 'prompt' must be a string (it is a number)"));
  free(got);
  opt.skip_bad_lines = 1;
  got = records_with(path_of("prompts.jsonl"), &opt, &st);
  EXPECT(got && !strcmp(got, "prompts.jsonl:1 prompt T:p\nprompts.jsonl:3 text T:t\nprompts.jsonl:4 prompt T:q\n"
                             "prompts.jsonl:5 messages user=m\nprompts.jsonl:6 conversations user=c\n"));
  EXPECT(st.bad_lines == 2 && st.records == 5);
  free(got);
  /* without prompt_field, {"prompt"} is not a record; without text_lines, a file is one document */
  expect_refused(path_of("prompts.jsonl"), 0, "prompts.jsonl:1: a line needs a string 'text'", NULL);
  write_text("two.txt", "a\nb\n");
  EXPECT_RECORDS(path_of("two.txt"), 0, "two.txt:0 T:a\nb\n\n");
}

/* Bad lines: the error names file:line and the field; skip_bad_lines skips and counts them. */
static void test_bad_lines(void) {
  write_text("bad.jsonl",
             "{\"text\": \"ok 1\"}\n"
             "{\"conversations\": [{\"from\": \"human\", \"value\": 3}]}\n"
             "{\"messages\": [{\"role\": \"user\"}]}\n"
             "{\"text\": \"ok 2\"\n"
             "{\"nothing\": 1}\n"
             "{\"text\": \"bad \xff byte\"}\n"
             "{\"conversations\": [{\"value\": \"v\"}]}\n"
             "{\"text\": 5}\n"
             "[1, 2]\n"
             "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"thinking\": 1}]}\n"
             "{\"system\": 2, \"conversations\": []}\n"
             "{\"text\": \"ok 3\"}\n");
  char bad[1200];
  snprintf(bad, sizeof bad, "%s", path_of("bad.jsonl"));
  expect_refused(bad, 0, "bad.jsonl:2: conversations[0].value must be a string (it is a number)", NULL);
  ds_data_stats st;
  char *got = records(bad, 1, &st);
  EXPECT(got && !strcmp(got, "bad.jsonl:1 T:ok 1\nbad.jsonl:12 T:ok 3\n"));
  EXPECT(st.bad_lines == 10 && st.records == 2 && st.files == 1);
  free(got);
  /* each kind of bad line alone, with what its error names */
  static const struct {
    const char *line, *want;
  } cases[] = {
      {"{\"messages\": [{\"role\": \"user\"}]}", "one.jsonl:1: messages[0] needs string 'role' and 'content' (content is missing)"},
      {"{\"text\": \"ok 2\"", "one.jsonl:1: malformed JSON"},
      {"{\"nothing\": 1}", "one.jsonl:1: a line needs a string 'text', a list 'messages'"},
      {"{\"text\": \"bad \xff byte\"}", "one.jsonl:1:15: invalid UTF-8 (byte 0xFF)"},
      {"{\"conversations\": [{\"value\": \"v\"}]}", "one.jsonl:1: conversations[0].from must be a string (it is missing)"},
      {"{\"text\": 5}", "one.jsonl:1: 'text' must be a string (it is a number)"},
      {"[1, 2]", "one.jsonl:1:1: a JSONL line holds a JSON object, which starts with '{', not '['"},
      {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"thinking\": 1}]}",
       "one.jsonl:1: messages[0].thinking must be a string"},
      {"{\"system\": 2, \"conversations\": []}", "one.jsonl:1: 'system' must be a string (it is a number)"},
      {"{\"conversations\": [\"hi\"]}", "one.jsonl:1: conversations[0] must be an object with 'from' and 'value'"},
      {"{\"conversations\": {\"from\": \"human\"}}", "one.jsonl:1: 'conversations' must be an array"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    write_text("one.jsonl", cases[i].line);
    expect_refused(path_of("one.jsonl"), 0, cases[i].want, NULL);
  }
  /* the consumer's refusal (a template's raise_exception) is a bad line too, only while skipping */
  ds_data_options opt = {.format = DS_DATA_AUTO, .skip_bad_lines = 1};
  ds_data_reader *r;
  EXPECT_OK(ds_data_reader_open(bad, &opt, &r));
  ds_data_record rec;
  int got_one;
  EXPECT_OK(ds_data_reader_next(r, &rec, &got_one));
  EXPECT(got_one && rec.line == 1 && rec.json_len == 16 && !memcmp(rec.json, "{\"text\": \"ok 1\"}", 16));
  ds_status refused = DS_FAIL(DS_ERR_ARG, "the template raised an exception: no");
  EXPECT(ds_data_reader_reject(r, refused) == DS_OK);
  EXPECT(ds_data_reader_reject(r, DS_FAIL(DS_ERR_UNSUPPORTED, "unsupported construct")) == DS_ERR_UNSUPPORTED);
  ds_data_reader_stats(r, &st);
  EXPECT(st.bad_lines == 1 && st.records == 0);
  ds_data_reader_close(r);
  opt.skip_bad_lines = 0;
  EXPECT_OK(ds_data_reader_open(bad, &opt, &r));
  EXPECT_OK(ds_data_reader_next(r, &rec, &got_one));
  EXPECT(ds_data_reader_reject(r, DS_FAIL(DS_ERR_ARG, "raised")) == DS_ERR_ARG);
  EXPECT(strstr(ds_last_error(), "bad.jsonl:1: ") != NULL);
  ds_data_reader_close(r);
}

/* The same records from plain, .gz (one member or two), .zst and an unnamed gzip file; the
 * data hash is the decompressed bytes' xxh64, so the same for all. */
static void test_compression(void) {
  const char *data =
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n"
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"h\"}, {\"from\": \"gpt\", \"value\": \"g\"}]}\n"
      "{\"text\": \"t\"}\n";
  const char *want_tail = "1 user=q|assistant=a\n%s:2 user=h|assistant=g\n%s:3 T:t\n";
  const char *names[] = {"c.jsonl", "c.jsonl.gz", "c2.jsonl.gz", "c.jsonl.zst", "c.JSONL.GZ", "unnamed-gzip.jsonl"};
  write_text(names[0], data);
  write_gzip(names[1], data, 0);
  write_gzip(names[2], data, 40); /* two members, the cut inside the first line */
  write_zstd(names[3], data);
  write_gzip(names[4], data, 0);
  write_gzip(names[5], data, 0); /* gzip by its magic bytes, though not by its name */
  uint64_t plain_hash = XXH64(data, strlen(data), 0);
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char want[2048];
    snprintf(want, sizeof want, "%s:", names[i]);
    snprintf(want + strlen(want), sizeof want - strlen(want), want_tail, names[i], names[i]);
    EXPECT_RECORDS(path_of(names[i]), 0, want);
    uint64_t h = 0;
    EXPECT_OK(ds_data_hash(path_of(names[i]), 0, &h));
    EXPECT(h == plain_hash);
  }
  /* misnamed, truncated and corrupt files are refused, naming the file */
  write_text("plain.jsonl.gz", data);
  expect_refused(path_of("plain.jsonl.gz"), 1, "plain.jsonl.gz: the name says gzip", NULL);
  write_text("plain.jsonl.zst", data);
  expect_refused(path_of("plain.jsonl.zst"), 1, "plain.jsonl.zst: the name says zstd", NULL);
  char *gz;
  size_t gz_len;
  EXPECT_OK(ds_read_file(path_of("c.jsonl.gz"), &gz, &gz_len));
  write_bytes("cut.jsonl.gz", gz, gz_len - 10);
  expect_refused(path_of("cut.jsonl.gz"), 1, "cut.jsonl.gz: the gzip data ends early", NULL);
  gz[gz_len / 2] ^= 0x55;
  gz[gz_len / 2 + 1] ^= 0x55;
  write_bytes("corrupt.jsonl.gz", gz, gz_len);
  char *got = records(path_of("corrupt.jsonl.gz"), 1, NULL); /* never skipped as a bad line */
  EXPECT(got == NULL && strstr(ds_last_error(), "corrupt.jsonl.gz") != NULL);
  free(got);
  free(gz);
  char *zs;
  size_t zs_len;
  EXPECT_OK(ds_read_file(path_of("c.jsonl.zst"), &zs, &zs_len));
  write_bytes("cut.jsonl.zst", zs, zs_len - 6);
  expect_refused(path_of("cut.jsonl.zst"), 1, "cut.jsonl.zst: the zstd data ends early", NULL);
  free(zs);
}

/* A line far longer than the stream's buffers, across gzip and zstd chunks, comes back whole. */
static void test_long_lines(void) {
  size_t n = 3u << 20;
  char *data = malloc(n + 64);
  strcpy(data, "{\"text\": \"");
  size_t k = strlen(data);
  for (size_t i = 0; i < n; i++) data[k++] = (char)('a' + (i * 7 + i / 1000) % 26);
  strcpy(data + k, "\"}\n{\"text\": \"short\"}");
  write_gzip("long.jsonl.gz", data, 0);
  write_zstd("long.jsonl.zst", data);
  const char *names[] = {"long.jsonl.gz", "long.jsonl.zst"};
  for (int f = 0; f < 2; f++) {
    ds_data_reader *r;
    EXPECT_OK(ds_data_reader_open(path_of(names[f]), NULL, &r));
    ds_data_record rec;
    int got;
    EXPECT_OK(ds_data_reader_next(r, &rec, &got));
    EXPECT(got && rec.text_len == n && !memcmp(rec.text, data + 10, n));
    EXPECT_OK(ds_data_reader_next(r, &rec, &got));
    EXPECT(got && rec.line == 2 && rec.text_len == 5 && !memcmp(rec.text, "short", 5));
    EXPECT_OK(ds_data_reader_next(r, &rec, &got));
    EXPECT(!got);
    ds_data_stats st;
    ds_data_reader_stats(r, &st);
    EXPECT(st.hash == XXH64(data, strlen(data), 0));
    ds_data_reader_close(r);
  }
  free(data);
}

/* The line bound holds exactly at max_line_bytes, across decompressed chunks too; a JSONL line
 * with another first byte is cut there (and skipped with skip_bad_lines); duplicate keys are
 * refused in small and large objects; data without a record is refused. */
static void test_line_bound(void) {
  size_t n = (1u << 20) - 9; /* {"text": " + n + "} + \n: the first line is 1 MiB exactly */
  char *data = malloc(n + 64);
  strcpy(data, "{\"text\": \"");
  size_t k = strlen(data);
  for (size_t i = 0; i < n - 3; i++) data[k++] = (char)('a' + i % 26);
  strcpy(data + k, "\"}\n{\"text\": \"short\"}\n");
  EXPECT(strchr(data, '\n') - data == 1 << 20);
  write_gzip("bound.jsonl.gz", data, 300000);
  free(data);
  ds_data_options opt = {.format = DS_DATA_AUTO, .max_line_bytes = 1u << 20};
  ds_data_reader *r;
  ds_data_record rec;
  int n_got;
  EXPECT_OK(ds_data_reader_open(path_of("bound.jsonl.gz"), &opt, &r));
  EXPECT_OK(ds_data_reader_next(r, &rec, &n_got));
  EXPECT(n_got && rec.text_len == n - 3);
  EXPECT_OK(ds_data_reader_next(r, &rec, &n_got));
  EXPECT(n_got && rec.line == 2 && rec.text_len == 5);
  ds_data_reader_close(r);
  opt.max_line_bytes = (1u << 20) - 1;
  EXPECT_OK(ds_data_reader_open(path_of("bound.jsonl.gz"), &opt, &r));
  EXPECT(ds_data_reader_next(r, &rec, &n_got) == DS_ERR_FORMAT);
  EXPECT(strstr(ds_last_error(), "bound.jsonl.gz:1: the line is longer than the limit of 1048575 bytes") &&
         strstr(ds_last_error(), "--max-line-bytes"));
  ds_data_reader_close(r);
  char *got;
  /* a plain-text file read whole is one line for the bound */
  write_text("doc.txt", "0123456789");
  opt.max_line_bytes = 10;
  EXPECT((got = records_with(path_of("doc.txt"), &opt, NULL)) != NULL);
  free(got);
  opt.max_line_bytes = 9;
  EXPECT(records_with(path_of("doc.txt"), &opt, NULL) == NULL && strstr(ds_last_error(), "limit of 9 bytes"));
  /* a BOM and blanks before '{' are fine; any other first byte is refused at its column */
  write_text("start.jsonl", "\xEF\xBB\xBF \t{\"text\": \"a\"}\n  xyz and more\n\r\n{\"text\": \"b\"}\n");
  expect_refused(path_of("start.jsonl"), 0, "start.jsonl:2:3: a JSONL line holds a JSON object", "not 'x'");
  ds_data_stats st;
  got = records(path_of("start.jsonl"), 1, &st);
  EXPECT(got && !strcmp(got, "start.jsonl:1 T:a\nstart.jsonl:4 T:b\n") && st.bad_lines == 1);
  free(got);
  /* the skipped rest of a cut line still counts against the bound */
  write_text("cut.jsonl", "xyzxyzxyzxyzxyzxyz\n{\"text\": \"b\"}\n");
  opt = (ds_data_options){.format = DS_DATA_JSONL, .skip_bad_lines = 1, .max_line_bytes = 10};
  EXPECT(records_with(path_of("cut.jsonl"), &opt, NULL) == NULL && strstr(ds_last_error(), "cut.jsonl:1: the line is"));
  /* duplicate keys: pairwise for a few keys, sorted for many; nested places named */
  char big[4096] = "{\"text\": \"t\"";
  for (int i = 0; i < 40; i++) snprintf(big + strlen(big), sizeof big - strlen(big), ", \"k%d\": %d", i, i);
  char line[4200];
  snprintf(line, sizeof line, "%s}\n", big);
  write_text("keys.jsonl", line);
  EXPECT_RECORDS(path_of("keys.jsonl"), 0, "keys.jsonl:1 T:t\n");
  snprintf(line, sizeof line, "%s, \"k17\": 0}\n", big);
  write_text("keys.jsonl", line);
  expect_refused(path_of("keys.jsonl"), 0, "keys.jsonl:1: key 'k17' appears twice in the line's object", NULL);
  write_text("keys.jsonl", "{\"text\": \"t\", \"meta\": {\"a\": [1, {\"x\": 1, \"y\": 2, \"x\": 3}]}}\n");
  expect_refused(path_of("keys.jsonl"), 0, "key 'x' appears twice in meta.a[1]", NULL);
  write_text("keys.jsonl", "{\"text\": \"t\", \"a\\u0000\": 1, \"a\": 2}\n"); /* a NUL makes another key */
  EXPECT_RECORDS(path_of("keys.jsonl"), 0, "keys.jsonl:1 T:t\n");
  /* no record at all */
  write_text("none.jsonl", "\n \n");
  expect_refused(path_of("none.jsonl"), 0, "none.jsonl: no record in the data", NULL);
  write_text("none.jsonl", "[1]\n");
  expect_refused(path_of("none.jsonl"), 1, "none.jsonl: no record in the data: all 1 non-blank lines were bad", NULL);
}

/* Directories (recursive, sorted by path, hidden and non-data names skipped) and globs
 * (braces, matched directories walked), several files in one stable order. */
static void test_dirs_and_globs(void) {
  char cmd[2400];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s/tree/b' '%s/tree/a' '%s/tree/.hidden'", g_dir, g_dir, g_dir);
  EXPECT(system(cmd) == 0);
  write_text("tree/b/2.jsonl", "{\"text\": \"b2\"}\n");
  write_gzip("tree/a/1.jsonl.gz", "{\"text\": \"a1\"}\n", 0);
  write_zstd("tree/a/0.ndjson.zst", "{\"text\": \"a0\"}\n");
  write_text("tree/z.txt", "zt");
  write_text("tree/README.md", "not data");
  write_text("tree/.hidden/x.jsonl", "{\"text\": \"hidden\"}\n");
  write_text("tree/.swap.jsonl", "{\"text\": \"swap\"}\n");
  EXPECT_RECORDS(path_of("tree"), 0, "0.ndjson.zst:1 T:a0\n1.jsonl.gz:1 T:a1\n2.jsonl:1 T:b2\nz.txt:0 T:zt\n");
  EXPECT_RECORDS(path_of("tree/*/*.jsonl*"), 0, "1.jsonl.gz:1 T:a1\n2.jsonl:1 T:b2\n");
  EXPECT_RECORDS(path_of("tree/{b,a}"), 0, "0.ndjson.zst:1 T:a0\n1.jsonl.gz:1 T:a1\n2.jsonl:1 T:b2\n");
  /* a file named twice is read once; a glob's match is taken whatever its name; byte order
   * puts upper case first */
  EXPECT_RECORDS(path_of("tree/{a/1.jsonl.gz,a/*.gz,README.md}"), 0, "README.md:0 T:not data\n1.jsonl.gz:1 T:a1\n");
  ds_data_stats st;
  char *got = records(path_of("tree"), 0, &st);
  EXPECT(got && st.files == 4 && st.records == 4);
  free(got);
  uint64_t h;
  EXPECT_OK(ds_data_hash(path_of("tree"), 0, &h));
  EXPECT(h == st.hash);
  /* several files: the xxh64 of their (hash, size) pairs, so a moved line changes it */
  uint64_t hashes[2] = {XXH64("{\"text\": \"a1\"}\n", 15, 0), XXH64("{\"text\": \"b2\"}\n", 15, 0)};
  uint64_t sizes[2] = {15, 15};
  EXPECT_OK(ds_data_hash(path_of("tree/{a/1.jsonl.gz,b/2.jsonl}"), 0, &h));
  EXPECT(h == tk_data_hash_combine(hashes, sizes, 2));
  expect_refused(path_of("tree/*.parquet"), 0, "no file matches the pattern", NULL);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s/empty'", g_dir);
  EXPECT(system(cmd) == 0);
  write_text("empty/notes.md", "x");
  expect_refused(path_of("empty"), 0, "empty: no data file in the directory", NULL);
  expect_refused(path_of("missing.jsonl"), 0, "missing.jsonl: cannot open", NULL);
  EXPECT(tk_is_data_name("x.JSONL.Zst") && tk_is_data_name("a.txt.gz") && !tk_is_data_name("a.gz") &&
         !tk_is_data_name("a.parquet"));
}

/* A byte-level tokenizer without merges (token b is byte b) and ChatML's special tokens. */
static ds_tokenizer *byte_tokenizer(void) {
  size_t cap = 1 << 15, n = 0;
  char *j = malloc(cap);
  n += (size_t)snprintf(j + n, cap - n,
                        "{\"version\": \"1.0\", \"added_tokens\": ["
                        "{\"id\": 256, \"content\": \"<|im_start|>\", \"special\": true, \"normalized\": false},"
                        "{\"id\": 257, \"content\": \"<|im_end|>\", \"special\": true, \"normalized\": false},"
                        "{\"id\": 258, \"content\": \"<|endoftext|>\", \"special\": true, \"normalized\": false}],"
                        "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
                        " \"trim_offsets\": true, \"use_regex\": true}, \"post_processor\": null,"
                        " \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {");
  for (int b = 0; b < 256; b++) { /* GPT-2's byte -> character map */
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE, cp = b;
    if (!printable) {
      cp = 256;
      for (int k = 0; k < b; k++) cp += !((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE);
    }
    char c[8];
    if (cp == '"' || cp == '\\') snprintf(c, sizeof c, "\\%c", cp);
    else if (cp < 0x80) snprintf(c, sizeof c, "%c", cp);
    else snprintf(c, sizeof c, "%c%c", 0xC0 | cp >> 6, 0x80 | (cp & 0x3F));
    n += (size_t)snprintf(j + n, cap - n, "%s\"%s\": %d", b ? ", " : "", c, b);
  }
  n += (size_t)snprintf(j + n, cap - n, "}, \"merges\": []}}");
  ds_tokenizer *tok = NULL;
  EXPECT_OK(ds_tokenizer_load_memory(j, n, "bytes.json", &tok));
  free(j);
  return tok;
}

/* A ShareGPT file and the equivalent messages file give the same sequences and masks (ChatML
 * and a Jinja template); the loader counts skipped lines, including those the template
 * refuses. */
static void test_dataset(void) {
  ds_tokenizer *tok = byte_tokenizer();
  if (!tok) return;
  write_text("m.jsonl",
             "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"},"
             " {\"role\": \"assistant\", \"content\": \"hello there\"}]}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}, {\"role\": \"assistant\", \"content\": \"4\"},"
             " {\"role\": \"user\", \"content\": \"and 3+3?\"}, {\"role\": \"assistant\", \"content\": \"6\"}]}\n");
  write_gzip("s.jsonl.gz",
             "{\"system\": \"sys\", \"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, {\"from\": \"gpt\","
             " \"value\": \"hello there\"}]}\n"
             "{\"conversations\": [{\"from\": \"user\", \"value\": \"2+2?\"}, {\"from\": \"assistant\", \"value\": \"4\"},"
             " {\"from\": \"human\", \"value\": \"and 3+3?\"}, {\"from\": \"chatgpt\", \"value\": \"6\"}]}\n", 0);
  ds_chat_template *t = NULL;
  const char *tmpl = "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
                     "<{{ m.role }}>{{ m.content }}</s>{% endfor %}";
  EXPECT_OK(ds_chat_template_parse(tmpl, strlen(tmpl), "t.jinja", &t));
  for (int use_tmpl = 0; use_tmpl < 2; use_tmpl++) {
    ds_dataset a, b;
    ds_data_options opt = {.format = DS_DATA_AUTO};
    const ds_chat_template *tt = use_tmpl ? t : NULL;
    EXPECT_OK(ds_dataset_read(path_of("m.jsonl"), &opt, tok, tt, -1, 64, 258, 2, &a));
    EXPECT_OK(ds_dataset_read(path_of("s.jsonl.gz"), &opt, tok, tt, -1, 64, 258, 2, &b));
    EXPECT(a.n_seqs == 2 && b.n_seqs == 2 && ds_dataset_hash(&a) == ds_dataset_hash(&b));
    int64_t sup = 0;
    for (int64_t i = 0; i < a.n_seqs * a.seq_len; i++) sup += a.loss_mask[i];
    EXPECT(sup > 0 && a.bad_lines == 0);
    ds_dataset_free(&a);
    ds_dataset_free(&b);
  }
  /* with bad lines: refused by default, counted with skip_bad_lines */
  write_text("mixed.jsonl",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": 1}]}\n"
             "{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, {\"from\": \"tool\", \"value\": \"t\"}]}\n"
             "{\"text\": \"a plain document\"}\n");
  ds_dataset d;
  ds_data_options opt = {.format = DS_DATA_AUTO};
  EXPECT(ds_dataset_read(path_of("mixed.jsonl"), &opt, tok, t, -1, 64, 258, 2, &d) == DS_ERR_FORMAT);
  EXPECT(strstr(ds_last_error(), "mixed.jsonl:2: messages[0] needs string 'role' and 'content'") != NULL);
  opt.skip_bad_lines = 1;
  EXPECT_OK(ds_dataset_read(path_of("mixed.jsonl"), &opt, tok, t, -1, 64, 258, 2, &d));
  EXPECT(d.bad_lines == 2 && d.n_seqs == 2); /* line 3: the template's raise_exception */
  ds_dataset_free(&d);
  EXPECT_OK(ds_dataset_read(path_of("mixed.jsonl"), &opt, tok, NULL, -1, 64, 258, 2, &d)); /* ChatML renders tool */
  EXPECT(d.bad_lines == 1 && d.n_seqs == 3);
  ds_dataset_free(&d);
  opt.skip_bad_lines = 0;
  EXPECT(ds_dataset_read(path_of("mixed.jsonl"), &opt, tok, t, -1, 64, 258, 2, &d) != DS_OK);
  ds_chat_template_free(t);
  ds_tokenizer_free(tok);
}

/* ds_dataset_stream passes exactly ds_dataset_read's rows (conversations, skipped lines, a text
 * stream cut into windows, a short sequence dropped), and an error of its callback ends the read. */
typedef struct {
  const ds_dataset *want;
  int64_t seen, wrong, stop_at;
} stream_check;

static ds_status check_row(void *user, const int32_t *ids, const uint8_t *mask, int64_t n) {
  stream_check *c = user;
  if (c->seen == c->stop_at) return DS_FAIL(DS_ERR_ARG, "stopped at sequence %lld", (long long)c->seen);
  const ds_dataset *d = c->want;
  int64_t i = c->seen++, S = d->seq_len;
  c->wrong += i >= d->n_seqs || d->lengths[i] != n || memcmp(d->ids + i * S, ids, (size_t)n * sizeof(int32_t)) ||
              memcmp(d->loss_mask + i * S, mask, (size_t)n);
  return DS_OK;
}

static void test_stream(void) {
  ds_tokenizer *tok = byte_tokenizer();
  if (!tok) return;
  write_text("st.jsonl",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": 1}]}\n"
             "{\"text\": \"a plain document, long enough for three windows of sixteen tokens\"}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"a question that runs past the window\"},"
             " {\"role\": \"assistant\", \"content\": \"cut\"}]}\n"
             "{\"text\": \"x\"}\n");
  ds_data_options opt = {.format = DS_DATA_AUTO, .skip_bad_lines = 1};
  ds_dataset d;
  EXPECT_OK(ds_dataset_read(path_of("st.jsonl"), &opt, tok, NULL, -1, 16, 258, 4, &d));
  EXPECT(d.n_seqs >= 5 && d.bad_lines == 1);
  stream_check c = {&d, 0, 0, -1};
  uint64_t hash = 0;
  int64_t bad = -1;
  EXPECT_OK(ds_dataset_stream(path_of("st.jsonl"), &opt, tok, NULL, -1, 16, 258, 4, check_row, &c, &hash, &bad));
  EXPECT(c.seen == d.n_seqs && c.wrong == 0 && hash == d.source_hash && bad == 1);
  c = (stream_check){&d, 0, 0, 2};
  EXPECT(ds_dataset_stream(path_of("st.jsonl"), &opt, tok, NULL, -1, 16, 258, 4, check_row, &c, NULL, NULL) ==
         DS_ERR_ARG);
  EXPECT(strstr(ds_last_error(), "stopped at sequence 2") != NULL && c.seen == 2);
  ds_dataset_free(&d);
  ds_tokenizer_free(tok);
}

int main(void) {
  const char *tmp = getenv("DSPARK_TEST_TMP");
  snprintf(g_dir, sizeof g_dir, "%.500s/data_formats", tmp && *tmp ? tmp : "/tmp");
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
  if (system(cmd) != 0) return 1;
  TEST_RUN(test_shapes);
  TEST_RUN(test_bad_lines);
  TEST_RUN(test_prompt_options);
  TEST_RUN(test_compression);
  TEST_RUN(test_long_lines);
  TEST_RUN(test_line_bound);
  TEST_RUN(test_dirs_and_globs);
  TEST_RUN(test_stream);
  TEST_RUN(test_dataset);
  return TEST_RESULT();
}

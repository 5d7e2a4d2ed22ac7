/* libFuzzer target for the training-data reader: the input is a data file's bytes, written to
 * a temporary file whose name (chosen by the input's length) is .jsonl, .jsonl.gz, .jsonl.zst
 * or has no suffix, so the line classifier (text / messages / ShareGPT conversations), the
 * UTF-8 and JSON checks, and the gzip / zstd streams all see arbitrary bytes. Each file is
 * read three times: stopping at the first bad line, skipping bad lines, and skipping them with
 * the prompt readers' options (regenerate: a plain-text file's lines, {"prompt"}). Findings: a crash, a
 * record whose fields are inconsistent, an error that names no file, and with skipping an
 * error about a line (only the stream itself may fail then). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_all(const char *path, int skip, int prompts) {
  ds_data_options opt = {.format = DS_DATA_AUTO, .skip_bad_lines = skip, .text_lines = prompts, .prompt_field = prompts};
  ds_data_reader *r;
  if (ds_data_reader_open(path, &opt, &r) != DS_OK) abort(); /* the file exists */
  ds_data_record rec;
  int got;
  ds_status st;
  int64_t n = 0;
  while ((st = ds_data_reader_next(r, &rec, &got)) == DS_OK && got) {
    n++;
    if (!rec.file || (!rec.text && rec.n_messages && !rec.messages) || (rec.text && rec.messages)) abort();
    if (!rec.json != !rec.field || (rec.json && rec.line == 0) || (prompts && rec.line == 0)) abort();
    for (size_t i = 0; i < rec.n_messages; i++)
      if (!rec.messages[i].role || !rec.messages[i].content) abort();
  }
  if (st != DS_OK && !strstr(ds_last_error(), path)) abort();
  /* with skipping, a bad line never stops the read: what fails is the file or its stream */
  if (st != DS_OK && skip && !strstr(ds_last_error(), "gzip") && !strstr(ds_last_error(), "zstd") &&
      !strstr(ds_last_error(), "invalid UTF-8") && !strstr(ds_last_error(), "the name says") &&
      !strstr(ds_last_error(), "no record in the data")) /* every line bad, or none at all */
    abort();
  ds_data_stats stats;
  ds_data_reader_stats(r, &stats);
  if (stats.records != n || (!skip && stats.bad_lines)) abort();
  ds_data_reader_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const suffixes[] = {".jsonl", ".jsonl.gz", ".jsonl.zst", ""};
  char path[128];
  snprintf(path, sizeof path, "/tmp/fuzz_data_reader.%d%s", (int)getpid(), suffixes[size % 4]);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  read_all(path, 0, 0);
  read_all(path, 1, 0);
  read_all(path, 1, 1);
  unlink(path);
  return 0;
}

/* dspark tokenize: encode text / decode ids with a HF tokenizer.json, render ChatML
 * conversations, and time the encoder. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/chat_template.h"
#include "dspark/dataset.h"
#include "dspark/fileio.h"
#include "dspark/model_source.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"
#include "text/chat_json.h"
#include "text/json_text.h"

static const char k_usage[] =
    "usage: dspark tokenize TOKENIZER_JSON|MODEL [--text STR | --input FILE] [--add-special] [--ids-out FILE.bin]\n"
    "       dspark tokenize TOKENIZER_JSON --decode IDS.bin [--skip-special]\n"
    "       dspark tokenize TOKENIZER_JSON|MODEL --chat INPUT [--add-generation-prompt]\n"
    "                [--enable-thinking on|off] [--chat-template FILE.jinja] [--show-text] [--skip-bad-lines]\n"
    "                [--max-line-bytes N]\n"
    "       dspark tokenize TOKENIZER_JSON --bench FILE [--split-nul] [--add-special]\n";

static void help(void) {
  printf("%s\n"
         "Byte-level BPE tokenizer reading a Hugging Face tokenizer.json; ids are identical to\n"
         "HF tokenizers' encode(). Given a MODEL (a model directory, or a .gguf file read as `dspark\n"
         "convert` would write it, in memory), its tokenizer.json is used and first checked against its\n"
         "config.json (vocab_size, eos_token_id), as `dspark generate` and `capture` do.\n"
         "  --text STR        encode STR\n"
         "  --input FILE      encode the contents of FILE (UTF-8)\n"
         "  --add-special     apply the post-processor (e.g. Llama-3's <|begin_of_text|>), as\n"
         "                    add_special_tokens=True\n"
         "  --ids-out FILE    write the ids as raw int32 little-endian instead of printing them\n"
         "  --decode FILE     decode raw int32 little-endian ids; the text goes to stdout\n"
         "  --skip-special    with --decode: drop special tokens\n"
         "  --chat INPUT      each line {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} (or ShareGPT\n"
         "                    {\"conversations\": [{\"from\": ..., \"value\": ...}]}) of INPUT (a JSONL file,\n"
         "                    .gz / .zst too, a directory or a glob, as `dspark train --data`) is\n"
         "                    rendered with the model's chat template (chat_template.jinja, else the\n"
         "                    chat_template of tokenizer_config.json, beside the tokenizer; ChatML when\n"
         "                    there is none, said on stderr) as transformers' apply_chat_template;\n"
         "                    an assistant message may carry reasoning_content (or thinking / reasoning).\n"
         "                    Prints {\"ids\": [...], \"loss_mask\": [...]} per line: ids as\n"
         "                    apply_chat_template(tokenize=True), loss_mask 1 on the assistant turns'\n"
         "                    generated tokens (content, thinking block, end-of-turn token)\n"
         "  --add-generation-prompt  with --chat: end with the template's assistant header\n"
         "  --enable-thinking on|off  with --chat: pass enable_thinking to the template (Qwen3)\n"
         "  --chat-template FILE  with --chat: this Jinja template instead of the model's\n"
         "  --show-text       with --chat: also print the rendered conversation as \"text\"\n"
         "  --skip-bad-lines  with --chat: skip (and count) a malformed line instead of stopping\n"
         "  --max-line-bytes N  with --chat: the longest line read (bytes; K, M, G suffixes; default 64M)\n"
         "  --bench FILE      encode FILE three times; prints the best time and MB/s (1 MB = 1e6 bytes)\n"
         "  --split-nul       with --bench: FILE holds documents separated by NUL bytes, one encode\n"
         "                    call each\n"
         "An option that the chosen mode does not use (e.g. --skip-special without --decode) is a\n"
         "usage error (exit 2).\n",
         k_usage);
}

static int write_ids(const char *path, const ds_ids *ids) {
  unsigned char *buf = malloc(ids->len * 4 + 1);
  if (!buf) {
    fprintf(stderr, "dspark tokenize: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < ids->len; i++) {
    uint32_t v = (uint32_t)ids->ids[i];
    for (int k = 0; k < 4; k++) buf[4 * i + (size_t)k] = (unsigned char)(v >> (8 * k));
  }
  ds_status st = ds_write_file_atomic(path, buf, ids->len * 4);
  free(buf);
  if (st != DS_OK) ds_error_wrap(st, "--ids-out %s", path);
  return st == DS_OK ? 0 : cli_report_error("tokenize");
}

static void print_ids(const char *key, const int32_t *v, size_t n, int json) {
  if (json) printf("\"%s\": [", key);
  for (size_t i = 0; i < n; i++) printf(i ? (json ? ", %d" : " %d") : "%d", (int)v[i]);
  if (json) printf("]");
}

static int do_decode(const ds_tokenizer *tok, const char *path, int skip_special) {
  char *data;
  size_t len;
  if (ds_read_file(path, &data, &len) != DS_OK) return cli_report_error("tokenize");
  if (len % 4) {
    fprintf(stderr, "dspark tokenize: %s: size %zu is not a multiple of 4 (int32 ids expected)\n", path, len);
    free(data);
    return 1;
  }
  size_t n = len / 4;
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids) {
    free(data);
    fprintf(stderr, "dspark tokenize: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    const unsigned char *p = (const unsigned char *)data + 4 * i;
    ids[i] = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
  }
  free(data);
  char *text;
  size_t tlen;
  ds_status st = ds_tokenizer_decode(tok, ids, n, skip_special, &text, &tlen);
  free(ids);
  if (st != DS_OK) return cli_report_error("tokenize");
  fwrite(text, 1, tlen, stdout);
  free(text);
  return 0;
}

/* One conversation line -> its ids and loss mask on stdout. */
/* s[0..n) as a JSON string on stdout (NULs and control bytes escaped, UTF-8 kept). */
static void print_json_string(const char *s, size_t n) {
  putchar('"');
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') printf("\\%c", ch);
    else if (ch == '\n') printf("\\n");
    else if (ch < 0x20) printf("\\u%04x", ch);
    else putchar(ch);
  }
  putchar('"');
}

/* One conversation -> its ids and loss mask on stdout. */
static ds_status chat_record(const ds_tokenizer *tok, const ds_chat_template *tmpl, const ds_data_record *rec,
                             const ds_chat_options *opt, int show_text) {
  if (rec->text)
    return DS_FAIL(DS_ERR_FORMAT, "--chat reads conversations ('messages' or 'conversations'); this line is a 'text' "
                   "document");
  ds_ids ids = {0}, mask = {0};
  char *text = NULL;
  size_t text_len = 0;
  ds_status st = ds_chat_encode(tok, tmpl, rec->messages, rec->n_messages, opt, &ids, &mask);
  if (st == DS_OK && show_text)
    st = tmpl ? ds_chat_template_render(tmpl, rec->messages, rec->n_messages, opt, &text, &text_len, NULL)
              : ds_tokenizer_decode(tok, ids.ids, ids.len, 0, &text, &text_len);
  if (st == DS_OK) {
    printf("{");
    print_ids("ids", ids.ids, ids.len, 1);
    printf(", ");
    print_ids("loss_mask", mask.ids, mask.len, 1);
    if (show_text) {
      printf(", \"text\": ");
      print_json_string(text, text_len);
    }
    printf("}\n");
  }
  free(text);
  ds_ids_free(&ids);
  ds_ids_free(&mask);
  return st;
}

static int do_chat(const ds_tokenizer *tok, ds_model_source *src, const char *tok_path, const char *template_path,
                   const char *path, const ds_chat_options *opt, int show_text, int skip_bad_lines, size_t max_line) {
  ds_chat_template *tmpl = NULL;
  if ((src ? ds_model_source_chat_template(src, template_path, &tmpl) : ds_chat_template_load(tok_path, template_path, &tmpl)) != DS_OK)
    return cli_report_error("tokenize");
  if (!tmpl)
    fprintf(stderr, "dspark tokenize: no chat template for %s (chat_template.jinja or tokenizer_config.json's "
            "chat_template): rendering ChatML\n", tok_path);
  ds_data_options dopt = {.format = DS_DATA_JSONL, .skip_bad_lines = skip_bad_lines, .max_line_bytes = max_line};
  ds_data_reader *r;
  if (ds_data_reader_open(path, &dopt, &r) != DS_OK) {
    ds_chat_template_free(tmpl);
    return cli_report_error("tokenize");
  }
  ds_status st;
  ds_data_record rec;
  int got;
  while ((st = ds_data_reader_next(r, &rec, &got)) == DS_OK && got)
    if ((st = ds_data_reader_reject(r, chat_record(tok, tmpl, &rec, opt, show_text))) != DS_OK) break;
  ds_data_stats ds;
  ds_data_reader_stats(r, &ds);
  if (st == DS_OK && skip_bad_lines)
    fprintf(stderr, "dspark tokenize: %lld conversation%s, %lld bad line%s skipped (--skip-bad-lines)\n",
            (long long)ds.records, ds.records == 1 ? "" : "s",
            (long long)ds.bad_lines, ds.bad_lines == 1 ? "" : "s");
  ds_data_reader_close(r);
  ds_chat_template_free(tmpl);
  return st == DS_OK ? 0 : cli_report_error("tokenize");
}

/* Times the encoding of FILE, best of three; with split_nul the file holds documents
 * separated by NUL bytes, each encoded by its own call (as a data pipeline does). */
static int do_bench(const ds_tokenizer *tok, const char *path, int add_special, int split_nul, double load_s) {
  char *data;
  size_t len;
  if (ds_read_file(path, &data, &len) != DS_OK) return cli_report_error("tokenize");
  double best = 1e30;
  size_t n_tokens = 0, n_docs = 0;
  ds_ids ids = {0};
  for (int r = 0; r < 3; r++) {
    ids.len = 0;
    n_docs = 0;
    ds_status st = DS_OK;
    double t0 = ds_time_sec();
    for (size_t i = 0; i <= len && st == DS_OK; n_docs++) {
      const char *nul = split_nul ? memchr(data + i, 0, len - i) : NULL;
      size_t end = nul ? (size_t)(nul - data) : len;
      st = ds_tokenizer_encode(tok, data + i, end - i, add_special, &ids);
      i = end + 1;
    }
    double dt = ds_time_sec() - t0;
    n_tokens = ids.len;
    if (st != DS_OK) {
      ds_ids_free(&ids);
      free(data);
      return cli_report_error("tokenize");
    }
    if (dt < best) best = dt;
  }
  ds_ids_free(&ids);
  free(data);
  printf("{\"bytes\": %zu, \"documents\": %zu, \"tokens\": %zu, \"best_seconds\": %.6f, \"mb_per_s\": %.3f, "
         "\"load_seconds\": %.4f}\n",
         len, n_docs, n_tokens, best, best > 0 ? (double)len / 1e6 / best : 0.0, load_s);
  return 0;
}

int cmd_tokenize(int argc, char **argv) {
  const char *tok_path = NULL, *text = NULL, *input = NULL, *ids_out = NULL, *decode = NULL, *chat = NULL,
             *bench = NULL, *chat_template = NULL, *thinking = NULL;
  int add_special = 0, skip_special = 0, gen_prompt = 0, split_nul = 0, show_text = 0, skip_bad = 0;
  size_t max_line = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char **dst = !strcmp(a, "--text") ? &text : !strcmp(a, "--input") ? &input
                     : !strcmp(a, "--ids-out") ? &ids_out : !strcmp(a, "--decode") ? &decode
                     : !strcmp(a, "--chat") ? &chat : !strcmp(a, "--bench") ? &bench
                     : !strcmp(a, "--chat-template") ? &chat_template : !strcmp(a, "--enable-thinking") ? &thinking : NULL;
    if (cli_is_help(a)) {
      help();
      return 0;
    } else if (dst) {
      if (!(*dst = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--add-special")) {
      add_special = 1;
    } else if (!strcmp(a, "--skip-special")) {
      skip_special = 1;
    } else if (!strcmp(a, "--add-generation-prompt")) {
      gen_prompt = 1;
    } else if (!strcmp(a, "--show-text")) {
      show_text = 1;
    } else if (!strcmp(a, "--skip-bad-lines")) {
      skip_bad = 1;
    } else if (!strcmp(a, "--max-line-bytes")) {
      if (cli_max_line_option(argc, argv, &i, &max_line) < 0) return 2;
    } else if (!strcmp(a, "--split-nul")) {
      split_nul = 1;
    } else if (a[0] == '-' || tok_path) {
      fprintf(stderr, "dspark tokenize: unexpected argument '%s' (see --help)\n", a);
      return 2;
    } else {
      tok_path = a;
    }
  }
  int modes = (text || input) + !!decode + !!chat + !!bench;
  if (!tok_path || modes != 1 || (text && input)) {
    fprintf(stderr, "%sgive the tokenizer and exactly one of --text/--input, --decode, --chat, --bench\n", k_usage);
    return 2;
  }
  /* an option that the chosen mode would ignore is a mistake, not a no-op */
  const char *stray = ids_out && !(text || input) ? "--ids-out (only with --text / --input)"
                    : skip_special && !decode ? "--skip-special (only with --decode)"
                    : gen_prompt && !chat ? "--add-generation-prompt (only with --chat)"
                    : show_text && !chat ? "--show-text (only with --chat)"
                    : skip_bad && !chat ? "--skip-bad-lines (only with --chat)"
                    : max_line && !chat ? "--max-line-bytes (only with --chat)"
                    : chat_template && !chat ? "--chat-template (only with --chat)"
                    : thinking && !chat ? "--enable-thinking (only with --chat)"
                    : split_nul && !bench ? "--split-nul (only with --bench)"
                    : add_special && (decode || chat) ? "--add-special (only with --text / --input / --bench)"
                    : NULL;
  if (stray) {
    fprintf(stderr, "dspark tokenize: %s does not apply here (see --help)\n", stray);
    return 2;
  }
  const ds_input_path inputs[] = {{"TOKENIZER", tok_path}, {"--input", input}};
  int refused =
      ids_out ? cli_output_refused("tokenize", "--ids-out", ids_out, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs)) : 0;
  if (refused) return refused;
  ds_chat_options opt = {gen_prompt, -1};
  if (thinking && strcmp(thinking, "on") && strcmp(thinking, "off")) {
    fprintf(stderr, "dspark tokenize: --enable-thinking takes on or off, not '%s'\n", thinking);
    return 2;
  }
  if (thinking) opt.enable_thinking = !strcmp(thinking, "on");
  double t0 = ds_time_sec();
  ds_tokenizer *tok;
  ds_model_source *src = NULL; /* a model: its tokenizer.json checked against its config.json */
  struct stat sb;
  if ((stat(tok_path, &sb) == 0 && S_ISDIR(sb.st_mode)) || ds_model_path_is_gguf(tok_path)) {
    if (ds_model_source_open(tok_path, &src) != DS_OK || ds_model_source_checked_tokenizer(src, &tok) != DS_OK) {
      ds_model_source_close(src);
      return cli_report_error("tokenize");
    }
  } else if (ds_tokenizer_load(tok_path, &tok) != DS_OK) {
    return cli_report_error("tokenize");
  }
  double load_s = ds_time_sec() - t0;
  int rc = 0;
  if (decode) {
    rc = do_decode(tok, decode, skip_special);
  } else if (chat) {
    rc = do_chat(tok, src, tok_path, chat_template, chat, &opt, show_text, skip_bad, max_line);
  } else if (bench) {
    rc = do_bench(tok, bench, add_special, split_nul, load_s);
  } else {
    char *data = NULL;
    size_t len = text ? strlen(text) : 0;
    if (input && ds_read_file(input, &data, &len) != DS_OK) rc = cli_report_error("tokenize");
    ds_ids ids = {0};
    ds_status st = rc ? DS_OK : ds_tokenizer_encode(tok, input ? data : text, len, add_special, &ids);
    if (st != DS_OK) {
      if (input) ds_error_wrap(st, "%s", input);
      rc = cli_report_error("tokenize");
    }
    if (!rc && ids_out) {
      rc = write_ids(ids_out, &ids);
    } else if (!rc) {
      print_ids("ids", ids.ids, ids.len, 0);
      printf("\n");
    }
    ds_ids_free(&ids);
    free(data);
  }
  ds_tokenizer_free(tok);
  ds_model_source_close(src);
  if (!rc && fflush(stdout) != 0) {
    fprintf(stderr, "dspark tokenize: cannot write to stdout\n");
    rc = 1;
  }
  return rc;
}

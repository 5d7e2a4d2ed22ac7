/* libFuzzer target: arbitrary bytes read as a GGUF model, the way every command reads a `.gguf`
 * given as a model: the architecture and hyper-parameters mapped to config.json, the special
 * tokens, the gpt2 vocabulary and merges turned into tokenizer.json, the chat template into
 * tokenizer_config.json (src/model/gguf_model.c, gguf_tokenizer.c). A file the mapping accepts
 * must give texts the engine's own readers accept: config.json and generation_config.json must
 * parse (a finding otherwise); the tokenizer and the template, where they load, encode, decode and
 * render a conversation; and for a small model the weights image is built (every tensor checked,
 * renamed, dequantized, llama's q / k rows put back) and opened as a checkpoint. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/chat_template.h"
#include "dspark/gguf.h"
#include "dspark/hfconfig.h"
#include "dspark/safetensors.h"
#include "dspark/tokenizer.h"
#include "model/gguf_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The tokenizer and the template over a short conversation; their errors are the input's. */
static void exercise_tokenizer(const ds_gguf_model *m) {
  size_t tok_len = 0, cfg_len = 0;
  const char *tok_text = ds_gguf_model_text(m, DS_MODEL_TOKENIZER, &tok_len);
  const char *cfg_text = ds_gguf_model_text(m, DS_MODEL_TOKENIZER_CONFIG, &cfg_len);
  ds_tokenizer *tok = NULL;
  if (!tok_text || ds_tokenizer_load_memory(tok_text, tok_len, "fuzz.gguf (tokenizer.json)", &tok) != DS_OK) return;
  static const char text[] = "Hi there,\n  caf\xc3\xa9 42 <|im_end|>\xe4\xbd\xa0\xe5\xa5\xbd!";
  ds_ids ids = {0};
  if (ds_tokenizer_encode(tok, text, sizeof text - 1, 1, &ids) == DS_OK) {
    char *back = NULL;
    if (ds_tokenizer_decode(tok, ids.ids, ids.len, 0, &back, NULL) == DS_OK) free(back);
  }
  ds_ids_free(&ids);
  ds_chat_template_source src = {cfg_text, cfg_len, "fuzz.gguf (tokenizer_config.json)", NULL, 0, NULL};
  ds_chat_template *tmpl = NULL;
  if (cfg_text && ds_chat_template_load_texts(&src, NULL, &tmpl) == DS_OK && tmpl) {
    ds_chat_message msgs[2] = {{"user", "Hi", 0, NULL, 0}, {"assistant", "Hello.", 0, NULL, 0}};
    ds_chat_options opt = {0, -1};
    ds_ids cids = {0}, mask = {0};
    (void)ds_chat_encode(tok, tmpl, msgs, 2, &opt, &cids, &mask);
    ds_ids_free(&cids);
    ds_ids_free(&mask);
  }
  ds_chat_template_free(tmpl);
  ds_tokenizer_free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ds_gguf *g = NULL;
  if (ds_gguf_open_memory(data, size, "fuzz.gguf", &g) != DS_OK) return 0;
  uint64_t numel = 0; /* the weights' elements, to keep the image of a hostile file small */
  for (size_t i = 0; i < ds_gguf_tensor_count(g); i++) numel += (uint64_t)ds_gguf_tensor_at(g, i)->numel;
  ds_gguf_model *m = NULL;
  if (ds_gguf_model_from(g, DS_F32, &m) != DS_OK) return 0; /* g is m's, or closed */

  size_t cfg_len = 0, gen_len = 0;
  const char *cfg = ds_gguf_model_text(m, DS_MODEL_CONFIG, &cfg_len);
  const char *gen = ds_gguf_model_text(m, DS_MODEL_GENERATION_CONFIG, &gen_len);
  ds_model_config c;
  DS_CHECK(cfg && ds_config_parse_model(cfg, cfg_len, "fuzz.gguf (config.json)", gen, gen_len,
                                        "fuzz.gguf (generation_config.json)", &c) == DS_OK);
  exercise_tokenizer(m);
  if (numel <= (1u << 16)) {
    unsigned char *image = NULL;
    size_t bytes = 0;
    ds_checkpoint *ck = NULL;
    if (ds_gguf_model_weights(m, DS_F32, NULL, 0, 0, &image, &bytes) == DS_OK &&
        ds_ckpt_open_memory(image, bytes, "fuzz.gguf (model.safetensors)", &ck) == DS_OK)
      ds_ckpt_close(ck);
  }
  ds_gguf_model_close(m);
  return 0;
}

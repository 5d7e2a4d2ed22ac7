/* A llama.cpp model file (GGUF) as a Hugging Face model directory: the architectures `llama`,
 * `qwen2` and `qwen3` mapped to the families the loader knows, as transformers maps them when it
 * reads a GGUF file (`from_pretrained(..., gguf_file=...)`):
 *   config.json             hyper-parameters from `<arch>.*` metadata (the vocabulary from the
 *                           embedding's shape; tied when there is no `output.weight`);
 *   model.safetensors       every tensor dequantized (include/dspark/gguf.h) and renamed to the HF
 *                           name, in F32 or BF16; llama's q / k rows put back in HF's order (the
 *                           converter interleaves each head's two rotary halves);
 *   tokenizer.json          `tokenizer.ggml.model` gpt2 (byte-level BPE: tokens, merges, control
 *                           tokens as special added tokens, user-defined ones as added tokens) with
 *                           the pre-tokenizer `tokenizer.ggml.pre` names, as transformers builds it;
 *   tokenizer_config.json   the chat template (`tokenizer.chat_template`), bos / eos / unk / pad
 *                           tokens and add_bos_token;
 *   generation_config.json  bos / eos ids.
 * Anything the engine could not reproduce exactly (another architecture or tokenizer model,
 * rope scaling other than linear, partial rotary dimensions, an unknown tensor) is refused
 * naming the key or tensor. */
#ifndef DSPARK_GGUF_MODEL_H
#define DSPARK_GGUF_MODEL_H

#include "dspark/common.h"
#include "dspark/gguf_write.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the model directory out_dir (created; its files written atomically) from the GGUF file
 * at path; dtype DS_F32 or DS_BF16 for the weights. */
ds_status ds_gguf_convert(const char *path, const char *out_dir, ds_dtype dtype);

/* The other way, for a draft's GGUF: the tokenizer.* keys llama.cpp's convert_hf_to_gguf.py
 * writes for the Hugging Face model directory dir (config.json, tokenizer.json,
 * tokenizer_config.json and the chat-template files) given as --target-model-dir, over
 * vocab_size ids (the draft's), added to w in the converter's order. Byte-level BPE ("gpt2")
 * vocabularies of LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM directories, read as the
 * converter reads them through transformers 5 (tokenizer class, added tokens, special tokens;
 * src/model/hf_vocab_load.c); tokenizer.ggml.pre named as the converter names it, from the
 * SHA-256 of the ids of its check text. Refused naming the file or key: SentencePiece and
 * byte-fallback tokenizers, non-BPE models, tokenizer classes and files whose effect is not
 * reproduced, a pre-tokenizer the converter cannot name (the digest is in the message, as the
 * converter prints it), an id at or past vocab_size, a config.json vocab_size other than
 * vocab_size. */
ds_status ds_hf_vocab_gguf(const char *dir, int64_t vocab_size, ds_gguf_writer *w);

#ifdef __cplusplus
}
#endif
#endif

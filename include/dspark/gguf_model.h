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

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the model directory out_dir (created; its files written atomically) from the GGUF file
 * at path; dtype DS_F32 or DS_BF16 for the weights. */
ds_status ds_gguf_convert(const char *path, const char *out_dir, ds_dtype dtype);

#ifdef __cplusplus
}
#endif
#endif

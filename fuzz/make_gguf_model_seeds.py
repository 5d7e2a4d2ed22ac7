#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_gguf_model: one tiny model of each architecture the engine maps
(llama, qwen2, qwen3) as llama.cpp's converter lays it out, with a byte-level BPE vocabulary
(the 256 byte symbols, a few merges, ChatML's special tokens), a ChatML template and small random
weights in Q8_0, F16 and F32. Needs numpy and the `gguf` package (the tests' venv).

    ~/.cache/dspark/venv/bin/python fuzz/make_gguf_model_seeds.py fuzz/corpus/gguf_model
"""
import os
import sys

import gguf
import numpy as np

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]


def byte_symbols():
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def write(path, arch):
    rng = np.random.default_rng(7)
    tokens = byte_symbols() + [m.replace(" ", "") for m in MERGES] + SPECIALS
    d, heads, kv, hd, inter, V = 32, 2, 1, 16, 64, len(tokens)
    w = gguf.GGUFWriter(path, arch)
    for key, val in (("block_count", 1), ("context_length", 256), ("embedding_length", d),
                     ("feed_forward_length", inter), ("attention.head_count", heads),
                     ("attention.head_count_kv", kv), ("attention.key_length", hd),
                     ("attention.value_length", hd), ("rope.dimension_count", hd), ("vocab_size", V)):
        w.add_uint32(f"{arch}.{key}", val)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", {"llama": "smollm", "qwen2": "qwen2", "qwen3": "qwen2"}[arch])
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [3 if t in SPECIALS else 1 for t in tokens])
    w.add_array("tokenizer.ggml.merges", MERGES)
    w.add_uint32("tokenizer.ggml.bos_token_id", tokens.index("<|im_start|>"))
    w.add_uint32("tokenizer.ggml.eos_token_id", tokens.index("<|im_end|>"))
    w.add_uint32("tokenizer.ggml.padding_token_id", tokens.index("<|endoftext|>"))
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", CHATML)

    def tensor(name, *shape, qtype=gguf.GGMLQuantizationType.Q8_0):
        x = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if len(shape) == 1:
            x, qtype = x + 1.0, gguf.GGMLQuantizationType.F32
        w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    tensor("token_embd.weight", V, d)
    tensor("output_norm.weight", d)
    tensor("blk.0.attn_norm.weight", d)
    tensor("blk.0.ffn_norm.weight", d)
    tensor("blk.0.attn_q.weight", heads * hd, d)
    tensor("blk.0.attn_k.weight", kv * hd, d)
    tensor("blk.0.attn_v.weight", kv * hd, d, qtype=gguf.GGMLQuantizationType.F16)
    tensor("blk.0.attn_output.weight", d, heads * hd)
    if arch == "qwen2":
        for name, n in (("attn_q", heads * hd), ("attn_k", kv * hd), ("attn_v", kv * hd)):
            tensor(f"blk.0.{name}.bias", n)
    if arch == "qwen3":
        tensor("blk.0.attn_q_norm.weight", hd)
        tensor("blk.0.attn_k_norm.weight", hd)
    tensor("blk.0.ffn_gate.weight", inter, d)
    tensor("blk.0.ffn_up.weight", inter, d)
    tensor("blk.0.ffn_down.weight", d, inter)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus/gguf_model"
    os.makedirs(out, exist_ok=True)
    for arch in ("llama", "qwen2", "qwen3"):
        write(os.path.join(out, f"{arch}.gguf"), arch)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_hf_vocab: the tokenizer files of the tiny models of
fuzz/corpus/gguf_model (make_gguf_model_seeds.py) as `dspark convert` writes them, joined in
the fuzzer's layout (a byte choosing the vocabulary size, then config.json, tokenizer.json,
tokenizer_config.json, special_tokens_map.json, added_tokens.json and merges.txt separated by
"\\n\\x01\\n"); one seed also carries the last three files. Needs only the standard library and
a built dspark.

    python3 fuzz/make_hf_vocab_seeds.py build/release/dspark fuzz/corpus/hf_vocab
"""
import json
import os
import subprocess
import sys
import tempfile

SEP = b"\n\x01\n"
VOCAB_263 = b"\x02"  # index 2 of the fuzzer's sizes: the tiny models' 263 ids


def main():
    dspark = sys.argv[1] if len(sys.argv) > 1 else "build/release/dspark"
    out = sys.argv[2] if len(sys.argv) > 2 else "fuzz/corpus/hf_vocab"
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ("llama", "qwen2", "qwen3"):
            d = os.path.join(tmp, arch)
            subprocess.run([dspark, "convert", os.path.join(here, "corpus", "gguf_model", f"{arch}.gguf"), "--out", d],
                           check=True, capture_output=True)
            parts = [open(os.path.join(d, name), "rb").read()
                     for name in ("config.json", "tokenizer.json", "tokenizer_config.json")]
            if arch == "llama":
                parts += [json.dumps({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
                                      "pad_token": "<|endoftext|>"}).encode(),
                          json.dumps({"<|extra|>": 263}).encode(),
                          "#version: 0.2\nĠ t\nh e\n".encode()]
            with open(os.path.join(out, f"{arch}.seed"), "wb") as f:
                f.write(VOCAB_263 + SEP.join(parts))


if __name__ == "__main__":
    main()

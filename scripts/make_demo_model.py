"""Builds the demo target: a byte-level BPE tokenizer trained with HF `tokenizers` on the
Python standard library's sources (real text every machine with Python has) and a small
Qwen3 model with seeded random weights, saved in HF layout.

    python scripts/make_demo_model.py OUT_DIR

Until the project can train a target (the distillation issue), the weights are random: the
demo shows the pipeline (load, tokenize, prefill, decode, tokens/s), not good text."""
import glob
import os
import sys
import sysconfig


def corpus_files():
    lib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(lib, "*.py")))
    return files[: len(files) // 2]  # the first half, deterministically


def main():
    out = sys.argv[1]
    if os.path.exists(os.path.join(out, "model.safetensors")) and os.path.exists(os.path.join(out, "tokenizer.json")):
        print(f"demo model already at {out}")
        return
    os.makedirs(out, exist_ok=True)
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(corpus_files(), trainer)
    tok.save(os.path.join(out, "tokenizer.json"))

    cfg = transformers.Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=768,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=2048, tie_word_embeddings=True,
                                   bos_token_id=None, eos_token_id=tok.token_to_id("<|endoftext|>"))
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).eval().save_pretrained(out)
    print(f"demo model written to {out}")


if __name__ == "__main__":
    main()

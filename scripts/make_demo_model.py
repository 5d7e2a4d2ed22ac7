"""Builds the demo target: a byte-level BPE tokenizer trained with HF `tokenizers` on the
Python standard library's sources (real text every machine with Python has) and a small
Qwen3 trained with PyTorch on the same text for --train-steps steps, saved in HF layout.

    python scripts/make_demo_model.py OUT_DIR [--train-steps N] [--size small|tiny]

The target is trained on the first half of the standard library's modules (sorted by name);
the second half is left for the draft's training data (scripts/demo.sh writes it out), so the
draft learns the target's behaviour on text the target did not memorize. Seeded: the same
command gives the same model on the same machine."""
import argparse
import glob
import os
import sysconfig
import time


def corpus_files(half):
    lib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(lib, "*.py")))
    mid = len(files) // 2
    return files[:mid] if half == 0 else files[mid:]


SIZES = {
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64),
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--train-steps", type=int, default=600)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--corpus-out", help="also write the held-out half of the corpus here (draft training data)")
    args = ap.parse_args()
    if args.corpus_out and not os.path.exists(args.corpus_out):
        with open(args.corpus_out, "w") as f:
            for path in corpus_files(1):
                f.write(open(path, encoding="utf-8", errors="replace").read())
    out = args.out
    if os.path.exists(os.path.join(out, "model.safetensors")) and os.path.exists(os.path.join(out, "tokenizer.json")):
        print(f"demo model already at {out}")
        return
    os.makedirs(out, exist_ok=True)
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    torch.manual_seed(0)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    files = corpus_files(0)
    tok.train(files, trainer)
    eos = tok.token_to_id("<|endoftext|>")

    cfg = transformers.Qwen3Config(vocab_size=tok.get_vocab_size(), max_position_embeddings=2048,
                                   tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos,
                                   **SIZES[args.size])
    cfg.architectures = ["Qwen3ForCausalLM"]
    model = transformers.Qwen3ForCausalLM(cfg)
    if args.train_steps > 0:
        ids = []
        for path in files:
            ids.extend(tok.encode(open(path, encoding="utf-8", errors="replace").read()).ids)
            ids.append(eos)
        data = torch.tensor(ids, dtype=torch.long)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.train_steps, pct_start=0.05)
        g = torch.Generator().manual_seed(0)
        model.train()
        t0 = time.time()
        for step in range(args.train_steps):
            starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch,), generator=g)
            x = torch.stack([data[s:s + args.seq_len] for s in starts])
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if step % 50 == 0 or step == args.train_steps - 1:
                print(f"target step {step}/{args.train_steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)",
                      flush=True)
    model.eval()
    model.save_pretrained(out)
    tok.save(os.path.join(out, "tokenizer.json"))  # last: its presence marks a finished build
    print(f"demo model written to {out}")


if __name__ == "__main__":
    main()

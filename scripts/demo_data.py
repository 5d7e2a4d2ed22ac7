"""The demo's data, from the Python standard library's sources (real text every machine with
Python has), written once into DIR:
  tokenizer.json       a byte-level BPE tokenizer (4096 entries, HF `tokenizers`; specials
                       <|endoftext|> <|im_start|> <|im_end|> <|mask|>) trained on the first half
  target-corpus.txt    the first half of the modules (sorted by name): the target's pretraining text
  draft-corpus.txt     the second half: the drafts' training text (the target did not see it)
  prompts.txt          held-out prompts (code openings from the second half, one per line)
  gen-prompts.txt      1024 other lines of the second half: the target continues them to write
                       its drafts' training text (the draft learns what the target says)
  calib-prompts.txt    32 more: the rounds the confidence calibration is fitted on
Seeded and deterministic: the same Python gives the same files.

    python scripts/demo_data.py DIR"""
import glob
import os
import random
import sys
import sysconfig


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    mid = len(files) // 2
    halves = {"target-corpus.txt": files[:mid], "draft-corpus.txt": files[mid:]}
    for name, group in halves.items():
        path = os.path.join(out, name)
        if not os.path.exists(path):
            with open(path + ".tmp", "w") as f:
                for p in group:
                    f.write(open(p, encoding="utf-8", errors="replace").read())
            os.replace(path + ".tmp", path)
    prompts = os.path.join(out, "prompts.txt")
    if not os.path.exists(prompts):
        lines = []
        for p in files[mid::max(1, (len(files) - mid) // 16)][:16]:
            for line in open(p, encoding="utf-8", errors="replace"):
                if line.startswith("def ") or line.startswith("class "):
                    lines.append(line.rstrip("\n"))
                    break
        with open(prompts, "w") as f:
            f.write("\n".join(lines) + "\n")
    # prompts the target continues to write its drafts' training text (lines of the second
    # half, none of them a held-out prompt), and a calibration set for the scheduler
    held = set(open(prompts).read().splitlines())
    lines = [l.rstrip("\n") for p in files[mid:] for l in open(p, encoding="utf-8", errors="replace")]
    pool = [l for l in lines if len(l.strip()) >= 12 and l not in held and not l.lstrip().startswith("#")]
    rng = random.Random(1)
    picked = rng.sample(pool, 1024 + 32)
    for name, group in (("gen-prompts.txt", picked[:1024]), ("calib-prompts.txt", picked[1024:])):
        path = os.path.join(out, name)
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write("\n".join(group) + "\n")
    tok_path = os.path.join(out, "tokenizer.json")
    if not os.path.exists(tok_path):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                                       "<|mask|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train(halves["target-corpus.txt"], trainer)
        tok.save(tok_path + ".tmp")
        os.replace(tok_path + ".tmp", tok_path)
    print(f"demo data in {out}")


if __name__ == "__main__":
    main()

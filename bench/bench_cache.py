"""Offline cache benchmark: what capturing costs over the target forward alone, what a cache
weighs per token, and what training from it costs over training from features in memory.

Model: a random Qwen3 of about 30M parameters (d=512, 8 layers, 8 heads / 4 KV heads,
head_dim 64, MLP 1536) with a byte-level BPE of 8192 tokens trained here on the Python
standard library's sources (so the corpus tokenizes like text); data: more of those sources,
--seqs sequences of --seq-len tokens. Measures, in one run:

- capture tokens/s against the forward alone (`dspark capture --forward-only`: the same
  sequences, the same forward calls, plus the vocabulary matmul when KD is captured; nothing
  converted, selected or written), run in interleaved pairs: overhead for bf16 / f16 / f32
  features, KD top-64 alone, and features + KD (goal: <= 10%); also the in-run overhead
  (capture loop time over the time its own forward calls took), which machine load between
  runs cannot skew;
- bytes per token (shard bytes / real tokens) for each option set;
- time to first step of `dspark train --cache` (process start to the first step's metrics
  line), against online training from the target;
- step time from the cache (mmap + prefetch thread) against the same run with the whole
  cache converted to fp32 in memory first (--cache-preload): ratio (goal: <= 1.05).
Prints a table and writes bench/out/cache.json. This machine is shared: each figure is the
best of --reps runs.

    $VENV/bin/python bench/bench_cache.py --dspark build/release/dspark [--threads 2]
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time


def build_model(path):
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    os.makedirs(path, exist_ok=True)
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:120]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>", "<|mask|>"],
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    cfg = transformers.Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=512, intermediate_size=1536,
                                   num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                                   max_position_embeddings=4096, tie_word_embeddings=False,
                                   eos_token_id=tok.token_to_id("<|endoftext|>"), bos_token_id=None)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).eval().save_pretrained(path)
    tok.save(os.path.join(path, "tokenizer.json"))


def write_data(path, chars):
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[150:]
    text = []
    n = 0
    for p in files:
        t = open(p, encoding="utf-8", errors="replace").read()
        text.append(t)
        n += len(t)
        if n >= chars:
            break
    with open(path, "w") as f:
        f.write("".join(text)[:chars])


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout, p.stderr


def capture_once(args, env, extra, out=None):
    cmd = [args.dspark, "capture", "--target", args.model, "--data", args.data, "--seq-len", str(args.seq_len),
           "--shard-size", str(args.shard_size), "--threads", str(args.threads), "--quiet"] + extra
    if out:
        shutil.rmtree(out, ignore_errors=True)
        cmd += ["--out", out]
    return json.loads(run(cmd, env)[0].strip().splitlines()[-1])


def capture(args, env, extra, baseline, out):
    """--reps pairs (forward alone, capture), interleaved so both see the same machine load.
    Returns the best of each, the in-run overhead (capture loop time over the time its own
    forward calls took, best rep) and the bytes per real token of the cache."""
    best_f = best_c = None
    in_run = float("inf")
    for _ in range(args.reps):
        f = capture_once(args, env, baseline)
        c = capture_once(args, env, extra, out)
        best_f = f if best_f is None or f["loop_s"] < best_f["loop_s"] else best_f
        best_c = c if best_c is None or c["loop_s"] < best_c["loop_s"] else best_c
        in_run = min(in_run, c["loop_s"] / c["forward_s"] - 1)
    man = json.load(open(os.path.join(out, "manifest.json")))
    shard_bytes = sum(os.path.getsize(os.path.join(out, s["file"])) for s in man["shards"])
    return best_f, best_c, in_run, shard_bytes / man["num_tokens"]


def train_run(args, env, run_dir, source, extra):
    """Starts a training run; returns (time to the first step's metrics line, per-step time)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [args.dspark, "train", "--out", run_dir, "--seq-len", str(args.seq_len), "--draft-layers", "1",
           "--num-anchors", "64", "--block-size", "7", "--markov-rank", "64", "--batch-seqs", "4", "--steps",
           str(args.steps), "--eval-seqs", "0", "--eval-every", "0", "--save-every", "100000", "--threads",
           str(args.threads), "--quiet"] + source + extra
    metrics = os.path.join(run_dir, "metrics.jsonl")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = None
    while p.poll() is None and first is None:
        if os.path.exists(metrics) and '"kind":"train"' in open(metrics).read():
            first = time.perf_counter() - t0
        time.sleep(0.005)
    _, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    if first is None:
        first = time.perf_counter() - t0
    el = [json.loads(l)["elapsed_s"] for l in open(metrics) if '"kind":"train"' in l]
    return first, (el[-1] - el[0]) / (len(el) - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--seqs", type=int, default=32, help="about this many sequences of --seq-len tokens")
    ap.add_argument("--shard-size", type=int, default=8, help="several shards, as a real cache has")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/dspark/bench-cache-qwen3-30m"))
    ap.add_argument("--work", default="/tmp/dspark-bench-cache")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    build_model(args.model)
    args.data = os.path.join(args.work, "data.txt")
    write_data(args.data, int(args.seqs * args.seq_len * 3.3))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    w = lambda name: os.path.join(args.work, name)  # noqa: E731

    res = {"threads": args.threads, "seq_len": args.seq_len, "capture": {}, "train": {}}
    print(f"{'option set':28s} {'tok/s':>9s} {'forward':>9s} {'overhead':>9s} {'in-run':>7s} {'bytes/token':>12s}")
    sets = [("features bf16", ["--dtype", "bf16"], [], "cache-bf16"),
            ("features f16", ["--dtype", "f16"], [], "cache-f16"),
            ("features f32", ["--dtype", "f32"], [], "cache-f32"),
            ("KD top-64 (bf16)", ["--no-features", "--topk", "64"], ["--topk", "64"], "cache-kd"),
            ("features + KD top-64 (bf16)", ["--topk", "64"], ["--topk", "64"], "cache-both")]
    for name, extra, base, d in sets:
        f, c, in_run, bpt = capture(args, env, extra, ["--forward-only"] + base, w(d))
        over = c["loop_s"] / f["loop_s"] - 1
        res["tokens"] = c["tokens"]
        res["capture"][name] = {"tok_s": c["tokens_per_s"], "forward_alone_tok_s": f["tokens_per_s"],
                                "overhead": over, "overhead_in_run": in_run, "bytes_per_token": bpt}
        print(f"{name:28s} {c['tokens_per_s']:9.1f} {f['tokens_per_s']:9.1f} {100 * over:8.1f}% {100 * in_run:6.1f}% "
              f"{bpt:12.1f}")
    print(f"({res['tokens']:.0f} tokens, {args.threads} threads; 'forward' = `capture --forward-only`, the same "
          "forward calls (with the vocabulary matmul for KD), best of the interleaved pairs; 'in-run' = capture loop "
          "time over its own forward time)")

    cache = w("cache-bf16")
    ttfs_cache, step_cache, ttfs_online, step_online, step_pre = [], [], [], [], []
    for _ in range(args.reps):
        a, b = train_run(args, env, w("run-cache"), ["--cache", cache], [])
        ttfs_cache.append(a)
        step_cache.append(b)
        _, b = train_run(args, env, w("run-preload"), ["--cache", cache], ["--cache-preload"])
        step_pre.append(b)
        a, b = train_run(args, env, w("run-online"), ["--target", args.model, "--data", args.data], [])
        ttfs_online.append(a)
        step_online.append(b)
    ratio = min(step_cache) / min(step_pre)
    res["train"] = {"time_to_first_step_cache_s": min(ttfs_cache), "time_to_first_step_online_s": min(ttfs_online),
                    "step_s_online": min(step_online), "step_s_cache": min(step_cache),
                    "step_s_in_memory": min(step_pre), "step_ratio": ratio}
    print(f"\ntraining (1 draft layer, 64 anchors x 7, 4 sequences per step, {args.steps} steps, bf16 cache):")
    print(f"  time to first step (process start to the first step's metrics line, the step included): from the "
          f"cache {min(ttfs_cache):.2f} s, online {min(ttfs_online):.2f} s; before the first step: "
          f"{min(ttfs_cache) - min(step_cache):.2f} s and {min(ttfs_online) - min(step_online):.2f} s")
    print(f"  step time: from the cache {min(step_cache):.3f} s, features in memory {min(step_pre):.3f} s, "
          f"ratio {ratio:.3f} (goal <= 1.05); online (the target runs every step) {min(step_online):.3f} s")
    with open(os.path.join(args.out, "cache.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

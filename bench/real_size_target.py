"""A real-size target on this machine: a random Qwen3 with the shapes of Qwen3-1.7B (hidden
2048, 28 layers, 16 heads / 8 KV heads, head_dim 128, MLP 6144, vocabulary 151936, tied
embeddings) saved in bf16 by transformers, with a small byte-level BPE tokenizer (4096 ids,
including <|endoftext|>, <|im_start|>, <|im_end|> and <|mask|>) padded to the model's
vocabulary. Then, each under /usr/bin/time -v for its peak RSS:

- `dspark info`: load time and the weight bytes held (in place, memory-mapped);
- `dspark generate`: a prompt, 32 new tokens: load time, prefill and decode tokens/s;
  decode is also given as a share of the memory-bandwidth roofline (weight bytes read per
  token over the streaming read bandwidth measured in the same run: a read-only pass over
  1 GiB with the same threads, bench_linear16 --stream-only);
- `dspark capture` of a small corpus (a few sequences of --seq-len tokens, bf16 features of
  5 layers and the KD top-16): time and tokens/s.

It is a benchmark, not a test: building the model takes a minute or two and about 3.4 GB of
disk; the builder runs in its own process (the model is created directly in bf16, never as an
fp32 copy) and has exited before anything is timed. The page cache is warm (the files were
just written; nothing here may drop it), so "load" is the cost of mapping and checking the
weights, not of reading a disk. Prints a table and writes bench/out/real_size_target.json.

    $VENV/bin/python bench/real_size_target.py --dspark build/release/dspark [--dir /tmp/qwen3-1.7b-shape]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import sysconfig
import time

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
SHAPES = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
              num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
              rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)
# --smoke: the same steps on a small model, to check the script itself in seconds.
SMOKE = dict(SHAPES, vocab_size=8192, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64)


def stdlib_files(lo, hi):
    return sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[lo:hi]


def build(path, shapes):
    """The tokenizer and the bf16 model (run in a child process: its memory is gone after)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    os.makedirs(path, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=4096, special_tokens=SPECIALS,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(stdlib_files(0, 40), tr)
    tok.save(os.path.join(path, "tokenizer.json"))
    cfg = transformers.Qwen3Config(eos_token_id=tok.token_to_id("<|endoftext|>"), **shapes)
    cfg.architectures = ["Qwen3ForCausalLM"]
    # Created in bf16 from the start (2 bytes a parameter): no fp32 model, no second copy. The
    # random init is transformers' own (normal(0, 0.02) matrices, unit norms).
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    n = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    model.save_pretrained(path)
    print(f"built {n / 1e9:.3f}B parameters in bf16, saved in {time.perf_counter() - t0:.1f} s", flush=True)


def run_timed(cmd):
    """Runs cmd under /usr/bin/time -v: (stdout, stderr, peak RSS MiB, wall seconds)."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    return p.stdout, p.stderr, rss, wall


def stream_bandwidth(dspark, threads):
    """Streaming read GB/s of a 1 GiB read-only pass with the run's threads (bench_linear16
    --stream-only, built next to dspark), or, without it, of a one-thread numpy copy."""
    exe = os.path.join(os.path.dirname(os.path.abspath(dspark)), "bench_linear16")
    if os.path.exists(exe):
        out = subprocess.run([exe, "--stream-only", "--threads", str(threads)], capture_output=True, text=True).stdout
        m = re.search(r"stream read 1 GiB, \d+ threads: ([\d.]+) GB/s", out)
        if m:
            return float(m.group(1)), f"bench_linear16 --stream-only --threads {threads}"
    import numpy as np
    a = np.ones(1 << 28, dtype=np.float32)
    b = np.empty_like(a)
    best = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9, "numpy copy, one thread"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--dir", default="/tmp/dspark-qwen3-1.7b-shape")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--smoke", action="store_true", help="a small model instead (checks the script in seconds)")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = SMOKE if args.smoke else SHAPES
    if args.build_only:
        build(args.dir, shapes)
        return
    if not os.path.exists(os.path.join(args.dir, "config.json")):
        t0 = time.perf_counter()
        _, err, rss, _ = run_timed([sys.executable, os.path.abspath(__file__), "--dspark", args.dspark, "--dir",
                                    args.dir, "--build-only"] + (["--smoke"] if args.smoke else []))
        print(f"builder: {time.perf_counter() - t0:.1f} s, peak RSS {rss:.0f} MiB", flush=True)
    files = sorted(os.listdir(args.dir))
    disk = sum(os.path.getsize(os.path.join(args.dir, f)) for f in files)
    th = ["--threads", str(args.threads)]
    res = {"model_dir": args.dir, "files": files, "disk_bytes": disk, "threads": args.threads, "shapes": shapes}
    res["cpu"] = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True,
                                                                           text=True).stdout.splitlines()
                       if l.startswith("Model name")), "?")
    res["load_average_before"] = os.getloadavg()[0]

    out, err, rss, wall = run_timed([args.dspark, "info", args.dir])
    res["info"] = {"peak_rss_mib": rss, "wall_s": wall,
                   "load_s": float(re.search(r"loaded in:\s+([\d.]+) s", out).group(1)),
                   "weights_line": re.search(r"weights in memory:\s+(.*)", out).group(1),
                   "kernels_line": re.search(r"loaded in:\s+(.*)", out).group(1)}

    prompt = ("The quick brown fox jumps over the lazy dog. " * 3 +
              "def main():\n    args = parse_args()\n    for item in args.items:\n        print(item)\n") * 2
    out, err, rss, wall = run_timed([args.dspark, "generate", args.dir, "--prompt", prompt, "--max-new-tokens", "32",
                                     "--ignore-eos"] + th)
    m = re.search(r"load: ([\d.]+) s; prefill: (\d+) tokens, ([\d.]+) s \(([\d.]+) tokens/s\); "
                  r"decode: (\d+) tokens, ([\d.]+) s \(([\d.]+) tokens/s\)", err)
    res["generate"] = {"peak_rss_mib": rss, "wall_s": wall, "load_s": float(m.group(1)),
                       "prompt_tokens": int(m.group(2)), "prefill_s": float(m.group(3)),
                       "prefill_tok_s": float(m.group(4)), "new_tokens": int(m.group(5)),
                       "decode_s": float(m.group(6)), "decode_tok_s": float(m.group(7))}
    c = shapes
    d, I, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    per_token = 2 * (L * (d * (q + 2 * kv) + q * d + 3 * d * I) + V * d)  # every matrix once, lm_head = the table
    bw, bw_how = stream_bandwidth(args.dspark, args.threads)
    roof = bw * 1e9 / per_token
    res["roofline"] = {"weight_bytes_per_token": per_token, "stream_read_gb_s": bw, "stream_measured_by": bw_how,
                       "decode_roofline_tok_s": roof,
                       "decode_share_of_roofline": res["generate"]["decode_tok_s"] / roof}

    data = os.path.join(args.dir + "-corpus.txt")
    with open(data, "w") as f:
        text = "".join(open(p, encoding="utf-8", errors="replace").read() for p in stdlib_files(60, 62))
        f.write(text[:6000])
    cache = args.dir + "-cache"
    subprocess.run(["rm", "-rf", cache], check=True)
    out, err, rss, wall = run_timed([args.dspark, "capture", "--target", args.dir, "--data", data, "--out", cache,
                                     "--seq-len", str(args.seq_len), "--topk", "16", "--quiet"] + th)
    summary = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    res["capture"] = {"peak_rss_mib": rss, "wall_s": wall, "summary": summary,
                      "cache_bytes": sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache))}
    res["load_average_after"] = os.getloadavg()[0]

    print(f"CPU: {res['cpu']}; {args.threads} threads; {res['info']['kernels_line']}")
    print(f"model: {disk / 1e9:.2f} GB on disk ({', '.join(files)})")
    print(f"info:     load {res['info']['load_s']:.2f} s, peak RSS {res['info']['peak_rss_mib']:.0f} MiB; "
          f"weights in memory {res['info']['weights_line']}")
    g = res["generate"]
    print(f"generate: load {g['load_s']:.2f} s; prefill {g['prompt_tokens']} tokens {g['prefill_tok_s']:.1f} tok/s; "
          f"decode {g['new_tokens']} tokens {g['decode_tok_s']:.2f} tok/s ({100 * res['roofline']['decode_share_of_roofline']:.0f}% "
          f"of the {roof:.2f} tok/s roofline: {per_token / 1e9:.2f} GB of weights per token at {bw:.1f} GB/s); "
          f"peak RSS {g['peak_rss_mib']:.0f} MiB; wall {g['wall_s']:.1f} s")
    cp = res["capture"]
    print(f"capture:  {json.dumps(summary)}; wall {cp['wall_s']:.1f} s; peak RSS {cp['peak_rss_mib']:.0f} MiB; "
          f"cache {cp['cache_bytes'] / 1e9:.2f} GB")
    print(f"load average before / after: {res['load_average_before']:.2f} / {res['load_average_after']:.2f}")
    os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"), exist_ok=True)
    name = "real_size_target_smoke.json" if args.smoke else "real_size_target.json"
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", name), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

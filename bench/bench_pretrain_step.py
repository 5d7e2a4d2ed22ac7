"""Pretraining step benchmark (issue 10): one causal-LM training step of a ~30M-parameter Qwen3
at seq 512, `dspark pretrain` against the transformers model trained with torch AdamW, same
machine, same thread count, same tokens per step, in one run.

Both sides do the whole step: forward, LM cross-entropy over every position, backward,
gradient clipping at 1.0 and AdamW (fp32 weights and optimizer state). dspark runs its
sequences one micro-batch each (its trainer's way); torch runs the batch [B, S] at once
(its usual way), with transformers' default attention.
  dspark  `dspark pretrain --config CONFIG --tokenizer TOK --data TEXT --seq-len S
          --batch-seqs B --steps N`; the step time is read from metrics.jsonl (elapsed_s between
          steps; tokens from tokens_per_s * elapsed_s), the first step excluded (warm-up)
  torch   Qwen3ForCausalLM(config) in fp32, torch.optim.AdamW, clip_grad_norm_, perf_counter
          around each step, the first excluded
Each side runs in its own process under /usr/bin/time -v: peak RSS is the process's maximum
resident set size (data, tokenizer and run files included on both sides). The config, a
byte-level BPE tokenizer (trained here on the standard library's sources) and the text are
built once under --tmp. Prints the CPU model, the GEMM kernel (`dspark --help` names it), the
load average before and after, a table with the ratios (goal: >= 1.5x tokens/s, <= 1/2 peak
memory) and writes bench/out/pretrain_step.json.

    $VENV/bin/python bench/bench_pretrain_step.py --dspark build/release/dspark [--threads N] [--steps N]
    ... --tiny     a tiny config at seq 64 (checks the script, measures nothing useful)
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

# ~29M parameters: 12 layers of hidden 384 (GQA 6 / 2 heads of 64, MLP 1536) + a tied 8192 x 384 table
FULL = dict(vocab=8192, hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6,
            num_key_value_heads=2, head_dim=64, seq=512)
TINY = dict(vocab=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, seq=64)


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def run_timed(cmd, env):
    """Runs cmd under /usr/bin/time -v; returns (stdout, stderr, peak RSS MiB)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    return p.stdout, p.stderr, rss


def build_inputs(tmp, shape, tokens_needed):
    """config.json (Qwen3), tokenizer.json (byte-level BPE) and a text file of at least
    tokens_needed tokens, in tmp (reused when present)."""
    cfg_path, tok_path, text_path = (os.path.join(tmp, n) for n in ("config.json", "tokenizer.json", "data.txt"))
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    if not os.path.exists(tok_path):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=shape["vocab"], special_tokens=["<|endoftext|>"],
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train(files[:60], tr)
        tok.save(tok_path)
    tok = Tokenizer.from_file(tok_path)
    if not os.path.exists(text_path) or len(tok.encode(open(text_path, encoding="utf-8").read()).ids) < tokens_needed:
        parts, n = [], 0
        for p in files:
            t = open(p, encoding="utf-8", errors="replace").read()
            parts.append(t)
            n += len(tok.encode(t).ids)
            if n >= tokens_needed:
                break
        if n < tokens_needed:
            sys.exit(f"the standard library gives {n} tokens, fewer than the {tokens_needed} needed")
        with open(text_path, "w", encoding="utf-8") as f:
            f.write("".join(parts))
    from transformers import Qwen3Config
    cfg = Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=shape["hidden_size"],
                      intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_hidden_layers"],
                      num_attention_heads=shape["num_attention_heads"],
                      num_key_value_heads=shape["num_key_value_heads"], head_dim=shape["head_dim"],
                      max_position_embeddings=max(2048, shape["seq"]), tie_word_embeddings=True,
                      eos_token_id=tok.token_to_id("<|endoftext|>"), bos_token_id=None, rms_norm_eps=1e-6)
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.to_json_file(cfg_path)
    return cfg_path, tok_path, text_path


def torch_worker(args):
    """One process: the transformers model trained with torch AdamW on the packed text."""
    import resource
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM
    import_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the libraries alone, before any model
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(os.path.dirname(args.config))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.train()
    tok = Tokenizer.from_file(args.tokenizer)
    ids = tok.encode(open(args.data, encoding="utf-8").read()).ids
    S, B = args.seq, args.batch
    n = len(ids) // S
    seqs = torch.tensor(ids[:n * S]).view(n, S)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    times = []
    for step in range(args.steps):
        x = seqs[(step * B + torch.arange(B)) % n]
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"step_s": times, "tokens_per_step": B * S, "params": n_params, "last_loss": float(loss),
                      "import_rss_mib": import_rss}))


def dspark_side(args, cfg, tok, data, env):
    run = os.path.join(args.tmp, "run")
    cmd = [args.dspark, "pretrain", "--config", cfg, "--tokenizer", tok, "--data", data, "--data-format", "text",
           "--out", run, "--overwrite", "--seq-len", str(args.seq), "--batch-seqs", str(args.batch), "--steps",
           str(args.steps), "--eval-seqs", "1", "--eval-every", "0", "--save-every", str(args.steps), "--threads",
           str(args.threads), "--quiet"]
    _, _, rss = run_timed(cmd, env)
    rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"kind":"train"' in l]
    seen = [r["tokens_per_s"] * r["elapsed_s"] for r in rows]  # cumulative tokens processed
    el = [r["elapsed_s"] for r in rows]
    steady = [(el[i] - el[i - 1], seen[i] - seen[i - 1]) for i in range(1, len(rows))]
    return steady, rss, rows[-1]["loss"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dspark", help="the dspark program")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="steps per side (the first is a warm-up)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--tiny", action="store_true", help="a tiny config at seq 64, to check the script")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return torch_worker(args)
    if not args.dspark:
        ap.error("--dspark is required")
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first step is a warm-up)")
    shape = TINY if args.tiny else FULL
    args.seq = shape["seq"]
    args.tmp = args.tmp or f"/tmp/dspark-bench-pretrain{'-tiny' if args.tiny else ''}"
    os.makedirs(args.tmp, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    import torch
    # dspark holds one more sequence out for its (skipped) evaluation; both sides get enough text
    cfg, tok, data = build_inputs(args.tmp, shape, (args.steps * args.batch + 4) * args.seq * 2)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    helptext = subprocess.run([args.dspark, "--help"], capture_output=True, text=True, env=env).stdout
    m = re.search(r"matmuls: (.*)", helptext)
    gemm = m.group(1).strip() if m else "unknown"
    load_before = os.getloadavg()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs); dspark matmuls: {gemm}; torch {torch.__version__}; "
          f"{args.threads} threads; load average before: {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}", flush=True)

    steady, ds_rss, ds_loss = dspark_side(args, cfg, tok, data, env)
    ds_time, ds_tokens = sum(s for s, _ in steady), sum(t for _, t in steady)
    out, _, th_rss = run_timed([sys.executable, os.path.abspath(__file__), "--worker", "--config", cfg, "--tokenizer",
                                tok, "--data", data, "--seq", str(args.seq), "--batch", str(args.batch), "--steps",
                                str(args.steps), "--threads", str(args.threads)], env)
    th = json.loads(out.strip().splitlines()[-1])
    th_time, th_tokens = sum(th["step_s"][1:]), th["tokens_per_step"] * (args.steps - 1)
    load_after = os.getloadavg()

    ds_rate, th_rate = ds_tokens / ds_time, th_tokens / th_time
    print(f"\nPretraining step: Qwen3 of {th['params'] / 1e6:.1f}M parameters, seq {args.seq}, {args.batch} sequences "
          f"per step, {args.steps - 1} timed steps, {args.threads} threads; CPU {cpu_model()}; dspark matmuls: {gemm}; "
          f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"{'side':<22}{'tokens/s':>12}{'s/step':>10}{'peak RSS MiB':>14}{'last loss':>11}")
    print(f"{'dspark pretrain':<22}{ds_rate:>12.0f}{ds_time / len(steady):>10.3f}{ds_rss:>14.0f}{ds_loss:>11.4f}")
    print(f"{'transformers+AdamW':<22}{th_rate:>12.0f}{th_time / (args.steps - 1):>10.3f}{th_rss:>14.0f}"
          f"{th['last_loss']:>11.4f}")
    print(f"(torch's peak includes {th['import_rss_mib']:.0f} MiB of the imported libraries before any model)")
    speed, mem = ds_rate / th_rate, ds_rss / th_rss
    print(f"ratio: {speed:.2f}x tokens/s (goal >= 1.5x), {mem:.2f}x peak memory (goal <= 0.5x)")
    report = {"benchmark": "pretraining step", "tiny": args.tiny, "cpu": cpu_model(), "cpus": os.cpu_count(),
              "gemm": gemm, "torch": torch.__version__, "threads": args.threads, "seq": args.seq,
              "batch": args.batch, "timed_steps": args.steps - 1, "params": th["params"],
              "loadavg_before": load_before, "loadavg_after": load_after,
              "dspark": {"tokens_per_s": ds_rate, "peak_rss_mib": ds_rss, "step_s": [s for s, _ in steady]},
              "torch": {"tokens_per_s": th_rate, "peak_rss_mib": th_rss, "step_s": th["step_s"][1:],
                        "import_rss_mib": th["import_rss_mib"]},
              "speedup": speed, "memory_ratio": mem}
    path = os.path.join(args.out, "pretrain_step_tiny.json" if args.tiny else "pretrain_step.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

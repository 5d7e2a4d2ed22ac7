"""Target inference benchmark: dspark against PyTorch CPU running transformers on the same
weights, same machine, same thread count, in one run.

Model: a random Qwen3 of about 100M parameters (d=768, 12 layers, 12 heads / 4 KV heads,
head_dim 64, MLP 2048, V=32000, tied embeddings), saved in fp32.
Measures: prefill tokens/s (one sequence of --prefill tokens; both sides the best of --reps runs
in one process after a warm-up at that length: ours is `forward --repeat`, whose cold first run
is reported too), decode tokens/s (--decode greedy tokens after a 32-token prompt, KV cache on
both sides), our per-kernel profile of the prefill (matmul GFLOP/s and share), the OpenBLAS
sgemm peak in the same run, and peak RSS of each side. Each side runs in --procs fresh
processes (PyTorch's bf16 prefill on this machine moves by up to 2x from one process to the
next): the ratios are best process against best process, and median against median. Prints a
table and writes bench/out/target.json.

--compute bf16 (issue 9): the same weights saved in bf16 (a copy beside the model), ours with
the BF16 weights used in place and --compute bf16, transformers loading them with
torch_dtype=bfloat16 (computing in bf16); writes bench/out/target-bf16.json.

--model DIR --bf16-model: an existing bf16 checkpoint (e.g. the Qwen3-1.7B-shaped one that
bench/real_size_target.py builds) used as it is on both sides: ours reads its BF16 weights in
place under either --compute, transformers loads it in torch.float32 (fp32) or torch.bfloat16.

    $VENV/bin/python bench/bench_target.py --dspark build/release/dspark [--threads 2] [--compute bf16]
    $VENV/bin/python bench/bench_target.py --dspark build/release/dspark --model /tmp/dspark-qwen3-1.7b-shape \
        --bf16-model --prefill 256 --decode 16 --reps 2 [--compute bf16]
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import transformers


def build_model(path):
    if os.path.exists(os.path.join(path, "model.safetensors")):
        return
    cfg = transformers.Qwen3Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                   num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                                   max_position_embeddings=4096, tie_word_embeddings=True, eos_token_id=None)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(path)


def bf16_copy(path):
    """The fp32 model's weights rounded to bf16, saved by transformers beside it."""
    dst = path + "-bf16"
    if not os.path.exists(os.path.join(dst, "model.safetensors")):
        m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        m.to(torch.bfloat16).save_pretrained(dst)
    return dst


def run_timed(cmd, env):
    """Runs cmd under /usr/bin/time -v; returns (stderr, peak RSS MiB)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    return p.stdout, p.stderr, rss


def ours(args, model_dir, prompt_ids, env):
    """Prefill as PyTorch's side measures it: best of several runs in one process (forward
    --repeat: run 1 is cold, primitives made, and under --compute bf16 run 2 packs the frozen
    weights), with the profile of the last run; the cold first run is reported too."""
    best_decode, rss_max = 0.0, 0.0
    ids = ",".join(map(str, prompt_ids))
    _, err, rss_max = run_timed([args.dspark, "forward", model_dir, "--ids", ids, "--logits", "last", "--out",
                                 os.path.join(args.out, "prefill.safetensors"), "--threads", str(args.threads),
                                 "--compute", args.compute, "--repeat", str(args.reps + 1), "--profile"], env)
    runs = [float(r) for r in re.findall(r"run \d+: forward: .*\(([\d.]+) tokens/s\)", err)]
    best_prefill, cold_prefill = max(runs), runs[0]
    profile = err[err.index("kernel "):err.index("forward, best of")].strip()
    short = ",".join(map(str, prompt_ids[:32]))
    for _ in range(args.reps):
        _, err, rss = run_timed([args.dspark, "generate", model_dir, "--prompt-ids", short, "--max-new-tokens",
                                 str(args.decode), "--print-ids", "--ignore-eos", "--threads", str(args.threads),
                                 "--compute", args.compute], env)
        rate = float(re.search(r"decode: \d+ tokens, [\d.]+ s \(([\d.]+) tokens/s\)", err).group(1))
        best_decode = max(best_decode, rate)
        rss_max = max(rss_max, rss)
    return best_prefill, cold_prefill, best_decode, profile, rss_max


def torch_side(args, model_dir, prompt_ids):
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.compute == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    inp = torch.tensor([prompt_ids])
    best_prefill = 0.0
    with torch.no_grad():
        model(input_ids=inp)  # warm-up at the measured shape (oneDNN makes its primitives per shape)
        for _ in range(args.reps):
            t0 = time.perf_counter()
            model(input_ids=inp, logits_to_keep=1)
            best_prefill = max(best_prefill, inp.shape[1] / (time.perf_counter() - t0))
        best_decode = 0.0
        for _ in range(args.reps):
            cache = transformers.DynamicCache(config=model.config)
            out = model(input_ids=inp[:, :32], past_key_values=cache, use_cache=True, logits_to_keep=1)
            nxt = out.logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            for _ in range(args.decode - 1):
                out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
                nxt = out.logits[:, -1:].argmax(-1)
            best_decode = max(best_decode, (args.decode - 1) / (time.perf_counter() - t0))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return best_prefill, best_decode, rss


def sgemm_peak(args, env):
    exe = os.path.join(os.path.dirname(args.dspark), "bench_sgemm")
    out = subprocess.run([exe, str(args.threads)], capture_output=True, text=True, env=env, check=True).stdout
    kernel = re.search(r"gemm (.+?) \| threads", out).group(1)
    return float(re.search(r"peak ([\d.]+)", out).group(1)), kernel, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--procs", type=int, default=3,
                    help="fresh processes per side (PyTorch's prefill moves by up to 2x between processes here)")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/dspark/bench-qwen3-100m"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    ap.add_argument("--compute", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: bf16 weights, ours --compute bf16, transformers in torch.bfloat16")
    ap.add_argument("--bf16-model", action="store_true",
                    help="--model is an existing bf16 checkpoint, used as it is for both --compute settings")
    ap.add_argument("--torch-side", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.bf16_model:
        model_dir = args.model
    else:
        build_model(args.model)
        model_dir = bf16_copy(args.model) if args.compute == "bf16" else args.model
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, min(vocab, 32000), size=args.prefill).tolist()
    if args.torch_side:  # child process, so its peak RSS is PyTorch's alone
        print(json.dumps(torch_side(args, model_dir, prompt)))
        return

    t_runs = []  # (prefill, decode, rss) of each fresh PyTorch process
    for _ in range(args.procs):
        child = subprocess.run([sys.executable, __file__, "--torch-side", "--dspark", args.dspark, "--threads",
                                str(args.threads), "--prefill", str(args.prefill), "--decode", str(args.decode),
                                "--reps", str(args.reps), "--model", args.model, "--compute", args.compute]
                               + (["--bf16-model"] if args.bf16_model else []),
                               capture_output=True, text=True)
        if child.returncode != 0:
            sys.exit(f"torch side failed:\n{child.stderr}")
        t_runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    t_pre, t_dec, t_rss = (max(r[i] for r in t_runs) for i in range(3))
    t_pre_med, t_dec_med = (statistics.median(r[i] for r in t_runs) for i in range(2))

    # Our side twice: with the environment as it is (this machine sets OPENBLAS_CORETYPE to
    # an AVX2 kernel) and with OpenBLAS choosing its own kernel (AVX-512 here).
    base_env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    native_env = {k: v for k, v in base_env.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    results = {"compute": args.compute, "threads": args.threads, "prefill_tokens": args.prefill, "decode_tokens": args.decode,
               "procs": args.procs, "torch_prefill_tok_s": t_pre, "torch_decode_tok_s": t_dec,
               "torch_prefill_tok_s_median": t_pre_med, "torch_decode_tok_s_median": t_dec_med,
               "torch_per_process": t_runs, "torch_peak_rss_mib": t_rss,
               "torch_version": torch.__version__, "transformers_version": transformers.__version__,
               "dspark": {}}
    print(f"peer: PyTorch {torch.__version__} CPU, transformers {transformers.__version__}, "
          f"{args.threads} threads: prefill {t_pre:.1f} tok/s, decode {t_dec:.1f} tok/s, peak RSS {t_rss:.0f} MiB "
          f"(best of {args.procs} processes; each: prefill {', '.join('%.0f' % r[0] for r in t_runs)}, "
          f"decode {', '.join('%.1f' % r[1] for r in t_runs)})")
    runs = (("environment", base_env), ("native-blas", native_env)) if args.compute == "fp32" else \
        (("environment", base_env),)
    if args.compute == "bf16":
        info = subprocess.run([args.dspark, "info", model_dir, "--compute", "bf16"], capture_output=True, text=True,
                              env=base_env).stdout
        results["bf16_gemm"] = re.search(r"bf16 compute GEMM:\s+(.+?) \(", info).group(1)
        print(f"ours: --compute bf16, bf16 GEMM {results['bf16_gemm']}")
    for label, env in runs:
        peak, kernel, _ = sgemm_peak(args, env)
        o_runs = [ours(args, model_dir, prompt, env) for _ in range(args.procs)]
        o_pre, o_cold, o_dec, o_rss = (max(r[i] for r in o_runs) for i in (0, 1, 2, 4))
        o_pre_med, o_dec_med = (statistics.median(r[i] for r in o_runs) for i in (0, 2))
        profile = max(o_runs, key=lambda r: r[0])[3]
        # the matmuls: "linear" on fp32 weights, "linear16" on the bf16 ones
        m = re.search(r"%s\s+(\d+)\s+([\d.]+)\s+([\d.]+)%%\s+([\d.]+)" % (
            "linear16" if args.compute == "bf16" or args.bf16_model else "linear"), profile)
        lin_share, lin_gflops = float(m.group(3)), float(m.group(4))
        r = {"blas_kernel": kernel, "sgemm_peak_gflops": peak, "prefill_tok_s": o_pre,
             "prefill_cold_tok_s": o_cold, "decode_tok_s": o_dec,
             "prefill_ratio_vs_torch": o_pre / t_pre, "decode_ratio_vs_torch": o_dec / t_dec,
             "prefill_tok_s_median": o_pre_med, "decode_tok_s_median": o_dec_med,
             "prefill_ratio_of_medians": o_pre_med / t_pre_med, "decode_ratio_of_medians": o_dec_med / t_dec_med,
             "per_process": [{"prefill": r[0], "prefill_cold": r[1], "decode": r[2]} for r in o_runs],
             "matmul_share_of_prefill_pct": lin_share, "matmul_gflops": lin_gflops,
             "matmul_pct_of_sgemm_peak": 100 * lin_gflops / peak, "peak_rss_mib": o_rss, "profile": profile}
        results["dspark"][label] = r
        print(f"\n== dspark, OpenBLAS kernel {kernel} ({label}); sgemm peak {peak:.1f} GFLOP/s")
        print(profile)
        print(f"{'':18s} {'dspark':>9s} {'torch':>9s} {'ratio':>6s}")
        print(f"{'prefill tokens/s':18s} {o_pre:9.1f} {t_pre:9.1f} {o_pre / t_pre:6.2f}   "
              f"(both: best of {args.reps} runs in a process, best of {args.procs} processes)")
        print(f"{'  median process':18s} {o_pre_med:9.1f} {t_pre_med:9.1f} {o_pre_med / t_pre_med:6.2f}")
        print(f"{'prefill, cold':18s} {o_cold:9.1f} {'':9s} {o_cold / t_pre:6.2f}   (ours: the first run of a fresh process)")
        print(f"{'decode tokens/s':18s} {o_dec:9.1f} {t_dec:9.1f} {o_dec / t_dec:6.2f}")
        print(f"{'  median process':18s} {o_dec_med:9.1f} {t_dec_med:9.1f} {o_dec_med / t_dec_med:6.2f}")
        print(f"{'peak RSS MiB':18s} {o_rss:9.0f} {t_rss:9.0f}")
        print(f"matmul {lin_gflops:.1f} GFLOP/s = {r['matmul_pct_of_sgemm_peak']:.0f}% of the sgemm peak, "
              f"{lin_share:.0f}% of prefill time")
    name = ("target-bf16-model-%s.json" % args.compute) if args.bf16_model else \
        "target.json" if args.compute == "fp32" else "target-bf16.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

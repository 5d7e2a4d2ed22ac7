"""Speculative decoding on this machine: the demo pair as measured, and a projection to a target
large enough that decoding is memory-bound here.

1. The demo pair (scripts/demo_toy.sh's reports, `speculate --one-at-a-time --baseline`): tokens/s
   speculative against plain, tau, and the per-round cost breakdown (draft, verification,
   bookkeeping) against the cost of one plain decoding step.
2. A random Qwen3 with the shapes of Qwen3-1.7B in bf16 (3.4 GB of weights, far beyond the
   caches; built once by bench/real_size_target.py --build-only): `dspark profile` measures the
   seconds of one target pass verifying B = 1 .. 8 tokens. With the DSpark draft's measured
   unconditional acceptance per position a_k (the demo's report), a round proposing L tokens
   commits E(L) = 1 + sum_{k<=L} a_k tokens on average and costs verify(L+1) + draft; the
   draft of such a target (one layer of its width, and its head applied to the block's rows
   in one pass, so read once, as ds_draft_block does) is estimated from the profile as
   verify(1) * (1 + head) / (n_layers + head), head = the head's weights in layers, a stated
   assumption (memory-bound: cost follows the weights read). Projected speedup(L) = E(L) * verify(1) / (verify(L+1) + draft(L)): a
   projection, not a measurement of decoding that target (no draft for it is trained here).

    $VENV/bin/python bench/spec_projection.py --dspark build/release/dspark [--demo DIR] [--dir DIR]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--demo", default=os.environ.get("DSPARK_DEMO_DIR", os.path.expanduser("~/.cache/dspark/demo")))
    ap.add_argument("--dir", default="/tmp/qwen3-1.7b-shape", help="the real-size target (built when missing)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    res = {}
    rep = json.load(open(os.path.join(args.demo, "speculate-dspark.json")))
    plain_step = 1.0 / rep["plain_decode_tokens_per_s"]
    pr = rep["per_round"]
    res["demo"] = {"tau": rep["tau"], "tokens_per_s": rep["decode_tokens_per_s"],
                   "plain_tokens_per_s": rep["plain_decode_tokens_per_s"], "speedup": rep["speedup"],
                   "per_round_s": pr, "plain_step_s": plain_step, "gemm": rep["gemm"], "threads": rep["threads"]}
    print(f"demo pair ({rep['gemm']}, {rep['threads']} threads): tau {rep['tau']:.3f}, "
          f"{rep['decode_tokens_per_s']:.1f} vs {rep['plain_decode_tokens_per_s']:.1f} tokens/s plain = "
          f"{rep['speedup']:.2f}x")
    print(f"  per round: draft {pr['draft_s'] * 1e3:.3f} ms, verify {pr['verify_s'] * 1e3:.3f} ms, bookkeeping "
          f"{pr['bookkeeping_s'] * 1e3:.3f} ms; one plain decoding step {plain_step * 1e3:.3f} ms")

    if not os.path.exists(os.path.join(args.dir, "config.json")):
        print(f"building the real-size target in {args.dir} (once; minutes)", file=sys.stderr)
        subprocess.run([sys.executable, os.path.join(HERE, "real_size_target.py"), "--dspark", args.dspark,
                        "--dir", args.dir, "--build-only"], check=True)
    prof = args.dir + "-profile.json"
    subprocess.run([args.dspark, "profile", "--target", args.dir, "--out", prof, "--max-tokens", str(args.max_tokens),
                    "--context", "128", "--reps", "3", "--threads", str(args.threads)], check=True)
    p = json.load(open(prof))
    v = p["verify_seconds"]
    cfg = json.load(open(os.path.join(args.dir, "config.json")))
    d, V, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    layer = 4 * d * d + 3 * d * cfg["intermediate_size"]  # per-layer weights, roughly (attention + MLP)
    head_share = V * d / layer  # the head's weights in units of one layer
    a = rep["accept_unconditional"]
    print(f"\nreal-size target {args.dir} ({p['gemm']}, {p['threads']} threads): verifying B tokens, ms: "
          + " ".join(f"{x * 1e3:.1f}" for x in v))
    print(f"{'L':>3} {'E(L)':>6} {'verify(L+1)/verify(1)':>22} {'draft est. ms':>13} {'projected speedup':>18}")
    rows = []
    for L in range(1, min(len(a), len(v) - 1) + 1):
        e = 1 + sum(a[:L])
        draft = v[0] * (1 + head_share) / (n + head_share)
        sp = e * v[0] / (v[L] + draft)
        rows.append({"L": L, "expected_tokens": e, "verify_ratio": v[L] / v[0], "draft_s_estimate": draft,
                     "projected_speedup": sp})
        print(f"{L:>3} {e:6.3f} {v[L] / v[0]:22.3f} {draft * 1e3:13.2f} {sp:17.2f}x")
    res["projection"] = {"target": args.dir, "profile": p, "rows": rows,
                         "assumption": "draft = verify(1) * (1 + head_share) / (n_layers + head_share)"}
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", "spec_projection.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

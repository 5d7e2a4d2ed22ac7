"""Draft quality at equal steps: DSpark (vanilla Markov head + confidence head, the
three-term loss) against the same backbone with rank 0 and CE only (DFlash-style), and the
untrained draft (step 0), on held-out sequences of the same data. Runs both trainings with
the same seed, data order and anchors, then prints accept rate and tau (mean accepted length
per block, bonus token included) per evaluation from each run's metrics.jsonl.

    python bench/draft_quality.py --dspark build/release/dspark --target MODEL_DIR --data FILE
        [--steps 400] [--out bench/out/quality]

scripts/demo_toy.sh builds the default target (a small Qwen3 trained on the Python standard
library's first half) and data (the second half)."""
import argparse
import json
import os
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")


def evals(run_dir):
    out = []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        m = json.loads(line)
        if m["kind"] == "eval":
            out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1, help="per run; the two runs go in parallel")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "quality"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    common = ["train", "--target", args.target, "--data", args.data, "--seq-len", "256", "--num-anchors", "64",
              "--steps", str(args.steps), "--batch-seqs", "4", "--draft-layers", "1", "--eval-every",
              str(max(1, args.steps // 4)), "--eval-seqs", "32", "--save-every", str(args.steps), "--lr", "2e-3",
              "--threads", str(args.threads), "--seed", "1", "--quiet"]
    runs = {"dspark": ["--markov", "vanilla", "--markov-rank", "64"],
            "dflash": ["--markov", "none", "--ce-only", "--no-confidence-head"]}
    procs = {}
    for name, extra in runs.items():
        procs[name] = subprocess.Popen([args.dspark] + common + ["--out", os.path.join(args.out, name)] + extra,
                                       stderr=subprocess.PIPE, text=True)
    for name, p in procs.items():
        _, err = p.communicate()
        if p.returncode:
            sys.exit(f"{name} run failed:\n{err[-3000:]}")
    table = {name: evals(os.path.join(args.out, name)) for name in runs}
    print(f"{'step':>6s} | {'DSpark accept':>13s} {'tau':>6s} | {'DFlash-style accept':>19s} {'tau':>6s}")
    for a, b in zip(table["dspark"], table["dflash"]):
        print(f"{a['step']:6d} | {a['accept_rate']:13.4f} {a['tau']:6.3f} | {b['accept_rate']:19.4f} {b['tau']:6.3f}")
    first, last_s, last_f = table["dspark"][0], table["dspark"][-1], table["dflash"][-1]
    print(f"untrained (step 0): accept {first['accept_rate']:.4f}, tau {first['tau']:.3f}")
    print(f"after {args.steps} steps: DSpark accept {last_s['accept_rate']:.4f} tau {last_s['tau']:.3f}; "
          f"DFlash-style accept {last_f['accept_rate']:.4f} tau {last_f['tau']:.3f} "
          f"(DSpark tau {100 * (last_s['tau'] / last_f['tau'] - 1):+.1f}%)")
    print("per-position acceptance (DSpark):", " ".join(f"{x:.3f}" for x in last_s["accept_per_position"]))
    print("per-position acceptance (DFlash):", " ".join(f"{x:.3f}" for x in last_f["accept_per_position"]))
    json.dump(table, open(os.path.join(args.out, "quality.json"), "w"), indent=1)


if __name__ == "__main__":
    main()

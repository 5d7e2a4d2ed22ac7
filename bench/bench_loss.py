"""DSpark loss benchmark: the loss forward + backward alone at a real vocabulary (V = 151936,
Qwen3), ours (`dspark loss`) against PyTorch eager on the same inputs, same machine, same
thread count, in one run.

Peers:
  torch chunked    the DeepSpec-style chunked loss: 128 rows at a time, fp32 log-softmax of
                   draft and teacher, CE + raw L1 + confidence BCE, autograd backward per chunk
                   into a preallocated [R, V] gradient
  torch unchunked  the straightforward full-batch formula with autograd (skipped when its
                   estimated peak would not fit comfortably in memory)
Each side runs in its own process under /usr/bin/time -v: time of the loss alone (ours: the
timing line `dspark loss` prints; torch: perf_counter around forward + backward) and peak RSS.
Inputs are loaded and the preallocated gradient buffers (ours, torch chunked) touched before
the clock starts, as for a trainer that reuses them every step; torch unchunked allocates its
gradients inside autograd, which is part of that approach.
Inputs (draft and teacher logits [R, V] fp32) and the [R, V] gradient are part of every
side's RSS; the table also shows the peak minus that common floor ("extra").
Prints a table and writes bench/out/loss.json.

    $VENV/bin/python bench/bench_loss.py --dspark build/release/dspark [--threads 2] [--rows 448,3584]
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

V_DEFAULT = 151936
ALPHA = (0.1, 0.9, 1.0)
GAMMA = 4.0


def make_input(path, R, V, g, seed):
    """Random draft / teacher logits (the teacher near the draft on half the rows), ids,
    masks with a few dropped anchors and masked tails, confidence logits."""
    import torch
    from safetensors.torch import save_file
    gen = torch.Generator().manual_seed(seed)
    B = R // g
    draft = torch.randn(R, V, generator=gen) * 3
    target = torch.randn(R, V, generator=gen) * 3
    close = torch.rand(R, generator=gen) < 0.5
    target[close] = draft[close] + 0.3 * target[close] / 3
    ids = torch.randint(0, V, (R,), generator=gen, dtype=torch.int32)
    em = torch.ones(B, g, dtype=torch.uint8)
    em[::5, 5:] = 0
    bk = torch.ones(B, dtype=torch.uint8)
    bk[3::17] = 0
    conf = torch.randn(R, generator=gen)
    save_file({"draft_logits": draft, "target_logits": target, "target_ids": ids, "eval_mask": em.reshape(-1),
               "block_keep_mask": bk, "conf_logits": conf}, path)


def torch_loss_rows(x, t, ids, w, sup, z):
    """Numerator of spec section 4 for a set of rows (float32), unsupervised rows selected out."""
    import torch
    import torch.nn.functional as F
    zero = torch.zeros_like(w)
    x = torch.where(sup[:, None], x, torch.zeros_like(x))
    t = torch.where(sup[:, None], t, torch.zeros_like(t))
    logq = torch.log_softmax(x.float(), dim=-1)
    ce = -logq.gather(1, torch.where(sup, ids, torch.zeros_like(ids))[:, None].long())[:, 0]
    p = torch.softmax(t.float(), dim=-1)
    l1 = (logq.exp() - p).abs().sum(-1)
    accept = torch.clamp(1 - 0.5 * l1.detach(), 0, 1)
    bce = F.binary_cross_entropy_with_logits(torch.where(sup, z, zero), accept, reduction="none")
    return ALPHA[0] * (w * ce).sum() + ALPHA[1] * (w * l1).sum() + ALPHA[2] * (w * bce).sum()


def worker(args):
    import torch
    from safetensors.torch import load_file
    torch.set_num_threads(args.threads)
    d = load_file(args.input)
    draft, target, ids, conf = d["draft_logits"], d["target_logits"], d["target_ids"], d["conf_logits"]
    R, V = draft.shape
    g = args.g
    sup = (d["eval_mask"].bool() & d["block_keep_mask"].bool().repeat_interleave(g))
    k = torch.arange(R) % g
    w = torch.where(sup, torch.exp(-k.float() / GAMMA), torch.zeros(R))
    if args.worker == "chunked":  # the gradient buffers exist (and are touched) before the clock, as in ours
        grad = torch.zeros(R, V)
        gconf = torch.zeros(R)
    t0 = time.perf_counter()
    if args.worker == "chunked":
        num = 0.0
        for r0 in range(0, R, 128):
            sl = slice(r0, min(R, r0 + 128))
            x = draft[sl].clone().requires_grad_(True)
            z = conf[sl].clone().requires_grad_(True)
            n = torch_loss_rows(x, target[sl], ids[sl], w[sl], sup[sl], z)
            n.backward()
            grad[sl] = x.grad
            gconf[sl] = z.grad
            num += n.item()
    else:
        x = draft.requires_grad_(True)
        z = conf.clone().requires_grad_(True)
        n = torch_loss_rows(x, target, ids, w, sup, z)
        n.backward()
        num = n.item()
    dt = time.perf_counter() - t0
    print(json.dumps({"time_s": dt, "numerator": num}))


def run_timed(cmd, env):
    """Runs cmd under /usr/bin/time -v; returns (stdout, stderr, peak RSS MiB)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    return p.stdout, p.stderr, rss


def mem_available_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dspark", help="the dspark program")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="448,3584", help="comma-separated row counts (multiples of --g)")
    ap.add_argument("--V", type=int, default=V_DEFAULT)
    ap.add_argument("--g", type=int, default=7)
    ap.add_argument("--reps", type=int, default=2, help="runs per side; the best time and the max RSS are kept")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    ap.add_argument("--tmp", default="/tmp/dspark-bench-loss")
    ap.add_argument("--worker", choices=["chunked", "unchunked"], help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not args.dspark:
        ap.error("--dspark is required")
    import torch
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.tmp, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    results = []
    for R in [int(r) for r in args.rows.split(",")]:
        assert R % args.g == 0, f"--rows {R} is not a multiple of g = {args.g}"
        V = args.V
        inp = os.path.join(args.tmp, f"in-{R}.safetensors")
        outp = os.path.join(args.tmp, f"out-{R}.safetensors")
        t0 = time.perf_counter()
        make_input(inp, R, V, args.g, seed=R)
        print(f"R={R}: input written in {time.perf_counter() - t0:.1f} s", flush=True)
        tensor_mib = R * V * 4 / 2**20
        floor_mib = 3 * tensor_mib  # draft + teacher + gradient, held by every side
        row = {"rows": R, "V": V, "g": args.g, "threads": args.threads, "tensor_mib": tensor_mib,
               "floor_mib": floor_mib}
        best, rss_max, num = 1e30, 0.0, None
        for _ in range(args.reps):
            out, err, rss = run_timed([args.dspark, "loss", inp, "--out", outp, "--threads", str(args.threads)], env)
            best = min(best, float(re.search(r"forward\+backward: ([\d.]+) s", err).group(1)))
            rss_max = max(rss_max, rss)
            num = float(re.search(r"numerator (\S+)", out).group(1))
        os.remove(outp)
        row["ours"] = {"time_s": best, "peak_rss_mib": rss_max, "numerator": num}
        for mode in ("chunked", "unchunked"):
            # unchunked: inputs + about 10 full [R, V] fp32 temporaries in forward and backward
            est = floor_mib + 10 * tensor_mib
            if mode == "unchunked" and est > 0.7 * mem_available_mib():
                row["torch_" + mode] = {"skipped": f"estimated peak {est / 1024:.1f} GiB > 70% of available memory"}
                continue
            best, rss_max, tnum = 1e30, 0.0, None
            for _ in range(args.reps):
                out, _, rss = run_timed([sys.executable, os.path.abspath(__file__), "--worker", mode, "--input", inp,
                                         "--threads", str(args.threads), "--g", str(args.g)], env)
                res = json.loads(out.strip().splitlines()[-1])
                best = min(best, res["time_s"])
                rss_max = max(rss_max, rss)
                tnum = res["numerator"]
            row["torch_" + mode] = {"time_s": best, "peak_rss_mib": rss_max, "numerator": tnum}
        os.remove(inp)
        results.append(row)

    print(f"\nDSpark loss forward+backward, V={args.V}, g={args.g}, {args.threads} threads "
          f"(torch {torch.__version__}); RSS in MiB, extra = peak - (draft + teacher + grad)")
    print(f"{'rows':>6} {'side':<16} {'time s':>8} {'peak RSS':>9} {'extra':>8} {'vs ours':>8} {'rel diff num':>12}")
    for row in results:
        ours = row["ours"]
        for side in ("ours", "torch_chunked", "torch_unchunked"):
            r = row[side]
            if "skipped" in r:
                print(f"{row['rows']:>6} {side:<16} skipped: {r['skipped']}")
                continue
            ratio = r["time_s"] / ours["time_s"]
            diff = abs(r["numerator"] - ours["numerator"]) / abs(ours["numerator"])
            print(f"{row['rows']:>6} {side:<16} {r['time_s']:>8.3f} {r['peak_rss_mib']:>9.0f} "
                  f"{r['peak_rss_mib'] - row['floor_mib']:>8.0f} {ratio:>7.2f}x {diff:>12.1e}")
    report = {"benchmark": "dspark loss forward+backward", "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "torch": torch.__version__, "threads": args.threads, "results": results}
    path = os.path.join(args.out, "loss.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

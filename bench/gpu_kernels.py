#!/usr/bin/env python3
"""The CUDA backend's kernels against PyTorch on the same GPU, at a real draft step's shapes.

Runs bench_cuda_kernels (our backend, one JSON line per operation) and the same operations in
PyTorch eager (torch.matmul without TF32 for fp32, bf16 matmuls with fp32 accumulation,
scaled_dot_product_attention for the attentions: causal over whole sequences, and the draft's
block attention as a boolean mask over [context ; own block], as an eager DFlash-style
implementation runs it), then prints one table: time, TFLOP/s and our speed-up per operation,
and the bf16 dense peak measured by a large square matmul (the denominator of "share of the
tensor-core peak"). Writes the rows as JSON lines too (--jsonl).

    python3 bench/gpu_kernels.py --bin build/gpu/bench_cuda_kernels [--reps 10] [--jsonl FILE]

Peer: PyTorch eager with its own cuBLAS / flash kernels. Attention on our side runs in fp32;
PyTorch's is timed in fp32 (its memory-efficient / math kernels) and in bf16 (flash).
"""
import argparse
import json
import math
import subprocess
import sys
import time


def timed(fn, reps):
    import torch
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def sdpa_rows(rows, op, shape, q_shape, kv_shape, how, pairs, hd, reps):
    """PyTorch's scaled_dot_product_attention (GQA; `how`: is_causal or attn_mask), forward and
    backward, in fp32 and bf16; pairs: visible (query, key, head) triples for the TFLOP/s."""
    import torch
    import torch.nn.functional as F
    for mode, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        q = torch.randn(*q_shape, device="cuda", dtype=dt, requires_grad=True)
        k = torch.randn(*kv_shape, device="cuda", dtype=dt, requires_grad=True)
        v = torch.randn(*kv_shape, device="cuda", dtype=dt, requires_grad=True)
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **how)
        sec = timed(fwd, reps)
        rows.append(dict(op=op, mode=mode, shape=shape, ms=sec * 1e3, tflops=4 * hd * pairs / sec / 1e12))
        o = fwd()
        do = torch.randn_like(o)
        sec = timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), reps)
        rows.append(dict(op=op + "_backward", mode=mode, shape=shape, ms=sec * 1e3,
                         tflops=10 * hd * pairs / sec / 1e12))
        del q, k, v, o, do
        torch.cuda.empty_cache()


def torch_rows(reps):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    rows = []
    shapes = [(3584, 2560, 151936, "lm_head"), (3584, 2560, 4096, "q_proj"),
              (3584, 2560, 19456, "gate_up"), (3584, 9728, 2560, "down")]
    for mode, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for n, k, m, name in shapes:
            x = torch.rand(n, k, device=dev, dtype=dt) - 0.5
            w = torch.rand(m, k, device=dev, dtype=dt) - 0.5
            dy = torch.rand(n, m, device=dev, dtype=dt) - 0.5
            fl = 2.0 * n * k * m
            shape = f"{name} {n}x{k} @ {m}x{k}^T"
            sec = timed(lambda: x @ w.t(), reps)
            rows.append(dict(op="linear", mode=mode, shape=shape, ms=sec * 1e3, tflops=fl / sec / 1e12))
            sec = timed(lambda: (dy @ w, dy.t() @ x), reps)
            rows.append(dict(op="linear_backward", mode=mode, shape=shape, ms=sec * 1e3,
                             tflops=2 * fl / sec / 1e12))
            del x, w, dy
            torch.cuda.empty_cache()
    H, KV, hd, L, S = 32, 8, 128, 2048, 2
    pairs = S * L * (L + 1) / 2 * H
    shape = f"{S} seqs x {L}, heads {H}/{KV}, hd {hd}"
    sdpa_rows(rows, "attention_causal_train", shape, (S, H, L, hd), (S, KV, L, hd), dict(is_causal=True),
              pairs, hd, reps)
    # block attention: 512 blocks of 7 over a 2048-token context, lengths drawn uniformly
    nb, g = 512, 7
    gen = torch.Generator().manual_seed(3)
    ctx = torch.randint(1, L, (nb,), generator=gen)
    qrows = nb * g
    blk_of = torch.arange(qrows) // g
    kpos = torch.arange(L + qrows)
    mask = torch.where(kpos[None, :] < L, kpos[None, :] < ctx[blk_of][:, None],
                       ((kpos[None, :] - L) // g) == blk_of[:, None]).to(dev)
    bpairs = float(((ctx + g) * g).sum()) * H
    shape = f"{nb} blocks x {g}, ctx {L}, heads {H}/{KV}, hd {hd}"
    sdpa_rows(rows, "block_attention", shape, (1, H, qrows, hd), (1, KV, L + qrows, hd), dict(attn_mask=mask),
              bpairs, hd, reps)
    return rows


def bf16_peak():
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    sec = timed(lambda: a @ b, 20)
    return 2 * 8192 ** 3 / sec / 1e12


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="bench_cuda_kernels of a DSPARK_CUDA build")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--jsonl", help="write every row here")
    a = ap.parse_args()
    ours = []
    p = subprocess.run([a.bin, str(a.reps)], capture_output=True, text=True)
    sys.stderr.write(p.stderr)
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            ours.append(json.loads(line))
    if p.returncode != 0:
        print(f"gpu_kernels: {a.bin} exited {p.returncode}", file=sys.stderr)
    import torch
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    peak = bf16_peak()
    print(f"bf16 dense matmul 8192^3 (torch): {peak:.0f} TFLOP/s")
    theirs = torch_rows(a.reps)
    key = lambda r: (r["op"], r["mode"], r["shape"])
    tmap = {key(r): r for r in theirs}
    print(f"| op | shape | mode | ours ms | torch ms | ours TFLOP/s | speed-up | torch bf16 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in ours:
        t = tmap.get(key(r))
        tb = tmap.get((r["op"], "bf16", r["shape"])) if r["mode"] == "fp32" and "attention" in r["op"] else None
        cells = [r["op"], r["shape"], r["mode"], f"{r['ms']:.3f}", f"{t['ms']:.3f}" if t else "-",
                 f"{r['tflops']:.1f}", f"{t['ms'] / r['ms']:.2f}x" if t else "-", f"{tb['ms']:.3f}" if tb else "-"]
        print("| " + " | ".join(cells) + " |")
    if a.jsonl:
        with open(a.jsonl, "w") as f:
            for r in ours:
                f.write(json.dumps(dict(side="dspark", **r)) + "\n")
            for r in theirs:
                f.write(json.dumps(dict(side="torch", **r)) + "\n")
            f.write(json.dumps(dict(side="torch", op="bf16_peak_8192", tflops=peak)) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Training kernels against PyTorch autograd on the same inputs.

    python test_kernels_torch.py --dspark BUILD/dspark --tmp TMPDIR

Uses the unit-test binary next to dspark (BUILD/kernel_dump IN OUT): Python writes
seeded random fp32 inputs for each case (linear, linear_w on a frozen BF16 / F16 weight, rmsnorm,
rope, swiglu, block attention) with
safetensors; the binary runs forward and backward of every case on the cpu and the reference
backends and writes outputs and gradients. PyTorch computes the same in float64 from the same
fp32 inputs (F.linear, a hand-written rmsnorm in HF order, rotate_half rope with the fp32
angle pos * inv_freq, silu(gate) * up, block attention as an explicit masked softmax over
[context ; block] keys, block by block, and the causal attention of packed sequences with
scaled_dot_product_attention(is_causal=True, enable_gqa=True) per sequence) and autograd gives the gradients of
L = sum(dy * y) with random dy. Every output and gradient of both backends must be within
1e-4 normwise relative error (max|ours - ref| / max|ref|); dropped blocks must give exactly
0 outputs and gradients and -inf log-sum-exp. Exits 1 on any failure; prints
"N passed, M failed".
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

TOL = 1e-4
BACKENDS = ("cpu", "ref")


def rnd(g, *shape, scale=1.0):
    return ((torch.rand(*shape, generator=g, dtype=torch.float32) * 2 - 1) * scale).contiguous()


# ---------------------------------------------------------------- torch references (float64)

def ref_linear(t):
    x, w, dy = (t[k].double().requires_grad_() for k in ("x", "w", "dy"))
    b = t["b"].double().requires_grad_() if "b" in t else None
    y = F.linear(x, w, b)
    (y * dy).sum().backward()
    out = {"y": y, "dx": x.grad, "dw": w.grad}
    if b is not None:
        out["db"] = b.grad
    return out


def ref_linear_w(t):
    """A frozen weight stored in bf16 / f16: F.linear on its exact float64 value; dx only."""
    x, dy = t["x"].double().requires_grad_(), t["dy"].double()
    w = t["w"].double()
    y = F.linear(x, w, t["b"].double() if "b" in t else None)
    (y * dy).sum().backward()
    return {"y": y, "dx": x.grad}


def ref_rmsnorm(t):
    x, w = t["x"].double().requires_grad_(), t["w"].double().requires_grad_()
    eps = float(t["eps"][0])
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    y = w * (x * rstd)
    (y * t["dy"].double()).sum().backward()
    return {"y": y, "rstd": rstd[:, 0], "dx": x.grad, "dw": w.grad}


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def ref_rope(t):
    heads, hd = (int(v) for v in t["cfg"])
    x = t["x"].double().requires_grad_()
    n, stride = x.shape
    # fp32 angle as transformers computes it (inv_freq @ position_ids in fp32), cos/sin in float64
    ang = (t["pos"].float()[:, None] * t["inv_freq"][None, :]).double()
    emb = torch.cat((ang, ang), dim=-1)[:, None, :]  # [n, 1, hd]
    xr = x[:, :heads * hd].view(n, heads, hd)
    yr = xr * emb.cos() + rotate_half(xr) * emb.sin()
    y = torch.cat((yr.reshape(n, heads * hd), x[:, heads * hd:]), dim=1)
    (y * t["dy"].double()).sum().backward()
    return {"y": y, "dx": x.grad}


def ref_swiglu(t):
    gu = t["gu"].double().requires_grad_()
    inter = gu.shape[1] // 2
    out = F.silu(gu[:, :inter]) * gu[:, inter:]
    (out * t["dout"].double()).sum().backward()
    return {"out": out, "dgu": gu.grad}


def ref_attn(t):
    g, nh, nkv, hd = (int(v) for v in t["cfg"])
    scale = float(t["scale"][0])
    ctx_len = [int(v) for v in t["ctx_len"]]
    nb, n_ctx = len(ctx_len), t["k_ctx"].shape[0]
    q, kc, vc, kb, vb = (t[k].double().requires_grad_() for k in ("q", "k_ctx", "v_ctx", "k_blk", "v_blk"))
    group = nh // nkv
    outs, lses = [], []
    for b in range(nb):
        rows = slice(b * g, (b + 1) * g)
        L = ctx_len[b]
        if L < 0:  # dropped block: no visible key, output 0, no gradient
            outs.append(torch.zeros(g, nh * hd, dtype=torch.float64))
            lses.append(torch.full((g, nh), float("-inf"), dtype=torch.float64))
            continue
        keys = torch.cat((kc, kb[rows]), 0).view(n_ctx + g, nkv, hd)
        vals = torch.cat((vc, vb[rows]), 0).view(n_ctx + g, nkv, hd)
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [nh, n_ctx+g, hd]
        vals = vals.repeat_interleave(group, dim=1).transpose(0, 1)
        qb = q[rows].view(g, nh, hd).transpose(0, 1)  # [nh, g, hd]
        mask = torch.zeros(g, n_ctx + g, dtype=torch.bool)
        mask[:, :L] = True
        mask[:, n_ctx:] = True
        s = (qb @ keys.transpose(1, 2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        outs.append((p @ vals).transpose(0, 1).reshape(g, nh * hd))
        lses.append(torch.logsumexp(s, dim=-1).transpose(0, 1))
    out = torch.cat(outs, 0)
    (out * t["dout"].double()).sum().backward()
    zero = torch.zeros_like
    return {"out": out, "lse": torch.cat(lses, 0),
            "dq": q.grad if q.grad is not None else zero(q), "dk_ctx": kc.grad if kc.grad is not None else zero(kc),
            "dv_ctx": vc.grad if vc.grad is not None else zero(vc),
            "dk_blk": kb.grad if kb.grad is not None else zero(kb),
            "dv_blk": vb.grad if vb.grad is not None else zero(vb)}


def ref_cattn(t):
    """Causal self-attention of each packed sequence alone, with torch's scaled_dot_product_attention
    (is_causal=True, enable_gqa=True) in float64; lse as logsumexp of the masked scaled scores."""
    nh, nkv, hd = (int(v) for v in t["cfg"])
    scale = float(t["scale"][0])
    off = [int(v) for v in t["seq_off"]]
    q, k, v = (t[n].double().requires_grad_() for n in ("q", "k", "v"))
    outs, lses = [], []
    for s in range(len(off) - 1):
        a, b = off[s], off[s + 1]
        if b == a:
            continue
        n = b - a
        qs = q[a:b].view(n, nh, hd).transpose(0, 1)[None]  # [1, nh, n, hd]
        ks = k[a:b].view(n, nkv, hd).transpose(0, 1)[None]
        vs = v[a:b].view(n, nkv, hd).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        outs.append(o[0].transpose(0, 1).reshape(n, nh * hd))
        kr = ks[0].repeat_interleave(nh // nkv, dim=0)
        sc = (qs[0] @ kr.transpose(1, 2)) * scale
        sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        lses.append(torch.logsumexp(sc, dim=-1).transpose(0, 1))
    out = torch.cat(outs, 0)
    (out * t["dout"].double()).sum().backward()
    return {"out": out, "lse": torch.cat(lses, 0), "dq": q.grad, "dk": k.grad, "dv": v.grad}


REFS = {"linear": ref_linear, "linear_w": ref_linear_w, "rmsnorm": ref_rmsnorm, "rope": ref_rope, "swiglu": ref_swiglu, "attn": ref_attn,
        "cattn": ref_cattn}


# ---------------------------------------------------------------- cases

def attn_case(gen, g, nb, n_ctx, nh, nkv, hd, ctx_len=None, amp=1.0):
    """Inputs of one block attention case; ctx_len random in [-1, n_ctx] when not given."""
    if ctx_len is None:
        ctx_len = torch.randint(-1, n_ctx + 1, (nb,), generator=gen).tolist()
    return {"q": rnd(gen, nb * g, nh * hd, scale=amp), "k_ctx": rnd(gen, n_ctx, nkv * hd, scale=amp),
            "v_ctx": rnd(gen, n_ctx, nkv * hd), "k_blk": rnd(gen, nb * g, nkv * hd, scale=amp),
            "v_blk": rnd(gen, nb * g, nkv * hd), "dout": rnd(gen, nb * g, nh * hd),
            "ctx_len": torch.tensor(ctx_len, dtype=torch.int64),
            "cfg": torch.tensor([g, nh, nkv, hd], dtype=torch.int64),
            "scale": torch.tensor([hd ** -0.5], dtype=torch.float32)}


def build_cases(seed):
    gen = torch.Generator().manual_seed(seed)
    cases = {}
    cases["lin0"] = ("linear", {"x": rnd(gen, 7, 33), "w": rnd(gen, 17, 33), "b": rnd(gen, 17), "dy": rnd(gen, 7, 17)})
    cases["lin1"] = ("linear", {"x": rnd(gen, 70, 64), "w": rnd(gen, 96, 64), "dy": rnd(gen, 70, 96)})  # no bias
    cases["lin2"] = ("linear", {"x": rnd(gen, 1, 48), "w": rnd(gen, 20, 48), "b": rnd(gen, 20), "dy": rnd(gen, 1, 20)})
    # frozen 16-bit weights: decode (1 row, the direct path), prefill (40 rows, the chunked path)
    cases["lw0"] = ("linear_w", {"x": rnd(gen, 1, 70), "w": rnd(gen, 37, 70).to(torch.bfloat16),
                                 "b": rnd(gen, 37), "dy": rnd(gen, 1, 37)})
    cases["lw1"] = ("linear_w", {"x": rnd(gen, 40, 64), "w": rnd(gen, 96, 64).to(torch.float16), "dy": rnd(gen, 40, 96)})
    cases["lw2"] = ("linear_w", {"x": rnd(gen, 40, 33), "w": rnd(gen, 17, 33).to(torch.bfloat16), "dy": rnd(gen, 40, 17)})
    cases["rms0"] = ("rmsnorm", {"x": rnd(gen, 9, 80, scale=3), "w": 1 + 0.2 * rnd(gen, 80),
                                 "eps": torch.tensor([1e-6]), "dy": rnd(gen, 9, 80)})
    cases["rms1"] = ("rmsnorm", {"x": rnd(gen, 33, 512, scale=0.01), "w": rnd(gen, 512),
                                 "eps": torch.tensor([1e-5]), "dy": rnd(gen, 33, 512)})
    inv = 1.0 / (10000.0 ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32))
    cases["rope0"] = ("rope", {"x": rnd(gen, 6, 3 * 32 + 16), "dy": rnd(gen, 6, 3 * 32 + 16),
                               "pos": torch.tensor([0, 1, 7, 100, 511, 4000], dtype=torch.int64),
                               "inv_freq": inv.contiguous(), "cfg": torch.tensor([3, 32], dtype=torch.int64)})
    gu = rnd(gen, 5, 74, scale=6)
    gu[0, 0], gu[0, 1] = 40.0, -40.0
    cases["swi0"] = ("swiglu", {"gu": gu, "dout": rnd(gen, 5, 37)})
    # block attention: ctx 0, dropped, full and partial contexts, GQA 2
    cases["att0"] = ("attn", attn_case(gen, 3, 5, 9, 4, 2, 8, ctx_len=[0, 4, -1, 9, 2], amp=1.5))
    # decode: every block sees the whole context; MQA
    cases["att1"] = ("attn", attn_case(gen, 7, 2, 30, 6, 1, 16, ctx_len=[30, 30]))
    # training-like: g 7, 8 heads over 2 kv heads, head_dim 32, random contexts (some dropped)
    cases["att2"] = ("attn", attn_case(gen, 7, 12, 64, 8, 2, 32))
    # no GQA, sharp scores
    cases["att3"] = ("attn", attn_case(gen, 4, 3, 10, 4, 4, 16, ctx_len=[10, 0, 6], amp=3.0))
    # causal attention over packed sequences: GQA 2 with an empty sequence and one longer than a
    # query chunk (64); MQA on one sequence (per-part buffers on 2 and 3 threads); MHA, sharp scores
    cases["catt0"] = ("cattn", cattn_case(gen, [70, 0, 9, 33], 8, 2, 16))
    cases["catt1"] = ("cattn", cattn_case(gen, [150], 4, 1, 32))
    cases["catt2"] = ("cattn", cattn_case(gen, [12, 5], 3, 3, 8, amp=3.0))
    return cases


def cattn_case(gen, lens, nh, nkv, hd, amp=1.0):
    """Inputs of one causal attention case over sequences of the given lengths."""
    rows = sum(lens)
    off = [0]
    for n in lens:
        off.append(off[-1] + n)
    return {"q": rnd(gen, rows, nh * hd, scale=amp), "k": rnd(gen, rows, nkv * hd, scale=amp),
            "v": rnd(gen, rows, nkv * hd), "dout": rnd(gen, rows, nh * hd),
            "seq_off": torch.tensor(off, dtype=torch.int64), "cfg": torch.tensor([nh, nkv, hd], dtype=torch.int64),
            "scale": torch.tensor([hd ** -0.5], dtype=torch.float32)}


def main():
    args = common.parse_args(__doc__.splitlines()[1])
    exe = os.path.join(os.path.dirname(os.path.abspath(args.dspark)), "kernel_dump")
    if not os.path.exists(exe):
        print(f"FAIL: {exe} not found (build the kernel_dump target)", flush=True)
        sys.exit(1)
    chk = common.Checker()
    cases = build_cases(seed=20240611)
    tensors, order = {}, []
    for prefix, (kind, t) in cases.items():
        order.append(f"{kind}:{prefix}")
        for k, v in t.items():
            tensors[f"{prefix}.{k}"] = v.contiguous()
    in_path = os.path.join(args.tmp, "kernels_in.safetensors")
    out_path = os.path.join(args.tmp, "kernels_out.safetensors")
    save_file(tensors, in_path, metadata={"cases": ",".join(order)})
    for threads in ("1", "2", "3"):  # one part per kv head, and per-part buffers (3 threads over 2 kv heads)
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        common.run([exe, in_path, out_path], env=env)
        got = load_file(out_path)
        for prefix, (kind, t) in cases.items():
            want = REFS[kind](t)
            for be in BACKENDS:
                for name, ref in want.items():
                    key = f"{be}.{prefix}.{name}"
                    what = f"{key} ({threads} threads)"
                    if not chk.check(key in got, f"{what}: missing from the dump"):
                        continue
                    ours = got[key].astype(np.float64)
                    ref = ref.detach().numpy()
                    if not chk.check(ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"):
                        continue
                    if name == "lse":  # dropped rows exactly -inf, the others compared
                        dropped = np.isneginf(ref)
                        chk.check(np.array_equal(np.isneginf(ours), dropped), f"{what}: -inf rows differ")
                        ours, ref = ours[~dropped], ref[~dropped]
                    if kind == "attn":  # dropped blocks: exactly zero outputs and gradients of their rows
                        g = int(t["cfg"][0])
                        for b, L in enumerate(t["ctx_len"].tolist()):
                            if L < 0 and name in ("out", "dq", "dk_blk", "dv_blk"):
                                chk.check(not np.any(ours[b * g:(b + 1) * g]), f"{what}: dropped block {b} not 0")
                    err = common.normwise_rel_err(ours, ref)
                    chk.check(np.all(np.isfinite(ours)) and err < TOL, f"{what}: normwise rel err {err:.3g}")
    chk.finish("test_kernels_torch")


if __name__ == "__main__":
    main()

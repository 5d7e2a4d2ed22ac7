"""Draft conformance: a PyTorch reference of the DSpark draft forward and loss, written here
from spec/dspark.md sections 2-4, against `dspark draft-forward --loss` on random tiny drafts
(vanilla / gated / rnn / no Markov head; with and without the confidence head and its Markov
input; a dropped anchor; NaN teacher states where only unsupervised slots read them; decay
variants). Checked within 1e-4 normwise relative error (max|ours - ref| / max|ref|): block
logits, confidence logits, the loss numerator, every reporting pair, the per-position
acceptance, and the gradient of every trainable tensor. The draft is written in the HF
export layout (spec section 7) by this test, so loading that layout is checked too."""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

TOL = 1e-4
V, D, HQ, HKV, HD, I, ND, M, G, T = 50, 32, 4, 2, 8, 48, 2, 2, 4, 20
EPS = 1e-6
THETA = 10000.0
L_TARGET = 6


def rmsnorm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rope(x, pos):
    """x [n, H, hd]; HF rotate_half with fp32 angles."""
    inv = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :].to(x.dtype)
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def make_params(case, gen):
    r = case["rank"]
    p = {}

    def rnd(*shape, s=0.3):
        return (s * torch.randn(*shape, generator=gen, dtype=torch.float64))

    p["embed_tokens.weight"] = rnd(V, D, s=1.0)
    p["lm_head.weight"] = rnd(V, D, s=0.5)
    for i in range(ND):
        pre = f"layers.{i}."
        p[pre + "self_attn.q_proj.weight"] = rnd(HQ * HD, D)
        p[pre + "self_attn.k_proj.weight"] = rnd(HKV * HD, D)
        p[pre + "self_attn.v_proj.weight"] = rnd(HKV * HD, D)
        p[pre + "self_attn.o_proj.weight"] = rnd(D, HQ * HD)
        p[pre + "self_attn.q_norm.weight"] = 1 + rnd(HD, s=0.2)
        p[pre + "self_attn.k_norm.weight"] = 1 + rnd(HD, s=0.2)
        p[pre + "mlp.gate_proj.weight"] = rnd(I, D)
        p[pre + "mlp.up_proj.weight"] = rnd(I, D)
        p[pre + "mlp.down_proj.weight"] = rnd(D, I)
        p[pre + "input_layernorm.weight"] = 1 + rnd(D, s=0.2)
        p[pre + "post_attention_layernorm.weight"] = 1 + rnd(D, s=0.2)
    p["fc.weight"] = rnd(D, M * D)
    p["hidden_norm.weight"] = 1 + rnd(D, s=0.2)
    p["norm.weight"] = 1 + rnd(D, s=0.2)
    if r:
        p["markov_head.markov_w1.weight"] = rnd(V, r, s=1.0)
        p["markov_head.markov_w2.weight"] = rnd(V, r, s=0.5)
    if case["markov"] == "gated":
        p["markov_head.gate_proj.weight"] = rnd(r, D + r)
        p["markov_head.gate_proj.bias"] = rnd(r, s=0.1)
    if case["markov"] == "rnn":
        p["markov_head.joint_proj.weight"] = rnd(3 * r, 2 * r + D)
        p["markov_head.joint_proj.bias"] = rnd(3 * r, s=0.1)
    if case["conf"]:
        p["confidence_head.proj.weight"] = rnd(1, D + (r if case["conf_markov"] else 0))
        p["confidence_head.proj.bias"] = rnd(1, s=0.1)
    return p


def write_draft(case, params, path):
    os.makedirs(path, exist_ok=True)
    cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "vocab_size": V, "hidden_size": D,
           "intermediate_size": I, "num_hidden_layers": ND, "num_attention_heads": HQ, "num_key_value_heads": HKV,
           "head_dim": HD, "rms_norm_eps": EPS, "rope_theta": THETA, "max_position_embeddings": 128,
           "num_target_layers": L_TARGET, "block_size": G, "mask_token_id": V - 1, "target_layer_ids": [1, 3],
           "num_anchors": 8, "enable_confidence_head": case["conf"],
           "confidence_head_with_markov": case["conf_markov"], "markov_rank": case["rank"],
           "markov_head_type": case["markov"], "tie_word_embeddings": False,
           "layer_types": ["full_attention"] * ND}
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    save_file({k: v.float().contiguous() for k, v in params.items()}, os.path.join(path, "model.safetensors"))


def reference(case, p, ctx, last, ids, anchors, keep, eval_mask, loss_cfg):
    """Draft forward + DSpark loss in float64 autograd, straight from the spec."""
    r = case["rank"]
    B = len(anchors)
    h_ctx = rmsnorm(ctx @ p["fc.weight"].T, p["hidden_norm.weight"])  # [T, D]
    toks = torch.full((B, G), V - 1, dtype=torch.long)
    pos = torch.zeros((B, G), dtype=torch.long)
    for b in range(B):
        a = anchors[b] if keep[b] else 0
        toks[b, 0] = ids[a] if keep[b] else V - 1
        pos[b] = torch.arange(a, a + G)
    H = p["embed_tokens.weight"][toks]  # [B, G, D]
    # visibility: context j < a, own block all; a dropped block sees nothing (output 0)
    vis = torch.zeros((B, T + G), dtype=torch.bool)
    for b in range(B):
        if keep[b]:
            vis[b, : anchors[b]] = True
            vis[b, T:] = True
    scale = 1.0 / math.sqrt(HD)
    for i in range(ND):
        pre = f"layers.{i}."
        hn = rmsnorm(H, p[pre + "input_layernorm.weight"])
        q = (hn @ p[pre + "self_attn.q_proj.weight"].T).view(B * G, HQ, HD)
        q = rope(rmsnorm(q, p[pre + "self_attn.q_norm.weight"]), pos.reshape(-1)).view(B, G, HQ, HD)
        kb = (hn @ p[pre + "self_attn.k_proj.weight"].T).view(B * G, HKV, HD)
        kb = rope(rmsnorm(kb, p[pre + "self_attn.k_norm.weight"]), pos.reshape(-1)).view(B, G, HKV, HD)
        vb = (hn @ p[pre + "self_attn.v_proj.weight"].T).view(B, G, HKV, HD)
        kc = (h_ctx @ p[pre + "self_attn.k_proj.weight"].T).view(T, HKV, HD)
        kc = rope(rmsnorm(kc, p[pre + "self_attn.k_norm.weight"]), torch.arange(T))
        vc = (h_ctx @ p[pre + "self_attn.v_proj.weight"].T).view(T, HKV, HD)
        outs = []
        for b in range(B):
            k = torch.cat([kc, kb[b]], 0).repeat_interleave(HQ // HKV, dim=1)  # [T+G, HQ, HD]
            v = torch.cat([vc, vb[b]], 0).repeat_interleave(HQ // HKV, dim=1)
            s = torch.einsum("ghd,khd->hgk", q[b], k) * scale
            if keep[b]:
                s = s.masked_fill(~vis[b][None, None, :], float("-inf"))
                o = torch.einsum("hgk,khd->ghd", torch.softmax(s, -1), v)
            else:
                o = torch.zeros(G, HQ, HD, dtype=H.dtype)
            outs.append(o.reshape(G, HQ * HD))
        attn = torch.stack(outs)
        H = H + attn @ p[pre + "self_attn.o_proj.weight"].T
        hp = rmsnorm(H, p[pre + "post_attention_layernorm.weight"])
        act = torch.nn.functional.silu(hp @ p[pre + "mlp.gate_proj.weight"].T) * (hp @ p[pre + "mlp.up_proj.weight"].T)
        H = H + act @ p[pre + "mlp.down_proj.weight"].T
    h = rmsnorm(H, p["norm.weight"])  # [B, G, D]
    logits = h @ p["lm_head.weight"].T
    prev = torch.zeros((B, G), dtype=torch.long)
    for b in range(B):
        for k in range(G):
            t = (anchors[b] if keep[b] else 0) + k
            prev[b, k] = ids[t] if t < T else 0
    e = p["markov_head.markov_w1.weight"][prev] if r else None
    if case["markov"] == "vanilla":
        z = e
    elif case["markov"] == "gated":
        gate = torch.sigmoid(torch.cat([h, e], -1) @ p["markov_head.gate_proj.weight"].T + p["markov_head.gate_proj.bias"])
        z = gate * e
    elif case["markov"] == "rnn":
        s_state = torch.zeros(B, r, dtype=h.dtype)
        zs = []
        for k in range(G):
            zin = torch.cat([s_state, e[:, k], h[:, k]], -1)
            aco = zin @ p["markov_head.joint_proj.weight"].T + p["markov_head.joint_proj.bias"]
            a_, c_, o_ = aco[:, :r], aco[:, r:2 * r], aco[:, 2 * r:]
            zs.append(torch.tanh(o_))
            s_state = torch.sigmoid(a_) * s_state + (1 - torch.sigmoid(a_)) * torch.tanh(c_)
        z = torch.stack(zs, 1)
    else:
        z = None
    if z is not None:
        logits = logits + z @ p["markov_head.markov_w2.weight"].T
    conf = None
    if case["conf"]:
        cin = torch.cat([h, e], -1) if case["conf_markov"] else h
        conf = (cin @ p["confidence_head.proj.weight"].T)[..., 0] + p["confidence_head.proj.bias"][0]
    # ---- loss (spec section 4)
    sup = torch.zeros(B, G, dtype=torch.bool)
    tgt = torch.zeros(B, G, dtype=torch.long)
    teacher_rows = torch.zeros(B, G, D, dtype=h.dtype)
    for b in range(B):
        for k in range(G):
            sup[b, k] = bool(eval_mask[b * G + k]) and bool(keep[b])
            t = anchors[b] + k
            if sup[b, k]:
                tgt[b, k] = ids[t + 1]
                teacher_rows[b, k] = last[t]
    ks = torch.arange(G, dtype=h.dtype)
    if loss_cfg["decay"] == "paper":
        decay = torch.exp(-ks / G)
    elif loss_cfg["gamma"] > 0:
        decay = torch.exp(-ks / loss_cfg["gamma"])
    else:
        decay = torch.ones(G, dtype=h.dtype)
    w = torch.where(sup, decay[None, :].expand(B, G), torch.zeros(()))
    logq = torch.log_softmax(torch.where(sup[..., None], logits, torch.zeros(())), -1)
    pt = torch.softmax(teacher_rows @ p["lm_head.weight"].T, -1)
    ce = -logq.gather(-1, tgt[..., None])[..., 0]
    l1 = (logq.exp() - pt).abs().sum(-1)
    accept = torch.clamp(1 - 0.5 * l1, 0, 1).detach()
    zero = torch.zeros((), dtype=h.dtype)
    num_ce = torch.where(sup, w * ce, zero).sum()
    num_l1 = torch.where(sup, w * l1, zero).sum()
    num = loss_cfg["a_ce"] * num_ce + loss_cfg["a_l1"] * num_l1
    pairs = {"ce": (num_ce, w.sum()), "l1": (num_l1, w.sum())}
    if conf is not None:
        zc = torch.where(sup, conf, zero)
        bce = torch.clamp(zc, min=0) - zc * accept + torch.log1p(torch.exp(-zc.abs()))
        num_conf = torch.where(sup, w * bce, zero).sum()
        num = num + loss_cfg["a_conf"] * num_conf
        pairs["confidence"] = (num_conf, w.sum())
    else:
        pairs["confidence"] = (zero, w.sum())
    acc_sup = torch.where(sup, accept, zero)
    pairs["accept_rate"] = (acc_sup.sum(), sup.sum().to(h.dtype))
    valid = sup.any(-1)
    tau = torch.cumprod(acc_sup, -1).sum(-1) + 1
    pairs["tau"] = ((tau * valid).sum(), valid.sum().to(h.dtype))
    pairs["loss"] = (num, w.sum())
    pos_acc = torch.stack([acc_sup.sum(0), sup.sum(0).to(h.dtype)], -1)
    return logits, conf, num, pairs, pos_acc


CASES = [
    {"markov": "vanilla", "rank": 6, "conf": True, "conf_markov": True},
    {"markov": "gated", "rank": 6, "conf": True, "conf_markov": True},
    {"markov": "rnn", "rank": 6, "conf": True, "conf_markov": True},
    {"markov": "none", "rank": 0, "conf": True, "conf_markov": False},
    {"markov": "vanilla", "rank": 6, "conf": False, "conf_markov": False},
    {"markov": "rnn", "rank": 5, "conf": True, "conf_markov": False},
]
LOSSES = [
    {"a_ce": 0.1, "a_l1": 0.9, "a_conf": 1.0, "gamma": 4.0, "decay": "deepspec"},
    {"a_ce": 0.3, "a_l1": 0.5, "a_conf": 0.7, "gamma": 0.0, "decay": "paper"},
]


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    for ci, case in enumerate(CASES):
        for li, lc in enumerate(LOSSES):
            if li and ci not in (0, 2):
                continue  # the decay variants on two head types are enough
            name = f"{case['markov']}-r{case['rank']}-conf{int(case['conf'])}{int(case['conf_markov'])}-loss{li}"
            gen = torch.Generator().manual_seed(100 + ci)
            params = make_params(case, gen)
            ddir = os.path.join(args.tmp, name)
            write_draft(case, params, ddir)
            # round the reference to the fp32 values the engine reads
            p = {k: v.float().double().requires_grad_(not k.startswith(("embed", "lm_head"))) for k, v in params.items()}
            ctx = torch.randn(T, M * D, generator=gen, dtype=torch.float64).float().double()
            last = torch.randn(T, D, generator=gen, dtype=torch.float64).float().double()
            ids = torch.randint(0, V - 1, (T,), generator=gen).tolist()
            anchors = [0, 3, 9, 15, 17, 2]
            keep = [1, 1, 1, 1, 1, 0]  # the last block is dropped
            loss_mask = [1] * T
            loss_mask[12] = 0  # cuts block 9's supervision prefix
            eval_mask = []
            for b, a in enumerate(anchors):
                alive = bool(keep[b])
                for k in range(G):
                    t = a + k + 1
                    alive = alive and t < T and bool(loss_mask[t])
                    eval_mask.append(int(alive))
            # Poison the teacher where only unsupervised slots read it: position T-1 is read
            # by block 17's slot 2 (target x_20: past the end) only.
            last_in = last.clone()
            last_in[T - 1] = float("nan")
            inputs = {"ctx": ctx.float(), "last": last_in.float(), "input_ids": torch.tensor(ids, dtype=torch.int64),
                      "anchors": torch.tensor(anchors, dtype=torch.int64),
                      "block_keep": torch.tensor(keep, dtype=torch.uint8),
                      "loss_mask": torch.tensor(loss_mask, dtype=torch.uint8)}
            in_path = os.path.join(args.tmp, name + "-in.safetensors")
            out_path = os.path.join(args.tmp, name + "-out.safetensors")
            save_file(inputs, in_path)
            extra = ["--alpha-ce", str(lc["a_ce"]), "--alpha-l1", str(lc["a_l1"]), "--alpha-conf", str(lc["a_conf"]),
                     "--decay-gamma", str(lc["gamma"]), "--chunk-rows", "5"]
            if lc["decay"] == "paper":
                extra.append("--decay-paper")
            common.run([args.dspark, "draft-forward", ddir, "--inputs", in_path, "--out", out_path, "--loss"] + extra)
            got = load_file(out_path)
            logits, conf, num, pairs, pos_acc = reference(case, p, ctx, last, ids, anchors, keep, eval_mask, lc)
            num.backward()

            def cmp(what, ours, ref, tol=TOL):
                err = common.normwise_rel_err(ours, ref)
                ck.check(err <= tol, f"{name} {what}: rel err {err:.2e}")
                return err

            worst = 0.0
            worst = max(worst, cmp("logits", got["logits"], logits.detach().reshape(-1, V).numpy()))
            if conf is not None:
                worst = max(worst, cmp("conf_logits", got["conf_logits"], conf.detach().reshape(-1).numpy()))
            worst = max(worst, cmp("numerator", got["numerator"], [num.item()]))
            for pname, (pn, pd) in pairs.items():
                key = f"pair.{pname}"
                ck.check(key in got, f"{name}: {key} missing")
                if key in got:
                    worst = max(worst, cmp(key, got[key], [float(pn.detach()), float(pd.detach())]))
            worst = max(worst, cmp("accept_per_position", got["accept_per_position"], pos_acc.detach().numpy()))
            for k, v in p.items():
                if not v.requires_grad:
                    continue
                gk = "grad." + k
                ck.check(gk in got, f"{name}: {gk} missing")
                if gk in got and v.grad is not None:
                    worst = max(worst, cmp(gk, got[gk], v.grad.numpy()))
            print(f"{name}: worst rel err {worst:.2e}", flush=True)
    ck.finish("test_draft_torch")


if __name__ == "__main__":
    main()

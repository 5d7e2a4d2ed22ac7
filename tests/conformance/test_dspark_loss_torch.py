"""DSpark loss conformance: `dspark loss` against a PyTorch reference written here from
spec/dspark.md section 4 (float64, autograd for the gradients).

Random inputs in several shapes ([R, V] and [B, g, V] layouts, I32 / I64 ids, U8 / BOOL masks)
with dropped anchors, eval-mask prefixes and poisoned padding (sentinel ids -1 / -100 / V and
NaN / +inf / -inf logits in draft, teacher and confidence at unsupervised slots), with and
without teacher and confidence logits, both decay modes, custom alphas, chunk sizes and
grad scales. Checked within 1e-4 normwise relative error (max|ours - ref| / max|ref|):
numerator, W, every reporting pair, per-position acceptance, per-row values, both gradients;
with a reduced draft vocabulary (draft_vocab, spec section 4a) the same against a reference of
4a (q over S, the teacher's full p, CE only where x* is in S, l1 with p's mass outside S), and
S = all of V bit-identical to the unrestricted loss;
num_tokens exactly; absent pairs absent; gradients exactly 0 at unsupervised slots; results
independent of --chunk-rows (bit for bit). Error paths: a missing tensor, a wrong dtype, a
wrong shape, a supervised out-of-range id and a NaN at a supervised slot each exit 1 with a
message naming the tensor or the block / slot / row; usage errors exit 2.

    $PY tests/conformance/test_dspark_loss_torch.py --dspark build/dspark --tmp /tmp/x
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

TOL = 1e-4
PAIRS = ["loss", "ce", "l1", "confidence", "accept_rate", "tau"]


def reference(inp, g, teacher=True, conf=True, alpha=(0.1, 0.9, 1.0), decay="deepspec", gamma=4.0, scale=1.0):
    """The loss of spec section 4 in float64 with autograd. Unsupervised inputs are replaced
    (torch.where selects), never multiplied by zero."""
    draft = torch.tensor(inp["draft_logits"], dtype=torch.float64)
    V = draft.shape[-1]
    draft = draft.reshape(-1, V).clone().requires_grad_(True)
    R = draft.shape[0]
    B = R // g
    ids = torch.tensor(inp["target_ids"].reshape(-1).astype(np.int64))
    em = torch.tensor(inp["eval_mask"].reshape(-1).astype(bool))
    bk = torch.tensor(inp["block_keep_mask"].astype(bool))
    sup = em & bk.repeat_interleave(g)
    k = torch.arange(R) % g
    if decay == "paper":
        dec = torch.exp(-k.double() / g)
    elif gamma > 0:
        dec = torch.exp(-k.double() / gamma)
    else:
        dec = torch.ones(R, dtype=torch.float64)
    w = torch.where(sup, dec, torch.zeros_like(dec))
    x = torch.where(sup[:, None], draft, torch.zeros_like(draft))
    logq = torch.log_softmax(x, dim=-1)
    ce = -logq.gather(1, torch.where(sup, ids, torch.zeros_like(ids))[:, None])[:, 0]
    zero = torch.zeros(R, dtype=torch.float64)
    l1, accept, bce, z = zero, zero, zero, None
    conf_on = teacher and conf and "conf_logits" in inp
    if teacher:
        t = torch.tensor(inp["target_logits"], dtype=torch.float64).reshape(-1, V)
        t = torch.where(sup[:, None], t, torch.zeros_like(t))
        p = torch.softmax(t, dim=-1)
        l1 = (logq.exp() - p).abs().sum(-1)
        accept = torch.clamp(1 - 0.5 * l1.detach(), 0, 1)
        accept = torch.where(sup, accept, zero)
    if conf_on:
        z = torch.tensor(inp["conf_logits"].reshape(-1), dtype=torch.float64).requires_grad_(True)
        zs = torch.where(sup, z, zero)
        bce = torch.nn.functional.binary_cross_entropy_with_logits(zs, accept, reduction="none")
    a_ce, a_l1, a_conf = alpha
    s_ce, s_l1, s_bce = (w * ce).sum(), (w * l1).sum(), (w * bce).sum()
    num = a_ce * s_ce + a_l1 * s_l1 + a_conf * s_bce
    (scale * num).backward()
    W = w.sum().item()
    out = {"numerator": num.item(), "num_tokens": int(sup.sum()), "W": W,
           "pair.loss": [num.item(), W], "pair.ce": [s_ce.item(), W],
           "pair.l1": [s_l1.item() if teacher else 0.0, W],
           "pair.confidence": [s_bce.item() if conf_on else 0.0, W],
           "row.ce": torch.where(sup, ce, zero).detach().numpy(),
           "row.l1": torch.where(sup, l1, zero).detach().numpy(),
           "row.accept": accept.numpy(),
           "row.bce": torch.where(sup, bce, zero).detach().numpy(),
           "grad.draft_logits": draft.grad.numpy().reshape(inp["draft_logits"].shape),
           "sup": sup.numpy()}
    if teacher:
        acc_sup = torch.where(sup, accept, zero).reshape(B, g)
        valid = sup.reshape(B, g).any(1)
        tau_b = torch.cumprod(acc_sup, dim=1).sum(1) + 1
        out["pair.accept_rate"] = [acc_sup.sum().item(), float(sup.sum())]
        out["pair.tau"] = [torch.where(valid, tau_b, torch.zeros_like(tau_b)).sum().item(), float(valid.sum())]
        out["per_position.accept"] = acc_sup.sum(0).numpy()
        out["per_position.count"] = sup.reshape(B, g).double().sum(0).numpy()
    if "conf_logits" in inp and conf:
        gz = z.grad.numpy() if conf_on else np.zeros(R)
        out["grad.conf_logits"] = gz.reshape(inp["conf_logits"].shape)
    return out


def reference_vocab(inp, g, teacher=True, conf=True, alpha=(0.1, 0.9, 1.0), decay="deepspec", gamma=4.0, scale=1.0):
    """Section 4a in float64 with autograd: draft_logits over the N ids of draft_vocab (S), the
    teacher's full softmax p (not renormalized over S), CE only where the target id is in S,
    l1 = sum_S |q - p| + (1 - sum_S p)."""
    S = torch.tensor(inp["draft_vocab"].astype(np.int64))
    N = S.shape[0]
    draft = torch.tensor(inp["draft_logits"], dtype=torch.float64).reshape(-1, N).clone().requires_grad_(True)
    R = draft.shape[0]
    B = R // g
    ids = torch.tensor(inp["target_ids"].reshape(-1).astype(np.int64))
    em = torch.tensor(inp["eval_mask"].reshape(-1).astype(bool))
    bk = torch.tensor(inp["block_keep_mask"].astype(bool))
    sup = em & bk.repeat_interleave(g)
    k = torch.arange(R) % g
    dec = torch.exp(-k.double() / g) if decay == "paper" else (
        torch.exp(-k.double() / gamma) if gamma > 0 else torch.ones(R, dtype=torch.float64))
    w = torch.where(sup, dec, torch.zeros_like(dec))
    x = torch.where(sup[:, None], draft, torch.zeros_like(draft))
    logq = torch.log_softmax(x, dim=-1)
    col = torch.full((int(inp["vocab_size"]),), -1, dtype=torch.int64)
    col[S] = torch.arange(N)
    j = torch.where(sup, col[torch.where(sup, ids, torch.zeros_like(ids))], torch.full_like(ids, -1))
    ce_on = j >= 0
    ce = torch.where(ce_on, -logq.gather(1, j.clamp(min=0)[:, None])[:, 0], torch.zeros(R, dtype=torch.float64))
    zero = torch.zeros(R, dtype=torch.float64)
    l1, accept, bce = zero, zero, zero
    conf_on = teacher and conf and "conf_logits" in inp
    if teacher:
        t = torch.tensor(inp["target_logits"], dtype=torch.float64).reshape(R, -1)
        t = torch.where(sup[:, None], t, torch.zeros_like(t))
        p = torch.softmax(t, dim=-1)
        pS = p[:, S]
        l1 = (logq.exp() - pS).abs().sum(-1) + (1 - pS.sum(-1))
        accept = torch.where(sup, torch.clamp(1 - 0.5 * l1.detach(), 0, 1), zero)
    if conf_on:
        z = torch.tensor(inp["conf_logits"].reshape(-1), dtype=torch.float64).requires_grad_(True)
        bce = torch.nn.functional.binary_cross_entropy_with_logits(torch.where(sup, z, zero), accept, reduction="none")
    a_ce, a_l1, a_conf = alpha
    s_ce, s_l1, s_bce = (w * ce).sum(), (w * l1).sum(), (w * bce).sum()
    num = a_ce * s_ce + a_l1 * s_l1 + a_conf * s_bce
    (scale * num).backward()
    W = w.sum().item()
    out = {"numerator": num.item(), "num_tokens": int(sup.sum()), "W": W,
           "pair.loss": [num.item(), W], "pair.ce": [s_ce.item(), (w * ce_on).sum().item()],
           "pair.l1": [s_l1.item() if teacher else 0.0, W],
           "pair.confidence": [s_bce.item() if conf_on else 0.0, W],
           "row.ce": ce.detach().numpy(), "row.l1": torch.where(sup, l1, zero).detach().numpy(),
           "row.accept": accept.numpy(), "row.bce": torch.where(sup, bce, zero).detach().numpy(),
           "grad.draft_logits": draft.grad.numpy().reshape(inp["draft_logits"].shape), "sup": sup.numpy(),
           "ce_on": ce_on.numpy()}
    if teacher:
        acc_sup = torch.where(sup, accept, zero).reshape(B, g)
        valid = sup.reshape(B, g).any(1)
        tau_b = torch.cumprod(acc_sup, dim=1).sum(1) + 1
        out["pair.accept_rate"] = [acc_sup.sum().item(), float(sup.sum())]
        out["pair.tau"] = [torch.where(valid, tau_b, torch.zeros_like(tau_b)).sum().item(), float(valid.sum())]
        out["per_position.accept"] = acc_sup.sum(0).numpy()
        out["per_position.count"] = sup.reshape(B, g).double().sum(0).numpy()
    if "conf_logits" in inp and conf:
        out["grad.conf_logits"] = (z.grad.numpy() if conf_on else np.zeros(R)).reshape(inp["conf_logits"].shape)
    return out


def make_inputs(rng, B, g, V, scale=3.0, layout="2d", id_dtype=np.int32, mask_dtype=np.uint8, teacher=True,
                conf=True, dropped=(), prefixes=None, poison=True):
    R = B * g
    draft = (rng.standard_normal((R, V)) * scale).astype(np.float32)
    target = (rng.standard_normal((R, V)) * scale).astype(np.float32)
    # make the teacher close to the draft for some rows so accept is not always ~0
    close = rng.random(R) < 0.5
    target[close] = draft[close] + 0.3 * rng.standard_normal((int(close.sum()), V)).astype(np.float32)
    ids = rng.integers(0, V, size=R).astype(np.int64)
    em = np.ones(R, dtype=bool)
    if prefixes:
        for b, n in prefixes.items():
            em[b * g + n:(b + 1) * g] = False
    bk = np.ones(B, dtype=bool)
    for b in dropped:
        bk[b] = False
    confl = (rng.standard_normal(R) * 2).astype(np.float32)
    sup = em & np.repeat(bk, g)
    if poison:
        poisons = [np.nan, np.inf, -np.inf]
        sentinels = [-1, -100, V]
        for n, r in enumerate(np.flatnonzero(~sup)):
            ids[r] = sentinels[n % 3]
            draft[r] = np.array([poisons[(v + n) % 3] for v in range(V)], dtype=np.float32)
            target[r] = np.array([poisons[(v + n + 1) % 3] for v in range(V)], dtype=np.float32)
            confl[r] = poisons[n % 3]
    inp = {"draft_logits": draft, "target_ids": ids.astype(id_dtype), "eval_mask": em.astype(mask_dtype),
           "block_keep_mask": bk.astype(mask_dtype)}
    if teacher:
        inp["target_logits"] = target
    if conf:
        inp["conf_logits"] = confl
    if layout == "3d":
        for k in ("draft_logits", "target_logits"):
            if k in inp:
                inp[k] = inp[k].reshape(B, g, V)
        for k in ("target_ids", "eval_mask", "conf_logits"):
            if k in inp:
                inp[k] = inp[k].reshape(B, g)
    return inp


def run_ours(args, inp, name, extra):
    path_in = os.path.join(args.tmp, name + ".in.safetensors")
    path_out = os.path.join(args.tmp, name + ".out.safetensors")
    save_file(inp, path_in)
    common.run([args.dspark, "loss", path_in, "--out", path_out] + extra)
    return load_file(path_out)


def rel(ours, ref):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        return float("inf")
    if ref.size == 0:
        return 0.0
    scale = np.max(np.abs(ref))
    return float(np.max(np.abs(ours - ref)) / (scale if scale > 0 else 1.0))


CASES = [
    # name, shape (B, g, V), make_inputs kwargs, reference kwargs, CLI options
    ("teacher-conf-2d-poisoned", (3, 7, 50), dict(dropped=(1,), prefixes={0: 4, 2: 6}), {}, []),
    ("teacher-noconf-3d-i64-bool", (4, 5, 1000),
     dict(layout="3d", id_dtype=np.int64, mask_dtype=bool, conf=False, dropped=(3,), prefixes={1: 2}), {}, []),
    ("noteacher-conf-ignored", (2, 7, 257), dict(teacher=False, prefixes={1: 3}), dict(teacher=False), []),
    ("paper-decay-alphas-chunk2", (5, 3, 33), dict(dropped=(0, 4), prefixes={2: 1}),
     dict(alpha=(0.25, 0.5, 2.0), decay="paper"),
     ["--alpha-ce", "0.25", "--alpha-l1", "0.5", "--alpha-conf", "2", "--decay", "paper", "--chunk-rows", "2"]),
    ("no-decay-scale-vocab4000", (6, 7, 4000), dict(prefixes={0: 1, 5: 5}), dict(gamma=0.0, scale=0.5),
     ["--decay-gamma", "0", "--grad-scale", "0.5", "--threads", "2"]),
    ("gamma2-block-size-flag", (3, 4, 70), dict(prefixes={1: 0}), dict(gamma=2.0),
     ["--decay-gamma", "2", "--block-size", "4"]),
    ("flag-no-teacher", (2, 7, 40), dict(prefixes={0: 5}), dict(teacher=False), ["--no-teacher"]),
    ("flag-no-conf", (2, 7, 40), dict(dropped=(0,)), dict(conf=False), ["--no-conf"]),
    ("all-masked", (2, 3, 20), dict(prefixes={0: 0, 1: 0}), {}, []),
]


def check_case(ck, args, rng, name, shape, mk, refkw, extra):
    B, g, V = shape
    inp = make_inputs(rng, B, g, V, **mk)
    ours = run_ours(args, inp, name, extra)
    ref = reference(inp, g, **refkw)
    teacher = refkw.get("teacher", True) and "target_logits" in inp
    ck.check(int(ours["num_tokens"]) == ref["num_tokens"],
             f"{name}: num_tokens {int(ours['num_tokens'])} != {ref['num_tokens']}")
    worst = 0.0
    for key in ["numerator", "W", "pair.loss", "pair.ce", "pair.l1", "pair.confidence", "row.ce", "row.l1",
                "row.accept", "row.bce", "grad.draft_logits", "grad.conf_logits", "pair.accept_rate", "pair.tau",
                "per_position.accept", "per_position.count"]:
        if key not in ref:
            ck.check(key not in ours, f"{name}: {key} present, expected absent")
            continue
        if not ck.check(key in ours, f"{name}: {key} missing from the output"):
            continue
        err = rel(ours[key], ref[key])
        worst = max(worst, err)
        ck.check(err <= TOL, f"{name}: {key} rel err {err:.2e} > {TOL:g}")
    sup = ref["sup"]
    gd = ours["grad.draft_logits"].reshape(len(sup), V)
    ck.check(np.all(gd[~sup] == 0) and not np.any(np.signbit(gd[~sup])),
             f"{name}: gradient not exactly +0 at unsupervised slots")
    if "grad.conf_logits" in ours:
        gc = ours["grad.conf_logits"].reshape(-1)
        ck.check(np.all(gc[~sup] == 0), f"{name}: confidence gradient not 0 at unsupervised slots")
    ck.check(teacher == ("pair.tau" in ours), f"{name}: tau presence")
    # chunking does not change a bit
    for chunk in ("1", "1000"):
        other = run_ours(args, inp, f"{name}-chunk{chunk}", [e for e in extra] + ["--chunk-rows", chunk])
        same = all(np.array_equal(other[k], ours[k], equal_nan=False) for k in ours)
        ck.check(same, f"{name}: --chunk-rows {chunk} changes the results")
    print(f"{name}: B={B} g={g} V={V} tokens={ref['num_tokens']} loss={ref['numerator'] / max(ref['W'], 1e-300):.6f} "
          f"worst rel err {worst:.2e}", flush=True)


def restrict(rng, inp, N, id_dtype=np.int32, sorted_ids=True):
    """inp over the full V -> the same batch for a draft over N ids S (draft_logits' columns S,
    target_logits kept whole); some supervised target ids are moved into S, some out of it."""
    V = inp["draft_logits"].shape[-1]
    S = np.sort(rng.choice(V, size=N, replace=False)) if N < V else np.arange(V)
    out = dict(inp)
    out["draft_logits"] = np.ascontiguousarray(inp["draft_logits"][..., S])
    out["draft_vocab"] = S.astype(id_dtype)
    ids = inp["target_ids"].reshape(-1).copy()
    outside = np.setdiff1d(np.arange(V), S)
    for r in range(0, ids.size, 3):
        if 0 <= ids[r] < V:
            ids[r] = S[r % N]
    for r in range(1, ids.size, 5):
        if 0 <= ids[r] < V and outside.size:
            ids[r] = outside[r % outside.size]
    out["target_ids"] = ids.reshape(inp["target_ids"].shape).astype(inp["target_ids"].dtype)
    return out


VOCAB_CASES = [
    # name, (B, g, V), N, make_inputs kwargs, reference kwargs, CLI options
    ("vocab-teacher-conf-2d-poisoned", (3, 7, 300), 40, dict(dropped=(1,), prefixes={0: 4, 2: 6}), {}, []),
    ("vocab-teacher-noconf-3d-i64", (4, 5, 1000), 77, dict(layout="3d", id_dtype=np.int64, mask_dtype=bool,
                                                            conf=False, prefixes={1: 2}), {}, []),
    ("vocab-noteacher", (2, 7, 257), 31, dict(teacher=False, prefixes={1: 3}), dict(teacher=False),
     ["--vocab-size", "257"]),
    ("vocab-paper-alphas-chunk3", (5, 3, 120), 64, dict(dropped=(0,), prefixes={2: 1}),
     dict(alpha=(0.25, 0.5, 2.0), decay="paper"),
     ["--alpha-ce", "0.25", "--alpha-l1", "0.5", "--alpha-conf", "2", "--decay", "paper", "--chunk-rows", "3"]),
]


def check_vocab_case(ck, args, rng, name, shape, N, mk, refkw, extra):
    B, g, V = shape
    inp = restrict(rng, make_inputs(rng, B, g, V, **mk), N, id_dtype=mk.get("id_dtype", np.int32))
    ours = run_ours(args, inp, name, extra)
    ref = reference_vocab(dict(inp, vocab_size=V), g, **refkw)
    ck.check(int(ours["num_tokens"]) == ref["num_tokens"], f"{name}: num_tokens")
    ck.check(ref["ce_on"].sum() < ref["sup"].sum(), f"{name}: every supervised target id is in S (weak case)")
    worst = 0.0
    for key in ["numerator", "W", "pair.loss", "pair.ce", "pair.l1", "pair.confidence", "row.ce", "row.l1",
                "row.accept", "row.bce", "grad.draft_logits", "grad.conf_logits", "pair.accept_rate", "pair.tau",
                "per_position.accept", "per_position.count"]:
        if key not in ref:
            ck.check(key not in ours, f"{name}: {key} present, expected absent")
            continue
        if not ck.check(key in ours, f"{name}: {key} missing from the output"):
            continue
        err = rel(ours[key], ref[key])
        worst = max(worst, err)
        ck.check(err <= TOL, f"{name}: {key} rel err {err:.2e} > {TOL:g}")
    sup = ref["sup"]
    gd = ours["grad.draft_logits"].reshape(len(sup), N)
    ck.check(np.all(gd[~sup] == 0) and not np.any(np.signbit(gd[~sup])), f"{name}: gradient not +0 at unsupervised slots")
    for chunk in ("1", "1000"):
        other = run_ours(args, inp, f"{name}-chunk{chunk}", list(extra) + ["--chunk-rows", chunk])
        ck.check(all(np.array_equal(other[k], ours[k]) for k in ours), f"{name}: --chunk-rows {chunk} changes results")
    print(f"{name}: B={B} g={g} V={V} N={N} tokens={ref['num_tokens']} ce slots {int(ref['ce_on'].sum())} "
          f"worst rel err {worst:.2e}", flush=True)


def check_vocab_identity(ck, args, rng):
    """Section 4a's regression fact: S = all of V in order gives the unrestricted loss, bit for bit."""
    inp = make_inputs(rng, 3, 7, 211, dropped=(2,), prefixes={0: 3})
    full = run_ours(args, inp, "vocab-identity-full", [])
    ident = run_ours(args, dict(inp, draft_vocab=np.arange(211, dtype=np.int64)), "vocab-identity", [])
    same = sorted(full) == sorted(ident) and all(np.array_equal(full[k], ident[k]) for k in full)
    ck.check(same, "draft_vocab = all of V changes the results")
    print(f"draft_vocab = 0 .. V-1: {'bit-identical' if same else 'DIFFERENT'} to the unrestricted loss")


def check_vocab_errors(ck, args, rng):
    base = restrict(rng, make_inputs(rng, 2, 7, 60, poison=False), 20)
    cases = []
    s = base["draft_vocab"].copy()
    s[5] = s[4]
    cases.append(("vocab-not-increasing", dict(base, draft_vocab=s), ["draft_vocab", "strictly increasing"], []))
    s = base["draft_vocab"].copy()
    s[-1] = 60
    cases.append(("vocab-out-of-range", dict(base, draft_vocab=s), ["draft_vocab", "60"], []))
    cases.append(("vocab-shape", dict(base, draft_vocab=base["draft_vocab"][:19]), ["draft_vocab", "shape"], []))
    nt = dict(base)
    del nt["target_logits"]
    cases.append(("vocab-no-size", nt, ["draft_vocab", "--vocab-size"], []))
    cases.append(("vocab-target-shape", dict(base, target_logits=base["target_logits"][:13]),
                  ["target_logits", "shape"], []))
    for name, inp, needles, extra in cases:
        path_in = os.path.join(args.tmp, name + ".in.safetensors")
        save_file(inp, path_in)
        _, err, code = common.run([args.dspark, "loss", path_in, "--out", os.path.join(args.tmp, name + ".out")] + extra,
                                  expect_rc=None)
        ck.check(code == 1 and all(n in err for n in needles),
                 f"error case {name}: exit {code}, stderr {err.strip()!r} lacks {needles}")
        print(f"error case {name}: exit {code}: {err.strip().splitlines()[-1] if err.strip() else ''}")


def save_unaligned(inp, path):
    """A valid safetensors file whose float tensors start at odd offsets (a 1-byte tensor
    first; the format does not require alignment), written by hand."""
    import json
    import struct
    names = ["pad"] + sorted(inp)
    arrays = {"pad": np.zeros(1, dtype=np.uint8), **inp}
    dt = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
          np.dtype(np.uint8): "U8", np.dtype(bool): "BOOL"}
    header, off, blobs = {}, 0, []
    for n in names:
        a = np.ascontiguousarray(arrays[n])
        b = a.tobytes()
        header[n] = {"dtype": dt[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def check_unaligned(ck, args, rng):
    inp = make_inputs(rng, 2, 7, 31, dropped=(1,), prefixes={0: 5})
    aligned = run_ours(args, inp, "aligned", [])
    path_in = os.path.join(args.tmp, "unaligned.in.safetensors")
    path_out = os.path.join(args.tmp, "unaligned.out.safetensors")
    save_unaligned(inp, path_in)
    common.run([args.dspark, "loss", path_in, "--out", path_out])
    got = load_file(path_out)
    same = all(np.array_equal(got[k], aligned[k]) for k in aligned)
    ck.check(same, "unaligned input tensors give different results")
    print(f"unaligned float tensors: {'identical' if same else 'DIFFERENT'} results")


def check_errors(ck, args, rng):
    base = make_inputs(rng, 3, 7, 20, poison=False)

    def expect_fail(name, inp, needles, extra=("--out", None), rc=1):
        path_in = os.path.join(args.tmp, name + ".in.safetensors")
        save_file(inp, path_in)
        extra = [os.path.join(args.tmp, name + ".out") if e is None else e for e in extra]
        _, err, code = common.run([args.dspark, "loss", path_in] + extra, expect_rc=None)
        ok = code == rc and all(n in err for n in needles)
        ck.check(ok, f"error case {name}: exit {code} (want {rc}), stderr {err.strip()!r} lacks {needles}")
        print(f"error case {name}: exit {code}: {err.strip().splitlines()[-1] if err.strip() else ''}")

    inp = dict(base)
    del inp["target_ids"]
    expect_fail("missing-ids", inp, ["target_ids", "missing"])
    inp = dict(base)
    inp["draft_logits"] = base["draft_logits"].astype(np.float64)
    expect_fail("dtype-draft", inp, ["draft_logits", "F64"])
    inp = dict(base)
    inp["target_ids"] = base["target_ids"].astype(np.float32)
    expect_fail("dtype-ids", inp, ["target_ids", "F32"])
    inp = dict(base)
    inp["eval_mask"] = base["eval_mask"][:20]
    expect_fail("shape-eval-mask", inp, ["eval_mask", "shape", "[20]"])
    inp = dict(base)
    inp["target_logits"] = base["target_logits"][:, :19]
    expect_fail("shape-target", inp, ["target_logits", "shape"])
    inp = dict(base)
    inp["conf_logits"] = base["conf_logits"][:5]
    expect_fail("shape-conf", inp, ["conf_logits", "shape"])
    expect_fail("block-size-mismatch", base, ["draft_logits", "--block-size"], extra=["--out", None, "--block-size", "5"])
    for bad in (-1, -100, 20):
        inp = dict(base)
        ids = base["target_ids"].copy()
        ids[9] = bad
        inp["target_ids"] = ids
        expect_fail(f"bad-id{bad}", inp, ["block 1 slot 2 (row 9)", str(bad)])
    inp = dict(base)
    ids = base["target_ids"].astype(np.int64)
    ids[9] = 1 << 40
    inp["target_ids"] = ids
    expect_fail("bad-id-i64", inp, ["block 1 slot 2 (row 9)", str(1 << 40)])
    inp = dict(base)
    d = base["draft_logits"].copy()
    d[9, 3] = np.nan
    inp["draft_logits"] = d
    expect_fail("nan-supervised", inp, ["draft logits", "block 1 slot 2 (row 9)"])
    expect_fail("usage-no-out", base, [], extra=[], rc=2)
    expect_fail("usage-bad-decay", base, ["--decay"], extra=["--out", None, "--decay", "linear"], rc=2)
    _, _, code = common.run([args.dspark, "loss", "--help"], expect_rc=None)
    ck.check(code == 0, "--help exits 0")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    rng = np.random.default_rng(20260711)
    torch.manual_seed(0)
    for name, shape, mk, refkw, extra in CASES:
        check_case(ck, args, rng, name, shape, mk, refkw, extra)
    for name, shape, N, mk, refkw, extra in VOCAB_CASES:
        check_vocab_case(ck, args, rng, name, shape, N, mk, refkw, extra)
    check_vocab_identity(ck, args, rng)
    check_vocab_errors(ck, args, rng)
    check_unaligned(ck, args, rng)
    check_errors(ck, args, rng)
    ck.finish("dspark loss conformance")


if __name__ == "__main__":
    main()

"""KD loss conformance: `dspark kd-loss` against a PyTorch reference written here from
spec/kd.md sections 2-3 (float64, autograd for the gradient).

The teacher's top-K is made in PyTorch the way kd.md section 1 says a capture makes it (full-
vocabulary log-probs of the K most probable ids, sorted; optionally a top-p prefix with sentinels
id -1 / -inf after it: "dropped entries"). Every combination of K in {1, 7}, training-time
(top-p, min_k) in {(1, 1), (0.6, 1), (0.6, 3), (1e-6, 3)}, temperature in {1, 2.5}, forward /
reverse, kd_loss_alpha in {0, 0.35, 1}, masked tokens (poisoned with sentinel ids and labels and
NaN / inf logits) on / off and dropped entries on / off; K = V; and the dense KL against teacher
logits (with -inf teacher logits) for every temperature, direction, alpha and mask. Checked:
kd_per_token, lm_per_token and grad.student_logits within 1e-5 normwise relative error
(max|ours - ref| / max|ref|), the numerator within 1e-5, num_tokens and the pairs' presence
exactly, the gradient exactly +0 at masked rows, --chunk-rows and --threads change no bit;
BF16 / F16 log-probs and I64 ids; error paths: every refusal exits 1 naming the tensor and the
index, usage errors (removed options with their hint, out-of-range options, --top-p with a dense
teacher) exit 2.

    $PY tests/conformance/test_kd_loss_torch.py --dspark build/dspark --tmp /tmp/x
"""
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

TOL = 1e-5
EPS = float(torch.finfo(torch.float32).eps)  # the ghost clamp of the fp32 compute dtype


def reference(inp, T=1.0, top_p=1.0, min_k=1, reverse=False, alpha=1.0, no_ghost=False):
    """kd.md sections 2-3 in float64 with autograd. Masked rows are replaced (torch.where
    selects), never multiplied by zero."""
    s = torch.tensor(inp["student_logits"], dtype=torch.float64).requires_grad_(True)
    R, V = s.shape
    sup = torch.tensor(inp["loss_mask"].astype(bool)) if "loss_mask" in inp else torch.ones(R, dtype=torch.bool)
    zero_rows = torch.zeros(R, dtype=torch.float64)
    s_safe = torch.where(sup[:, None], s, torch.zeros_like(s))
    P = torch.log_softmax(s_safe / T, dim=-1)
    kd = zero_rows
    if alpha > 0 and "teacher_logits" in inp:
        t = torch.tensor(inp["teacher_logits"], dtype=torch.float64)
        t = torch.where(sup[:, None], t, torch.zeros_like(t))
        Q = torch.log_softmax(t / T, dim=-1)
        if reverse:
            terms = torch.where(P > -torch.inf, P.exp() * (P - Q), torch.zeros_like(P))
        else:
            terms = torch.where(Q > -torch.inf, Q.exp() * (Q - P), torch.zeros_like(P))
        kd = terms.sum(-1)
    elif alpha > 0:
        ids = torch.tensor(inp["topk_ids"].astype(np.int64))
        lq = torch.tensor(inp["topk_logprobs"].astype(np.float32).astype(np.float64))
        K = ids.shape[1]
        pos = torch.arange(K)
        kept = (ids != -1) & sup[:, None]  # the captured prefix
        probs = torch.where(kept, lq, torch.full_like(lq, -torch.inf)).exp()
        before = torch.cat([torch.zeros(R, 1, dtype=torch.float64), torch.cumsum(probs, -1)[:, :-1]], -1)
        keep = kept & ((before < top_p) | (pos < min_k))  # the top-p rule at training time
        keep = keep | (~sup[:, None] & (pos == 0))  # masked rows: a harmless entry, selected out below
        q = torch.where(keep, lq, torch.zeros_like(lq))
        q = torch.where(sup[:, None], q, torch.zeros_like(q))
        p = P.gather(1, torch.where(keep & sup[:, None], ids, torch.zeros_like(ids)))
        ninf = torch.full_like(q, -torch.inf)
        Lq = torch.logsumexp(torch.where(keep, q, ninf), -1).clamp(max=-EPS)
        Lp = torch.logsumexp(torch.where(keep, p, ninf), -1).clamp(max=-EPS)
        gq, gp = torch.log(-torch.expm1(Lq)), torch.log(-torch.expm1(Lp))
        if no_ghost:  # the ablation: both sides renormalized over the kept entries, K buckets
            qh = q - torch.logsumexp(torch.where(keep, q, ninf), -1, keepdim=True)
            ph = p - torch.logsumexp(torch.where(keep, p, ninf), -1, keepdim=True)
            a, b = (ph, qh) if reverse else (qh, ph)
            kd = torch.where(keep, a.exp() * (a - b), torch.zeros_like(p)).sum(-1)
        elif reverse:
            kd = torch.where(keep, p.exp() * (p - q), torch.zeros_like(p)).sum(-1) + gp.exp() * (gp - gq)
        else:
            kd = torch.where(keep, q.exp() * (q - p), torch.zeros_like(p)).sum(-1) + gq.exp() * (gq - gp)
    kd = torch.where(sup, kd, zero_rows)
    lm = zero_rows
    if alpha < 1:
        labels = torch.tensor(inp["labels"].astype(np.int64))
        P1 = torch.log_softmax(s_safe, dim=-1)
        lm = -P1.gather(1, torch.where(sup, labels, torch.zeros_like(labels))[:, None])[:, 0]
        lm = torch.where(sup, lm, zero_rows)
    if alpha == 1:
        num = kd.sum()
    elif alpha == 0:
        num = lm.sum()
    else:
        num = (1 - alpha) * lm.sum() + alpha * kd.sum()
    num.backward()
    return {"kd_per_token": kd.detach().numpy(), "lm_per_token": lm.detach().numpy(), "numerator": num.item(),
            "num_tokens": int(sup.sum()), "grad.student_logits": s.grad.numpy(), "sup": sup.numpy()}


def capture_topk(teacher, K, cap_top_p=1.0, cap_min_k=1):
    """kd.md section 1 in torch: full-vocabulary log-probs of the top-K ids, sorted; with
    cap_top_p < 1 a prefix, the rest sentinels (id -1, -inf)."""
    lp = torch.log_softmax(torch.tensor(teacher, dtype=torch.float64), -1)
    vals, ids = torch.topk(lp, K, dim=-1)
    if cap_top_p < 1:
        probs = vals.exp()
        before = torch.cumsum(probs, -1) - probs
        keep = (before < cap_top_p) | (torch.arange(K) < cap_min_k)
        ids = torch.where(keep, ids, torch.full_like(ids, -1))
        vals = torch.where(keep, vals, torch.full_like(vals, -torch.inf))
    return ids.numpy().astype(np.int32), vals.numpy().astype(np.float32)


def make_inputs(rng, R, V, K, masked=False, dropped=False, dense=False, scale=3.0, neg_inf=True):
    s = (rng.standard_normal((R, V)) * scale).astype(np.float32)
    t = (rng.standard_normal((R, V)) * scale).astype(np.float32)
    close = np.arange(R) % 2 == 1  # half the rows: a teacher near the student
    t[close] = s[close] + 0.5 * rng.standard_normal((int(close.sum()), V)).astype(np.float32)
    labels = rng.integers(0, V, size=R).astype(np.int32)
    mask = np.ones(R, dtype=np.uint8)
    if masked:
        mask[[0, R // 2, R - 1]] = 0
    inp = {"student_logits": s, "labels": labels, "loss_mask": mask}
    if dense:
        if neg_inf:
            t[2, 3] = -np.inf  # zero teacher probability (forward KL: a term of 0; reverse: infinite)
        inp["teacher_logits"] = t
    else:
        ids, lq = capture_topk(t, K, cap_top_p=0.5 if dropped else 1.0, cap_min_k=2 if dropped else 1)
        inp["topk_ids"], inp["topk_logprobs"] = ids, lq
    if masked:  # poison the masked rows: nothing there may be read
        poisons = [np.nan, np.inf, -np.inf]
        for n, r in enumerate(np.flatnonzero(mask == 0)):
            s[r] = np.array([poisons[(v + n) % 3] for v in range(V)], dtype=np.float32)
            labels[r] = [-100, V, -1][n % 3]
            if dense:
                t[r] = np.array([poisons[(v + n + 1) % 3] for v in range(V)], dtype=np.float32)
            else:
                inp["topk_ids"][r] = np.array([[-7, V, 1 << 30][(i + n) % 3] for i in range(K)], dtype=np.int32)
                inp["topk_logprobs"][r] = np.array([poisons[(i + n) % 3] for i in range(K)], dtype=np.float32)
    return inp


def options(T, top_p, min_k, reverse, alpha, no_ghost=False):
    o = ["--temperature", repr(T), "--kd-loss-alpha", repr(alpha)] + (["--no-ghost"] if no_ghost else [])
    if top_p < 1:
        o += ["--top-p", repr(top_p), "--min-k", str(min_k)]
    if reverse:
        o.append("--reverse")
    return o


def run_ours(args, path_in, name, extra, expect_rc=0):
    path_out = os.path.join(args.tmp, name + ".out.safetensors")
    out, err, code = common.run([args.dspark, "kd-loss", path_in, "--out", path_out] + extra, expect_rc=expect_rc)
    return (load_file(path_out) if code == 0 else None), err, code


def rel(ours, ref):
    return common.normwise_rel_err(np.asarray(ours, dtype=np.float64), ref)


class Stats:
    def __init__(self):
        self.worst = {"kd_per_token": 0.0, "lm_per_token": 0.0, "grad.student_logits": 0.0, "numerator": 0.0}
        self.cases = 0


def check_case(ck, st, ours, ref, label, alpha):
    st.cases += 1
    ck.check(int(ours["num_tokens"]) == ref["num_tokens"], f"{label}: num_tokens {ours['num_tokens']} != {ref['num_tokens']}")
    for key in ("kd_per_token", "lm_per_token", "grad.student_logits"):
        err = rel(ours[key], ref[key])
        st.worst[key] = max(st.worst[key], err)
        ck.check(err <= TOL, f"{label}: {key} rel err {err:.2e} > {TOL:g}")
    err = abs(float(ours["numerator"]) - ref["numerator"]) / max(abs(ref["numerator"]), 1e-30)
    st.worst["numerator"] = max(st.worst["numerator"], err)
    ck.check(err <= TOL, f"{label}: numerator rel err {err:.2e}")
    ck.check(("pair.kd" in ours) == (alpha > 0) and ("pair.lm" in ours) == (alpha < 1) and "pair.loss" in ours,
             f"{label}: pair presence")
    sup = ref["sup"]
    g = ours["grad.student_logits"][~sup]
    ck.check(np.all(g == 0) and not np.any(np.signbit(g)), f"{label}: gradient not exactly +0 at masked rows")


def check_grid(ck, args, rng, st):
    R, V = 12, 61
    files = {}
    for K, masked, dropped in itertools.product((1, 7), (False, True), (False, True)):
        if K == 1 and dropped:
            continue  # a capture keeps the top-1: nothing to drop
        inp = make_inputs(rng, R, V, K, masked=masked, dropped=dropped)
        path = os.path.join(args.tmp, f"grid-K{K}-m{int(masked)}-d{int(dropped)}.in.safetensors")
        save_file(inp, path)
        files[(K, masked, dropped)] = (path, inp)
    tp_mink = [(1.0, 1), (0.6, 1), (0.6, 3), (1e-6, 3)]
    for (K, masked, dropped), (path, inp) in files.items():
        for (top_p, min_k), T, reverse, alpha in itertools.product(tp_mink, (1.0, 2.5), (False, True), (0.0, 0.35, 1.0)):
            label = f"K={K} masked={masked} dropped={dropped} top_p={top_p} min_k={min_k} T={T} rev={reverse} a={alpha}"
            ours, _, _ = run_ours(args, path, "grid", options(T, top_p, min_k, reverse, alpha))
            ref = reference(inp, T, top_p, min_k, reverse, alpha)
            check_case(ck, st, ours, ref, label, alpha)
            if K > 1 and T == 2.5 and min_k == 1:  # the no-ghost ablation (distillation comparison)
                ours, _, _ = run_ours(args, path, "grid", options(T, top_p, min_k, reverse, alpha, True))
                check_case(ck, st, ours, reference(inp, T, top_p, min_k, reverse, alpha, True), label + " no-ghost",
                           alpha)
    # K = V: every id kept
    inp = make_inputs(rng, 6, 40, 40)
    path = os.path.join(args.tmp, "k-eq-v.in.safetensors")
    save_file(inp, path)
    for reverse, alpha in itertools.product((False, True), (0.35, 1.0)):
        ours, _, _ = run_ours(args, path, "kv", options(1.0, 1.0, 1, reverse, alpha))
        check_case(ck, st, ours, reference(inp, 1.0, 1.0, 1, reverse, alpha), f"K=V rev={reverse} a={alpha}", alpha)
    # dense KL against teacher logits
    for masked, reverse in itertools.product((False, True), (False, True)):
        # a -inf teacher logit for the forward KL; the reverse KL would be infinite (an error case below)
        inp = make_inputs(rng, R, V, 0, masked=masked, dense=True, neg_inf=not reverse)
        path = os.path.join(args.tmp, f"dense-m{int(masked)}.in.safetensors")
        save_file(inp, path)
        for T, alpha in itertools.product((1.0, 2.5), (0.0, 0.35, 1.0)):
            ours, _, _ = run_ours(args, path, "dense", options(T, 1.0, 1, reverse, alpha))
            ref = reference(inp, T, 1.0, 1, reverse, alpha)
            check_case(ck, st, ours, ref, f"dense masked={masked} T={T} rev={reverse} a={alpha}", alpha)


def check_invariance(ck, args, rng):
    """--chunk-rows and --threads change no bit; the mask may be absent (every row)."""
    inp = make_inputs(rng, 10, 300, 16, masked=True, dropped=True)
    path = os.path.join(args.tmp, "inv.in.safetensors")
    save_file(inp, path)
    base, _, _ = run_ours(args, path, "inv", ["--kd-loss-alpha", "0.5", "--top-p", "0.8", "--temperature", "1.5"])
    for extra in (["--chunk-rows", "1"], ["--chunk-rows", "3"], ["--chunk-rows", "1000"], ["--threads", "1"],
                  ["--threads", "2", "--chunk-rows", "4"]):
        other, _, _ = run_ours(args, path, "inv2",
                               ["--kd-loss-alpha", "0.5", "--top-p", "0.8", "--temperature", "1.5"] + extra)
        ck.check(all(np.array_equal(other[k], base[k]) for k in base), f"{' '.join(extra)} changes the results")
    clean = make_inputs(rng, 5, 50, 4)
    del clean["loss_mask"]
    path = os.path.join(args.tmp, "nomask.in.safetensors")
    save_file(clean, path)
    ours, _, _ = run_ours(args, path, "nomask", ["--kd-loss-alpha", "0.5"])
    ref = reference(clean, alpha=0.5)
    ck.check(rel(ours["grad.student_logits"], ref["grad.student_logits"]) <= TOL and int(ours["num_tokens"]) == 5,
             "without loss_mask every row is supervised")


def check_dtypes(ck, args, rng):
    """BF16 / F16 log-probs (converted exactly to fp32), I64 ids and labels, BOOL mask."""
    from safetensors.torch import save_file as save_torch
    inp = make_inputs(rng, 8, 70, 9, masked=True)
    for dt in (torch.bfloat16, torch.float16):
        lq16 = torch.tensor(inp["topk_logprobs"]).to(dt)
        x = {"student_logits": torch.from_numpy(inp["student_logits"]), "topk_logprobs": lq16,
             "topk_ids": torch.from_numpy(inp["topk_ids"].astype(np.int64)),
             "labels": torch.from_numpy(inp["labels"].astype(np.int64)),
             "loss_mask": torch.from_numpy(inp["loss_mask"].astype(bool))}
        path = os.path.join(args.tmp, f"dtype-{str(dt)[6:]}.in.safetensors")
        save_torch(x, path)
        ours, _, _ = run_ours(args, path, "dtype", ["--kd-loss-alpha", "0.35"])
        ref_inp = dict(inp)
        ref_inp["topk_logprobs"] = lq16.to(torch.float32).numpy()  # -inf and NaN at masked rows stay as they are
        ref = reference(ref_inp, alpha=0.35)
        err = rel(ours["grad.student_logits"], ref["grad.student_logits"])
        ck.check(err <= TOL, f"{dt} log-probs: gradient rel err {err:.2e}")
        ck.check(rel(ours["kd_per_token"], ref["kd_per_token"]) <= TOL, f"{dt} log-probs: kd_per_token")


def check_errors(ck, args, rng):
    base = make_inputs(rng, 6, 20, 5)

    def expect_fail(name, inp, needles, extra=(), rc=1):
        path = os.path.join(args.tmp, name + ".in.safetensors")
        save_file(inp, path)
        _, err, code = run_ours(args, path, name, list(extra), expect_rc=None)
        ok = code == rc and all(n in err for n in needles)
        ck.check(ok, f"error case {name}: exit {code} (want {rc}), stderr {err.strip()!r} lacks {needles}")
        print(f"error case {name}: exit {code}: {err.strip().splitlines()[-1] if err.strip() else ''}")

    def edit(**kw):
        x = {k: v.copy() for k, v in base.items()}
        for k, v in kw.items():
            if v is None:
                del x[k]
            else:
                x[k] = v
        return x

    expect_fail("missing-student", edit(student_logits=None), ["student_logits", "missing"])
    expect_fail("missing-logprobs", edit(topk_logprobs=None), ["topk_logprobs", "missing"])
    expect_fail("missing-labels", edit(labels=None), ["labels", "missing", "--kd-loss-alpha"], ["--kd-loss-alpha", "0.5"])
    expect_fail("missing-teacher", edit(topk_ids=None, topk_logprobs=None), ["topk_ids", "missing"])
    expect_fail("dtype-student", edit(student_logits=base["student_logits"].astype(np.float64)),
                ["student_logits", "F64"])
    expect_fail("dtype-ids", edit(topk_ids=base["topk_ids"].astype(np.float32)), ["topk_ids", "F32"])
    expect_fail("shape-logprobs", edit(topk_logprobs=base["topk_logprobs"][:, :4]), ["topk_logprobs", "shape"])
    expect_fail("shape-mask", edit(loss_mask=base["loss_mask"][:5]), ["loss_mask", "shape", "[5]"])
    expect_fail("shape-student", edit(student_logits=base["student_logits"].reshape(-1)),
                ["student_logits", "1 dimensions, expected 2: [R, V]"])
    wide = edit(topk_ids=np.zeros((6, 21), dtype=np.int32), topk_logprobs=np.zeros((6, 21), dtype=np.float32))
    expect_fail("k-above-v", wide, ["'topk_ids' has 21 entries per row", "vocabulary", "(20)"])
    both = edit(teacher_logits=base["student_logits"].copy())
    expect_fail("both-teachers", both, ["teacher_logits", "topk_ids", "one teacher"])
    ids = base["topk_ids"].copy()
    ids[3, 2] = 20
    expect_fail("id-range", edit(topk_ids=ids), ["'topk_ids' holds 20 at [3, 2]", "row 3"])
    ids = base["topk_ids"].astype(np.int64)
    ids[3, 2] = 1 << 40
    expect_fail("id-i64", edit(topk_ids=ids), ["'topk_ids' holds 1099511627776 at [3, 2]"])
    mask = base["loss_mask"].copy()
    mask[3] = 0
    expect_fail("id-i64-masked-ok", edit(topk_ids=ids, loss_mask=mask), [], rc=0)
    ids = base["topk_ids"].copy()
    ids[3, 4] = ids[3, 1]
    expect_fail("id-duplicate", edit(topk_ids=ids), ["twice in row 3"])
    ids = base["topk_ids"].copy()
    ids[3, 1] = -1
    expect_fail("id-not-prefix", edit(topk_ids=ids), ["after the sentinel -1 at [3, 1]"])
    lq = base["topk_logprobs"].copy()
    lq[3, 2] = np.nan
    expect_fail("logprob-nan", edit(topk_logprobs=lq), ["'topk_logprobs' holds NaN at [3, 2]"])
    expect_fail("logits-not-logprobs", edit(topk_logprobs=base["topk_logprobs"] + 5.0), ["not logits"])
    s = base["student_logits"].copy()
    s[3, 6] = np.nan
    expect_fail("student-nan", edit(student_logits=s), ["'student_logits' holds NaN at [3, 6]"])
    lab = base["labels"].copy()
    lab[3] = -100
    expect_fail("label-range", edit(labels=lab), ["'labels' holds -100 at [3]"], ["--kd-loss-alpha", "0.5"])
    dense = edit(topk_ids=None, topk_logprobs=None, teacher_logits=base["student_logits"].copy())
    dense["teacher_logits"][1, 4] = -np.inf
    expect_fail("dense-reverse-infinite", dense, ["reverse KL of supervised row 1 is infinite", "teacher_logits"],
                ["--reverse"])
    # usage errors: exit 2 naming the option
    expect_fail("top-p-dense", dense, ["--top-p", "top-K teacher", "teacher_logits"], ["--top-p", "0.5"], rc=2)
    for opt in ("--skip-lm-loss", "--skip_lm_loss", "--kd-loss-scale", "--kd_loss_scale"):
        expect_fail("removed" + opt, base, [opt, "was removed", "use --kd-loss-alpha (1.0 reproduces skip_lm_loss=true)"],
                    [opt], rc=2)
    expect_fail("alpha-range", base, ["--kd-loss-alpha"], ["--kd-loss-alpha", "1.5"], rc=2)
    expect_fail("temperature-zero", base, ["--temperature"], ["--temperature", "0"], rc=2)
    expect_fail("min-k-zero", base, ["--min-k"], ["--top-p", "0.5", "--min-k", "0"], rc=2)
    expect_fail("unknown-option", base, ["--bogus"], ["--bogus"], rc=2)
    _, _, code = common.run([args.dspark, "kd-loss", "--help"], expect_rc=None)
    ck.check(code == 0, "--help exits 0")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    rng = np.random.default_rng(20261202)
    st = Stats()
    check_grid(ck, args, rng, st)
    print(f"{st.cases} configurations; worst normwise rel err: " +
          ", ".join(f"{k} {v:.2e}" for k, v in st.worst.items()), flush=True)
    check_invariance(ck, args, rng)
    check_dtypes(ck, args, rng)
    check_errors(ck, args, rng)
    ck.finish("dspark kd-loss conformance")


if __name__ == "__main__":
    main()

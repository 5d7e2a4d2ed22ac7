"""`dspark distill --intermediate S:T[:cosine|mse]` against PyTorch (issue 10, kd.md section 3),
on the tiny Qwen3 teacher of test_lm_train (4 layers, hidden 64) and two students (2 layers,
hidden 32: a learned projection 32 -> 64; hidden 64: none):

- 5 steps of dspark equal 5 steps of a PyTorch reference written from kd.md (per-step losses
  within 2e-5 relative, stricter than the issue's 1e-4 so that the pairs' own effect, checked
  to exceed 10x that, cannot hide in it): per micro-batch (one sequence), the logits KD (top-8 + ghost) and the
  LM CE as in test_lm_train, each intermediate pair's loss summed over the supervised rows and
  divided by the step's tokens, averaged to I, scale = |logits_kd| / max(I, FLT_MIN) detached,
  kd = logits_kd + I * scale; the projection starts as the rectangular identity and trains
  with the student (torch AdamW, clipping over both); cosine and mse, with and without the
  projection, the student's last layer (pre-norm) included;
- the metrics report the intermediate loss;
- a run stopped and resumed ends byte-identical (the projections are in the checkpoint);
- offline from an f32 cache with the needed layers equals the live teacher (1e-6);
- refusals, each naming --intermediate or the manifest field: a malformed pair, a student or
  teacher layer out of range, --kd-loss-alpha 0, a cache without features, a cache without the
  layer, a resume with other pairs."""
import hashlib
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import test_lm_train as lmt  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

# lr 1e-2 (not test_lm_train's 3e-3): the pairs' gradients must move the trajectory well beyond
# the tolerance within 5 steps for the comparison to see them (checked below)
STEPS, LR, SEQ, K, ALPHA = 5, 1e-2, 32, 8, 0.5
LOSS_TOL = 2e-5  # the issue asks 1e-4; we stay ~1e-6, and the pairs move the losses by > 10x this
FLT_MIN = 1.1754943508222875e-38


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def metric(run, key):
    return [json.loads(l).get(key) for l in open(os.path.join(run, "metrics.jsonl")) if '"kind":"train"' in l]


def parse_pair(spec):
    parts = spec.split(":")
    return int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "cosine"


def student_hidden(model, x, layers):
    """Our layer numbering: -1 = embeddings (HF hidden_states[0]), l = after layer l; the last
    layer's output before the final norm comes from a hook (HF's hidden_states[L] is normed)."""
    got = {}

    def hook(_m, _inp, out):
        got["last"] = out[0] if isinstance(out, tuple) else out
    L = model.config.num_hidden_layers
    h = model.model.layers[L - 1].register_forward_hook(hook)
    out = model(x, output_hidden_states=True)
    h.remove()
    hs = {l: (got["last"][0] if l == L - 1 else out.hidden_states[l + 1][0]) for l in layers}
    return out.logits[0], hs


def pair_rows(kind, a, b):
    if kind == "mse":
        return ((a - b) ** 2).mean(-1)
    return 1 - torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-8)


def torch_train(student_dir, teacher_dir, seqs, pairs):
    """kd.md sections 2-3 in float64, balanced per micro-batch (one sequence)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float64)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float64).eval()
    ds, dt = model.config.hidden_size, teacher.config.hidden_size
    projs = [torch.nn.Parameter(torch.eye(dt, ds, dtype=torch.float64)) if ds != dt else None for _ in pairs]
    params = list(model.parameters()) + [p for p in projs if p is not None]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses, inters = [], []
    W = float(sum(len(s) - 1 for s in seqs))
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lmt.lr_at(step, STEPS, 0.04, LR)
        opt.zero_grad()
        total, inter_report = 0.0, 0.0
        for ids in seqs:
            x = torch.tensor([ids])
            logits, hs = student_hidden(model, x, sorted({p[0] for p in pairs}))
            with torch.no_grad():
                tout = teacher(x, output_hidden_states=True)
            labels = x[0, 1:]
            n = len(ids) - 1
            lp_s = torch.log_softmax(logits[:-1], dim=-1)
            lp_t = torch.log_softmax(tout.logits[0, :-1], dim=-1)
            q, tid = torch.topk(lp_t, K, dim=-1)
            p = lp_s.gather(-1, tid)
            eps = 1.1920929e-7
            lq = torch.clamp(torch.logsumexp(q, -1), max=-eps)
            lpk = torch.clamp(torch.logsumexp(p, -1), max=-eps)
            gq, gp = torch.log(-torch.expm1(lq)), torch.log(-torch.expm1(lpk))
            kd = ((q.exp() * (q - p)).sum(-1) + gq.exp() * (gq - gp)).sum() / W
            lm = torch.nn.functional.cross_entropy(logits[:-1], labels, reduction="sum") / W
            terms = []
            for (s_l, t_l, kind), proj in zip(pairs, projs):
                a = hs[s_l][:n]
                if proj is not None:
                    a = a @ proj.T
                b = tout.hidden_states[t_l + 1][0, :n]
                terms.append(pair_rows(kind, a, b).sum() / W)
            inter = sum(terms) / len(terms)
            scale = (kd.detach().abs() / max(float(inter.detach()), FLT_MIN)) if float(inter.detach()) > 0 else 0.0
            total = total + (1 - ALPHA) * lm + ALPHA * (kd + inter * scale)
            inter_report += float(inter.detach())
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(total.detach()))
        inters.append(inter_report)
    return losses, inters, [p.detach().numpy() if p is not None else None for p in projs]


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp = args.tmp
    teacher = common.build_bpe_target(tmp, n_files=20, vocab_size=300, seed=3, name="teacher")
    V = json.load(open(os.path.join(teacher, "config.json")))["vocab_size"]
    students = {}
    for name, hidden in (("student32", 32), ("student64", 64)):
        sdir = os.path.join(tmp, name)
        if not os.path.exists(os.path.join(sdir, "config.json")):
            common.build_tiny_model("qwen3", sdir, seed=9, vocab_size=V, eos_token_id=0, num_hidden_layers=2,
                                    hidden_size=hidden, intermediate_size=48, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8)
            shutil.copy(os.path.join(teacher, "tokenizer.json"), os.path.join(sdir, "tokenizer.json"))
        students[hidden] = sdir
    import glob
    import sysconfig
    data = os.path.join(tmp, "data.txt")
    with open(data, "w") as f:
        for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[40:41]:
            f.write(open(p, encoding="utf-8", errors="replace").read()[:3000])
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(os.path.join(teacher, "tokenizer.json")).encode(open(data, encoding="utf-8").read()).ids
    ids = ids + [0]
    seqs = [s for s in (ids[i:i + SEQ] for i in range(0, len(ids), SEQ)) if len(s) >= 2]
    n_eval = 2
    train_seqs = seqs[:len(seqs) - n_eval]
    loop = ["--seq-len", str(SEQ), "--steps", str(STEPS), "--batch-seqs", str(len(train_seqs)), "--lr", str(LR),
            "--eval-seqs", str(n_eval), "--eval-every", "0", "--save-every", "1", "--threads", "2", "--quiet"]
    data_opts = ["--data", data, "--data-format", "text"]
    kd_opts = ["--topk", str(K), "--kd-loss-alpha", str(ALPHA)]

    def distill(out, student, pairs, source=("--teacher", teacher), extra=(), rc=0):
        cmd = [args.dspark, "distill", *source, "--student", student, "--out", out, "--overwrite", *loop,
               *(data_opts if source[0] == "--teacher" else []), *kd_opts, *extra]
        for p in pairs:
            cmd += ["--intermediate", p]
        return common.run(cmd, expect_rc=rc)

    cases = [
        ("proj-cosine", 32, ["0:1", "1:2:cosine"]),
        ("proj-mse", 32, ["-1:0:mse", "1:2:mse"]),
        ("noproj-cosine", 64, ["0:1:cosine"]),
        ("noproj-mixed", 64, ["1:2:mse", "0:0:cosine"]),
    ]
    for name, hidden, pairs in cases:
        run = os.path.join(tmp, name)
        distill(run, students[hidden], pairs)
        ours, ref = metric(run, "loss"), None
        ref, ref_inter, ref_projs = torch_train(students[hidden], teacher, train_seqs, [parse_pair(p) for p in pairs])
        err = max(abs(a - b) / abs(b) for a, b in zip(ours, ref)) if len(ours) == STEPS else float("inf")
        print(f"{name}: losses ours {ours}\n  torch {ref}\n  worst relative difference {err:.2e}")
        ck.check(err < LOSS_TOL, f"{name}: losses differ from PyTorch by {err:.2e}")
        inter = metric(run, "intermediate")
        ierr = max(abs(a - b) / abs(b) for a, b in zip(inter, ref_inter)) if None not in inter else float("inf")
        print(f"  intermediate ours {inter}\n  torch {ref_inter}\n  worst relative difference {ierr:.2e}")
        ck.check(ierr < LOSS_TOL, f"{name}: the reported intermediate loss {inter} differs from {ref_inter}")
        # the pairs' gradients move the student: I changes far beyond the tolerance over the steps
        ck.check(abs(ref_inter[-1] - ref_inter[0]) > 1e-2 * abs(ref_inter[0]), f"{name}: I hardly moves: {ref_inter}")
        from safetensors.numpy import load_file
        ckpt = load_file(os.path.join(run, "checkpoint.safetensors"))
        for i, want in enumerate(ref_projs):
            got = ckpt.get(f"intermediate.{i}.proj.weight")
            if want is None:
                ck.check(got is None, f"{name}: pair {i} has a projection though the sizes are equal")
                continue
            eye = np.eye(*want.shape)  # compare what training changed, not the identity it started from
            e = common.normwise_rel_err(got - eye, want - eye) if got is not None else float("inf")
            print(f"  projection {i}'s change over {STEPS} steps: normwise difference {e:.2e}")
            # Adam divides by sqrt(v): entries with tiny gradients move by about lr whatever their
            # size, so fp32 vs fp64 roundoff in them shows more here than in the losses
            ck.check(e < 1e-3, f"{name}: projection {i} differs from PyTorch's by {e:.2e}")

    # the pairs' gradients matter at the tolerance: without them the same balanced total
    # ((1 - a) lm + 2 a kd once I > 0) ends more than 10x LOSS_TOL away
    for name, hidden, _ in cases[:1] + cases[2:3]:
        plain = os.path.join(tmp, f"{name}-plain")
        distill(plain, students[hidden], [])
        with_pairs = os.path.join(tmp, name)
        tot = [(1 - ALPHA) * lm + 2 * ALPHA * kd for lm, kd in zip(metric(plain, "lm"), metric(plain, "kd"))]
        ref = metric(with_pairs, "loss")
        moved = abs(tot[-1] - ref[-1]) / abs(ref[-1])
        print(f"{name}: the last step's loss without the pairs' gradients moves by {moved:.2e}")
        ck.check(moved > 10 * LOSS_TOL, f"{name}: the pairs barely change the trajectory ({moved:.2e}); the test is blind")

    # stop + resume: byte-identical (the projections and their optimizer state are checkpointed)
    pairs = ["0:1", "1:2:mse"]
    full, stop = os.path.join(tmp, "proj-cosine-full"), os.path.join(tmp, "proj-cosine-stop")
    distill(full, students[32], pairs)
    distill(stop, students[32], pairs, extra=["--stop-after", "2"])
    common.run([args.dspark, "distill", "--teacher", teacher, "--student", students[32], "--out", stop, "--resume",
                *loop, *data_opts, *kd_opts, "--intermediate", pairs[0], "--intermediate", pairs[1]])
    ck.check(sha(os.path.join(full, "checkpoint.safetensors")) == sha(os.path.join(stop, "checkpoint.safetensors")),
             "stop + resume with --intermediate did not end byte-identical")
    from safetensors.numpy import load_file
    ckpt = load_file(os.path.join(full, "checkpoint.safetensors"))
    ck.check(ckpt.get("intermediate.0.proj.weight", np.zeros(0)).shape == (64, 32),
             f"checkpoint projections: {[k for k in ckpt if k.startswith('intermediate')]}")
    # a resume with other pairs is refused by name
    _, msg, _ = common.run([args.dspark, "distill", "--teacher", teacher, "--student", students[32], "--out", stop,
                            "--resume", *loop, *data_opts, *kd_opts, "--intermediate", "0:1"], expect_rc=1)
    ck.check("intermediate" in msg, f"a resume with other --intermediate pairs: {msg}")

    # offline from an f32 cache with the teacher's layers == live
    cache = os.path.join(tmp, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    common.run([args.dspark, "capture", "--target", teacher, "--data", data, "--data-format", "text", "--out", cache,
                "--seq-len", str(SEQ), "--topk", str(K), "--target-layer-ids", "0,1,2", "--dtype", "f32", "--quiet"])
    off = os.path.join(tmp, "offline")
    distill(off, students[32], pairs, source=("--cache", cache))
    a, b = metric(full, "loss"), metric(off, "loss")
    err = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(b) == STEPS else float("inf")
    wa, wb = load_file(os.path.join(full, "checkpoint.safetensors")), load_file(os.path.join(off, "checkpoint.safetensors"))
    werr = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa if k.startswith(("student.", "intermediate.")))
    print(f"live vs cache with --intermediate: losses {err:.2e}, weights {werr:.2e}")
    ck.check(err < 1e-6 and werr < 1e-6, f"offline --intermediate differs from live: {a} vs {b}, weights {werr:.2e}")

    # refusals, each naming the option or the manifest field
    bad = os.path.join(tmp, "bad")
    _, msg, _ = distill(bad, students[32], ["0:x"], rc=2)
    ck.check("--intermediate" in msg, f"a malformed pair: {msg}")
    _, msg, _ = distill(bad, students[32], ["0:1:l1"], rc=2)
    ck.check("--intermediate" in msg, f"an unknown loss kind: {msg}")
    _, msg, _ = distill(bad, students[32], ["2:1"], rc=1)
    ck.check("--intermediate 2:1" in msg and "student layer" in msg, f"a student layer out of range: {msg}")
    _, msg, _ = distill(bad, students[32], ["0:3"], rc=1)
    ck.check("--intermediate 0:3" in msg and "teacher layer" in msg, f"a teacher layer out of range: {msg}")
    _, msg, _ = distill(bad, students[32], ["0:1"], extra=["--kd-loss-alpha", "0"], rc=1)
    ck.check("--intermediate" in msg and "--kd-loss-alpha" in msg, f"--kd-loss-alpha 0: {msg}")
    nofeat = os.path.join(tmp, "cache-nofeat")
    shutil.rmtree(nofeat, ignore_errors=True)
    common.run([args.dspark, "capture", "--target", teacher, "--data", data, "--data-format", "text", "--out", nofeat,
                "--seq-len", str(SEQ), "--topk", str(K), "--no-features", "--dtype", "f32", "--quiet"])
    _, msg, _ = distill(bad, students[32], ["0:1"], source=("--cache", nofeat), rc=1)
    ck.check("'features'" in msg and "--intermediate" in msg, f"a cache without features: {msg}")
    few = os.path.join(tmp, "cache-few")
    shutil.rmtree(few, ignore_errors=True)
    common.run([args.dspark, "capture", "--target", teacher, "--data", data, "--data-format", "text", "--out", few,
                "--seq-len", str(SEQ), "--topk", str(K), "--target-layer-ids", "0,2", "--dtype", "f32", "--quiet"])
    _, msg, _ = distill(bad, students[32], ["0:1"], source=("--cache", few), rc=1)
    ck.check("'target_layer_ids'" in msg and "--intermediate 0:1" in msg, f"a cache without the layer: {msg}")
    _, msg, _ = common.run([args.dspark, "pretrain", "--intermediate", "0:1"], expect_rc=2)
    ck.check("--intermediate" in msg, f"pretrain --intermediate: {msg}")
    ck.finish("test_kd_intermediate")


if __name__ == "__main__":
    main()

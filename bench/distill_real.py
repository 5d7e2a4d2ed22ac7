#!/usr/bin/env python3
"""Distillation on a real teacher: a student of about a quarter of SmolLM2-135M-Instruct's
parameters (same tokenizer and vocabulary, tied embeddings) distilled from it on its own
regenerated answers, against the same student trained with the LM loss alone on the same
tokens and steps, for several seeds; held-out cross-entropy on the true next token and the
KL(teacher || student) over the full vocabulary.

    nice -n 15 python3 bench/distill_real.py [--teacher MODEL.gguf|DIR] [--data answers.jsonl]
        [--out DIR] [--seeds 1,2,3] [--steps N] [--arms lm=0,kd=0.5] ...

Stages (each resumable: rerunning the command skips what is complete):
  1. the teacher: the path as given when `dspark info` accepts it, else (a .gguf the build
     cannot read directly) `dspark convert --dtype f32` into OUT/teacher;
  2. the data: the conversations of --data with every --holdout-every-th one (from
     --holdout-offset) moved to the end, written to OUT/data.jsonl: the trainers hold out the
     last --eval-seqs sequences, so the held-out set is spread over the file's prompt kinds;
  3. one KD cache of the teacher's top-K (`dspark capture --topk K --no-features --dtype f32`):
     the teacher runs once for every seed and arm;
  4. per seed and arm, `dspark distill --cache` from the same fresh student (seeded), with the
     same data order, steps and batches; the arms differ only in --kd-loss-alpha (alpha 0 is the
     pretraining objective: metrics bit-identical to `dspark pretrain` on the same sequences);
  5. per run, `dspark export` and an evaluation-only `dspark distill --teacher T --student
     EXPORT --topk 0` (the live teacher, the dense KL over all 49152 entries, at T = 1): its
     step-0 evaluation over the same held-out conversations gives `lm` (CE on the true next
     token, assistant tokens) and `kd` (KL(teacher || student), summed over the vocabulary,
     averaged over the same tokens). The script checks that this CE equals the training run's
     final one (the same sequences and weights) before it trusts the KL;
  6. the table (markdown) on stdout and in OUT/results.md, everything in OUT/results.json.
"""
import argparse
import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HOME = Path.home()
T0 = time.time()

# two-sided 95% Student t quantiles by degrees of freedom (no scipy needed)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df):
    keys = [k for k in T95 if k <= df]
    return T95[max(keys)] if keys else float("inf")


def log(msg):
    el = int(time.time() - T0)
    print(f"[{el // 60:3d}m{el % 60:02d}s] {msg}", flush=True)


def run(cmd, what, capture=False):
    """Runs a dspark command; on failure prints its stderr tail and stops."""
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        sys.exit(f"{what} failed (exit {p.returncode}): {' '.join(map(str, cmd))}")
    return p.stdout if capture else None


def parse_arms(text, topk):
    arms = []
    for item in text.split(","):
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)=([0-9.]+)(?:@([0-9]+))?", item.strip())
        if not m:
            sys.exit(f"--arms: '{item}' is not NAME=ALPHA or NAME=ALPHA@K")
        alpha = float(m.group(2))
        if not 0 <= alpha <= 1:
            sys.exit(f"--arms: alpha {alpha} of '{m.group(1)}' is outside [0, 1]")
        arms.append({"name": m.group(1), "alpha": alpha, "topk": int(m.group(3) or topk)})
    if len({a["name"] for a in arms}) != len(arms):
        sys.exit("--arms: names must differ")
    return arms


def count_params(c):
    d, L, V, I = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    hd = c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = d * q + 2 * d * kv + q * d + 3 * d * I + 2 * d
    return V * d * (1 if c["tie_word_embeddings"] else 2) + L * layer + d


def info_params(ds, model):
    out = run([ds, "info", model], "dspark info", capture=True)
    m = re.search(r"^parameters:\s+(\d+)", out, re.M)
    return int(m.group(1)) if m else None


def evals_of(run_dir):
    return [json.loads(l) for l in open(run_dir / "metrics.jsonl") if '"kind":"eval"' in l]


def done(run_dir, key):
    f = run_dir / "bench-done.json"
    return f.exists() and json.loads(f.read_text()).get("key") == key


def mark_done(run_dir, key, **extra):
    (run_dir / "bench-done.json").write_text(json.dumps({"key": key, **extra}) + "\n")


def mean_std(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else float("nan"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dspark", default="build/release/dspark")
    ap.add_argument("--teacher", default=str(HOME / ".cache/dspark/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
                    help="a .gguf file or an HF model directory (default: the SmolLM2-135M-Instruct GGUF)")
    ap.add_argument("--data", default=str(HOME / ".cache/dspark/demo-smollm2/answers.jsonl"),
                    help="chat JSONL: the teacher's regenerated answers (default: the main job's)")
    ap.add_argument("--out", default=str(HOME / ".cache/dspark/distill-real"))
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--arms", default="lm=0,kd=0.5",
                    help="NAME=ALPHA[@K],... (alpha 0: the LM loss alone; default lm=0,kd=0.5)")
    ap.add_argument("--topk", type=int, default=64, help="the KD arms' K (and the cache's, at least)")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--batch-seqs", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", default="2e-3")
    ap.add_argument("--warmup", default="0.05")
    ap.add_argument("--holdout-every", type=int, default=9)
    ap.add_argument("--holdout-offset", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=0, help="threads per dspark command (0: its default)")
    ap.add_argument("--no-teacher-row", action="store_true", help="skip the teacher's own held-out CE")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep the runs' 378 MB checkpoints")
    a = ap.parse_args()

    ds = Path(a.dspark).resolve()
    out = Path(a.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in a.seeds.split(",")]
    arms = parse_arms(a.arms, a.topk)
    K = max(arm["topk"] for arm in arms)
    thr = ["--threads", str(a.threads)] if a.threads else []
    help_text = run([ds, "--help"], "dspark --help", capture=True)
    kernels = next((l for l in help_text.splitlines() if l.startswith("matmuls")), "?")
    cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], stdout=subprocess.PIPE,
               text=True).stdout.splitlines() if l.startswith("Model name")), platform.processor())
    log(f"{kernels}; CPU: {cpu}; load {os.getloadavg()[0]:.1f}; out {out}")
    stage_s = {}

    # 1. the teacher
    t = time.time()
    teacher = Path(a.teacher).expanduser().resolve()
    probe = subprocess.run([str(ds), "info", str(teacher)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    teacher_note = "read directly"
    if probe.returncode != 0:
        if teacher.suffix != ".gguf":
            sys.stderr.write(probe.stderr)
            sys.exit(f"dspark info refuses the teacher {teacher}")
        conv = out / "teacher"
        if not (conv / "config.json").exists():
            log(f"this build does not read {teacher.name} directly: converting it to {conv} (f32)")
            run([ds, "convert", teacher, "--out", conv, "--dtype", "f32", "--overwrite"], "dspark convert")
        teacher_note = f"converted from {teacher} (dspark convert --dtype f32)"
        teacher = conv
    teacher_params = info_params(ds, teacher)
    log(f"teacher {teacher} ({teacher_note}): {teacher_params} parameters")
    stage_s["teacher"] = time.time() - t

    # 2. the data, held-out conversations last
    lines = [l for l in open(Path(a.data).expanduser(), encoding="utf-8") if l.strip()]
    held = [l for i, l in enumerate(lines) if i % a.holdout_every == a.holdout_offset]
    train = [l for i, l in enumerate(lines) if i % a.holdout_every != a.holdout_offset]
    n_eval = len(held)
    data = out / "data.jsonl"
    text = "".join(l if l.endswith("\n") else l + "\n" for l in train + held)
    if not data.exists() or data.read_text(encoding="utf-8") != text:
        data.write_text(text, encoding="utf-8")
    log(f"data {a.data}: {len(lines)} conversations, {len(train)} for training, {n_eval} held out "
        f"(every {a.holdout_every}th from #{a.holdout_offset})")

    # 3. the student's config
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": None,
           "hidden_size": a.hidden, "intermediate_size": a.intermediate, "num_hidden_layers": a.layers,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.hidden // a.heads,
           "max_position_embeddings": None, "rms_norm_eps": None, "rope_theta": None, "hidden_act": "silu",
           "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "bos_token_id": None,
           "eos_token_id": None, "initializer_range": 0.02}
    tcfg = json.loads((teacher / "config.json").read_text()) if teacher.is_dir() else {}
    for k, dflt in (("vocab_size", 49152), ("max_position_embeddings", 8192), ("rms_norm_eps", 1e-5),
                    ("rope_theta", 100000.0), ("bos_token_id", 1), ("eos_token_id", 2)):
        cfg[k] = tcfg.get(k, dflt)
    scfg = out / "student_config.json"
    scfg.write_text(json.dumps(cfg, indent=1) + "\n")
    student_params = count_params(cfg)
    log(f"student: Llama d={a.hidden}, {a.layers} layers, {a.heads}/{a.kv_heads} heads, head_dim {cfg['head_dim']}, "
        f"intermediate {a.intermediate}, vocabulary {cfg['vocab_size']} tied: {student_params} parameters "
        f"({student_params / 1e6:.2f} M, {100 * student_params / teacher_params:.1f}% of the teacher)")

    # 4. the KD cache (the teacher's top-K once for all seeds and arms)
    t = time.time()
    cache = out / f"cache-k{K}"
    log(f"capture: the teacher's top-{K} over {len(lines)} conversations -> {cache} (resumes / verifies)")
    summary = run([ds, "capture", "--target", teacher, "--data", data, "--out", cache, "--topk", K, "--no-features",
                   "--dtype", "f32", "--seq-len", a.seq_len, "--quiet", *thr], "dspark capture", capture=True)
    cap = json.loads(summary.strip().splitlines()[-1])
    manifest = json.loads((cache / "manifest.json").read_text())
    cap["samples"], cap["tokens"] = manifest["num_samples"], manifest["num_tokens"]
    stage_s["capture"] = time.time() - t
    log(f"capture: {cap['samples']} sequences, {cap['tokens']} tokens, {stage_s['capture']:.0f} s")

    # 5. training runs
    common = ["--cache", cache, "--student-config", scfg, "--steps", a.steps, "--batch-seqs", a.batch_seqs,
              "--lr", a.lr, "--warmup", a.warmup, "--eval-seqs", n_eval, "--eval-every", a.steps,
              "--save-every", a.steps, "--quiet", *thr]
    key_base = json.dumps([str(cache), cap["tokens"], a.steps, a.batch_seqs, a.lr, a.warmup, n_eval, cfg])
    runs = {}
    t_train = time.time()
    n_runs, n_done = len(seeds) * len(arms), 0
    for seed in seeds:
        for arm in arms:
            name = f"{arm['name']}-s{seed}"
            rd = out / "runs" / name
            key = key_base + json.dumps([arm, seed])
            t = time.time()
            fresh = not done(rd, key)
            if not fresh:
                log(f"train {name}: already complete")
            else:
                log(f"train {name}: alpha {arm['alpha']}, top-{arm['topk']}, seed {seed}, {a.steps} steps of "
                    f"{a.batch_seqs} conversations")
                run([ds, "distill", *common, "--kd-loss-alpha", arm["alpha"], "--topk", arm["topk"], "--seed", seed,
                     "--out", rd, "--overwrite"], f"training {name}")
                mark_done(rd, key, train_s=time.time() - t)
                n_done += 1
                el = time.time() - t_train
                left = (n_runs - len(runs) - 1) * el / n_done
                log(f"train {name}: {time.time() - t:.0f} s (about {left / 60:.0f} min of training left)")
            runs[name] = {"arm": arm["name"], "alpha": arm["alpha"], "topk": arm["topk"], "seed": seed, "dir": rd,
                          "fresh": fresh,
                          "train_s": json.loads((rd / "bench-done.json").read_text())["train_s"]}
    stage_s["train"] = time.time() - t_train

    # 6. evaluation: the live teacher's full-vocabulary KL and the CE, per run
    t_eval = time.time()
    ev_common = ["--teacher", teacher, "--topk", 0, "--kd-loss-alpha", 1, "--data", data, "--seq-len", a.seq_len,
                 "--eval-seqs", n_eval, "--steps", 1, "--lr", 0, "--batch-seqs", 1, "--eval-every", 0,
                 "--save-every", 1, "--quiet", "--overwrite", *thr]

    def evaluate(name, student, expect_lm=None):
        ed = out / "evals" / name
        key = json.dumps([str(student), str(teacher), str(data), n_eval, a.seq_len,
                          (Path(student) / "model.safetensors").stat().st_mtime])
        if not done(ed, key):
            run([ds, "distill", *ev_common, "--student", student, "--out", ed], f"evaluating {name}")
            (ed / "checkpoint.safetensors").unlink(missing_ok=True)
            mark_done(ed, key)
        e = evals_of(ed)[0]
        if expect_lm is not None and abs(e["lm"] - expect_lm) > 1e-6 * abs(expect_lm):
            sys.exit(f"{name}: the evaluation's CE {e['lm']!r} is not the training run's final {expect_lm!r}: "
                     "the held-out sequences differ (tokenizer or chat template?)")
        return e

    for name, r in runs.items():
        rd = r["dir"]
        final = [e for e in evals_of(rd) if e["step"] == a.steps][-1]
        hf = out / "students" / name
        if r["fresh"] or not (hf / "model.safetensors").exists():
            run([ds, "export", rd, "--out", hf, "--overwrite"], f"export {name}")
        # the export carries the cache's tokenizer.json without the chat template beside it: the
        # evaluation takes the teacher's tokenizer and template instead (the CE check proves it)
        (hf / "tokenizer.json").unlink(missing_ok=True)
        if name == next(iter(runs)) and info_params(ds, hf) != student_params:
            sys.exit(f"dspark info {hf} counts {info_params(ds, hf)} parameters, this script {student_params}")
        if not a.keep_checkpoints:
            (rd / "checkpoint.safetensors").unlink(missing_ok=True)
        t = time.time()
        e = evaluate(name, hf, final["lm"])
        r.update(ce=e["lm"], kl=e["kd"], eval_tokens=e["tokens"], ce_step0=evals_of(rd)[0]["lm"],
                 topk_kl=final.get("kd"), train_tokens=sum(json.loads(l)["tokens"] for l in open(rd / "metrics.jsonl")
                                                           if '"kind":"train"' in l))
        log(f"eval {name}: CE {r['ce']:.4f}, KL(teacher||student) {r['kl']:.4f} over {e['tokens']} held-out tokens "
            f"({time.time() - t:.0f} s)")
    teacher_row = None
    if not a.no_teacher_row and teacher.is_dir():
        e = evaluate("teacher", teacher)
        teacher_row = {"ce": e["lm"], "kl": e["kd"]}
        log(f"eval teacher: CE {e['lm']:.4f} (KL to itself {e['kd']:.2e})")
    stage_s["eval"] = time.time() - t_eval

    # 7. the table
    base = arms[0]["name"]
    by = {arm["name"]: [runs[f"{arm['name']}-s{s}"] for s in seeds] for arm in arms}
    for i, s in enumerate(seeds):  # the arms of a seed saw the same supervised tokens
        if len({by[arm["name"]][i]["train_tokens"] for arm in arms}) != 1:
            sys.exit(f"seed {s}: the arms trained on different token counts: "
                     f"{[by[arm['name']][i]['train_tokens'] for arm in arms]}")
    total_s = time.time() - T0
    md = []
    md.append(f"Teacher {Path(a.teacher).name} ({teacher_params / 1e6:.1f} M parameters); student Llama d={a.hidden}, "
              f"{a.layers} layers, {a.heads}/{a.kv_heads} heads, intermediate {a.intermediate}, tied "
              f"{cfg['vocab_size']}-token vocabulary: {student_params / 1e6:.2f} M parameters "
              f"({100 * student_params / teacher_params:.1f}%). {len(train)} training conversations "
              f"({cap['tokens']} tokens with the held-out ones), {n_eval} held out "
              f"({runs[next(iter(runs))]['eval_tokens']} supervised tokens); {a.steps} steps of {a.batch_seqs} "
              f"conversations, lr {a.lr}, seeds {a.seeds}. CE: held-out cross-entropy on the true next token; "
              f"KL: KL(teacher || student) over the full vocabulary, per token.")
    md.append("")
    md.append("| arm | alpha | K | CE (mean ± std) | perplexity | KL (mean ± std) | per seed CE | per seed KL |")
    md.append("|---|---|---|---|---|---|---|---|")
    for arm in arms:
        rs = by[arm["name"]]
        cm, cs = mean_std([r["ce"] for r in rs])
        km, ks = mean_std([r["kl"] for r in rs])
        md.append(f"| {arm['name']} | {arm['alpha']} | {arm['topk'] if arm['alpha'] > 0 else '-'} | {cm:.4f} ± {cs:.4f} | "
                  f"{math.exp(cm):.1f} | {km:.4f} ± {ks:.4f} | {', '.join('%.4f' % r['ce'] for r in rs)} | "
                  f"{', '.join('%.4f' % r['kl'] for r in rs)} |")
    if teacher_row:
        md.append(f"| teacher | | | {teacher_row['ce']:.4f} | {math.exp(teacher_row['ce']):.1f} | "
                  f"{teacher_row['kl']:.1e} | | |")
    comparisons = []
    if len(arms) > 1:
        md.append("")
        md.append(f"Paired by seed (same initialization, data order and tokens), arm minus {base}; t = mean / "
                  f"(std / sqrt(n)), outside the noise when |t| > t(0.975, n-1) = {t95(len(seeds) - 1):.2f}:")
        md.append("")
        md.append("| arm - " + base + " | ΔCE per seed | ΔCE mean ± std | t | ΔKL per seed | ΔKL mean ± std | t |")
        md.append("|---|---|---|---|---|---|---|")
        for arm in arms[1:]:
            row = {"arm": arm["name"], "baseline": base}
            cells = []
            for metric in ("ce", "kl"):
                dif = [r[metric] - b[metric] for r, b in zip(by[arm["name"]], by[base])]
                m, s = mean_std(dif)
                tv = m / (s / math.sqrt(len(dif))) if len(dif) > 1 and s > 0 else float("nan")
                row[metric] = {"diffs": dif, "mean": m, "std": s, "t": tv,
                               "outside_noise": bool(len(dif) > 1 and abs(tv) > t95(len(dif) - 1))}
                cells += [", ".join(f"{x:+.4f}" for x in dif), f"{m:+.4f} ± {s:.4f}", f"{tv:.1f}"]
            comparisons.append(row)
            md.append(f"| {arm['name']} | " + " | ".join(cells) + " |")
    md.append("")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = ru.ru_utime + ru.ru_stime
    md.append(f"{kernels}; CPU: {cpu}; {datetime.now(timezone.utc).strftime('%Y-%m-%d')}; "
              f"{total_s / 60:.1f} min in all (capture {stage_s['capture'] / 60:.1f}, training "
              f"{stage_s['train'] / 60:.1f}, evaluation {stage_s['eval'] / 60:.1f}), {cpu_s / 60:.1f} CPU-minutes "
              f"in this invocation's commands; load average {os.getloadavg()[1]:.1f} (5 min) at the end.")
    text = "\n".join(md)
    print()
    print(text)
    (out / "results.md").write_text(text + "\n")
    res = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu": cpu, "kernels": kernels,
           "command": " ".join(sys.argv), "teacher": str(teacher), "teacher_source": a.teacher,
           "teacher_params": teacher_params, "student_config": cfg, "student_params": student_params,
           "data": a.data, "conversations": len(lines), "train_conversations": len(train), "eval_conversations": n_eval,
           "cache": str(cache), "cache_tokens": cap["tokens"], "steps": a.steps, "batch_seqs": a.batch_seqs,
           "seq_len": a.seq_len, "lr": a.lr, "warmup": a.warmup, "seeds": seeds, "arms": arms,
           "runs": {n: {k: v for k, v in r.items() if k not in ("dir", "fresh")} for n, r in runs.items()},
           "teacher_row": teacher_row, "comparisons": comparisons, "stage_s": stage_s, "total_s": total_s,
           "cpu_s": cpu_s}
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    log(f"results: {out / 'results.md'}, {out / 'results.json'}")


if __name__ == "__main__":
    main()

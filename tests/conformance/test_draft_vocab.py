"""A reduced draft vocabulary (`train --draft-vocab N`, spec/dspark.md section 4a) end to end, on
a tiny Qwen3 chat target (Qwen3-0.6B's template) and chat data built here:

- selection: S is exactly what docs/training.md says, recomputed here from `dspark tokenize
  --chat` of the same data: the ids the chat template emits in an assistant turn (the supervised
  ids of a conversation whose answer is empty), the stop / eos ids, then the most frequent
  supervised target tokens of the training split (ties by lower id), sorted; the run records
  it (train_config draft_vocab_size / draft_vocab_xxh64, run.json's coverage);
- N = V gives the plain run's weights, metrics and evaluations bit for bit (only d2t / t2d added);
- a cache: training from an f32 cache with --draft-vocab equals the online run bit for bit (the
  template found through the capture's target), also after --stop-after + --resume; without the
  template at hand the run says so and S keeps the stop / eos ids;
- export: config.json draft_vocab_size, d2t I64 [N] (offsets, S[j] = j + d2t[j]) and t2d BOOL
  [V] as speculators / vLLM read them (python safetensors), lm_head and markov_w2 [N, .] (the
  target's lm_head rows S), markov_w1 and embed_tokens [V, .];
- decoding: `speculate` with the reduced draft (export and run directory) prints what `generate`
  prints (greedy, several prompts, fixed / threshold policies, batched); under sampling the
  first drafted token's distribution equals the target's (chi-square against transformers);
  calibrate and profile run with it; `regenerate --draft` gives the plain regeneration;
- refusals naming what is wrong: N > V, N below the mandatory ids, a resume with another N,
  a checkpoint whose d2t is out of range or not increasing (draft.d2t), an export whose d2t or
  t2d is damaged (d2t / t2d)."""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from test_speculate import chi_square_p, sampling_probs  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

SEQ = 128
EVAL = 4


def chat_prompts(path, n):
    """n user turns cut from the standard library's sources."""
    import glob
    import sysconfig
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:12]
    text = "".join(open(p, encoding="utf-8", errors="replace").read()[:8000] for p in files)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"messages": [{"role": "user", "content": text[i * 97: i * 97 + 40]}]}) + "\n")
    return path


def tokenize_chat(dspark, target, path):
    out, _, _ = common.run([dspark, "tokenize", target, "--chat", path])
    return [json.loads(l) for l in out.strip().split("\n")]


def expected_vocab(dspark, target, tmp, data, N, V):
    """S by the documented rule, from the engine's own chat tokenization of the data."""
    probe = os.path.join(tmp, "probe.jsonl")
    with open(probe, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]}) + "\n")
    p = tokenize_chat(dspark, target, probe)[0]
    template = {i for i, m in zip(p["ids"], p["loss_mask"]) if m}
    cfg = json.load(open(os.path.join(target, "config.json")))
    eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    gen = os.path.join(target, "generation_config.json")
    if os.path.exists(gen):
        g = json.load(open(gen)).get("eos_token_id")
        eos += g if isinstance(g, list) else [g] if g is not None else []
    mandatory = template | set(eos)
    recs = tokenize_chat(dspark, target, data)
    recs = [r for r in recs if len(r["ids"][:SEQ]) >= 2]
    counts = np.zeros(V, dtype=np.int64)
    for r in recs[: len(recs) - EVAL]:
        ids, mask = r["ids"][:SEQ], r["loss_mask"][:SEQ]
        for k in range(1, len(ids)):
            if mask[k]:
                counts[ids[k]] += 1
    rest = sorted((v for v in range(V) if v not in mandatory), key=lambda v: (-counts[v], v))
    S = sorted(mandatory | set(rest[: N - len(mandatory)]))
    return np.array(S, dtype=np.int64), mandatory, template


def tokenize_chat_prompt(dspark, target, path):
    """The ids of a one-turn conversation with the assistant prompt, as speculate --chat builds them."""
    out, _, _ = common.run([dspark, "tokenize", target, "--chat", path, "--add-generation-prompt"])
    return json.loads(out.strip().split("\n")[0])["ids"]


def vocab_of(ckpt):
    t = load_file(ckpt)
    d2t = t["draft.d2t"]
    return np.arange(len(d2t)) + d2t, t


T0 = [0.0]


def mark(what):
    import time
    now = time.time()
    if T0[0]:
        print(f"[{now - T0[0]:6.1f} s] {what}", flush=True)
    T0[0] = now


def main():
    mark("")
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp, dspark = args.tmp, args.dspark
    edit = os.path.join(os.path.dirname(os.path.abspath(dspark)), "checkpoint_edit")
    target = common.build_qwen3_chat_target(tmp)
    V = json.load(open(os.path.join(target, "config.json")))["vocab_size"]
    # the data a draft is best trained on: the target's own answers (regenerated, greedy)
    prompts_file = chat_prompts(os.path.join(tmp, "prompts.jsonl"), 48)
    data = os.path.join(tmp, "chat.jsonl")
    if os.path.exists(data):
        os.remove(data)
    common.run([dspark, "regenerate", "--target", target, "--data", prompts_file, "--out", data, "--max-new-tokens",
                "40", "--threads", "2"])
    N = 64
    base = [dspark, "train", "--target", target, "--data", data, "--seq-len", str(SEQ), "--num-anchors", "16",
            "--block-size", "4", "--markov-rank", "16", "--batch-seqs", "4", "--eval-seqs", str(EVAL), "--threads", "2",
            "--seed", "5", "--lr", "1e-2"]

    def fresh(name):
        d = os.path.join(tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        return d

    def same_tensors(a, b, skip=()):
        ta, tb = load_file(a), load_file(b)
        keys = sorted(k for k in ta if k not in skip)
        return keys == sorted(k for k in tb if k not in skip) and all(np.array_equal(ta[k], tb[k]) for k in keys)

    def metric_lines(d):
        drop = ("tokens_per_s", "elapsed_s", "peak_rss_mib")
        return [{k: v for k, v in json.loads(l).items() if k not in drop} for l in open(os.path.join(d, "metrics.jsonl"))]

    mark("setup")
    # ---- selection, recorded
    run = fresh("vocab-run")
    _, err, _ = common.run(base + ["--out", run, "--steps", "40", "--eval-every", "0", "--save-every", "40",
                                   "--draft-vocab", str(N)])
    want, mandatory, template = expected_vocab(dspark, target, tmp, data, N, V)
    S, ckt = vocab_of(os.path.join(run, "checkpoint.safetensors"))
    ck.check(np.array_equal(S, want), f"S differs from the documented rule:\n ours {S.tolist()}\n want {want.tolist()}")
    ck.check(mandatory <= set(S.tolist()) and len(template) >= 2, f"mandatory ids {sorted(mandatory)} (template "
                                                                  f"{sorted(template)}) not all in S")
    ck.check("draft vocabulary: 64 of" in err and f"{len(mandatory)} mandatory" in err, f"the run's note: {err}")
    ck.check(ckt["draft.t2d"].dtype == np.bool_ and ckt["draft.t2d"].sum() == N and ckt["draft.t2d"][S].all(),
             "checkpoint t2d does not mark S")
    rj = json.load(open(os.path.join(run, "run.json")))
    ck.check(rj.get("draft_vocab_size") == N and len(rj.get("draft_vocab_xxh64", "")) == 16
             and 0 < rj.get("draft_vocab_coverage", 0) < 1, f"run.json: {rj}")
    print(f"S: {N} of {V} ids, mandatory {sorted(mandatory)}, coverage {rj.get('draft_vocab_coverage'):.3f}")

    mark("selection")
    # ---- N = V: the plain run, bit for bit
    plain, full = fresh("plain-run"), fresh("fullvocab-run")
    short = ["--steps", "4", "--eval-every", "2", "--save-every", "4"]
    common.run(base + ["--out", plain] + short)
    common.run(base + ["--out", full, "--draft-vocab", str(V)] + short)
    ck.check(same_tensors(os.path.join(plain, "checkpoint.safetensors"), os.path.join(full, "checkpoint.safetensors"),
                          skip=("draft.d2t", "draft.t2d")), "--draft-vocab V changes the trained weights or moments")
    ck.check(metric_lines(plain) == metric_lines(full), "--draft-vocab V changes the losses or evaluations")
    Sf, _ = vocab_of(os.path.join(full, "checkpoint.safetensors"))
    ck.check(np.array_equal(Sf, np.arange(V)), "--draft-vocab V: S is not 0 .. V-1")

    mark("N = V")
    # ---- from a cache: the online run's bits, through stop + resume too
    cache = fresh("cache")
    common.run([dspark, "capture", "--target", target, "--data", data, "--out", cache, "--seq-len", str(SEQ),
                "--target-layers", "2", "--dtype", "f32", "--threads", "2"])
    online, cached, resumed = fresh("online-vocab"), fresh("cache-vocab"), fresh("cache-vocab-resumed")
    six = ["--steps", "6", "--eval-every", "3", "--save-every", "2", "--draft-vocab", str(N), "--target-layers", "2"]
    common.run(base + ["--out", online] + six)
    cbase = [a for a in base if a not in ("--target", target, "--data", data)]
    common.run(cbase + ["--cache", cache, "--out", cached] + six)
    common.run(cbase + ["--cache", cache, "--out", resumed, "--stop-after", "3"] + six)
    common.run(cbase + ["--cache", cache, "--out", resumed, "--resume"] + six)
    for name, d in (("cache", cached), ("cache stop + resume", resumed)):
        ck.check(same_tensors(os.path.join(online, "checkpoint.safetensors"), os.path.join(d, "checkpoint.safetensors")),
                 f"--draft-vocab from the {name}: the checkpoint differs from the online run's")
        ck.check(metric_lines(online) == metric_lines(d), f"--draft-vocab from the {name}: metrics differ")
    # the template out of reach: a cache whose target is gone, and no --target
    moved = os.path.join(tmp, "moved-target")
    shutil.rmtree(moved, ignore_errors=True)
    shutil.copytree(target, moved)
    cache2 = fresh("cache-moved")
    common.run([dspark, "capture", "--target", moved, "--data", data, "--out", cache2, "--seq-len", str(SEQ),
                "--target-layers", "2", "--dtype", "f32", "--threads", "2"])
    shutil.rmtree(moved)
    nt = fresh("cache-no-template")
    _, err, _ = common.run(cbase + ["--cache", cache2, "--out", nt, "--steps", "1", "--eval-every", "0",
                                    "--draft-vocab", str(N), "--target-layers", "2"])
    S2, _ = vocab_of(os.path.join(nt, "checkpoint.safetensors"))
    eos = json.load(open(os.path.join(target, "config.json")))["eos_token_id"]
    ck.check("not at hand" in err and eos in S2.tolist(), f"cache without its template: {err}")
    # a capture that passed enable_thinking: S from the cache is the online run's with the same
    # option (the template's ids as the capture rendered them, its empty thinking block among
    # them, not ChatML's)
    cache3, on3, ca3 = fresh("cache-thinking"), fresh("online-thinking"), fresh("cache-vocab-thinking")
    common.run([dspark, "capture", "--target", target, "--data", data, "--out", cache3, "--seq-len", str(SEQ),
                "--target-layers", "2", "--dtype", "f32", "--threads", "2", "--enable-thinking", "on"])
    one = ["--steps", "1", "--eval-every", "0", "--draft-vocab", str(N), "--target-layers", "2"]
    _, err3, _ = common.run(base + ["--out", on3, "--enable-thinking", "on"] + one)
    _, err4, _ = common.run(cbase + ["--cache", cache3, "--out", ca3] + one)
    S3, _ = vocab_of(os.path.join(on3, "checkpoint.safetensors"))
    S4, _ = vocab_of(os.path.join(ca3, "checkpoint.safetensors"))
    # the run's note counts the mandatory ids: the data's frequent ids would hide a short set in S
    notes = [re.search(r"draft vocabulary: .*?(\d+) mandatory", e) for e in (err3, err4)]
    ck.check(all(notes) and notes[0].group(1) == notes[1].group(1) and int(notes[0].group(1)) == len(mandatory)
             and np.array_equal(S3, S4), f"--enable-thinking on: S from the cache {S4.tolist()} ({err4.strip()}) "
             f"differs from the online run's {S3.tolist()} ({err3.strip()})")

    mark("cache")
    # ---- export: the tensors as speculators / vLLM read them
    exp = fresh("vocab-export")
    common.run([dspark, "export", run, "--out", exp])
    cfg = json.load(open(os.path.join(exp, "config.json")))
    from safetensors import safe_open
    with safe_open(os.path.join(exp, "model.safetensors"), "pt") as f:
        tens = {k: f.get_tensor(k) for k in f.keys()}
    d2t, t2d = tens["d2t"], tens["t2d"]
    ck.check(cfg.get("draft_vocab_size") == N and cfg.get("vocab_size") == V, f"config.json draft_vocab_size {cfg}")
    ck.check(d2t.dtype == torch.int64 and tuple(d2t.shape) == (N,), f"d2t {d2t.dtype} {tuple(d2t.shape)}")
    ck.check(t2d.dtype == torch.bool and tuple(t2d.shape) == (V,), f"t2d {t2d.dtype} {tuple(t2d.shape)}")
    S_exp = (torch.arange(N) + d2t).numpy()
    ck.check(np.array_equal(S_exp, S) and t2d.sum().item() == N and bool(t2d[torch.tensor(S)].all()),
             "export d2t / t2d do not give the run's S")
    r = cfg["markov_rank"]
    D = cfg["hidden_size"]
    shapes = {"lm_head.weight": (N, D), "markov_head.markov_w2.weight": (N, r), "markov_head.markov_w1.weight": (V, r),
              "embed_tokens.weight": (V, D)}
    for k, s in shapes.items():
        ck.check(tuple(tens[k].shape) == s, f"export {k} {tuple(tens[k].shape)}, expected {s}")
    tgt = load_file(os.path.join(target, "model.safetensors"))
    ck.check(np.array_equal(tens["lm_head.weight"].numpy(), tgt["lm_head.weight"][S]),
             "the export's lm_head is not the target's rows S")

    mark("export")
    # ---- decoding: lossless (chat prompts of the training split and of none, and plain-text prompts)
    batch = os.path.join(tmp, "spec-prompts.jsonl")
    with open(batch, "w") as f:
        lines = open(prompts_file).read().strip().split("\n")
        f.write("\n".join(lines[:4] + lines[-2:]) + "\n")
        for p in ("def main(", "import os"):
            f.write(json.dumps({"prompt": p}) + "\n")
    gen = [dspark, "generate", target, "--data", batch, "--max-new-tokens", "32", "--print-ids"]
    plain_lines = common.run(gen)[0].strip().split("\n")
    taus = []
    for d in (exp, run):
        for policy in (["--policy", "fixed"], ["--policy", "fixed", "--draft-len", "2"],
                       ["--policy", "threshold", "--threshold", "0.3"], ["--one-at-a-time"]):
            rep = os.path.join(tmp, "report.json")
            out, _, _ = common.run([dspark, "speculate", "--target", target, "--draft", d, "--data", batch,
                                    "--max-new-tokens", "32", "--print-ids", "--report", rep] + policy)
            got = out.strip().split("\n")
            ck.check(got == plain_lines, f"greedy {d} {policy}: speculate\n{got}\n!= generate\n{plain_lines}")
            if policy == ["--policy", "fixed"]:
                taus.append(json.load(open(rep))["tau"])
    print(f"greedy tau with the reduced draft: {taus}")
    # a tiny random target is hard to predict; some acceptances (and rejections) are what matters here
    ck.check(min(taus) > 1.0, f"the reduced draft accepts nothing ({taus}): acceptance unexercised")

    mark("greedy")
    # sampling: the first drafted token's distribution is the target's (q is 0 outside S)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    first = json.loads(open(prompts_file).readline())["messages"][0]["content"]
    one = os.path.join(tmp, "one-prompt.jsonl")
    with open(one, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": first}]}) + "\n")
    ids = tokenize_chat_prompt(dspark, target, one)
    # under the sanitizers (scripts/test.sh sets ASAN_OPTIONS) fewer samples keep the run short; the
    # test stays valid, with less power
    n = 300 if "ASAN_OPTIONS" in os.environ else 2000
    with torch.no_grad():
        p0 = sampling_probs(model(torch.tensor([ids])).logits[0, -1], 1.0, 1.0)
        support = [i for i in range(len(p0)) if p0[i] > 0]
        logits = model(torch.tensor([ids + [i] for i in support])).logits[:, -1]
        p1 = sum(float(p0[i]) * sampling_probs(logits[k], 1.0, 1.0) for k, i in enumerate(support))
    probs = [float(x) for x in p1]
    out, _, _ = common.run([dspark, "speculate", "--target", target, "--draft", exp, "--prompt-ids",
                            ",".join(str(i) for i in ids), "--max-new-tokens", "3", "--print-ids", "--ignore-eos",
                            "--temperature", "1", "--repeat", str(n), "--seed", "77", "--policy", "fixed"])
    rows = [l.split() for l in out.strip().split("\n")]
    counts = [0] * len(probs)
    for row in rows:
        counts[int(row[1])] += 1
    outside = sum(probs[v] for v in range(len(probs)) if v not in set(S.tolist()))
    pval, stat, df = chi_square_p(counts, probs, len(rows))
    print(f"sampling T=1 with the reduced draft: chi-square {stat:.1f} on {df} df, p = {pval:.3g} ({len(rows)} "
          f"samples; the target's mass outside S {outside:.3f})")
    ck.check(len(rows) == n and pval > 1e-3, f"speculative sampling with a reduced draft differs (p = {pval:.3g})")
    ck.check(outside > 0.05, f"the target puts {outside:.3f} outside S: the test does not exercise q = 0 there")

    # calibrate / profile / regenerate with the reduced draft
    mark("sampling")
    outside_first = sum(float(p0[v]) for v in range(len(p0)) if v not in set(S.tolist()))
    print(f"  (the target's mass outside S at the first token {outside_first:.3f})")
    cal = os.path.join(tmp, "cal.json")
    common.run([dspark, "calibrate", "--target", target, "--draft", exp, "--data", batch, "--out", cal,
                "--max-new-tokens", "24", "--ignore-eos"])
    ck.check(len(json.load(open(cal))["temperatures"]) == 4, "calibrate with a reduced draft")
    prof = os.path.join(tmp, "profile.json")
    common.run([dspark, "profile", "--target", target, "--draft", exp, "--out", prof, "--max-tokens", "4",
                "--context", "16", "--reps", "1"])
    ck.check(len(json.load(open(prof))["draft_block_seconds"]) == 4, "profile with a reduced draft")
    regen, few = os.path.join(tmp, "regen-draft.jsonl"), os.path.join(tmp, "prompts-few.jsonl")
    if os.path.exists(regen):
        os.remove(regen)
    with open(few, "w") as f:
        f.write("".join(open(prompts_file).readlines()[:8]))
    common.run([dspark, "regenerate", "--target", target, "--data", few, "--out", regen, "--max-new-tokens", "40",
                "--threads", "2", "--draft", exp])
    ck.check([json.loads(l)["messages"] for l in open(regen)] == [json.loads(l)["messages"] for l in open(data)][:8],
             "regenerate --draft (reduced) differs from plain regeneration")

    mark("calibrate/profile/regenerate")
    # ---- refusals
    def refused(cmd, needles, rc=1):
        _, err, code = common.run(cmd, expect_rc=None)
        ok = code == rc and all(x in err for x in needles)
        ck.check(ok, f"{cmd[1:3]}: exit {code}, stderr {err.strip()!r} lacks {needles}")
        print(f"refused (exit {code}): {err.strip().splitlines()[-1] if err.strip() else ''}")

    refused(base + ["--out", fresh("too-big"), "--steps", "1", "--draft-vocab", str(V + 1)],
            ["--draft-vocab", str(V + 1), str(V)])
    refused(base + ["--out", fresh("too-small"), "--steps", "1", "--draft-vocab", str(len(mandatory) - 1)],
            ["--draft-vocab", f"below the {len(mandatory)} ids"])
    stopped = fresh("vocab-stopped")
    common.run(base + ["--out", stopped, "--steps", "4", "--save-every", "2", "--stop-after", "2", "--draft-vocab",
                       str(N)])
    refused(base + ["--out", stopped, "--steps", "4", "--save-every", "2", "--resume", "--draft-vocab", str(N + 1)],
            ["draft_vocab_size", "resume"])
    ckpt = os.path.join(run, "checkpoint.safetensors")
    bad_ckpt = fresh("bad-ckpt")
    os.makedirs(bad_ckpt)
    offs = ckt["draft.d2t"]
    for label, j, value, needles in (
            ("out of range", N - 1, V, ["draft.d2t", "outside the vocabulary"]),
            ("not increasing", 5, int(offs[4]) - 1, ["draft.d2t", "strictly increase"])):
        shutil.copy(os.path.join(run, "run.json"), bad_ckpt)
        common.run([edit, ckpt, os.path.join(bad_ckpt, "checkpoint.safetensors"), f"i64:draft.d2t:{j}={value}"])
        refused([dspark, "export", bad_ckpt, "--out", fresh("bad-ckpt-export")], needles)
        print(f"  (a checkpoint's d2t {label})")
    for label, change, needles in (
            ("d2t out of range", lambda t: t["d2t"].__setitem__(N - 1, V), ["d2t", "outside the vocabulary"]),
            ("d2t not increasing", lambda t: t["d2t"].__setitem__(3, t["d2t"][2] - 1), ["d2t", "strictly increase"]),
            ("t2d not S", lambda t: t["t2d"].__setitem__(int(S[0]), False), ["t2d", "mark exactly"])):
        bad = fresh("bad-export")
        shutil.copytree(exp, bad)
        t = load_file(os.path.join(exp, "model.safetensors"))
        change(t)
        save_file(t, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
        refused([dspark, "speculate", "--target", target, "--draft", bad, "--prompt", "x", "--max-new-tokens", "2"],
                needles)
        print(f"  (an export's {label})")
    mark("refusals")
    ck.finish("test_draft_vocab")


if __name__ == "__main__":
    main()

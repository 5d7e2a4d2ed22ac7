"""Hardening (issue 7) of `dspark export` on drafts trained here for a tiny Qwen3 target:

- 12: the checkpoint is the single source: editing or deleting RUN/target_config.json changes
  nothing in the export (config.json and model.safetensors byte-identical, same logits).
- 6: export refuses a non-empty directory that is not a previous export (a target model, a
  stray file, a config.json that is not a DSpark draft's) and leaves it untouched; a previous
  export (also one interrupted before its config.json) is replaced; --overwrite writes into
  anything, replacing only config.json and model.safetensors.
- 30: the exported config.json carries dflash_config {target_layer_ids, mask_token_id} equal
  to the top-level keys (here 2 captured layers for a 1-layer draft), which loading accepts and
  checks; gated and rnn exports say that vLLM's DSpark head loads vanilla heads only."""
import hashlib
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402


def run(cmd, expect_rc=0):
    """common.run, and a sanitizer report on stderr (the sanitizer build runs these tests too)
    fails the command even when its exit status is as expected."""
    out, err, rc = common.run(cmd, expect_rc=expect_rc)
    if "runtime error:" in err or "Sanitizer" in err:
        sys.stderr.write(f"command {' '.join(map(str, cmd))}\nreported a sanitizer error:\n{err[-4000:]}\n")
        raise SystemExit(1)
    return out, err, rc


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def build_target(tmp):
    mdir = os.path.join(tmp, "target")
    if os.path.exists(os.path.join(mdir, "tokenizer.json")):
        return mdir
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    text = os.path.join(tmp, "tok-corpus.txt")
    words = ["alpha", "beta", "gamma", "delta", "speculative", "draft", "target", "token", "block", "anchor"]
    rng = np.random.default_rng(0)
    open(text, "w").write("\n".join(" ".join(rng.choice(words, 12)) for _ in range(400)))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|mask|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([text], tr)
    common.build_tiny_model("qwen3", mdir, seed=6, vocab_size=tok.get_vocab_size(),
                            eos_token_id=tok.token_to_id("<|endoftext|>"), num_hidden_layers=4)
    tok.save(os.path.join(mdir, "tokenizer.json"))
    return mdir


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    checks(args, ck)
    ck.finish("test_hardening_model_export")


def guarded(ck, fn):
    try:
        fn()
    except SystemExit:  # common.run's unexpected exit status, already printed
        ck.check(False, "a command exited with an unexpected status (above)")


def checks(args, ck):
    target = build_target(args.tmp)
    data = os.path.join(args.tmp, "data.txt")
    rng = np.random.default_rng(1)
    words = ["alpha", "beta", "gamma", "delta", "draft", "token", "block"]
    open(data, "w").write("\n".join(" ".join(rng.choice(words, 10)) for _ in range(80)))

    def train(name, markov):
        rundir = os.path.join(args.tmp, name)
        shutil.rmtree(rundir, ignore_errors=True)
        run([args.dspark, "train", "--target", target, "--data", data, "--out", rundir, "--steps", "1",
             "--seq-len", "32", "--num-anchors", "4", "--block-size", "3", "--markov", markov,
             "--markov-rank", "8", "--target-layers", "2", "--draft-layers", "1", "--batch-seqs", "1",
             "--eval-seqs", "1", "--eval-every", "100", "--threads", "2", "--quiet", "--seed", "1"])
        return rundir

    def export(rundir, out, *extra, rc=0):
        return run([args.dspark, "export", rundir, "--out", out, *extra], expect_rc=rc)

    def fresh(name):
        d = os.path.join(args.tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        return d

    rundir = train("run-vanilla", "vanilla")
    e1 = fresh("exp-ref")
    export(rundir, e1)
    m = json.load(open(os.path.join(e1, "config.json")))
    V, D, ids = m["vocab_size"], m["hidden_size"], m["target_layer_ids"]
    inputs = {"ctx": rng.standard_normal((20, len(ids) * D)).astype(np.float32),
              "input_ids": rng.integers(0, V, 20).astype(np.int64), "anchors": np.array([0, 7, 15], dtype=np.int64)}
    ip = os.path.join(args.tmp, "fwd-in.safetensors")
    save_file(inputs, ip)

    def logits(d, rc=0):
        o = os.path.join(args.tmp, "fwd-out.safetensors")
        _, err, got = run([args.dspark, "draft-forward", d, "--inputs", ip, "--out", o], expect_rc=rc)
        return (load_file(o)["logits"] if got == 0 else None), err
    ref, _ = logits(rundir)
    guarded(ck, lambda: check_12(args, ck, rundir, e1, export, fresh, logits, ref))
    guarded(ck, lambda: check_30(args, ck, rundir, e1, m, export, fresh, logits, train))
    guarded(ck, lambda: check_6(args, ck, target, rundir, e1, export, fresh, logits, ref))


def check_12(args, ck, rundir, e1, export, fresh, logits, ref):
    """12: RUN/target_config.json is never read."""
    e2, e3 = fresh("exp-12-b"), fresh("exp-12-c")
    tc = os.path.join(rundir, "target_config.json")
    original = open(tc).read()
    try:
        edit_and_remove(args, ck, rundir, e1, e2, e3, tc, export, logits, ref)
    finally:
        open(tc, "w").write(original)


def edit_and_remove(args, ck, rundir, e1, e2, e3, tc, export, logits, ref):
    cfg = json.load(open(tc))
    cfg["rope_theta"] = 7.0
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 7.0}
    cfg["rms_norm_eps"] = 0.25
    json.dump(cfg, open(tc, "w"))
    export(rundir, e2)
    for f in ("config.json", "model.safetensors"):
        ck.check(sha(os.path.join(e1, f)) == sha(os.path.join(e2, f)),
                 f"12: an edited RUN/target_config.json changed the exported {f}")
    os.remove(tc)
    _, err, rc = run([args.dspark, "export", rundir, "--out", e3], expect_rc=None)
    ck.check(rc == 0, f"12: export without RUN/target_config.json failed: {err}")
    if rc == 0:
        ck.check(sha(os.path.join(e1, "config.json")) == sha(os.path.join(e3, "config.json")),
                 "12: export without RUN/target_config.json differs")
    got, _ = logits(e2)
    ck.check(got is not None and np.array_equal(ref, got), "12: the export's logits differ from the checkpoint's")


def check_30(args, ck, rundir, e1, m, export, fresh, logits, train):
    """30: dflash_config beside the top-level keys; loading accepts and checks it."""
    ids = m["target_layer_ids"]
    dc = m.get("dflash_config")
    ck.check(isinstance(dc, dict) and dc.get("target_layer_ids") == ids and dc.get("mask_token_id") ==
             m["mask_token_id"], f"30: dflash_config {dc}, top-level target_layer_ids {ids}, mask {m['mask_token_id']}")
    ck.check(len(ids) == 2 and m["num_hidden_layers"] == 1, f"30: setup: {len(ids)} layers captured, depth "
             f"{m['num_hidden_layers']}")
    for k in ("num_key_value_heads", "num_attention_heads", "head_dim", "max_position_embeddings", "rms_norm_eps"):
        ck.check(k in m, f"30: the exported config.json lacks the resolved {k}")
    bad = fresh("exp-30-bad")
    shutil.copytree(e1, bad)
    m_bad = dict(m, dflash_config={"target_layer_ids": [0], "mask_token_id": m["mask_token_id"]})
    json.dump(m_bad, open(os.path.join(bad, "config.json"), "w"))
    _, err = logits(bad, rc=None)
    ck.check("dflash_config" in err, f"30: a dflash_config that disagrees was not refused by name: {err}")
    _, err, _ = export(rundir, fresh("exp-30-vanilla"))
    ck.check("vLLM" not in err, f"30: a vanilla export should not warn about vLLM: {err}")
    for markov, module in (("gated", "gate_proj"), ("rnn", "joint_proj")):
        r = train(f"run-{markov}", markov)
        _, err, _ = export(r, fresh(f"exp-30-{markov}"))
        ck.check("vLLM" in err and "vanilla" in err and module in err,
                 f"30: the {markov} export does not say vLLM cannot load it: {err}")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    import glob
    docs = "".join(open(p).read() for p in [os.path.join(root, "README.md")] + glob.glob(os.path.join(root, "docs", "*.md")))
    ck.check("markov_head.gate_proj" in docs and "dflash_config" in docs,
             "30: README.md and docs/ do not document vLLM's vanilla-only loader and dflash_config")


def check_6(args, ck, target, rundir, e1, export, fresh, logits, ref):
    """6: what export may overwrite."""
    def tree(d):
        return {f: sha(os.path.join(d, f)) for f in sorted(os.listdir(d))}

    tgt_copy = fresh("exp-6-target")
    shutil.copytree(target, tgt_copy)
    before = tree(tgt_copy)
    _, err, rc = run([args.dspark, "export", rundir, "--out", tgt_copy], expect_rc=None)
    ck.check(rc == 1 and tgt_copy in err and "--overwrite" in err, f"6: export into a target model: rc {rc}: {err}")
    ck.check(tree(tgt_copy) == before, "6: the refused export changed the target model directory")
    run([args.dspark, "info", tgt_copy])  # still loadable

    stray = fresh("exp-6-stray")
    shutil.copytree(e1, stray)
    open(os.path.join(stray, "notes.txt"), "w").write("mine\n")
    before = tree(stray)
    _, err, rc = run([args.dspark, "export", rundir, "--out", stray], expect_rc=None)
    ck.check(rc == 1 and "notes.txt" in err, f"6: export into an export plus a stray file: rc {rc}: {err}")
    ck.check(tree(stray) == before, "6: the refused export changed the directory")

    foreign_cfg = fresh("exp-6-foreign-config")
    os.makedirs(foreign_cfg)
    shutil.copy(os.path.join(target, "config.json"), foreign_cfg)
    _, err, rc = run([args.dspark, "export", rundir, "--out", foreign_cfg], expect_rc=None)
    ck.check(rc == 1 and "config.json" in err, f"6: export over a target's config.json alone: rc {rc}: {err}")

    not_dir = os.path.join(args.tmp, "exp-6-file")
    open(not_dir, "w").write("x")
    _, err, rc = run([args.dspark, "export", rundir, "--out", not_dir], expect_rc=None)
    ck.check(rc == 1 and not_dir in err, f"6: export onto a regular file: rc {rc}: {err}")

    empty = fresh("exp-6-empty")
    os.makedirs(empty)
    export(rundir, empty)
    export(rundir, empty)  # a previous export is replaced
    ck.check(tree(empty) == tree(e1), "6: re-export into a previous export differs")
    half = fresh("exp-6-interrupted")
    shutil.copytree(e1, half)
    os.remove(os.path.join(half, "config.json"))
    open(os.path.join(half, "config.json.tmp.4242"), "w").write("{")
    export(rundir, half)
    ck.check(os.path.exists(os.path.join(half, "config.json")), "6: an interrupted export was not completed")

    _, err, _ = export(rundir, tgt_copy, "--overwrite")
    ck.check(os.path.exists(os.path.join(tgt_copy, "tokenizer.json")), "6: --overwrite removed a foreign file")
    got, _ = logits(tgt_copy)
    ck.check(got is not None and np.array_equal(ref, got), "6: the --overwrite export does not load back")


if __name__ == "__main__":
    main()

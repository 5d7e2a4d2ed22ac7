"""The draft trainer end to end on a tiny Qwen3 target built here (transformers) with a BPE
tokenizer trained here (tokenizers) on the Python standard library's sources:

- the same seed gives the same bits: two runs write identical metrics and checkpoints;
- a run stopped (--stop-after) or killed with SIGKILL, then resumed, ends with a checkpoint
  byte-identical to the uninterrupted run's, and the same per-step losses;
- a non-finite gradient stops the run with a message naming the step and batch, leaving the
  last good checkpoint intact; --skip-nonfinite skips and counts it instead;
- resuming with a changed option is refused naming the option;
- the export is the HF layout of spec section 7 (checked with `safetensors` and json), and
  loading it back gives identical logits to the checkpoint it came from;
- a target whose tokenizer reserves no mask token gets the last special token that the data never
  contains (and no eos or bos), and a clear error when there is none;
- the progress line shows the acceptance of a step only where it was computed (not with --ce-only)."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def build_target(tmp):
    return common.build_bpe_target(tmp)


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    target = build_target(args.tmp)
    data = common.stdlib_text(os.path.join(args.tmp, "data.txt"), 60, 64)
    base = [args.dspark, "train", "--target", target, "--data", data, "--seq-len", "64", "--num-anchors", "8",
            "--block-size", "4", "--markov-rank", "16", "--steps", "6", "--batch-seqs", "2", "--eval-every", "3",
            "--eval-seqs", "2", "--threads", "2", "--quiet", "--seed", "3", "--lr", "3e-3"]

    def run_dir(name):
        d = os.path.join(args.tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        return d

    def train_lines(d):
        return [l for l in open(os.path.join(d, "metrics.jsonl")) if '"kind":"train"' in l]

    def losses(d):
        return [json.loads(l)["loss"] for l in train_lines(d)]

    a, b = run_dir("run-a"), run_dir("run-b")
    common.run(base + ["--out", a, "--save-every", "2"])
    common.run(base + ["--out", b, "--save-every", "2"])
    ck.check(sha(os.path.join(a, "checkpoint.safetensors")) == sha(os.path.join(b, "checkpoint.safetensors")),
             "two identical runs wrote different checkpoints")
    ck.check(losses(a) == losses(b), "two identical runs logged different losses")
    ck.check(len(losses(a)) == 6, f"expected 6 train metric lines, got {len(losses(a))}")
    metrics = [json.loads(l) for l in open(os.path.join(a, "metrics.jsonl"))]
    needed = {"loss", "ce", "l1", "confidence", "accept_rate", "tau", "accept_per_position", "lr", "grad_norm",
              "tokens_per_s", "peak_rss_mib"}
    ck.check(needed <= set(metrics[1]), f"train metrics lack {needed - set(metrics[1])}")
    ck.check(any(m["kind"] == "eval" for m in metrics), "no eval metrics")

    # no held-out split: no eval record and no eval line (there is nothing to measure)
    e = run_dir("run-no-eval")
    no_eval = [x if x != "2" or base[i - 1] != "--eval-seqs" else "0" for i, x in enumerate(base)]
    no_eval = [x for x in no_eval if x != "--quiet"]
    out, err, _ = common.run(no_eval + ["--out", e, "--steps", "3"])
    kinds = [json.loads(l)["kind"] for l in open(os.path.join(e, "metrics.jsonl"))]
    ck.check("eval" not in kinds, f"--eval-seqs 0 wrote eval records: {kinds}")
    ck.check("eval at step" not in out + err, "--eval-seqs 0 printed an eval line")

    # stop after 3 steps, resume: identical end state
    c = run_dir("run-c")
    common.run(base + ["--out", c, "--save-every", "2", "--stop-after", "3"])
    common.run(base + ["--out", c, "--save-every", "2", "--resume"])
    ck.check(sha(os.path.join(a, "checkpoint.safetensors")) == sha(os.path.join(c, "checkpoint.safetensors")),
             "stop + resume ended with a different checkpoint than the uninterrupted run")
    ck.check(losses(c) == losses(a), f"stop + resume losses differ:\n{losses(c)}\n{losses(a)}")

    # SIGKILL once a checkpoint exists, resume
    k = run_dir("run-kill")
    p = subprocess.Popen(base + ["--out", k, "--save-every", "1", "--steps", "6"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    ckpt = os.path.join(k, "checkpoint.safetensors")
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and not os.path.exists(ckpt):
        time.sleep(0.05)
    killed = p.poll() is None
    if killed:
        p.send_signal(signal.SIGKILL)
    p.wait()
    print(f"SIGKILL test: {'killed mid-run' if killed else 'run finished before the kill'}")
    common.run(base + ["--out", k, "--save-every", "1", "--resume"])
    ck.check(sha(os.path.join(a, "checkpoint.safetensors")) == sha(ckpt),
             "kill -9 + resume ended with a different checkpoint than the uninterrupted run")
    ck.check(losses(k) == losses(a), "kill -9 + resume losses differ")

    # a changed option is refused on resume
    _, err, rc = common.run(base + ["--out", c, "--resume", "--lr", "1e-3"], expect_rc=1)
    ck.check("lr" in err and "resume" in err, f"changed-option resume message: {err}")

    # non-finite gradient: stop, naming the step; the last good checkpoint stays loadable
    n = run_dir("run-nan")
    # steps count from 1 in messages as on the progress line: poisoning step 3 leaves step 2's checkpoint
    _, err, rc = common.run(base + ["--out", n, "--save-every", "1", "--inject-nan-step", "3"], expect_rc=1)
    ck.check("non-finite" in err and "step 3" in err and "batch" in err, f"non-finite message: {err}")
    _, err2, _ = common.run([args.dspark, "export", n, "--out", os.path.join(args.tmp, "exp-nan")])
    ck.check("step 2)" in err2, f"the last good checkpoint should be step 2: {err2}")
    s = run_dir("run-skip")
    common.run(base + ["--out", s, "--inject-nan-step", "3", "--skip-nonfinite"])
    last = [json.loads(l) for l in train_lines(s)][-1]
    ck.check(last["skipped_steps"] == 1, f"skipped_steps {last.get('skipped_steps')}")

    # export: HF layout and identical logits
    e = os.path.join(args.tmp, "export-a")
    shutil.rmtree(e, ignore_errors=True)
    common.run([args.dspark, "export", a, "--out", e])
    cfg = json.load(open(os.path.join(e, "config.json")))
    for key, want in (("architectures", ["Qwen3DSparkModel"]), ("num_hidden_layers", 1), ("block_size", 4),
                      ("markov_rank", 16), ("markov_head_type", "vanilla"), ("tie_word_embeddings", False),
                      ("enable_confidence_head", True), ("confidence_head_with_markov", True)):
        ck.check(cfg.get(key) == want, f"export config.json {key} = {cfg.get(key)}, expected {want}")
    for key in ("num_target_layers", "mask_token_id", "target_layer_ids", "num_anchors", "layer_types", "vocab_size",
                "hidden_size"):
        ck.check(key in cfg, f"export config.json lacks {key}")
    ck.check("rope_theta" in cfg or "rope_parameters" in cfg, "export config.json lacks the target's rope")
    from safetensors.numpy import load_file, save_file
    t = load_file(os.path.join(e, "model.safetensors"))
    V, D = cfg["vocab_size"], cfg["hidden_size"]
    m = len(cfg["target_layer_ids"])
    shapes = {"embed_tokens.weight": (V, D), "lm_head.weight": (V, D), "fc.weight": (D, m * D),
              "hidden_norm.weight": (D,), "norm.weight": (D,), "markov_head.markov_w1.weight": (V, 16),
              "markov_head.markov_w2.weight": (V, 16), "confidence_head.proj.weight": (1, D + 16),
              "confidence_head.proj.bias": (1,), "layers.0.self_attn.q_proj.weight": (4 * 24, D),
              "layers.0.self_attn.q_norm.weight": (24,), "layers.0.mlp.gate_proj.weight": (160, D),
              "layers.0.input_layernorm.weight": (D,), "layers.0.post_attention_layernorm.weight": (D,)}
    for name, shape in shapes.items():
        ck.check(name in t and t[name].shape == shape,
                 f"export tensor {name}: {t[name].shape if name in t else 'missing'}, expected {shape}")
    ck.check(not any(k.startswith("model.") for k in t), "export tensor names must not carry a model. prefix")
    rng = np.random.default_rng(0)
    T = 24
    inputs = {"ctx": rng.standard_normal((T, m * D)).astype(np.float32),
              "input_ids": rng.integers(0, V, T).astype(np.int64),
              "anchors": np.array([0, 5, 11, 20], dtype=np.int64)}
    ip = os.path.join(args.tmp, "fwd-in.safetensors")
    save_file(inputs, ip)
    o1, o2 = os.path.join(args.tmp, "fwd-ckpt.safetensors"), os.path.join(args.tmp, "fwd-export.safetensors")
    common.run([args.dspark, "draft-forward", a, "--inputs", ip, "--out", o1])
    common.run([args.dspark, "draft-forward", e, "--inputs", ip, "--out", o2])
    r1, r2 = load_file(o1), load_file(o2)
    ck.check(np.array_equal(r1["logits"], r2["logits"]) and np.array_equal(r1["conf_logits"], r2["conf_logits"]),
             "the export's logits differ from the checkpoint's")

    # no reserved mask token: the last special token absent from the data, never the eos (id 0) or
    # the bos (the config's bos_token_id is 1)
    plain = common.build_bpe_target(args.tmp, specials=("<|endoftext|>", "<|bos|>", "<|spare_a|>", "<|spare_b|>"),
                                    name="target-nomask")
    tok = json.load(open(os.path.join(plain, "tokenizer.json")))
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    lines = open(data).read().splitlines()
    with_b = os.path.join(args.tmp, "data-spare-b.txt")
    with open(with_b, "w") as f:
        f.write("\n".join(lines[:-1] + [lines[-1] + " <|spare_b|>"]) + "\n")
    one = ["--target", plain, "--seq-len", "64", "--num-anchors", "8", "--block-size", "4", "--steps", "1",
           "--batch-seqs", "2", "--eval-seqs", "2", "--threads", "2", "--markov-rank", "16"]
    m = run_dir("run-nomask")
    _, err, _ = common.run([args.dspark, "train", "--data", data, "--out", m] + one)
    got = json.load(open(os.path.join(m, "run.json")))["mask_token_id"]
    ck.check(got == ids["<|spare_b|>"] and "<|spare_b|>" in err,
             f"default mask token {got} (stderr: {err.strip()[:300]}), expected <|spare_b|> = {ids['<|spare_b|>']}")
    # the progress line shows the acceptance only where the step computed it: not with --ce-only
    step_lines = [l for l in err.replace("\r", "\n").splitlines() if l.startswith("step 1/1")]
    ck.check(step_lines and all(" accept " in l for l in step_lines), f"three-term progress line: {step_lines}")
    _, err_ce, _ = common.run([args.dspark, "train", "--data", data, "--out", run_dir("run-ce-only"), "--ce-only",
                               "--markov", "none"] + one)
    step_lines = [l for l in err_ce.replace("\r", "\n").splitlines() if l.startswith("step 1/1")]
    ck.check(step_lines and not any("accept" in l for l in step_lines),
             f"--ce-only progress line shows an acceptance it never computed: {step_lines}")
    m = run_dir("run-nomask-b")
    common.run([args.dspark, "train", "--data", with_b, "--out", m] + one)
    got = json.load(open(os.path.join(m, "run.json")))["mask_token_id"]
    ck.check(got == ids["<|spare_a|>"], f"a special token the data contains became the mask ({got})")
    both = os.path.join(args.tmp, "data-spare-ab.txt")
    with open(both, "w") as f:
        f.write(open(with_b).read() + "<|spare_a|> again\n")
    _, err, _ = common.run([args.dspark, "train", "--data", both, "--out", run_dir("run-nomask-c")] + one, expect_rc=1)
    ck.check("--mask-token-id" in err and "never contains" in err, f"no-candidate message: {err}")
    ck.finish("test_train")


if __name__ == "__main__":
    main()

"""Hardening of the configuration a command reads (issue 22): each case is a file or an option
set that used to be accepted (and then computed something else than asked) or refused by one
command and accepted by another.

- 4: a `dspark calibrate` file records the draft it was fitted for (an identity hash of the
  draft's weights and config, its block size, the positions fitted); `speculate --calibration`
  refuses another draft's file, a file whose temperatures do not match its positions or the
  draft, and a file without that record (re-run calibrate); `--profile` the same for the target
  and the draft it measured.
- 5: config.json: every numeric field has a domain, refused naming the file, the field and the
  value (rope_theta, the rope scaling's fields, token ids outside the vocabulary); a rope_scaling
  beside rope_parameters is read as transformers reads it (rope_scaling wins), so an unsupported
  type there is refused and a supported one computes transformers' logits.
- 6: --topk / --min-k / --top-p / --temperature: one check for capture and distill.
- 7: tokenizer_config.json special tokens of the wrong type are refused naming the key, as
  transformers refuses them; null and flags such as add_bos_token stay accepted.
- 10: regenerate: a --max-new-tokens that leaves no position for a prompt is refused naming
  max_position_embeddings; a run that skipped every conversation fails, one that skipped some says
  how many.

"hardening" in the name makes the sanitizer build run this file too."""
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

transformers.logging.set_verbosity_error()


def run(cmd, expect_rc=None):
    """The command's (stdout, stderr, rc); a sanitizer report fails the test whatever the status."""
    out, err, rc = common.run(list(map(str, cmd)), expect_rc=expect_rc)
    if "runtime error:" in err or "Sanitizer" in err:
        sys.stderr.write(f"command {' '.join(map(str, cmd))}\nreported a sanitizer error:\n{err[-4000:]}\n")
        raise SystemExit(1)
    return out, err, rc


def expect(ck, name, cmd, rc, words):
    """The command exits rc (None: any non-zero) and its stderr holds every word."""
    out, err, got = run(cmd)
    ok = (got != 0 if rc is None else got == rc) and all(w in err for w in words)
    ck.check(ok, f"{name}: exit {got} (expected {'non-zero' if rc is None else rc}), stderr must hold {words}: "
                 f"{err.strip()[-1500:]}")
    return out, err


def fresh_copy(src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def edit_json(path, fn):
    j = json.load(open(path))
    fn(j)
    json.dump(j, open(path, "w"), indent=1)


# ------------------------------------------------------------------ 4: calibration and profile files

def train_draft(args, target, data, name, block, seed):
    run_dir = os.path.join(args.tmp, name)
    if not os.path.exists(os.path.join(run_dir, "checkpoint.safetensors")):
        run([args.dspark, "train", "--target", target, "--data", data, "--out", run_dir, "--overwrite", "--seq-len", "32",
             "--num-anchors", "4", "--block-size", str(block), "--markov-rank", "8", "--steps", "2", "--batch-seqs", "2",
             "--eval-every", "0", "--eval-seqs", "1", "--save-every", "2", "--quiet", "--threads", "2", "--seed",
             str(seed)], expect_rc=0)
    return run_dir


def test_calibration_files(ck, args, target):
    data = os.path.join(args.tmp, "draft-data.txt")
    common.stdlib_text(data, 0, 3)
    a = train_draft(args, target, data, "draft-a", 4, 1)
    b = train_draft(args, target, data, "draft-b8", 8, 1)
    c = train_draft(args, target, data, "draft-c", 4, 2)
    prompts = os.path.join(args.tmp, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("def main(\nimport os\nclass Foo:\nx = [\n")
    cal = os.path.join(args.tmp, "cal.json")
    run([args.dspark, "calibrate", "--target", target, "--draft", a, "--data", prompts, "--out", cal,
         "--max-new-tokens", "8", "--ignore-eos", "--threads", "2"], expect_rc=0)
    j = json.load(open(cal))
    ck.check(j.get("block_size") == 4 and j.get("draft_len") == 4 and len(j.get("temperatures", [])) == 4
             and re.fullmatch(r"[0-9a-f]{16}", str(j.get("draft_identity"))),
             f"4 calibrate: the file records the draft: {dict((k, j.get(k)) for k in ('draft_identity', 'block_size'))}")

    def spec(draft, extra):
        return [args.dspark, "speculate", "--target", target, "--draft", draft, "--prompt-ids", "5,6,7",
                "--max-new-tokens", "4", "--print-ids", "--threads", "2"] + extra
    _, err, rc = run(spec(a, ["--calibration", cal]))
    ck.check(rc == 0, f"4 the draft's own calibration refused: {err.strip()[-600:]}")
    # the same weights exported: the same draft
    exported = os.path.join(args.tmp, "draft-a-export")
    run([args.dspark, "export", a, "--out", exported, "--overwrite"], expect_rc=0)
    _, err, rc = run(spec(exported, ["--calibration", cal]))
    ck.check(rc == 0, f"4 the run's calibration refused for its export: {err.strip()[-600:]}")
    expect(ck, "4 a block-4 calibration on a block-8 draft", spec(b, ["--calibration", cal]), None,
           [cal, '"block_size" is 4', "block size 8", b, "dspark calibrate"])
    expect(ck, "4 another draft's calibration (same block size)", spec(c, ["--calibration", cal]), None,
           [cal, '"draft_identity"', c, "another draft"])

    def variant(name, fn):
        path = os.path.join(args.tmp, name)
        v = json.load(open(cal))
        fn(v)
        json.dump(v, open(path, "w"))
        return path
    p = variant("cal-1000.json", lambda v: v.update(temperatures=[1.0] * 1000))
    expect(ck, "4 1000 temperatures", spec(a, ["--calibration", p]), None, [p, '"temperatures" holds 1000', '"draft_len"'])
    p = variant("cal-len8.json", lambda v: v.update(temperatures=[1.0] * 8, draft_len=8))
    expect(ck, "4 draft_len 8 on a block-4 draft", spec(a, ["--calibration", p]), None, [p, "'draft_len'", "8"])
    for bad in (-1.0, 0.0):
        p = variant("cal-neg.json", lambda v: v["temperatures"].__setitem__(2, bad))
        expect(ck, f"4 a temperature {bad}", spec(a, ["--calibration", p]), None, [p, '"temperatures"[2]', "> 0"])
    p = variant("cal-old.json", lambda v: v.pop("draft_identity", None))
    expect(ck, "4 a file without the draft's identity", spec(a, ["--calibration", p]), None,
           [p, '"draft_identity"', "dspark calibrate --draft"])
    # fewer positions fitted than drafted: refused, unless --draft-len says so
    cal2 = os.path.join(args.tmp, "cal-2.json")
    run([args.dspark, "calibrate", "--target", target, "--draft", a, "--data", prompts, "--out", cal2,
         "--max-new-tokens", "8", "--ignore-eos", "--draft-len", "2", "--threads", "2"], expect_rc=0)
    expect(ck, "4 two positions fitted, four drafted", spec(a, ["--calibration", cal2]), None,
           [cal2, '"draft_len"', "--draft-len 2"])
    _, err, rc = run(spec(a, ["--calibration", cal2, "--draft-len", "2"]))
    ck.check(rc == 0, f"4 two positions fitted and drafted: refused: {err.strip()[-600:]}")

    # profile: the target and the draft it measured
    prof = os.path.join(args.tmp, "profile.json")
    run([args.dspark, "profile", "--target", target, "--draft", a, "--out", prof, "--max-tokens", "4", "--context", "8",
         "--reps", "1", "--threads", "2"], expect_rc=0)
    sched = ["--policy", "scheduler", "--profile"]
    _, err, rc = run(spec(a, sched + [prof]))
    ck.check(rc == 0, f"4 the draft's own profile refused: {err.strip()[-600:]}")
    # another draft's costs are the file's optional part: not used (measured during decoding, as
    # without them), the target's verification costs still are
    rep = os.path.join(args.tmp, "report.json")
    for name, draft in (("a block-4 draft's profile on a block-8 draft", b), ("another draft's profile", c)):
        _, err, rc = run(spec(draft, sched + [prof, "--report", rep]))
        src = json.load(open(rep))["scheduler"]["profile"] if rc == 0 else ""
        ck.check(rc == 0 and "measured on another draft" in err and '"draft_identity"' in err and draft in err
                 and "measured during decoding" in src,
                 f"4 {name}: exit {rc}, the report's profile '{src}': {err.strip()[-600:]}")
    other = fresh_copy(target, os.path.join(args.tmp, "target-other"))
    edit_json(os.path.join(other, "config.json"), lambda cfg: cfg.update(rms_norm_eps=1e-5))
    p = os.path.join(args.tmp, "profile-other.json")
    run([args.dspark, "profile", "--target", other, "--out", p, "--max-tokens", "4", "--context", "8", "--reps", "1",
         "--threads", "2"], expect_rc=0)
    expect(ck, "4 another target's profile", spec(a, sched + [p]), None, [p, '"target_config_xxh64"', target])
    p = variant("prof-len.json", lambda v: None)
    v = json.load(open(prof))
    v["draft_block_seconds"] = v["draft_block_seconds"] + [1e-3] * 996
    json.dump(v, open(p, "w"))
    expect(ck, "4 a profile with 1000 draft costs", spec(a, sched + [p]), None, [p, '"draft_block_seconds" holds 1000'])
    # a cost table written by hand (no record) is taken as given, with a note
    p = os.path.join(args.tmp, "prof-hand.json")
    json.dump({"verify_seconds": [1e-3] * 8, "draft_block_seconds": [1e-6] * 4}, open(p, "w"))
    _, err, rc = run(spec(a, sched + [p]))
    ck.check(rc == 0 and "taken as given" in err, f"4 a hand-written profile: exit {rc}: {err.strip()[-600:]}")


# ------------------------------------------------------------------ 5: config.json domains

def test_config_domains(ck, args):
    base = os.path.join(args.tmp, "cfg-base")
    if not os.path.exists(os.path.join(base, "config.json")):
        common.build_tiny_model("llama", base, seed=5)
    ids = [3, 17, 90, 41, 7, 200, 12]
    l3 = {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
    # (name, top-level fields to set, words the error must hold)
    bad = [
        ("unknown rope_scaling type beside rope_parameters", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
         ["rope_scaling", "yarn"]),
        ("4.x 'type' spelling, unsupported", {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
         ["rope_scaling", "dynamic"]),
        ("llama3 factor 0", {"rope_scaling": dict(l3, factor=0)}, ["rope_scaling", "'factor'", "0"]),
        ("llama3 original_max_position_embeddings 0", {"rope_scaling": dict(l3, original_max_position_embeddings=0)},
         ["rope_scaling", "original_max_position_embeddings", "0"]),
        ("llama3 low_freq_factor 0", {"rope_parameters": dict(l3, low_freq_factor=0, rope_theta=10000.0)},
         ["rope_parameters", "low_freq_factor"]),
        ("llama3 high_freq_factor <= low_freq_factor", {"rope_parameters": dict(l3, high_freq_factor=1.0)},
         ["high_freq_factor", "low_freq_factor"]),
        ("linear factor -2", {"rope_scaling": {"type": "linear", "factor": -2}}, ["'factor'", "-2"]),
        ("negative rope_theta (4.x layout)", {"rope_theta": -5, "rope_parameters": None}, ["'rope_theta'", "-5"]),
        ("negative rope_theta beside rope_parameters", {"rope_theta": -5}, ["'rope_theta'", "-5"]),
        ("negative rope_parameters.rope_theta", {"rope_parameters": {"rope_type": "default", "rope_theta": -3.0}},
         ["rope_parameters", "'rope_theta'", "-3"]),
        ("rms_norm_eps 0", {"rms_norm_eps": 0.0}, ["'rms_norm_eps'"]),
        ("rms_norm_eps negative", {"rms_norm_eps": -1e-6}, ["'rms_norm_eps'"]),
        ("bos_token_id outside the vocabulary", {"bos_token_id": 999}, ["'bos_token_id'", "999", "255"]),
        ("eos_token_id entry outside the vocabulary", {"eos_token_id": [2, 256]}, ["'eos_token_id'[1]", "256"]),
        ("max_position_embeddings 0", {"max_position_embeddings": 0}, ["'max_position_embeddings'"]),
        ("head_dim odd", {"head_dim": 15}, ["head_dim"]),
        ("num_key_value_heads not dividing", {"num_key_value_heads": 3}, ["num_key_value_heads"]),
    ]
    d = os.path.join(args.tmp, "cfg-case")
    for name, fields, words in bad:
        fresh_copy(base, d)
        edit_json(os.path.join(d, "config.json"), lambda c: c.update(fields))
        cfg = os.path.join(d, "config.json")
        expect(ck, f"5 info: {name}", [args.dspark, "info", d], None, [cfg] + words)
    # the same reader serves forward and generate
    fresh_copy(base, d)
    edit_json(os.path.join(d, "config.json"), lambda c: c.update(rope_scaling=dict(l3, factor=0)))
    expect(ck, "5 forward: llama3 factor 0", [args.dspark, "forward", d, "--ids", "1,2,3", "--out",
                                               os.path.join(args.tmp, "f.safetensors")], None, ["'factor'"])
    expect(ck, "5 generate: llama3 factor 0", [args.dspark, "generate", d, "--prompt-ids", "1,2,3",
                                                   "--max-new-tokens", "2", "--print-ids"], None, ["'factor'"])

    # accepted: supported scalings given as rope_scaling beside transformers 5's rope_parameters
    # compute what transformers computes (rope_scaling wins there)
    for name, scaling in (("linear", {"type": "linear", "factor": 2.0}), ("llama3", l3)):
        fresh_copy(base, d)
        edit_json(os.path.join(d, "config.json"), lambda c: c.update(rope_scaling=scaling))
        out = os.path.join(args.tmp, "fwd.safetensors")
        _, err, rc = run([args.dspark, "forward", d, "--ids", ",".join(map(str, ids)), "--out", out])
        if not ck.check(rc == 0, f"5 rope_scaling {name} beside rope_parameters refused: {err.strip()}"):
            continue
        ours = load_file(out)["logits.0"]
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([ids])).logits[0].numpy()
        plain = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
        with torch.no_grad():
            unscaled = plain(input_ids=torch.tensor([ids])).logits[0].numpy()
        err = common.normwise_rel_err(ours, ref)
        ck.check(err <= 1e-4 and common.normwise_rel_err(unscaled, ref) > 1e-3,
                 f"5 rope_scaling {name} beside rope_parameters: logits rel err {err:.2e} against transformers "
                 f"(the scaling must change them: {common.normwise_rel_err(unscaled, ref):.2e})")


# ------------------------------------------------------------------ 6: one KD selection check

def test_kd_selection(ck, args, target):
    """The same option pairs get the same verdict and words from capture and distill (before
    anything is loaded: the paths do not exist)."""
    nowhere = os.path.join(args.tmp, "nowhere")
    capture = [args.dspark, "capture", "--target", nowhere, "--data", nowhere, "--out", os.path.join(args.tmp, "c")]
    distill = [args.dspark, "distill", "--teacher", nowhere, "--student-config", nowhere, "--data", nowhere,
               "--out", os.path.join(args.tmp, "d")]
    cases = [("--min-k above --topk", ["--topk", "8", "--min-k", "9"], ["--min-k 9", "--topk 8"]),
             ("--min-k 0", ["--topk", "8", "--min-k", "0"], ["--min-k 0"]),
             ("--top-p 0", ["--topk", "8", "--top-p", "0"], ["--top-p 0"]),
             ("--top-p 1.5", ["--topk", "8", "--top-p", "1.5"], ["--top-p 1.5"]),
             ("--temperature 0", ["--topk", "8", "--temperature", "0"], ["--temperature 0"]),
             ("--temperature -1", ["--topk", "8", "--temperature", "-1"], ["--temperature -1"])]

    def message(err):
        line = [ln for ln in err.strip().split("\n") if ln.startswith("dspark ")][-1:]
        return re.sub(r"^dspark \w+: ", "", re.sub(r" \[[\w.]+:\d+\]$", "", line[0])) if line else ""
    for name, opts, words in cases:
        _, e1 = expect(ck, f"6 capture {name}", capture + opts, 2, words)
        _, e2 = expect(ck, f"6 distill {name}", distill + opts, 2, words)
        ck.check(message(e1) == message(e2) != "",
                 f"6 {name}: capture and distill word it differently: '{message(e1)}' / '{message(e2)}'")
    # the library check itself (a caller of ds_capture_run or ds_train_lm, not the CLI): the same
    # pair on a real target, past the option parsing (--topk K == --min-k is fine)
    data = os.path.join(args.tmp, "kd-data.txt")
    common.stdlib_text(data, 0, 2)
    out = os.path.join(args.tmp, "kd-cache")
    shutil.rmtree(out, ignore_errors=True)
    _, err, rc = run(capture[:2] + ["--target", target, "--data", data, "--out", out, "--seq-len", "32",
                                    "--topk", "8", "--min-k", "8", "--no-features", "--quiet"])
    ck.check(rc == 0, f"6 capture --topk 8 --min-k 8 refused: {err.strip()[-800:]}")


# ------------------------------------------------------------------ 7: special tokens' types

def test_special_tokens(ck, args, target):
    tmpl = "{{ bos_token }}|{{ eos_token }}|{% for m in messages %}{{ m.content }}{% endfor %}"
    chat = os.path.join(args.tmp, "chat.jsonl")
    with open(chat, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    d = os.path.join(args.tmp, "tok-case")
    cases = [("bos_token {content: 5}", {"bos_token": {"content": 5}}, "bos_token", False),
             ("eos_token [\"x\"]", {"eos_token": ["x"]}, "eos_token", False),
             ("bos_token 7", {"bos_token": 7}, "bos_token", False),
             ("pad_token true", {"pad_token": True}, "pad_token", False),
             ("unk_token {}", {"unk_token": {}}, "unk_token", False),
             ("pad_token null", {"pad_token": None}, None, True),
             ("add_bos_token true", {"add_bos_token": True, "bos_token": "<|mask|>"}, None, True),
             ("bos_token AddedToken", {"bos_token": {"__type": "AddedToken", "content": "<|mask|>", "lstrip": False,
                                                     "rstrip": False, "normalized": False, "single_word": False}},
              None, True)]
    for name, fields, key, accepted in cases:
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(target, "tokenizer.json"), d)
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tmpl, "eos_token": "<|endoftext|>"}
        cfg.update(fields)
        path = os.path.join(d, "tokenizer_config.json")
        json.dump(cfg, open(path, "w"))
        cmd = [args.dspark, "tokenize", os.path.join(d, "tokenizer.json"), "--chat", chat, "--show-text"]
        try:
            want = transformers.AutoTokenizer.from_pretrained(d).apply_chat_template(
                [{"role": "user", "content": "hi"}], tokenize=False)
        except (TypeError, ValueError):
            want = None
        ck.check((want is not None) == accepted, f"7 {name}: transformers {'refuses' if want is None else 'accepts'} it "
                                                 f"(the test's expectation is wrong)")
        if accepted:
            out, err, rc = run(cmd)
            got = json.loads(out.strip().split("\n")[0]).get("text") if rc == 0 and out.strip() else None
            ck.check(rc == 0 and got == want, f"7 {name}: rendered {got!r}, transformers {want!r}: {err.strip()[-600:]}")
        else:
            expect(ck, f"7 {name}", cmd, None, [path, f'"{key}"'])


# ------------------------------------------------------------------ 10: regenerate skips

def test_regenerate_skips(ck, args, target):
    data = os.path.join(args.tmp, "regen.txt")
    long_prompt = "def main(): " + " ".join(f"x{i} = {i}" for i in range(25))
    with open(data, "w") as f:
        f.write(long_prompt + "\n" + long_prompt + " y\n")
    out = os.path.join(args.tmp, "regen-out.jsonl")
    base = [args.dspark, "regenerate", "--completion", "--target", target, "--data", data, "--out", out,
            "--threads", "1"]
    if os.path.exists(out):
        os.remove(out)
    expect(ck, "10 --max-new-tokens 100000", base + ["--max-new-tokens", "100000"], 2,
           ["max_position_embeddings", "512", "--max-new-tokens 100000", "511"])
    expect(ck, "10 --max-new-tokens 512 (= max_position_embeddings)", base + ["--max-new-tokens", "512"], 2,
           ["max_position_embeddings"])
    # every conversation too long for the positions left: a failure, not a silent success
    if os.path.exists(out):
        os.remove(out)
    _, err = expect(ck, "10 every conversation skipped", base + ["--max-new-tokens", "500"], 1,
                    ["nothing was regenerated", "2 conversations", "max_position_embeddings"])
    # one fits: a success that says one was skipped
    with open(data, "a") as f:
        f.write("x = [\n")
    if os.path.exists(out):
        os.remove(out)
    _, err, rc = run(base + ["--max-new-tokens", "400"])
    ck.check(rc == 0 and "2 of 3 conversations skipped" in err and open(out).read().count("\n") == 1,
             f"10 some skipped: exit {rc}, stderr {err.strip()[-800:]}")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    target = common.build_bpe_target(args.tmp, n_files=8, vocab_size=300, seed=22, name="target", layers=3)
    test_calibration_files(ck, args, target)
    test_config_domains(ck, args)
    test_kd_selection(ck, args, target)
    test_special_tokens(ck, args, target)
    test_regenerate_skips(ck, args, target)
    ck.finish("hardening_config")


if __name__ == "__main__":
    main()

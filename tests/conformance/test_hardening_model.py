"""Hardening (issue 7) of model loading against transformers: the cases where dspark and
transformers used to read the same model directory differently, each checked against the
installed transformers on tiny seeded models built here.

- 21: tie_word_embeddings true with a stored lm_head.weight: transformers keeps the stored head
  (it ties only when both tables are equal); a tied checkpoint holding only lm_head.weight ties
  the embedding to it. Logits within 1e-4 of transformers.
- 28: the stop set of generate(): generation_config.json's eos_token_id (int or list) when the
  file exists, none at all when it lists none, else config.json's: greedy ids identical to
  transformers' generate (which stops there); a malformed generation_config.json is refused.
- 29: fields config.json leaves out take the family's config class defaults (Qwen3 head_dim
  128, Qwen2/Qwen3 num_key_value_heads 32, Qwen2 head_dim hidden // heads, llama3
  original_max_position_embeddings = max_position_embeddings, ...): `dspark info --config`
  against the config classes, and logits against transformers on models relying on them.
- 17: max_position_embeddings is enforced by the target forward (naming the limit and the
  model directory), up front by generate (prompt + --max-new-tokens) and capture (--seq-len).
- 24: a self-looping or dangling model.safetensors symlink (or shard, or draft checkpoint) is
  reported with its real reason, never as missing."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

TOL = 1e-4
transformers.logging.set_verbosity_error()


def run(cmd, expect_rc=0):
    """common.run, and a sanitizer report on stderr (the sanitizer build runs these tests too)
    fails the command even when its exit status is as expected."""
    out, err, rc = common.run(cmd, expect_rc=expect_rc)
    if "runtime error:" in err or "Sanitizer" in err:
        sys.stderr.write(f"command {' '.join(map(str, cmd))}\nreported a sanitizer error:\n{err[-4000:]}\n")
        raise SystemExit(1)
    return out, err, rc


def edit_config(mdir, fn, name="config.json"):
    p = os.path.join(mdir, name)
    cfg = json.load(open(p))
    fn(cfg)
    json.dump(cfg, open(p, "w"), indent=1)


def hf_logits(mdir, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()


def our_logits(dspark, mdir, ids, tmp):
    out = os.path.join(tmp, "fwd.safetensors")
    run([dspark, "forward", mdir, "--ids", ",".join(map(str, ids)), "--out", out])
    return load_file(out)["logits.0"]


def fresh(tmp, name):
    d = os.path.join(tmp, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


def compare_logits(ck, args, name, mdir, ids):
    ok, err = True, float("inf")
    try:
        ours = our_logits(args.dspark, mdir, ids, args.tmp)
        err = common.normwise_rel_err(ours, hf_logits(mdir, ids))
    except SystemExit:
        ok = False
    ck.check(ok and err <= TOL, f"{name}: logits rel err {err:.2e} against transformers (tolerance {TOL:g})")
    print(f"{name}: logits rel err {err:.2e}")


# ------------------------------------------------------------------ 21: tied config, stored head

def test_tied_with_stored_head(ck, args, ids):
    for arch in ("qwen3", "llama"):
        d = fresh(args.tmp, f"tied-stored-{arch}")
        model = common.build_tiny_model(arch, d, seed=21, tied=False)
        edit_config(d, lambda c: c.update(tie_word_embeddings=True))
        head = model.lm_head.weight.detach().numpy()
        emb = model.model.embed_tokens.weight.detach().numpy()
        ck.check(np.max(np.abs(head - emb)) > 0.1, "test setup: the two tables must differ")
        compare_logits(ck, args, f"21 {arch} tied config + stored lm_head", d, ids)
        out, _, _ = run([args.dspark, "info", d])
        ck.check("stores its own lm_head" in out, f"21 {arch}: info does not say the stored head is used: {out}")

    # A tied checkpoint that holds only lm_head.weight: transformers ties the embedding to it.
    d = fresh(args.tmp, "tied-head-only")
    common.build_tiny_model("qwen3", d, seed=22, tied=True)
    st = os.path.join(d, "model.safetensors")
    t = load_file(st)
    t["lm_head.weight"] = t.pop("model.embed_tokens.weight")
    save_file(t, st, metadata={"format": "pt"})
    compare_logits(ck, args, "21 tied checkpoint with only lm_head.weight", d, ids)


# ------------------------------------------------------------------ 28: generation_config.json

def test_generation_stop(ck, args):
    d = fresh(args.tmp, "gen-stop")
    common.build_tiny_model("qwen2", d, seed=28)
    prompt = [5, 17, 33, 2, 90, 41, 7]
    n_new = 24
    ref = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():
        free = ref.generate(torch.tensor([prompt]), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                            eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    # Tokens of the free-running continuation, each at its first occurrence, and two ids it
    # never produces (so they cannot stop it).
    firsts = [t for i, t in enumerate(free) if t not in free[:i]]
    unused = [t for t in range(256) if t not in free]
    ck.check(len(firsts) >= 4 and len(unused) >= 2, f"test setup: continuation {free}")
    early, late = firsts[2], firsts[-1]
    cases = [
        # name, config.json eos, generation_config.json content (None: no file; str: raw text)
        ("gen list, config int", unused[0], {"eos_token_id": [unused[1], late]}),
        ("gen int", unused[0], {"eos_token_id": late}),
        ("gen without eos: no stop token", early, {"do_sample": False}),
        ("gen eos null", early, {"eos_token_id": None, "bos_token_id": 1}),
        ("no gen file: config list", [unused[0], early], None),
        ("no gen file: config int", early, None),
    ]
    gen_path = os.path.join(d, "generation_config.json")
    for name, cfg_eos, gen in cases:
        edit_config(d, lambda c: c.update(eos_token_id=cfg_eos))
        if os.path.exists(gen_path):
            os.remove(gen_path)
        if gen is not None:
            json.dump(gen, open(gen_path, "w"))
        model = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
        with torch.no_grad():
            want = model.generate(torch.tensor([prompt]), max_new_tokens=n_new, do_sample=False,
                                  pad_token_id=0)[0, len(prompt):].tolist()
        # transformers pads a finished batch with pad_token_id; a batch of one ends at the stop token
        out, _, rc = run([args.dspark, "generate", d, "--prompt-ids", ",".join(map(str, prompt)),
                         "--max-new-tokens", str(n_new), "--print-ids"], expect_rc=None)
        got = [int(x) for x in out.split()] if rc == 0 else None
        ck.check(got == want, f"28 {name}: dspark generated {got}, transformers {want}")
        print(f"28 {name}: {len(want)} tokens, {'same' if got == want else 'DIFFERENT'}")
        cfg_out, err, rc = run([args.dspark, "info", d, "--config"], expect_rc=None)
        src = json.loads(cfg_out).get("stop_source") if rc == 0 else f"(info --config: rc {rc}: {err.strip()})"
        want_src = "generation_config.json" if gen is not None else "config.json"
        ck.check(src == want_src, f"28 {name}: stop_source {src}, expected {want_src}")

    # Malformed or invalid generation_config.json: transformers silently falls back to
    # config.json; dspark refuses, naming the file.
    for name, text in (("malformed", "{\"eos_token_id\": [1,"), ("string id", "{\"eos_token_id\": \"5\"}"),
                       ("empty list", "{\"eos_token_id\": []}"), ("outside the vocabulary", "{\"eos_token_id\": 256}")):
        open(gen_path, "w").write(text)
        _, err, rc = run([args.dspark, "generate", d, "--prompt-ids", "1,2", "--max-new-tokens", "2",
                         "--print-ids"], expect_rc=None)
        ck.check(rc == 1 and "generation_config.json" in err, f"28 {name} generation_config.json: rc {rc}: {err}")
    os.remove(gen_path)


# ------------------------------------------------------------------ 29: class defaults

RESOLVED = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
            "bos_token_id", "eos_token_id", "rope_theta"]


def hf_resolved(raw):
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "qwen3": transformers.Qwen3Config}[raw["model_type"]]
    c = cls.from_dict(dict(raw))
    eos = c.eos_token_id
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": head_dim,
            "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
            "tie_word_embeddings": c.tie_word_embeddings, "bos_token_id": c.bos_token_id,
            "eos_token_id": [] if eos is None else (eos if isinstance(eos, list) else [eos]),
            "rope_theta": c.rope_parameters["rope_theta"]}


def test_config_defaults(ck, args, ids):
    # The resolved configuration against the config classes, for configs that leave out
    # everything they can (and a few fields set to null where transformers maps null).
    raws = []
    for mt in ("llama", "qwen2", "qwen3"):
        raws.append({"model_type": mt})
        raws.append({"model_type": mt, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": None})
        raws.append({"model_type": mt, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "vocab_size": 1000, "eos_token_id": [3, 4], "bos_token_id": None})
    raws.append({"model_type": "qwen2", "hidden_size": 72, "num_attention_heads": 5, "num_key_value_heads": 1})
    raws.append({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "head_dim": None})
    for i, raw in enumerate(raws):
        d = fresh(args.tmp, f"cfg-{i}")
        os.makedirs(d)
        json.dump(raw, open(os.path.join(d, "config.json"), "w"))
        out, err, rc = run([args.dspark, "info", d, "--config"], expect_rc=None)
        if not ck.check(rc == 0, f"29 info --config {raw}: rc {rc}: {err}"):
            continue
        ours = json.loads(out)
        want = hf_resolved(raw)
        for k in RESOLVED:
            ck.check(ours[k] == want[k], f"29 {raw}: {k} = {ours[k]}, transformers {want[k]}")

    # Models that rely on the defaults: built by transformers, then the field is removed from
    # config.json (save_pretrained writes every field); logits must match transformers.
    cases = [
        ("qwen3 without head_dim (128)", "qwen3",
         dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=128), ["head_dim"]),
        ("qwen2 without num_key_value_heads (32)", "qwen2",
         dict(hidden_size=128, num_attention_heads=64, num_key_value_heads=32, intermediate_size=64), ["num_key_value_heads"]),
        ("qwen2 head_dim = hidden // heads", "qwen2",
         dict(hidden_size=72, num_attention_heads=5, num_key_value_heads=1), []),
        ("llama without head_dim / num_key_value_heads", "llama",
         dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4), ["head_dim", "num_key_value_heads"]),
        ("llama3 rope without original_max_position_embeddings", "llama",
         dict(max_position_embeddings=96, rope_parameters={"rope_type": "llama3", "rope_theta": 5e4, "factor": 8.0,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
         ["rope_parameters.original_max_position_embeddings"]),
    ]
    for name, arch, over, drop in cases:
        d = fresh(args.tmp, "defaults-" + name.split()[0] + str(abs(hash(name)) % 1000))
        common.build_tiny_model(arch, d, seed=29, **over)

        def strip(c):
            for k in drop:
                if "." in k:
                    a, b = k.split(".")
                    c[a].pop(b, None)
                else:
                    c.pop(k, None)
        edit_config(d, strip)
        compare_logits(ck, args, f"29 {name}", d, ids)


# ------------------------------------------------------------------ 17: max_position_embeddings

def test_position_limit(ck, args):
    d = fresh(args.tmp, "short-context")
    common.build_tiny_model("qwen3", d, seed=17, max_position_embeddings=64)
    ids = ",".join(str(i % 200 + 3) for i in range(70))
    _, err, rc = run([args.dspark, "forward", d, "--ids", ids, "--out", os.path.join(args.tmp, "f.st")],
                     expect_rc=None)
    ck.check(rc == 1 and "max_position_embeddings" in err and "64" in err and d in err,
             f"17 forward of 70 tokens on a 64-position target: rc {rc}: {err}")
    ok_ids = ",".join(str(i % 200 + 3) for i in range(64))
    run([args.dspark, "forward", d, "--ids", ok_ids, "--out", os.path.join(args.tmp, "f.st")])
    # the same limit through the KV cache, 8 tokens at a time
    _, err, rc = run([args.dspark, "forward", d, "--ids", ids, "--chunk", "8",
                     "--out", os.path.join(args.tmp, "f.st")], expect_rc=None)
    ck.check(rc == 1 and "max_position_embeddings" in err, f"17 chunked forward past the limit: rc {rc}: {err}")

    prompt = ",".join(str(i + 3) for i in range(10))
    _, err, rc = run([args.dspark, "generate", d, "--prompt-ids", prompt, "--max-new-tokens", "55",
                     "--print-ids"], expect_rc=None)
    ck.check(rc == 2 and "max_position_embeddings" in err and "64" in err and "--max-new-tokens" in err
             and "54" in err, f"17 generate 10 + 55 on a 64-position target: rc {rc}: {err}")
    out, _, _ = run([args.dspark, "generate", d, "--prompt-ids", prompt, "--max-new-tokens", "54",
                    "--print-ids", "--ignore-eos"])
    ck.check(len(out.split()) == 54, f"17 generate 10 + 54 should give 54 tokens: {out}")

    data = os.path.join(args.tmp, "tiny.txt")
    open(data, "w").write("hello world\n" * 50)
    _, err, rc = run([args.dspark, "capture", "--target", d, "--data", data, "--out",
                     os.path.join(args.tmp, "cache-long"), "--seq-len", "65"], expect_rc=None)
    ck.check(rc == 2 and "--seq-len" in err and "65" in err and "64" in err and "max_position_embeddings" in err,
             f"17 capture --seq-len 65 on a 64-position target: rc {rc}: {err}")
    ck.check(not os.path.exists(os.path.join(args.tmp, "cache-long", "manifest.json")),
             "17 refused capture wrote a cache")


# ------------------------------------------------------------------ 24: symlinks

def test_symlinks(ck, args):
    good = fresh(args.tmp, "link-good")
    common.build_tiny_model("llama", good, seed=24)

    def case(name, setup, needles):
        d = fresh(args.tmp, "link-" + name)
        shutil.copytree(good, d)
        setup(d)
        _, err, rc = run([args.dspark, "info", d], expect_rc=None)
        ok = rc == 1 and all(n in err for n in needles) and "neither" not in err and "not found" not in err
        ck.check(ok, f"24 {name}: rc {rc}: {err}")
        print(f"24 {name}: {err.strip()}")

    def self_loop(d):
        p = os.path.join(d, "model.safetensors")
        os.remove(p)
        os.symlink("model.safetensors", p)
    case("self-loop", self_loop, ["model.safetensors", "symbolic link"])

    def cycle(d):
        p = os.path.join(d, "model.safetensors")
        os.remove(p)
        os.symlink("b.safetensors", p)
        os.symlink("model.safetensors", os.path.join(d, "b.safetensors"))
    case("two-link-cycle", cycle, ["model.safetensors", "symbolic link"])

    def dangling(d):
        p = os.path.join(d, "model.safetensors")
        os.remove(p)
        os.symlink("gone.safetensors", p)
    case("dangling", dangling, ["model.safetensors", "dangling", "gone.safetensors"])

    def shard_loop(d):
        p = os.path.join(d, "model.safetensors")
        os.rename(p, os.path.join(d, "real.safetensors"))
        names = list(load_file(os.path.join(d, "real.safetensors")).keys())
        json.dump({"metadata": {}, "weight_map": {n: "shard-1.safetensors" for n in names}},
                  open(os.path.join(d, "model.safetensors.index.json"), "w"))
        os.symlink("shard-1.safetensors", os.path.join(d, "shard-1.safetensors"))
    case("index-shard-loop", shard_loop, ["shard-1.safetensors", "symbolic link"])

    # config.json and the draft checkpoint too
    def config_loop(d):
        p = os.path.join(d, "config.json")
        os.remove(p)
        os.symlink("config.json", p)
    case("config-loop", config_loop, ["config.json", "symbolic link"])

    rundir = fresh(args.tmp, "link-run")
    os.makedirs(rundir)
    os.symlink("checkpoint.safetensors", os.path.join(rundir, "checkpoint.safetensors"))
    _, err, rc = run([args.dspark, "draft-forward", rundir, "--inputs", os.path.join(rundir, "x"),
                     "--out", os.path.join(args.tmp, "link-run-y")], expect_rc=None)
    ck.check(rc == 1 and "checkpoint.safetensors" in err and "symbolic link" in err,
             f"24 draft-forward with a looping checkpoint symlink: rc {rc}: {err}")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    ids = [3, 200, 17, 45, 9, 128, 77, 1, 250, 64, 31, 8]
    for test in (lambda: test_tied_with_stored_head(ck, args, ids), lambda: test_generation_stop(ck, args),
                 lambda: test_config_defaults(ck, args, ids), lambda: test_position_limit(ck, args),
                 lambda: test_symlinks(ck, args)):
        try:
            test()
        except SystemExit:  # common.run's unexpected exit status, already printed
            ck.check(False, "a command exited with an unexpected status (above)")
    ck.finish("test_hardening_model")


if __name__ == "__main__":
    main()

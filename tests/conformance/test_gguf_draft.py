"""`dspark export RUN --gguf FILE` against llama.cpp's own converter (ctest
conformance.test_gguf_draft; docs/gguf-export.md).

A tiny Llama target with SmolLM2's tokenizer (a vocabulary whose pre-tokenizer llama.cpp's
converter recognizes) is made here, converted to GGUF by llama.cpp's convert_hf_to_gguf.py, and
drafts are trained against it for two steps: a full-vocabulary draft with the confidence head
over [h ; e], a reduced-vocabulary one (d2t, output.weight) whose confidence head sees h
only, and one whose "reduced" vocabulary is all of V (--draft-vocab V: d2t the identity, no
output.weight, as the converter has it). The GGUF's d2t must be S, the absolute target ids the
HF export's offsets encode. Each is exported both ways, `--out` (HF) and `--gguf` (f16, bf16, f32), and the converter
of the vendored llama.cpp (scripts/setup_llama_cpp.sh) is run on the HF export with the target
directory as --target-model-dir: every key (type and value, in order) and every tensor (name,
type, shape, bytes, in order) must be equal. Our reader reads the file too; gated heads and
outputs over inputs are refused.

Skips (exit 77) when the llama.cpp source or the SmolLM2 GGUF (scripts/setup.sh) is absent."""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import common  # noqa: E402
import llama_cpp_run  # noqa: E402

SKIP = 77


def skip(why):
    print(f"test_gguf_draft: SKIPPED: {why}", flush=True)
    sys.exit(SKIP)


def converter_env(lcpp, tmp):
    """PYTHONPATH with the vendored gguf-py; a stand-in for sentencepiece when it is not
    installed: the converter imports it before it looks for a tokenizer.model, which these
    byte-level BPE targets do not have (it then takes the tokenizer.json path)."""
    paths = [os.path.join(lcpp, "gguf-py")]
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        stub = os.path.join(tmp, "sentencepiece-stub")
        os.makedirs(stub, exist_ok=True)
        with open(os.path.join(stub, "sentencepiece.py"), "w") as f:
            f.write("class SentencePieceProcessor:  # never used: no tokenizer.model\n    pass\n")
        paths.append(stub)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def convert(lcpp, env, src, out, outtype, target_dir=None):
    cmd = [sys.executable, os.path.join(lcpp, "convert_hf_to_gguf.py"), src, "--outfile", out, "--outtype", outtype]
    if target_dir:
        cmd += ["--target-model-dir", target_dir]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode:
        sys.stderr.write(f"{' '.join(cmd)} failed:\n{p.stderr[-4000:]}\n")
        raise SystemExit(1)


def read_gguf(path):
    """(keys in order: name -> (types, value)), (tensors in order: name -> (type, shape, bytes))."""
    import numpy as np
    from gguf import GGUFReader
    r = GGUFReader(path)
    kv = {}
    for f in r.fields.values():
        if not f.name.startswith("GGUF."):
            kv[f.name] = ([t.name for t in f.types], f.contents())
    ts = {t.name: (t.tensor_type.name, [int(x) for x in t.shape], np.asarray(t.data).tobytes()) for t in r.tensors}
    return kv, ts


def compare(ck, ours_path, ref_path, what):
    ours, ref = read_gguf(ours_path), read_gguf(ref_path)
    ck.check(list(ours[0]) == list(ref[0]), f"{what}: key order differs:\n ours {list(ours[0])}\n ref  {list(ref[0])}")
    for k in sorted(set(ours[0]) | set(ref[0])):
        a, b = ours[0].get(k), ref[0].get(k)
        ck.check(a == b, f"{what}: key {k}: ours {str(a)[:200]}, llama.cpp's converter {str(b)[:200]}")
    ck.check(list(ours[1]) == list(ref[1]), f"{what}: tensor order differs:\n ours {list(ours[1])}\n ref  {list(ref[1])}")
    for k in sorted(set(ours[1]) | set(ref[1])):
        a, b = ours[1].get(k), ref[1].get(k)
        ck.check(a is not None and b is not None and a[:2] == b[:2] and a[2] == b[2],
                 f"{what}: tensor {k}: ours {a and a[:2]}, llama.cpp's converter {b and b[:2]}"
                 + ("" if a is None or b is None or a[:2] != b[:2] else " (bytes differ)"))
    return ours


def main():
    args = common.parse_args(__doc__)
    tmp, dspark = args.tmp, args.dspark
    lcpp = llama_cpp_run.source_dir()
    if not lcpp:
        skip(f"llama.cpp's source (llama-cpp-python {llama_cpp_run.VERSION}) is not set up: run scripts/setup_llama_cpp.sh")
    smol = os.path.join(os.environ.get("DSPARK_MODELS", os.path.expanduser("~/.cache/dspark/models")),
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(smol):
        skip(f"{smol} (its tokenizer) is not set up: run scripts/setup.sh")
    sys.path.insert(0, os.path.join(lcpp, "gguf-py"))
    ck = common.Checker()
    env = converter_env(lcpp, tmp)

    def fresh(*parts):
        d = os.path.join(tmp, *parts)
        shutil.rmtree(d, ignore_errors=True)
        if os.path.isfile(d):
            os.remove(d)
        return d

    # ---- the target: tiny Llama weights, SmolLM2's tokenizer, and its GGUF by llama.cpp's converter
    smol_dir = os.path.join(tmp, "smollm2")
    if not os.path.isfile(os.path.join(smol_dir, "tokenizer.json")):
        common.run([dspark, "convert", smol, "--out", fresh("smollm2")])
    target = fresh("target")
    common.build_tiny_model("llama", target, seed=3, vocab_size=49152, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, tied=True,
                            bos_token_id=1, eos_token_id=2)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(smol_dir, f), target)
    target_gguf = os.path.join(tmp, "target.gguf")
    convert(lcpp, env, target, target_gguf, "f32")
    data = common.stdlib_text(os.path.join(tmp, "text.txt"), 0, 3)
    base = [dspark, "train", "--target", target, "--data", data, "--steps", "2", "--seq-len", "64", "--num-anchors", "8",
            "--batch-seqs", "1", "--eval-seqs", "1", "--eval-every", "0", "--threads", "2", "--overwrite"]

    # ---- drafts: each run directory is named "draft", as is its HF export (general.name)
    runs = {
        "full": ["--block-size", "4", "--markov-rank", "16", "--target-layers", "2"],
        "reduced": ["--block-size", "3", "--markov-rank", "8", "--target-layer-ids", "0,2", "--draft-vocab", "256",
                    "--confidence-no-markov"],
        "identity": ["--block-size", "3", "--markov-rank", "8", "--target-layers", "2", "--draft-vocab", "49152"],
    }
    dtypes = {"full": ["f16", "f32"], "reduced": ["bf16"], "identity": ["f32"]}
    for name, opts in runs.items():
        run = fresh(f"run-{name}", "draft")
        common.run(base + ["--out", run] + opts)
        hf = fresh(f"hf-{name}", "draft")
        common.run([dspark, "export", run, "--out", hf])
        for dt in dtypes[name]:
            ours, ref = os.path.join(tmp, f"ours-{name}-{dt}.gguf"), os.path.join(tmp, f"ref-{name}-{dt}.gguf")
            common.run([dspark, "export", run, "--gguf", ours, "--target", target_gguf, "--dtype", dt])
            convert(lcpp, env, hf, ref, dt, target_dir=target)
            kv, ts = compare(ck, ours, ref, f"{name} draft, {dt}")
            print(f"{name} draft, {dt}: {len(kv)} keys, {len(ts)} tensors compared", flush=True)
        # our own reader takes what we write (and stops at the architecture, which is no target's)
        _, err, _ = common.run([dspark, "info", ours], expect_rc=1)
        ck.check("general.architecture 'dflash'" in err, f"dspark info on our GGUF: {err}")
    kv, ts = read_gguf(os.path.join(tmp, "ours-reduced-bf16.gguf"))
    ck.check("d2t" in ts and ts["d2t"][0] == "I64" and "output.weight" in ts and "token_embd.weight" in ts,
             f"reduced draft: tensors {list(ts)}")
    # llama.cpp's layout: W1 over the target's vocabulary (any previous token), W2 and the head over S
    ck.check(ts["markov_w1.weight"][1] == [8, 49152] and ts["markov_w2.weight"][1] == [8, 256]
             and ts["output.weight"][1] == [64, 256], "reduced draft: markov_w1 / markov_w2 / output shapes")
    ck.check(kv["dflash.target_layers"][1] == [1, 3] and kv["dflash.block_size"][1] == 3
             and kv["dflash.has_confidence_head"][1] is True, "reduced draft: dflash keys")
    # d2t round trip: the GGUF's absolute ids are S = j + d2t[j] of the HF export (vLLM's offsets)
    import numpy as np
    from safetensors.numpy import load_file
    for name, n in (("reduced", 256), ("identity", 49152)):
        hf = load_file(os.path.join(tmp, f"hf-{name}", "draft", "model.safetensors"))
        S = hf["d2t"].astype(np.int64) + np.arange(hf["d2t"].size, dtype=np.int64)
        ours = read_gguf(os.path.join(tmp, f"ours-{name}-{dtypes[name][-1]}.gguf"))[1]
        got = np.frombuffer(ours["d2t"][2], dtype=np.int64) if "d2t" in ours else None
        ck.check(S.size == n and bool(np.all(np.diff(S) > 0)) and got is not None and np.array_equal(got, S)
                 and bool(np.all(hf["t2d"].astype(bool) == np.isin(np.arange(49152), S))),
                 f"{name} draft: the GGUF's d2t is not S of the HF export's d2t / t2d")
    ident = read_gguf(os.path.join(tmp, "ours-identity-f32.gguf"))[1]
    ck.check("output.weight" not in ident and ident["markov_w2.weight"][1] == [8, 49152],
             f"identity draft: tensors {list(ident)}")
    kv, ts = read_gguf(os.path.join(tmp, "ours-full-f16.gguf"))
    ck.check("output.weight" not in ts and "d2t" not in ts and ts["conf_proj.weight"][1] == [80, 1],
             f"full draft: {list(ts)}")

    # ---- --draft-vocab from a cache captured from the .gguf: its Jinja template (tokenizer keys,
    # not a directory's files) is found through the recorded target and its assistant-turn ids
    # (SmolLM2's <|im_end|> and the newline after it) are in S
    import json
    chat = os.path.join(tmp, "chat.jsonl")
    with open(chat, "w") as f:
        for q, a in (("Name a color.", "Blue is a color."), ("Count to three.", "One, two, three.")):
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
    cache = fresh("cache-gguf")
    common.run([dspark, "capture", "--target", target_gguf, "--data", chat, "--out", cache, "--seq-len", "48"])
    run = fresh("run-cache-vocab")
    _, err, _ = common.run([dspark, "train", "--cache", cache, "--out", run, "--steps", "1", "--num-anchors", "4",
                            "--batch-seqs", "1", "--eval-seqs", "0", "--eval-every", "0", "--block-size", "3",
                            "--markov-rank", "8", "--draft-vocab", "64", "--threads", "2"])
    newline = common.run([dspark, "tokenize", target, "--text", "\n"])[0].split()
    ck.check("not at hand" not in err and "2 mandatory" in err and newline == ["198"],
             f"--draft-vocab from a cache of a .gguf target: the template's ids (<|im_end|> 2, newline {newline}): {err}")

    # ---- refusals
    gated = fresh("run-gated", "draft")
    common.run(base + ["--out", gated, "--block-size", "4", "--markov-rank", "8", "--markov", "gated",
                       "--steps", "1"])
    _, err, _ = common.run([dspark, "export", gated, "--gguf", os.path.join(tmp, "gated.gguf"), "--target",
                            target_gguf], expect_rc=1)
    ck.check("llama.cpp" in err and "vanilla" in err and not os.path.exists(os.path.join(tmp, "gated.gguf")),
             f"a gated draft: {err}")
    run = os.path.join(tmp, "run-full", "draft")
    for out in (target_gguf, os.path.join(run, "x.gguf")):
        _, err, _ = common.run([dspark, "export", run, "--gguf", out, "--target", target_gguf], expect_rc=2)
        ck.check("refusing to overwrite an input" in err, f"--gguf {out}: {err}")
    _, err, _ = common.run([dspark, "export", run, "--gguf", os.path.join(tmp, "x.gguf")], expect_rc=2)
    ck.check("--target" in err, f"--gguf with an HF-directory target recorded: {err}")
    ck.finish("test_gguf_draft")


if __name__ == "__main__":
    main()

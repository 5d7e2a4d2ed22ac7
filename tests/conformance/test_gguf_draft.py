"""`dspark export RUN --gguf FILE` against llama.cpp's own converter (ctest
conformance.test_gguf_draft; docs/gguf-export.md).

A tiny Llama target with SmolLM2's tokenizer (a vocabulary whose pre-tokenizer llama.cpp's
converter recognizes) is made here, converted to GGUF by llama.cpp's convert_hf_to_gguf.py, and
drafts are trained against it for two steps: a full-vocabulary draft with the confidence head
over [h ; e], a reduced-vocabulary one (d2t, output.weight) whose confidence head sees h
only, and one whose "reduced" vocabulary is all of V (--draft-vocab V: d2t the identity, no
output.weight, as the converter has it). The GGUF's d2t must be S, the absolute target ids the
HF export's offsets encode. Each is exported both ways, `--out` (HF) and `--gguf` (f16, bf16, f32, q8_0), and the converter
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


# ---- --target HF_DIR: the tokenizer.* keys built from the target's files as the converter builds them

def added_token(i, content, special=False, normalized=False):
    return dict(id=i, content=content, single_word=False, lstrip=False, rstrip=False, normalized=normalized,
                special=special)


def with_added_tokens(tj):
    """SmolLM2's vocabulary with its last three model tokens (and their merges) removed and new
    added tokens in their place: one that looks special, one with U+2581 (user-defined: written
    with a space), one not normalized whose text decodes otherwise, and a model token made a
    non-normalized added token (written as its decoded text). None of them is in the converter's
    check text, so the pre-tokenizer is still SmolLM2's."""
    v = tj["model"]["vocab"]
    by_id = {i: t for t, i in v.items()}
    gone = {by_id[i] for i in range(len(v) - 3, len(v))}
    for t in gone:
        del v[t]

    def parts(m):
        return m.split(" ") if isinstance(m, str) else m
    tj["model"]["merges"] = [m for m in tj["model"]["merges"] if "".join(parts(m)) not in gone and not set(parts(m)) & gone]
    n = len(v)
    tj["added_tokens"] += [added_token(n, "<|tool|>"), added_token(n + 1, "my\u2581word", normalized=True),
                           added_token(n + 2, "x<|\u00e9|>"), added_token(v["\u0120hello"], "\u0120hello")]


def hf_variant(tmp, base, name, config=None, tok_config=None, tokenizer=None, files=None, drop=()):
    """A copy of the target directory's config.json and tokenizer files, each edited in place by
    the given function, plus extra files (text written as is) and minus the dropped ones."""
    import json
    d = os.path.join(tmp, "hf-targets", name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for f, edit in (("config.json", config), ("tokenizer_config.json", tok_config), ("tokenizer.json", tokenizer)):
        if f in drop:
            continue
        with open(os.path.join(base, f), encoding="utf-8") as fh:
            j = json.load(fh)
        if edit:
            edit(j)
        with open(os.path.join(d, f), "w", encoding="utf-8") as fh:
            json.dump(j, fh, ensure_ascii=False)
    for f, text in (files or {}).items():
        os.makedirs(os.path.dirname(os.path.join(d, f)), exist_ok=True)
        with open(os.path.join(d, f), "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
    return d


def converter_digest(lcpp, env, hf, target_dir, out):
    """Runs the converter expecting it to refuse the target's pre-tokenizer; the digest it prints."""
    import re
    cmd = [sys.executable, os.path.join(lcpp, "convert_hf_to_gguf.py"), hf, "--outfile", out, "--outtype", "f16",
           "--target-model-dir", target_dir]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = re.search(r"chkhsh:\s+([0-9a-f]{64})", p.stderr)
    return (m.group(1) if m else None), p.returncode, p.stderr[-600:]


def hf_target_checks(ck, tmp, dspark, lcpp, env, target, smol_dir):
    import re

    def pop(*keys):
        return lambda j: [j.pop(k, None) for k in keys]

    post_pair = {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}},
                          {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {"<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}}}
    normalizer = {"type": "Sequence", "normalizers": [
        {"type": "Lowercase"},
        {"type": "BertNormalizer", "clean_text": False, "handle_chinese_chars": False, "strip_accents": True,
         "lowercase": True}]}
    eos_obj = {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "rstrip": False, "normalized": False,
               "single_word": False}
    variants = {
        # the tiny Llama target itself: GPT2Tokenizer, SmolLM2's vocabulary
        "llama": {},
        # GPT2Tokenizer over new added tokens; special tokens as strings, an AddedToken and extra ones
        # (and a normalizer, which GPT2Tokenizer drops but whose flags the converter writes)
        "added": dict(tokenizer=lambda j: (with_added_tokens(j), j.update(normalizer=normalizer)),
                      tok_config=lambda t: t.update(additional_special_tokens=["world"], mask_token="<|im_end|>",
                                                    eos_token=eos_obj)),
        # TokenizersBackend for a Qwen3 target: the file's added tokens kept; chat_template.jinja (CRLF);
        # a pair-only post-processor (add_sep, the eos token as sep); config.json's ids and text_config
        "qwen3-backend": dict(
            config=lambda c: c.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", bos_token_id=3,
                                      eos_token_id=[2, 5], pad_token_id=None, text_config={"pad_token_id": 5},
                                      sep_token_id=7, mask_token_id=9),
            tokenizer=lambda j: (with_added_tokens(j), j.update(post_processor=post_pair)),
            tok_config=lambda t: (t.update(tokenizer_class="PreTrainedTokenizerFast"),
                                  pop("chat_template", "bos_token")(t)),
            files={"chat_template.jinja": "{% for m in messages %}{{ m['content'] }}\r\n{% endfor %}\rend\n"}),
        # transformers' legacy special_tokens_map.json; named templates; add_prefix_space false
        "legacy-map": dict(
            tok_config=lambda t: (pop("bos_token", "eos_token", "tokenizer_class", "chat_template")(t),
                                  t.update(add_prefix_space=False)),
            files={"special_tokens_map.json": '{"bos_token": "world", "eos_token": {"content": "<|im_end|>"}, '
                                              '"additional_special_tokens": ["hello"]}',
                   "chat_template.jinja": "main {{ messages }}",
                   "additional_chat_templates/tool_use.jinja": "tools {{ tools }}"}),
        # an added_tokens_decoder that lists one token (the file's others become plain tokens), cls / sep
        # standing in for bos / eos, a list of named templates
        "decoder-list": dict(tok_config=lambda t: (pop("bos_token", "eos_token")(t), t.update(
            cls_token="<|im_start|>", sep_token="<|im_end|>",
            chat_template=[{"name": "default", "template": "D"}, {"name": "tool use", "template": "T"}],
            added_tokens_decoder={"3": dict(content="<repo_name>", lstrip=False, normalized=True, rstrip=False,
                                            single_word=False, special=False)}))),
        # no tokenizer_config.json at all
        "no-tokenizer-config": dict(drop=("tokenizer_config.json",)),
    }
    run_dir, hf = os.path.join(tmp, "run-full", "draft"), os.path.join(tmp, "hf-full", "draft")
    dirs = {name: hf_variant(tmp, target, name, **kw) for name, kw in variants.items()}
    dirs["smollm2"] = smol_dir
    for name, d in dirs.items():
        ours, ref = os.path.join(tmp, f"ours-dir-{name}.gguf"), os.path.join(tmp, f"ref-dir-{name}.gguf")
        common.run([dspark, "export", run_dir, "--gguf", ours, "--target", d, "--dtype", "f16"])
        convert(lcpp, env, hf, ref, "f16", target_dir=d)
        kv, _ = compare(ck, ours, ref, f"--target {name} (directory)")
        ck.check(kv.get("tokenizer.ggml.pre", (0, ""))[1] == "smollm", f"--target {name}: tokenizer.ggml.pre {kv.get('tokenizer.ggml.pre')}")
        print(f"--target {name} (directory): {len(kv)} keys equal to the converter's", flush=True)
    # what the added tokens became (types: 1 normal, 3 control, 4 user-defined)
    kv, _ = read_gguf(os.path.join(tmp, "ours-dir-added.gguf"))
    toks, types = kv["tokenizer.ggml.tokens"][1], kv["tokenizer.ggml.token_type"][1]
    n = 49152 - 3
    ck.check(toks[n:] == ["<|tool|>", "my word", "x<|\ufffd|>"] and types[n:] == [3, 4, 4]
             and types[toks.index("world")] == 3 and toks.count(" hello") == 1,
             f"added tokens: {toks[n:]} {types[n:]}")

    kv = {name: read_gguf(os.path.join(tmp, f"ours-dir-{name}.gguf"))[0] for name in ("added", "qwen3-backend", "legacy-map")}
    ck.check(kv["added"]["tokenizer.ggml.normalizer.lowercase"][1] is True
             and kv["qwen3-backend"]["tokenizer.ggml.add_sep_token"][1] is True
             and kv["qwen3-backend"]["tokenizer.ggml.seperator_token_id"][1] == 2
             and kv["qwen3-backend"]["tokenizer.chat_template"][1].endswith("\n{% endfor %}\nend\n")
             and kv["legacy-map"]["tokenizer.chat_templates"][1] == ["tool_use"],
             "the directory variants' normalizer flags, separator, template files")

    # the target a run recorded, a directory, is the default
    default = os.path.join(tmp, "ours-dir-default.gguf")
    common.run([dspark, "export", run_dir, "--gguf", default, "--dtype", "f16"])
    with open(default, "rb") as a, open(os.path.join(tmp, "ours-dir-llama.gguf"), "rb") as b:
        ck.check(a.read() == b.read(), "--gguf without --target: not the file of the recorded target directory")

    # ---- a pre-tokenizer the converter cannot name: refused, with the digest the converter prints
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    trained = hf_variant(tmp, target, "trained-bpe", tok_config=pop("additional_special_tokens"))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train([common.stdlib_text(os.path.join(tmp, "bpe.txt"), 3, 6)],
              trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    bpe.save(os.path.join(trained, "tokenizer.json"))
    unknown = {
        "trained-bpe": trained,
        # Qwen2Tokenizer (a qwen2 target) splits with Qwen2's regex whatever tokenizer.json says
        "qwen2-class": hf_variant(tmp, target, "qwen2-class", config=lambda c: c.update(
            architectures=["Qwen2ForCausalLM"], model_type="qwen2")),
        # a post-processor that adds a BOS changes the ids
        "bos-post": hf_variant(tmp, target, "bos-post", tok_config=lambda t: t.update(tokenizer_class="TokenizersBackend"),
                               tokenizer=lambda j: j.update(post_processor={
                                   "type": "TemplateProcessing",
                                   "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                              {"Sequence": {"id": "A", "type_id": 0}}],
                                   "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                                   "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1],
                                                                       "tokens": ["<|im_start|>"]}}})),
    }
    for name, d in unknown.items():
        out = os.path.join(tmp, f"ours-dir-{name}.gguf")
        _, err, _ = common.run([dspark, "export", run_dir, "--gguf", out, "--target", d], expect_rc=1)
        ref_digest, rc, tail = converter_digest(lcpp, env, hf, d, os.path.join(tmp, f"ref-dir-{name}.gguf"))
        m = re.search(r"hash to ([0-9a-f]{64})", err)
        ck.check(rc != 0 and ref_digest is not None, f"{name}: the converter did not refuse the pre-tokenizer: {tail}")
        ck.check(m is not None and "pre-tokenizer" in err and "get_vocab_base_pre" in err and not os.path.exists(out),
                 f"{name}: our refusal: {err}")
        ck.check(m is not None and m.group(1) == ref_digest, f"{name}: our digest {m and m.group(1)}, the converter's {ref_digest}")

    # ---- other refusals, each naming what it refuses
    wordpiece = hf_variant(tmp, target, "wordpiece", tokenizer=lambda j: j.update(
        model={"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
               "vocab": {"[UNK]": 0, "a": 1}}))
    spm = hf_variant(tmp, target, "sentencepiece", files={"tokenizer.model": "not read"})
    fallback = hf_variant(tmp, target, "byte-fallback", tokenizer=lambda j: j["model"].update(byte_fallback=True))
    bert = hf_variant(tmp, target, "bert-class", tok_config=lambda t: t.update(tokenizer_class="BertTokenizer"))
    other = hf_variant(tmp, target, "other-vocab", config=lambda c: c.update(vocab_size=50000))
    mistral = hf_variant(tmp, target, "mistral", config=lambda c: c.update(architectures=["MistralForCausalLM"]))
    # found by fuzz/fuzz_hf_vocab.c: an id no int64_t holds (UB to convert), an id that would size
    # a table of gigabytes
    huge_id = hf_variant(tmp, target, "huge-added-id", tok_config=lambda t: t.setdefault(
        "added_tokens_decoder", {}).update({"1e999": dict(content="<huge>", special=True)}))
    sparse = hf_variant(tmp, target, "sparse-vocab", tokenizer=lambda j: j["model"]["vocab"].update(
        {"zzsparse": 2147483000}))
    for d, rc, words in ((wordpiece, 1, ["'WordPiece'", "not a BPE"]), (spm, 1, ["SentencePiece", "tokenizer.model"]),
                         (fallback, 1, ["byte_fallback"]), (bert, 1, ["'BertTokenizer'"]),
                         (other, 1, ["vocab_size 50000", "not the draft's target"]),
                         (mistral, 1, ["'MistralForCausalLM'"]),
                         (huge_id, 1, ["added_tokens_decoder entry", "not an added token with an id"]),
                         (sparse, 1, ["id 2147483000, far beyond", "ids must be dense"]),
                         (os.path.join(tmp, "text.txt"), 2, ["neither"])):
        out = os.path.join(tmp, "refused.gguf")
        _, err, _ = common.run([dspark, "export", run_dir, "--gguf", out, "--target", d], expect_rc=rc)
        ck.check(all(w in err for w in words) and not os.path.exists(out), f"--target {d}: {err}")


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
    dtypes = {"full": ["f16", "f32", "q8_0"], "reduced": ["bf16"], "identity": ["f32"]}
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

    # ---- --target DIR: the vocabulary from the target's HF directory, as the converter builds it
    hf_target_checks(ck, tmp, dspark, lcpp, env, target, smol_dir)
    ck.finish("test_gguf_draft")


if __name__ == "__main__":
    main()

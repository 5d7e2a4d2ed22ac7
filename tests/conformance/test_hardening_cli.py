"""Hardening of the command line (issue 7): every tensor `dspark draft-forward` and `dspark loss`
read from a user's file is checked for dtype, shape and value range before use, naming the
tensor and the index (item 1 and, for draft-forward inputs, item 23); usage errors exit 2 with a
message for every command's options (items 24 and 26); a run too large for memory says so
instead of exiting 1 in silence (item 24). "hardening" in the name makes the sanitizer build run
this file, so the out-of-bounds reads and undefined behaviour these cases once hit are pinned
under ASan / UBSan too.

Each case is a command, its expected exit status and words its stderr must hold."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

# A small draft (HF export layout, spec section 7); V is large enough that 12M anchors need
# terabytes of logits.
V, D, HQ, HKV, HD, I, M, G, R_MK = 4096, 16, 2, 1, 8, 24, 2, 4, 8
T = 20
MD = M * D


def write_draft(path, seed=0, edit=None):
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)

    def rnd(*shape, s=0.3):
        return (s * rng.standard_normal(shape)).astype(np.float32)

    p = {"embed_tokens.weight": rnd(V, D, s=1.0), "lm_head.weight": rnd(V, D, s=0.5),
         "fc.weight": rnd(D, MD), "hidden_norm.weight": 1 + rnd(D, s=0.1), "norm.weight": 1 + rnd(D, s=0.1),
         "markov_head.markov_w1.weight": rnd(V, R_MK), "markov_head.markov_w2.weight": rnd(V, R_MK),
         "confidence_head.proj.weight": rnd(1, D + R_MK), "confidence_head.proj.bias": rnd(1, s=0.1)}
    pre = "layers.0."
    p.update({pre + "self_attn.q_proj.weight": rnd(HQ * HD, D), pre + "self_attn.k_proj.weight": rnd(HKV * HD, D),
              pre + "self_attn.v_proj.weight": rnd(HKV * HD, D), pre + "self_attn.o_proj.weight": rnd(D, HQ * HD),
              pre + "self_attn.q_norm.weight": 1 + rnd(HD, s=0.1), pre + "self_attn.k_norm.weight": 1 + rnd(HD, s=0.1),
              pre + "mlp.gate_proj.weight": rnd(I, D), pre + "mlp.up_proj.weight": rnd(I, D),
              pre + "mlp.down_proj.weight": rnd(D, I), pre + "input_layernorm.weight": 1 + rnd(D, s=0.1),
              pre + "post_attention_layernorm.weight": 1 + rnd(D, s=0.1)})
    cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "vocab_size": V, "hidden_size": D,
           "intermediate_size": I, "num_hidden_layers": 1, "num_attention_heads": HQ, "num_key_value_heads": HKV,
           "head_dim": HD, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 128,
           "num_target_layers": 6, "block_size": G, "mask_token_id": V - 1, "target_layer_ids": [1, 3],
           "num_anchors": 8, "enable_confidence_head": True, "confidence_head_with_markov": True,
           "markov_rank": R_MK, "markov_head_type": "vanilla", "tie_word_embeddings": False,
           "layer_types": ["full_attention"]}
    if edit:
        edit(p)
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    save_file(p, os.path.join(path, "model.safetensors"))


def save_raw(tensors, path):
    """A safetensors file written by hand: tensors = {name: (dtype name, shape, raw bytes)}, so
    that a test can store what numpy will not (a BOOL byte of 2)."""
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        dt, shape, raw = tensors[name]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def base_inputs(rng):
    return {"ctx": rng.standard_normal((T, MD)).astype(np.float32),
            "input_ids": rng.integers(0, V - 1, T).astype(np.int64),
            "anchors": np.array([0, 3, 9, 15], dtype=np.int64),
            "block_keep": np.array([1, 1, 1, 1], dtype=np.uint8),
            "last": rng.standard_normal((T, D)).astype(np.float32)}


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    D_ = args.dspark
    tmp = args.tmp
    draft = os.path.join(tmp, "draft")
    write_draft(draft)
    rng = np.random.default_rng(7)
    n_case = [0]

    def expect(name, cmd, rc, needles, env=None):
        _, err, code = common.run(cmd, expect_rc=None, env=env)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        ok = code == rc and all(n in err for n in needles) and (rc == 0 or lines)
        ck.check(ok, f"{name}: exit {code} (want {rc}); stderr {err.strip()[-600:]!r} should hold {needles}")
        print(f"{name}: exit {code}: {lines[-1][:200] if lines else '(no message)'}", flush=True)
        return err

    def fwd(name, inputs, rc, needles, extra=(), raw=False, env=None):
        n_case[0] += 1
        path = os.path.join(tmp, f"in-{n_case[0]}.safetensors")
        (save_raw if raw else save_file)(inputs, path)
        out = os.path.join(tmp, f"out-{n_case[0]}.safetensors")
        return expect("draft-forward " + name, [D_, "draft-forward", draft, "--inputs", path, "--out", out] +
                      list(extra), rc, needles, env=env)

    # ---------------------------------------------------------------- draft-forward inputs
    base = base_inputs(rng)
    fwd("clean", base, 0, [])
    fwd("clean --loss", base, 0, [], ["--loss"])

    def with_(**kw):
        x = {k: v.copy() for k, v in base.items()}
        for k, v in kw.items():
            if v is None:
                x.pop(k)
            else:
                x[k] = v
        return x

    # item 1: anchors range-checked before the eval mask reads loss_mask[a + k + 1]
    for a in (-3, -(2 ** 62), 2 ** 63 - 1, T - 1, T):
        fwd(f"anchor {a}", with_(anchors=np.array([0, a, 9, 15], dtype=np.int64)), 1,
            ["tensor 'anchors'", str(a), "[1]"], ["--loss"])
    # a dropped block's anchor is never read, whatever it holds
    fwd("dropped anchor -2^62", with_(anchors=np.array([0, -(2 ** 62), 9, 15], dtype=np.int64),
                                      block_keep=np.array([1, 0, 1, 1], dtype=np.uint8)), 0, [], ["--loss"])
    # token ids: I64 values are range-checked, not truncated to int32 (2^40 used to become 0)
    ids = base["input_ids"].copy()
    ids[5] = 2 ** 40
    fwd("id 2^40", with_(input_ids=ids), 1, ["tensor 'input_ids'", "1099511627776", "[5]"])
    ids = base["input_ids"].copy()
    ids[2] = -1
    fwd("id -1", with_(input_ids=ids), 1, ["tensor 'input_ids'", "-1", "[2]"])
    ids = base["input_ids"].copy()
    ids[2] = V
    fwd("id V", with_(input_ids=ids.astype(np.int32)), 1, ["tensor 'input_ids'", str(V), "[2]"])
    # shapes: ids [4, 4] are not 16 tokens
    x16 = with_(input_ids=base["input_ids"][:16].reshape(4, 4).copy(), ctx=base["ctx"][:16].copy(),
                last=base["last"][:16].copy(), anchors=np.array([0, 3], dtype=np.int64),
                block_keep=np.array([1, 1], dtype=np.uint8))
    fwd("ids [4, 4]", x16, 1, ["tensor 'input_ids'", "dimensions"])
    fwd("anchors [2, 2]", with_(anchors=base["anchors"].reshape(2, 2).copy()), 1, ["tensor 'anchors'", "dimensions"])
    fwd("ctx [T, m*d + 1]", with_(ctx=np.zeros((T, MD + 1), dtype=np.float32)), 1, ["tensor 'ctx'", "[T, m*d]"])
    fwd("ctx [T - 1, m*d]", with_(ctx=np.zeros((T - 1, MD), dtype=np.float32)), 1, ["tensor 'ctx'", "[T, m*d]"])
    fwd("last [T, d + 1]", with_(last=np.zeros((T, D + 1), dtype=np.float32)), 1, ["tensor 'last'", "[T, d]"])
    fwd("block_keep [3]", with_(block_keep=np.ones(3, dtype=np.uint8)), 1, ["tensor 'block_keep'", "[B]"])
    fwd("loss_mask [T + 1]", with_(loss_mask=np.ones(T + 1, dtype=np.uint8)), 1, ["tensor 'loss_mask'", "[T]"])
    fwd("eval_mask [B*g + 1]", with_(eval_mask=np.ones(4 * G + 1, dtype=np.uint8)), 1, ["tensor 'eval_mask'", "[B*g]"])
    fwd("one token", with_(input_ids=base["input_ids"][:1].copy(), ctx=base["ctx"][:1].copy(),
                           last=base["last"][:1].copy(), anchors=np.array([0], dtype=np.int64),
                           block_keep=np.array([0], dtype=np.uint8)), 1, ["tensor 'input_ids'", "at least 2"])
    fwd("no anchors", with_(anchors=np.zeros(0, dtype=np.int64), block_keep=np.zeros(0, dtype=np.uint8)), 1,
        ["tensor 'anchors'", "at least one"])
    # dtypes
    fwd("anchors F32", with_(anchors=base["anchors"].astype(np.float32)), 1, ["tensor 'anchors'", "F32", "I32"])
    fwd("ctx I32", with_(ctx=np.zeros((T, MD), dtype=np.int32)), 1, ["tensor 'ctx'", "I32", "F32"])
    fwd("block_keep I64", with_(block_keep=np.ones(4, dtype=np.int64)), 1, ["tensor 'block_keep'", "U8 or BOOL"])
    fwd("missing ctx", with_(ctx=None), 1, ["tensor 'ctx'", "missing"])
    # a BOOL byte other than 0 / 1
    raw = {k: ({np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}[v.dtype],
               v.shape, v.tobytes()) for k, v in base.items()}
    raw["block_keep"] = ("BOOL", (4,), bytes([1, 2, 1, 1]))
    fwd("block_keep BOOL 2", raw, 1, ["tensor 'block_keep'", "BOOL", "[1]"], raw=True)
    # an explicit eval mask that supervises a slot past the end of the sequence
    em = np.zeros(4 * G, dtype=np.uint8)
    em[3 * G + 1] = 1  # block 3 (anchor T - 2 = 18), slot 1: target position 18 + 1 + 1 = T
    fwd("eval_mask past the end", with_(eval_mask=em, anchors=np.array([0, 3, 9, T - 2], dtype=np.int64)), 1,
        ["tensor 'eval_mask'", "block 3 slot 1", "past"], ["--loss"])
    # item 23: a non-finite input names the tensor and the index, not "draft logits hold NaN"
    c = base["ctx"].copy()
    c[3, 5] = np.nan
    fwd("ctx NaN", with_(ctx=c), 1, ["tensor 'ctx'", "NaN", "[3, 5]"], ["--loss"])
    c = base["ctx"].copy()
    c[7, 0] = -np.inf
    fwd("ctx -inf", with_(ctx=c), 1, ["tensor 'ctx'", "-inf", "[7, 0]"])
    last = base["last"].copy()
    last[4, 2] = np.nan  # block 1 (anchor 3) slot 1 reads last[4]: supervised
    fwd("last NaN, supervised", with_(last=last), 1, ["tensor 'last'", "NaN", "[4, 2]", "block 1 slot 1"], ["--loss"])
    last = base["last"].copy()
    last[T - 1, 0] = np.nan  # block 3 (anchor 15) reads last[15..18]: nobody reads last[19]
    last[2, 0] = np.inf  # block 0 (anchor 0) slot 2 would read last[2], but its target 3 is masked below
    lm = np.ones(T, dtype=np.uint8)
    lm[3] = 0
    fwd("last NaN, unsupervised", with_(last=last, loss_mask=lm), 0, [], ["--loss"])
    # an input nobody reads is usually a misspelt one: warned about, not silently ignored
    fwd("misspelt block_keep_mask", with_(block_keep_mask=np.array([1, 0, 1, 1], dtype=np.uint8)), 0,
        ["block_keep_mask", "warning"])
    # item 24: too many anchors for memory: a message, not a silent exit 1
    big = 12_000_000
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":allocator_may_return_null=1").lstrip(":")
    fwd("12M anchors", with_(anchors=np.zeros(big, dtype=np.int32), block_keep=None), 1,
        ["cannot allocate", "logits"], env=env)

    # item 3: huge finite q/k-norm weights overflow the attention scores to inf, so NaN reaches
    # the softmax's exp inside the draft: defined behaviour (the sanitizer build aborts on any
    # UB), NaN logits without --loss, and with --loss a refusal naming the NaN, not a crash
    def huge_norms(p):
        p["layers.0.self_attn.q_norm.weight"][:] = 1e20
        p["layers.0.self_attn.k_norm.weight"][:] = 1e20
    hot = os.path.join(tmp, "draft-huge-norms")
    write_draft(hot, edit=huge_norms)
    n_case[0] += 1
    hot_in, hot_out = os.path.join(tmp, "hot-in.safetensors"), os.path.join(tmp, "hot-out.safetensors")
    save_file(base, hot_in)
    expect("huge q/k norms: forward", [D_, "draft-forward", hot, "--inputs", hot_in, "--out", hot_out], 0, [])
    from safetensors.numpy import load_file
    ck.check(bool(np.isnan(load_file(hot_out)["logits"]).any()), "huge q/k norms: the logits should hold NaN")
    expect("huge q/k norms: --loss", [D_, "draft-forward", hot, "--inputs", hot_in, "--out", hot_out, "--loss"], 1,
           ["draft logits", "NaN"])
    # a non-finite weight in the draft is named where it is read
    def nan_fc(p):
        p["fc.weight"][3, 4] = np.nan
    bad = os.path.join(tmp, "draft-nan-weight")
    write_draft(bad, edit=nan_fc)
    expect("NaN weight in the draft", [D_, "draft-forward", bad, "--inputs", hot_in, "--out", hot_out], 1,
           ["model.safetensors", "tensor 'fc.weight'", "NaN", "element %d" % (3 * MD + 4)])

    # ---------------------------------------------------------------- dspark loss inputs
    B, g, Vl = 3, 4, 11
    lbase = {"draft_logits": rng.standard_normal((B * g, Vl)).astype(np.float32),
             "target_logits": rng.standard_normal((B * g, Vl)).astype(np.float32),
             "target_ids": rng.integers(0, Vl, B * g).astype(np.int64),
             "eval_mask": np.ones(B * g, dtype=np.uint8), "block_keep_mask": np.ones(B, dtype=np.uint8),
             "conf_logits": rng.standard_normal(B * g).astype(np.float32)}

    def loss(name, inputs, rc, needles, extra=(), raw_=False):
        n_case[0] += 1
        path = os.path.join(tmp, f"loss-{n_case[0]}.safetensors")
        (save_raw if raw_ else save_file)(inputs, path)
        expect("loss " + name, [D_, "loss", path, "--out", path + ".out"] + list(extra), rc, needles)

    def lwith(**kw):
        x = {k: v.copy() for k, v in lbase.items()}
        x.update(kw)
        return x

    loss("clean", lbase, 0, [])
    ti = lbase["target_ids"].copy()
    ti[5] = 2 ** 40
    loss("id 2^40", lwith(target_ids=ti), 1, ["tensor 'target_ids'", "1099511627776", "[5]"])
    ti = lbase["target_ids"].copy()
    ti[5] = 2 ** 40
    em = np.ones(B * g, dtype=np.uint8)
    em[5] = 0
    loss("id 2^40 unsupervised", lwith(target_ids=ti, eval_mask=em), 0, [])
    dl = lbase["draft_logits"].copy()
    dl[6, 2] = np.nan
    loss("draft NaN", lwith(draft_logits=dl), 1, ["tensor 'draft_logits'", "NaN", "[6, 2]", "block 1 slot 2"])
    tl = lbase["target_logits"].copy()
    tl[1, 4] = np.inf
    loss("target +inf", lwith(target_logits=tl), 1, ["tensor 'target_logits'", "+inf", "[1, 4]"])
    cl = lbase["conf_logits"].copy()
    cl[9] = np.nan
    loss("conf NaN", lwith(conf_logits=cl), 1, ["tensor 'conf_logits'", "NaN", "[9]"])
    raw = {k: ({np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}[v.dtype],
               v.shape, v.tobytes()) for k, v in lbase.items()}
    raw["eval_mask"] = ("BOOL", (B * g,), bytes([1] * 7 + [3] + [1] * 4))
    loss("eval_mask BOOL 3", raw, 1, ["tensor 'eval_mask'", "BOOL", "[7]"], raw_=True)
    loss("block size 0", lwith(draft_logits=np.zeros((B, 0, Vl), dtype=np.float32),
                               target_logits=np.zeros((B, 0, Vl), dtype=np.float32),
                               target_ids=np.zeros((B, 0), dtype=np.int64), eval_mask=np.zeros((B, 0), dtype=np.uint8),
                               conf_logits=np.zeros((B, 0), dtype=np.float32)), 1, ["tensor 'draft_logits'", "g >= 1"])
    loss("--block-size 2^31-1", lbase, 1, ["tensor 'draft_logits'", "--block-size"], ["--block-size", "2147483647"])
    loss("misspelt block_keep", lwith(block_keep=np.ones(B, dtype=np.uint8)), 0, ["block_keep", "warning"])

    # ---------------------------------------------------------------- usage errors: exit 2 with a message
    nowhere = os.path.join(tmp, "no-such-model")
    tok = os.path.join(tmp, "no-such-tokenizer.json")
    usage = [
        ("forward --ids ''", ["forward", nowhere, "--ids", "", "--out", "x"], ["--ids"]),
        ("forward --ids '1,2;'", ["forward", nowhere, "--ids", "1,2;", "--out", "x"], ["sequence 1"]),
        ("forward --ids ';1'", ["forward", nowhere, "--ids", ";1", "--out", "x"], ["sequence 0"]),
        ("forward --ids '1,,2'", ["forward", nowhere, "--ids", "1,,2", "--out", "x"], ["--ids"]),
        ("forward --ids '1,2,'", ["forward", nowhere, "--ids", "1,2,", "--out", "x"], ["--ids"]),
        ("forward --ids 1x", ["forward", nowhere, "--ids", "1x", "--out", "x"], ["--ids"]),
        ("forward --capture ''", ["forward", nowhere, "--ids", "1,2", "--out", "x", "--capture", ""], ["--capture"]),
        ("forward --logits some", ["forward", nowhere, "--ids", "1", "--out", "x", "--logits", "some"], ["--logits"]),
        ("forward no --out", ["forward", nowhere, "--ids", "1"], ["--out"]),
        ("generate --prompt-ids 1,x", ["generate", nowhere, "--prompt-ids", "1,x"], ["--prompt-ids"]),
        ("generate --prompt-ids ''", ["generate", nowhere, "--prompt-ids", ""], ["--prompt-ids"]),
        ("generate --top-p 0", ["generate", nowhere, "--prompt-ids", "1", "--top-p", "0"], ["--top-p"]),
        ("speculate --threshold without its policy", ["speculate", "--target", nowhere, "--draft", "d", "--prompt-ids",
                                                      "1", "--threshold", "0.3"], ["--threshold", "--policy threshold"]),
        ("speculate --threshold under --policy fixed", ["speculate", "--target", nowhere, "--draft", "d",
                                                        "--prompt-ids", "1", "--policy", "fixed", "--threshold", "0.3"],
         ["--threshold"]),
        ("tokenize --decode --add-special", ["tokenize", tok, "--decode", "f", "--add-special"], ["--add-special"]),
        ("tokenize --text --skip-special", ["tokenize", tok, "--text", "a", "--skip-special"], ["--skip-special"]),
        ("tokenize --chat --ids-out", ["tokenize", tok, "--chat", "f", "--ids-out", "o"], ["--ids-out"]),
        ("tokenize --text --split-nul", ["tokenize", tok, "--text", "a", "--split-nul"], ["--split-nul"]),
        ("tokenize --bench --add-generation-prompt", ["tokenize", tok, "--bench", "f", "--add-generation-prompt"],
         ["--add-generation-prompt"]),
        ("capture layers twice", ["capture", "--target", nowhere, "--data", "d", "--out", "o", "--target-layers", "2",
                                  "--target-layer-ids", "0,1"], ["--target-layers", "--target-layer-ids"]),
        ("capture --target-layer-ids ''", ["capture", "--target", nowhere, "--data", "d", "--out", "o",
                                           "--target-layer-ids", ""], ["--target-layer-ids"]),
        ("capture --min-k > --topk", ["capture", "--target", nowhere, "--data", "d", "--out", "o", "--topk", "2",
                                      "--min-k", "5"], ["--min-k"]),
        ("capture positional", ["capture", "stray", "--target", nowhere, "--data", "d", "--out", "o"], ["stray"]),
        ("capture --dtype fp8", ["capture", "--target", nowhere, "--data", "d", "--out", "o", "--dtype", "fp8"],
         ["--dtype"]),
        ("draft-forward --alpha-ce -1", ["draft-forward", nowhere, "--inputs", "i", "--out", "o", "--alpha-ce", "-1"],
         ["--alpha-ce"]),
        ("draft-forward --threads 0", ["draft-forward", nowhere, "--inputs", "i", "--out", "o", "--threads", "0"],
         ["--threads"]),
        ("draft-forward no --inputs", ["draft-forward", nowhere, "--out", "o"], ["--inputs"]),
        ("loss --decay linear", ["loss", "i", "--out", "o", "--decay", "linear"], ["--decay"]),
        ("loss --alpha-l1 -1", ["loss", "i", "--out", "o", "--alpha-l1", "-1"], ["--alpha-l1"]),
        ("inspect two dirs", ["inspect", "a", "b"], ["one cache"]),
        ("export no --out", ["export", "run"], ["usage"]),
        ("unknown command", ["frobnicate"], ["frobnicate"]),
        ("regenerate --thinking maybe", ["regenerate", "--target", nowhere, "--data", "d", "--out", "o", "--thinking",
                                         "maybe"], ["--thinking", "maybe"]),
        ("regenerate --completion --thinking", ["regenerate", "--target", nowhere, "--data", "d", "--out", "o",
                                                "--completion", "--thinking", "on"], ["--completion"]),
        ("regenerate --batch 0", ["regenerate", "--target", nowhere, "--data", "d", "--out", "o", "--batch", "0"],
         ["--batch"]),
        ("regenerate no --out", ["regenerate", "--target", nowhere, "--data", "d"], ["--out"]),
    ]
    for name, cmd, needles in usage:
        expect(name, [D_] + cmd, 2, needles)
    # every command: an unknown option, and an option whose value is missing
    commands = {"info": [nowhere], "generate": [nowhere, "--prompt-ids", "1"], "forward": [nowhere, "--ids", "1"],
                "tokenize": [tok, "--text", "a"], "train": ["--cache", nowhere, "--out", "r"],
                "capture": ["--target", nowhere, "--data", "d", "--out", "o"], "inspect": [nowhere],
                "export": [nowhere, "--out", "o"], "draft-forward": [nowhere, "--inputs", "i", "--out", "o"],
                "loss": ["i", "--out", "o"],
                "calibrate": ["--target", nowhere, "--draft", nowhere, "--data", "d", "--out", "o"],
                "profile": ["--target", nowhere, "--out", "o"],
                "regenerate": ["--target", nowhere, "--data", "d", "--out", "o"]}
    for cmd, rest in commands.items():
        expect(f"{cmd} --bogus", [D_, cmd] + rest + ["--bogus"], 2, ["--bogus"])
        value_opt = {"info": None, "inspect": None}.get(cmd, "--out")
        if cmd in ("generate",):
            value_opt = "--max-new-tokens"
        if cmd == "tokenize":
            value_opt = "--ids-out"
        if value_opt:
            expect(f"{cmd} {value_opt} without a value", [D_, cmd] + rest + [value_opt], 2, [value_opt, "value"])
    ck.finish("test_hardening_cli")


if __name__ == "__main__":
    main()

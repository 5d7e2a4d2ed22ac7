"""Hardening of the data reader and of the tokenizer / model pairing (issue 7, items 8, 9, 10, 22).

On a tiny Qwen3 target with a ChatML byte-level BPE tokenizer built here, `dspark capture`
packs data files and the shard's input_ids / loss_mask are compared with HF tokenizers:

- item 8: chat data with no supervised token (no assistant turn, a role spelled "Assistant")
  is refused naming the file, by capture and by train; an unknown role is warned about naming
  file, line and role;
- item 9: "\\u0000" in a JSON string is a NUL character the tokenizer sees (ids equal HF's for
  the text with the NUL), in {"text"} and {"messages"} lines and in `dspark tokenize --chat`;
  "\\\\u0000" (an escaped backslash) stays literal text; a tokenizer.json holding \\u0000 is
  refused naming line and column;
- item 10: .JSONL, .ndjson and a file without suffix holding JSONL are read as JSONL;
  --data-format text|jsonl overrides the detection (train and capture), a bad value is a usage
  error (exit 2);
- item 22: invalid UTF-8 names the file, line and column; a tokenizer larger than the model's
  vocab_size, or an eos_token_id outside the vocabulary, is refused at load by generate,
  capture and tokenize MODEL_DIR, naming config.json and tokenizer.json."""
import glob
import json
import os
import shutil
import sys
import sysconfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
SEQ = 128


def build_tokenizer(tmp):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    path = os.path.join(tmp, "tokenizer.json")
    if not os.path.exists(path):
        lib = sysconfig.get_paths()["stdlib"]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=360, special_tokens=SPECIALS,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train(sorted(glob.glob(os.path.join(lib, "*.py")))[:12], tr)
        tok.save(path)
    return path


def build_target(tmp, name, tok_path, **overrides):
    """A tiny Qwen3 with tok_path as its tokenizer.json (vocab and eos from it unless overridden)."""
    from tokenizers import Tokenizer
    d = os.path.join(tmp, name)
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        tok = Tokenizer.from_file(tok_path)
        kw = dict(vocab_size=tok.get_vocab_size(), eos_token_id=tok.token_to_id("<|endoftext|>"), num_hidden_layers=3)
        kw.update(overrides)
        common.build_tiny_model("qwen3", d, seed=7, **kw)
        shutil.copy(tok_path, os.path.join(d, "tokenizer.json"))
    return d


def read_shard(cache):
    from safetensors.numpy import load_file
    t = load_file(os.path.join(cache, "shard-000000.safetensors"))
    seqs, masks = [], []
    for i, n in enumerate(t["lengths"].tolist()):
        seqs.append(t["input_ids"][i, :n].tolist())
        masks.append(t["loss_mask"][i, :n].tolist())
    return seqs, masks


def windows(stream, S=SEQ):
    return [stream[i:i + S] for i in range(0, len(stream), S) if len(stream[i:i + S]) >= 2]


def chatml(messages):
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp, D = args.tmp, args.dspark
    from tokenizers import Tokenizer
    tok_path = build_tokenizer(tmp)
    hf = Tokenizer.from_file(tok_path)
    eos = hf.token_to_id("<|endoftext|>")
    target = build_target(tmp, "target", tok_path)
    n = 0

    def write(name, data):
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return p

    def capture(data, extra=(), expect=0, what=""):
        nonlocal n
        n += 1
        out = os.path.join(tmp, f"cache{n}")
        shutil.rmtree(out, ignore_errors=True)
        _, err, rc = common.run([D, "capture", "--target", target, "--data", data, "--out", out, "--seq-len",
                                 str(SEQ), "--target-layer-ids", "0", "--dtype", "f32", "--threads", "1", "--quiet",
                                 *extra], expect_rc=None)
        crashed = rc < 0 or rc > 2 or "Sanitizer" in err or "runtime error" in err
        ck.check(not crashed, f"{what}: capture crashed (rc {rc}): {err[-2000:]}")
        ck.check(rc == expect, f"{what}: capture exit status {rc}, expected {expect}; stderr: {err.strip()[-1500:]}")
        if rc != 0:
            return None, None, err
        seqs, masks = read_shard(out)
        return seqs, masks, err

    def text_ids(docs):
        stream = []
        for d in docs:
            stream += hf.encode(d, add_special_tokens=False).ids + [eos]
        return windows(stream)

    def same(what, got, want):
        ok = got == want
        ck.check(ok, f"{what}: sequences differ from HF's\n got  {str(got)[:400]}\n want {str(want)[:400]}")
        return ok

    def refused(what, err, needles):
        for s in needles:
            ck.check(s in err, f"{what}: message lacks '{s}': {err.strip()[-1500:]}")

    # ---------------------------------------------------------------- item 10: format detection
    docs = ["def f(x):\n    return x + 1\n", "print('hello world')  # ok\n"]
    jsonl = "".join(json.dumps({"text": d}) + "\n" for d in docs)
    for name in ("data.JSONL", "data.ndjson", "data.Json", "datafile"):
        p = write(name, jsonl)
        seqs, _, err = capture(p, what=f"item 10: {name}")
        if seqs is not None:
            same(f"item 10: {name} read as JSONL", seqs, text_ids(docs))
    p = write("noext-text", "plain words, not JSON\n{\"text\": \"x\"}\n")
    seqs, _, err = capture(p, what="item 10: no suffix, plain text")
    if seqs is not None:
        same("item 10: no suffix, plain text", seqs, text_ids([open(p).read()]))
    ck.check("plain text" in err, f"item 10: detection by content is not reported: {err.strip()}")
    p = write("forced.jsonl", jsonl)
    seqs, _, _ = capture(p, ["--data-format", "text"], what="item 10: --data-format text")
    if seqs is not None:
        same("item 10: --data-format text reads a .jsonl as text", seqs, text_ids([jsonl]))
    p = write("forced.txt", jsonl)
    seqs, _, err = capture(p, what="item 10: JSONL in a .txt")
    ck.check("--data-format jsonl" in err, f"item 10: a .txt holding JSONL is not warned about: {err.strip()}")
    seqs, _, _ = capture(p, ["--data-format", "jsonl"], what="item 10: --data-format jsonl")
    if seqs is not None:
        same("item 10: --data-format jsonl reads a .txt as JSONL", seqs, text_ids(docs))
    for cmd in ("capture", "train"):
        _, err, rc = common.run([D, cmd, "--target", target, "--data", p, "--out", os.path.join(tmp, "x"),
                                 "--data-format", "yaml"], expect_rc=None)
        ck.check(rc == 2 and "--data-format" in err, f"item 10: {cmd} --data-format yaml: rc {rc}, {err.strip()}")
        out, _, _ = common.run([D, cmd, "--help"])
        ck.check("--data-format" in out, f"item 10: {cmd} --help does not document --data-format")

    # ---------------------------------------------------------------- item 8: no supervised token
    def conv(*turns):
        return json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]}) + "\n"

    p = write("nosup.jsonl", conv(("user", "hello there, how are you")) * 3)
    _, _, err = capture(p, expect=1, what="item 8: no assistant turn")
    refused("item 8: no assistant turn", err, ["nosup.jsonl", "no supervised token"])
    run = os.path.join(tmp, "run-nosup")
    shutil.rmtree(run, ignore_errors=True)
    _, err, rc = common.run([D, "train", "--target", target, "--data", p, "--out", run, "--seq-len", str(SEQ),
                             "--steps", "1", "--threads", "1", "--quiet"], expect_rc=None)
    ck.check(rc == 1 and "nosup.jsonl" in err and "no supervised token" in err,
             f"item 8: train on unsupervised data: rc {rc}, {err.strip()[-800:]}")
    ck.check(not os.path.exists(os.path.join(run, "checkpoint.safetensors")), "item 8: train wrote a checkpoint")
    p = write("capital.jsonl", conv(("user", "hi"), ("Assistant", "hello, how can I help")) * 2)
    _, _, err = capture(p, expect=1, what="item 8: role 'Assistant'")
    refused("item 8: role 'Assistant'", err, ["capital.jsonl:1:", "'Assistant'", "no supervised token"])
    p = write("tool.jsonl", conv(("user", "what is 2+2"), ("assistant", "let me check")) +
              conv(("user", "and 3+3?"), ("tool", "6"), ("assistant", "it is 6")))
    seqs, masks, err = capture(p, what="item 8: role 'tool'")
    refused("item 8: role 'tool' warned", err, ["tool.jsonl:2:", "'tool'", "warning"])
    if seqs is not None:
        want = [hf.encode(chatml(m["messages"]), add_special_tokens=False).ids
                for m in map(json.loads, open(p))]
        same("item 8: chat ids", seqs, want)
        ck.check(all(sum(m) > 0 for m in masks), "item 8: a conversation with an assistant turn is unsupervised")

    # ---------------------------------------------------------------- item 9: \u0000
    nul_docs = ["a\x00b and more text", "tail\x00", "\x00"]
    p = write("nul.jsonl", "".join(json.dumps({"text": d}) + "\n" for d in nul_docs))
    seqs, _, _ = capture(p, what="item 9: \\u0000 in text")
    if seqs is not None:
        same("item 9: \\u0000 in {\"text\"} is a NUL character", seqs, text_ids(nul_docs))
    # An escaped backslash before u0000 is literal text; a stand-in character already present.
    lit = ['x\\u0000y', 'nul \x00 and \ufdd0 and \ufdd1']
    p = write("nul-lit.jsonl", "".join(json.dumps({"text": d}) + "\n" for d in lit) +
              json.dumps({"text": "esc \x00 \ufdd0"}, ensure_ascii=True) + "\n")
    seqs, _, _ = capture(p, what="item 9: literal \\\\u0000 and stand-ins")
    if seqs is not None:
        same("item 9: literal \\\\u0000, U+FDD0 next to a NUL", seqs, text_ids(lit + ["esc \x00 \ufdd0"]))
    chat_msgs = [{"role": "user", "content": "say a\x00b"}, {"role": "assistant", "content": "a\x00b\x00"}]
    p = write("nul-chat.jsonl", json.dumps({"messages": chat_msgs}) + "\n")
    seqs, masks, _ = capture(p, what="item 9: \\u0000 in chat")
    want = hf.encode(chatml(chat_msgs), add_special_tokens=False).ids
    if seqs is not None:
        same("item 9: \\u0000 in {\"messages\"}", seqs, [want])
    out, err, rc = common.run([D, "tokenize", tok_path, "--chat", p], expect_rc=None)
    got = json.loads(out.splitlines()[0])["ids"] if rc == 0 and out.strip() else None
    ck.check(got == want, f"item 9: tokenize --chat with \\u0000: rc {rc}, {got} vs {want}; {err.strip()}")
    p = write("nul-role.jsonl", json.dumps({"messages": [{"role": "user\x00x", "content": "hi"},
                                                         {"role": "assistant", "content": "yo"}]}) + "\n")
    _, _, err = capture(p, expect=1, what="item 9: NUL in a role")
    refused("item 9: NUL in a role", err, ["nul-role.jsonl:1", "role"])
    tj = json.load(open(tok_path))
    tj["added_tokens"].append({"id": len(hf.get_vocab()), "content": "<|a\x00b|>", "single_word": False,
                               "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    bad_tok = write("tok-nul.json", json.dumps(tj, indent=1))
    _, err, rc = common.run([D, "tokenize", bad_tok, "--text", "hi"], expect_rc=None)
    ck.check(rc == 1 and "tok-nul.json" in err and "line" in err and "\\u0000" in err,
             f"item 9: tokenizer.json with \\u0000: rc {rc}, {err.strip()}")

    # ---------------------------------------------------------------- item 22: messages
    p = write("bad-utf8.txt", b"line one\nline two\nbad \xff byte\n")
    _, _, err = capture(p, expect=1, what="item 22: invalid UTF-8 in text")
    refused("item 22: invalid UTF-8 in text", err, ["bad-utf8.txt:3:5", "UTF-8"])
    p = write("bad-utf8.jsonl", b'{"text": "fine"}\n{"text": "caf\xc3"}\n')
    _, _, err = capture(p, expect=1, what="item 22: invalid UTF-8 in JSONL")
    refused("item 22: invalid UTF-8 in JSONL", err, ["bad-utf8.jsonl:2:", "UTF-8"])
    _, err, rc = common.run([D, "tokenize", tok_path, "--input", os.path.join(tmp, "bad-utf8.txt")], expect_rc=None)
    ck.check(rc == 1 and "bad-utf8.txt" in err, f"item 22: tokenize --input names the file: rc {rc}, {err.strip()}")

    V = hf.get_vocab_size()
    small = build_target(tmp, "target-small-vocab", tok_path, vocab_size=V - 8)
    cfg = json.load(open(os.path.join(target, "config.json")))
    far_eos = os.path.join(tmp, "target-far-eos")
    shutil.rmtree(far_eos, ignore_errors=True)
    shutil.copytree(target, far_eos)
    json.dump(dict(cfg, eos_token_id=V + 1000), open(os.path.join(far_eos, "config.json"), "w"))
    padded = build_target(tmp, "target-padded", tok_path, vocab_size=V + 16, eos_token_id=V + 3)
    ok_data = write("ok.txt", "some text for the target\n" * 4)
    for k, (name, d, needles) in enumerate((("tokenizer larger than vocab_size", small, ["tokenizer.json", "config.json",
                                                                          "vocab_size"]),
                             ("eos_token_id outside the vocabulary", far_eos, ["config.json", "eos_token_id"]),
                             ("eos_token_id not a token", padded, ["config.json", "eos_token_id", "tokenizer.json"]))):
        shutil.rmtree(os.path.join(tmp, f"cap-vocab{k}"), ignore_errors=True)
        for cmd in ([D, "generate", d, "--prompt", "hello", "--max-new-tokens", "2"],
                    [D, "capture", "--target", d, "--data", ok_data, "--out", os.path.join(tmp, f"cap-vocab{k}"),
                     "--seq-len", str(SEQ), "--target-layer-ids", "0", "--quiet"],
                    [D, "tokenize", d, "--text", "hello"]):
            _, err, rc = common.run(cmd, expect_rc=None)
            ck.check(rc == 1, f"item 22: {name}: {cmd[1]} exit {rc}, expected 1; {err.strip()[-600:]}")
            for s in needles:
                ck.check(s in err, f"item 22: {name}: {cmd[1]} message lacks '{s}': {err.strip()[-600:]}")
    out, err, rc = common.run([D, "tokenize", target, "--text", "hello"],
                              expect_rc=None)
    ck.check(rc == 0 and out.split() == [str(i) for i in hf.encode("hello").ids],
             f"item 22: tokenize MODEL_DIR on a matching model: rc {rc}, {out} {err}")
    ck.finish("test_hardening_text")


if __name__ == "__main__":
    main()

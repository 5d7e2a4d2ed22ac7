#!/usr/bin/env python3
"""Conformance: the formats users bring give the same tokens as OpenAI-style messages.

Random conversations (system or not, multi-turn, assistant reasoning) are written as
{"messages"} JSONL and as ShareGPT {"conversations"} (human / gpt / system, a top-level
"system", reasoning as "thinking"), plain, gzip'd, zstd'd (when the zstd program exists), and
split into a directory of shards read whole or through a glob. With Qwen3's own chat template:
`dspark tokenize --chat` gives identical ids and masks for every form, and the messages' ids
equal transformers' apply_chat_template. `dspark train` on the ShareGPT shards (one line of
them malformed) stops at that line naming file:line and the field, and with
--skip-bad-lines trains on exactly the messages file's sequences (sequences_xxh64), says so
on stderr and records the skipped count in run.json (pretrain too). `dspark capture` of a glob
of shards gives a cache that `train --cache --data DIR` accepts for the same shards as a
directory and refuses for other data.
"""
import gzip
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Checker, parse_args, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORDS = "the a of to and in is you that it for on was with as be at by this had not are but from or".split()


def text(rng, lo=1, hi=12):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def conversation(rng):
    msgs = [{"role": "system", "content": text(rng)}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": text(rng)})
        a = {"role": "assistant", "content": text(rng)}
        if rng.random() < 0.5:
            a["reasoning_content"] = text(rng)
        msgs.append(a)
    return msgs


def sharegpt(rng, msgs):
    """The same conversation as ShareGPT, with the aliases the format uses."""
    names = {"user": ["human", "user"], "assistant": ["gpt", "assistant", "chatgpt"], "system": ["system"]}
    out = {}
    turns = msgs
    if msgs and msgs[0]["role"] == "system" and rng.random() < 0.5:
        out["system"] = msgs[0]["content"]  # LLaMA-Factory's top-level system prompt
        turns = msgs[1:]
    conv = []
    for m in turns:
        t = {"from": rng.choice(names[m["role"]]), "value": m["content"]}
        if "reasoning_content" in m:
            t[rng.choice(["thinking", "reasoning_content", "reasoning"])] = m["reasoning_content"]
        conv.append(t)
    out["conversations"] = conv
    return out


def lines(objs):
    return "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs)


def tokenize_chat(args, target, inputs, extra=()):
    out, err, rc = run([args.dspark, "tokenize", os.path.join(target, "tokenizer.json"), "--chat", inputs, *extra],
                       expect_rc=None)
    return ([json.loads(x) for x in out.splitlines()] if rc == 0 else None), err, rc


def main():
    args = parse_args(__doc__)
    ck = Checker()
    rng = random.Random(1313)
    os.makedirs(args.tmp, exist_ok=True)
    target = common.build_qwen3_chat_target(args.tmp)
    convs = [conversation(rng) for _ in range(24)]
    shares = [sharegpt(rng, c) for c in convs]

    d = os.path.join(args.tmp, "data")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "shards", "part2"))
    msgs_path = os.path.join(d, "messages.jsonl")
    with open(msgs_path, "w", encoding="utf-8") as f:
        f.write(lines({"messages": c} for c in convs))
    forms = {}
    forms["sharegpt plain"] = os.path.join(d, "sharegpt.jsonl")
    with open(forms["sharegpt plain"], "w", encoding="utf-8") as f:
        f.write(lines(shares))
    forms["sharegpt .gz"] = os.path.join(d, "sharegpt.jsonl.gz")
    with gzip.open(forms["sharegpt .gz"], "wt", encoding="utf-8") as f:
        f.write(lines(shares))
    if shutil.which("zstd"):
        forms["sharegpt .zst"] = os.path.join(d, "sharegpt.jsonl.zst")
        subprocess.run(["zstd", "-q", "-f", forms["sharegpt plain"], "-o", forms["sharegpt .zst"]], check=True)
    # shards whose path order is the conversations' order: part1-a, part1-b, part2/c
    cut = [0, 8, 16, 24]
    shard_names = ["part1-a.jsonl.gz", "part1-b.jsonl", os.path.join("part2", "c.jsonl.gz")]
    for k, name in enumerate(shard_names):
        p = os.path.join(d, "shards", name)
        body = lines(shares[cut[k]:cut[k + 1]])
        if name.endswith(".gz"):
            with gzip.open(p, "wt", encoding="utf-8") as f:
                f.write(body)
        else:
            with open(p, "w", encoding="utf-8") as f:
                f.write(body)
    forms["directory of shards"] = os.path.join(d, "shards")
    forms["glob of shards"] = os.path.join(d, "shards", "{part1-*,part2/*.gz}")

    ref, err, rc = tokenize_chat(args, target, msgs_path)
    ck.check(rc == 0 and len(ref) == len(convs), f"messages file tokenizes: {err[-400:]}")
    from transformers import AutoTokenizer
    hf_tok = AutoTokenizer.from_pretrained(target)
    for i, c in enumerate(convs):
        hf = hf_tok.apply_chat_template(c, tokenize=True)
        hf = list(hf["input_ids"] if hasattr(hf, "keys") else hf)
        ck.check(hf == ref[i]["ids"], f"conversation {i}: messages ids equal apply_chat_template's")
    for what, path in forms.items():
        ours, err, rc = tokenize_chat(args, target, path)
        ck.check(rc == 0 and ours == ref, f"{what}: ids and masks equal the messages file's ({err[-300:]})")

    # capture reads the shards too; a run from its cache with --data recognizes them by content
    # (the data hash of several decompressed files), and refuses other data
    cache = os.path.join(args.tmp, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    run([args.dspark, "capture", "--target", target, "--data", forms["glob of shards"], "--out", cache, "--seq-len",
         "128", "--dtype", "f32", "--target-layers", "1", "--threads", "2", "--quiet"])
    man = json.load(open(os.path.join(cache, "manifest.json")))
    ck.check(man["num_samples"] == len(convs), f"capture of the shards: {man.get('num_samples')} samples")

    def train_cache(data, out):
        shutil.rmtree(out, ignore_errors=True)
        return run([args.dspark, "train", "--cache", cache, "--data", data, "--out", out, "--num-anchors", "8",
                    "--block-size", "4", "--markov-rank", "16", "--steps", "1", "--batch-seqs", "2", "--eval-seqs",
                    "2", "--threads", "2", "--quiet"], expect_rc=None)

    _, err, rc = train_cache(forms["directory of shards"], os.path.join(args.tmp, "run-cache"))
    ck.check(rc == 0, f"train --cache --data DIR: the directory is the captured data: {err.strip()[-300:]}")
    _, err, rc = train_cache(forms["sharegpt .gz"], os.path.join(args.tmp, "run-cache-other"))
    ck.check(rc != 0 and "data_xxh64" in err, f"train --cache --data OTHER is refused: {err.strip()[-300:]}")

    # a malformed line among the shards: named, or skipped and counted
    bad = os.path.join(d, "shards", "part1-b.jsonl")
    with open(bad, "a", encoding="utf-8") as f:
        f.write(json.dumps({"conversations": [{"from": "human", "value": ["not", "text"]}]}) + "\n")
    _, err, rc = tokenize_chat(args, target, forms["directory of shards"])
    ck.check(rc == 1 and "part1-b.jsonl:9: conversations[0].value must be a string" in err,
             f"tokenize --chat names the bad line: {err.strip()[-300:]}")
    ours, err, rc = tokenize_chat(args, target, forms["directory of shards"], ["--skip-bad-lines"])
    ck.check(rc == 0 and ours == ref and "1 bad line skipped" in err,
             f"tokenize --chat --skip-bad-lines: {err.strip()[-300:]}")

    def train(data, out, extra=()):
        shutil.rmtree(out, ignore_errors=True)
        return run([args.dspark, "train", "--target", target, "--data", data, "--out", out, "--seq-len", "128",
                    "--num-anchors", "8", "--block-size", "4", "--markov-rank", "16", "--steps", "1", "--batch-seqs",
                    "2", "--eval-seqs", "2", "--threads", "2", "--quiet", *extra], expect_rc=None)

    _, err, rc = train(forms["directory of shards"], os.path.join(args.tmp, "run-bad"))
    ck.check(rc == 1 and "part1-b.jsonl:9: conversations[0].value must be a string" in err,
             f"train stops at the bad line naming it: {err.strip()[-300:]}")
    _, err, rc = train(msgs_path, os.path.join(args.tmp, "run-messages"))
    ck.check(rc == 0, f"train on the messages file: {err.strip()[-300:]}")
    _, err, rc = train(forms["directory of shards"], os.path.join(args.tmp, "run-shards"), ["--skip-bad-lines"])
    ck.check(rc == 0 and "3 files, 24 records read, 1 bad line skipped (--skip-bad-lines)" in err,
             f"train --skip-bad-lines says what it read and skipped: {err.strip()[-400:]}")
    if rc == 0:
        a = json.load(open(os.path.join(args.tmp, "run-messages", "run.json")))
        b = json.load(open(os.path.join(args.tmp, "run-shards", "run.json")))
        ck.check(a["sequences_xxh64"] == b["sequences_xxh64"],
                 f"the shards train on the messages file's sequences: {a['sequences_xxh64']} {b['sequences_xxh64']}")
        ck.check(b.get("data_bad_lines_skipped") == 1 and "data_bad_lines_skipped" not in a,
                 f"run.json records the skipped lines: {b.get('data_bad_lines_skipped')}")
    # capture too: stops at the bad line, or skips it and counts it in its summary
    def capture(out, extra=()):
        shutil.rmtree(out, ignore_errors=True)
        return run([args.dspark, "capture", "--target", target, "--data", forms["glob of shards"], "--out", out,
                    "--seq-len", "128", "--dtype", "f32", "--target-layers", "1", "--threads", "2", "--quiet", *extra],
                   expect_rc=None)
    _, err, rc = capture(os.path.join(args.tmp, "cache-bad"))
    ck.check(rc != 0 and "part1-b.jsonl:9: conversations[0].value must be a string" in err,
             f"capture stops at the bad line naming it: {err.strip()[-300:]}")
    out_json, err, rc = capture(os.path.join(args.tmp, "cache-skip"), ["--skip-bad-lines"])
    summ = json.loads(out_json.strip().splitlines()[-1]) if rc == 0 else {}
    man = json.load(open(os.path.join(args.tmp, "cache-skip", "manifest.json"))) if rc == 0 else {}
    ck.check(rc == 0 and summ.get("data_bad_lines_skipped") == 1 and man.get("num_samples") == len(convs)
             and "1 bad line skipped" in err,
             f"capture --skip-bad-lines: {summ.get('data_bad_lines_skipped')} skipped, {man.get('num_samples')} samples: "
             f"{err.strip()[-300:]}")
    # pretrain reads the same inputs and records the count too
    out = os.path.join(args.tmp, "pretrain")
    shutil.rmtree(out, ignore_errors=True)
    _, err, rc = run([args.dspark, "pretrain", "--config", os.path.join(target, "config.json"), "--tokenizer",
                      os.path.join(target, "tokenizer.json"), "--data", forms["glob of shards"], "--skip-bad-lines",
                      "--out", out, "--seq-len", "128", "--steps", "1", "--batch-seqs", "2", "--eval-seqs", "2",
                      "--threads", "2", "--quiet"], expect_rc=None)
    info = json.load(open(os.path.join(out, "run.json"))) if rc == 0 else {}
    ck.check(rc == 0 and info.get("data_bad_lines_skipped") == 1 and "1 bad line skipped" in err,
             f"pretrain --skip-bad-lines: {info.get('data_bad_lines_skipped')} {err.strip()[-300:]}")
    ck.finish("test_data_formats")


if __name__ == "__main__":
    main()

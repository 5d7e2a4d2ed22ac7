"""Tokenizer benchmark: `dspark tokenize --bench` against Hugging Face tokenizers, single
thread, same tokenizer.json, same text, in one run.

Tokenizer: the Qwen2-style byte-level BPE of tests/conformance/test_tokenizer.py (Split regex +
NFC, vocab 8k, special tokens), trained by HF on Python standard library sources (reused from
--work when already there). Text: held-out standard library sources (other files), --mb MB.
Two shapes, the same for both sides:
  one string   the whole text in one encode call;
  documents    one encode call per source file (ours: --split-nul on a NUL-separated file;
               HF: a loop of encode(), single-threaded).
Both sides report the best of three. The ids are checked identical first. Prints a table
and writes bench/out/tokenizer.json.

    $VENV/bin/python bench/bench_tokenizer.py --dspark build/release/dspark [--mb 4] [--kind qwen2]
"""
import argparse
import importlib.util
import json
import os
import struct
import subprocess
import sys
import time

# Single thread on the HF side (its parallelism is across a batch, but be sure).
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def conformance_module():
    path = os.path.join(ROOT, "tests", "conformance", "test_tokenizer.py")
    spec = importlib.util.spec_from_file_location("tokenizer_conformance", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ours_bench(dspark, tok_path, text_path, split):
    cmd = [dspark, "tokenize", tok_path, "--bench", text_path] + (["--split-nul"] if split else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def hf_bench(tok, docs):
    best = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        for d in docs:
            tok.encode(d, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--work", default=os.path.join(HERE, "out", "tokenizer_work"))
    ap.add_argument("--mb", type=float, default=4.0, help="held-out text size in MB")
    ap.add_argument("--kind", default="qwen2", choices=["gpt2", "qwen2", "llama3"])
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    conf = conformance_module()
    train_texts, held = conf.stdlib_sources(heldout_bytes=int(a.mb * 1e6))
    tok_path = os.path.join(a.work, f"{a.kind}.json")
    if not os.path.exists(tok_path):
        t0 = time.time()
        conf.train_bpe(a.kind, train_texts).save(tok_path)
        print(f"trained {tok_path} in {time.time() - t0:.1f} s")
    tok = Tokenizer.from_file(tok_path)
    whole = "".join(held)
    nbytes = len(whole.encode())
    one_path = os.path.join(a.work, "heldout.txt")
    docs_path = os.path.join(a.work, "heldout.docs")
    with open(one_path, "w", encoding="utf-8", newline="") as f:
        f.write(whole)
    with open(docs_path, "w", encoding="utf-8", newline="") as f:
        f.write("\0".join(held))

    # Identical ids first: a fast wrong tokenizer is no result.
    ids_path = os.path.join(a.work, "ids.bin")
    subprocess.run([a.dspark, "tokenize", tok_path, "--input", one_path, "--ids-out", ids_path], check=True)
    with open(ids_path, "rb") as f:
        b = f.read()
    ours_ids = list(struct.unpack(f"<{len(b) // 4}i", b))
    ref = tok.encode(whole, add_special_tokens=False).ids
    if ours_ids != ref:
        i = next((k for k, (x, y) in enumerate(zip(ours_ids, ref)) if x != y), min(len(ours_ids), len(ref)))
        sys.exit(f"ids differ from HF at position {i} ({len(ours_ids)} vs {len(ref)} ids): not benchmarking")

    rows = []
    for shape, split, docs in (("one string", False, [whole]), ("documents", True, held)):
        o = ours_bench(a.dspark, tok_path, docs_path if split else one_path, split)
        hf_s = hf_bench(tok, docs)
        rows.append({"shape": shape, "documents": len(docs), "bytes": nbytes, "tokens": len(ref),
                     "dspark_mb_s": o["mb_per_s"], "hf_mb_s": nbytes / 1e6 / hf_s,
                     "ratio": o["mb_per_s"] / (nbytes / 1e6 / hf_s)})
    import tokenizers
    print(f"\ntokenizer {a.kind} ({tok.get_vocab_size()} ids), {nbytes / 1e6:.2f} MB held-out Python sources, "
          f"{len(ref)} tokens; single thread, best of 3; HF tokenizers {tokenizers.__version__}")
    print(f"{'shape':12s} {'docs':>6s} {'dspark MB/s':>12s} {'HF MB/s':>9s} {'ratio':>7s}")
    for r in rows:
        print(f"{r['shape']:12s} {r['documents']:6d} {r['dspark_mb_s']:12.2f} {r['hf_mb_s']:9.2f} {r['ratio']:6.1f}x")
    out = os.path.join(HERE, "out", "tokenizer.json")
    with open(out, "w") as f:
        json.dump({"kind": a.kind, "tokenizers_version": tokenizers.__version__, "rows": rows}, f, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

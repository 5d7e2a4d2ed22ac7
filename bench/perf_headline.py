"""The headline set of docs/performance.md, rerun on this machine: runs the existing bench
scripts one after the other and prints the table in the page's format (the CPU's heading, the
date, threads, kernels and peer, one row per figure with its command), ready to paste into
docs/performance.md under its CPU.

The set (each script against its peer in the same run, same threads; docs/benchmark-scripts.md):
  bench/bench_target.py                   100M Qwen3 prefill and decode against transformers, fp32
  bench/bench_target.py --compute bf16    the same in bf16 (ours --compute bf16, torch bfloat16)
  bench/bench_draft_step.py --bf16 ...    one draft optimizer step against the leanest eager
                                          PyTorch step (chunked loss + SDPA GQA), fp32 and bf16
  bench/bench_pretrain_step.py            one pretraining step of a 29M Qwen3 against
                                          transformers + torch AdamW
  bench/bench_kd_loss.py                  the KD loss (K 64, V 151936, 4096 tokens) against
                                          PyTorch eager in 128-row chunks
With --llama-cpp DEMO_DIR (the main job's folder, after scripts/demo.sh: its DSpark draft and
held-out chat prompts), also
  bench/llama_cpp_peer.py                 SmolLM2-135M-Instruct Q4_1 and Q8_0 as stored against
                                          llama.cpp built from its vendored source: prefill,
                                          decode (and after 1024 tokens of context), speculative
                                          decoding with that draft (scheduler) against llama.cpp's
                                          plain decoding and its draft-dspark decoding, 1 and 2
                                          threads (needs scripts/setup_llama_cpp.sh --build)

The CPU comes from lscpu (model name, family, model; flags avx2, avx512f, avx512_bf16 and
amx_tile), the kernels from `dspark --help` ("matmuls:", "bf16 matmuls" and "frozen weights"
lines), the peer's versions from the target benchmark's JSON. Every script writes its JSON under --out (default
bench/out/headline, bench/out/headline-quick with --quick) and this script writes
headline.json there; --results DIR prints the table again from such a folder, running nothing.
A script that fails leaves its rows marked failed and the others run. A full run takes about
20-30 minutes on 2 cores; run it on a quiet machine (the load average is printed).

    ~/.cache/dspark/venv/bin/python bench/perf_headline.py [--dspark build/release/dspark] [--threads 2]
    ... --list          what it would run (and the CPU it sees); runs nothing
    ... --quick         smaller sizes and one repetition (a few minutes): checks the set runs,
                        its figures are not the page's
    ... --results DIR   the table from a finished run's folder
    ... --llama-cpp DIR the llama.cpp rows too, with the main job's draft from DIR
                        (~/.cache/dspark/demo-smollm2)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# The page's table: docs/performance.md uses exactly this header (tests/scripts/test_perf_headline.py).
HEADER = ("| benchmark | ours | peer | speed ratio, best (median) | peak RSS MiB ours / peer | date | command |\n"
          "|---|---|---|---|---|---|---|")


def steps(args):
    """The headline set: (key, argv after the interpreter, JSON file it writes). argv uses the
    paths as given, so that the page shows the command a reader types."""
    d, b = args.dspark, os.path.dirname(args.dspark) or "."
    t = [] if args.threads == 2 else ["--threads", str(args.threads)]  # 2: every script's default
    if args.quick:
        target = ["--prefill", "128", "--decode", "16", "--reps", "1", "--procs", "1"]
        draft = ["--steps", "1", "--rounds", "1"]
        pretrain, pre_json = ["--tiny", "--steps", "2"], "pretrain_step_tiny.json"
        kd = ["--tokens", "256", "--reps", "1"]
        peer = ["--types", "Q4_1", "--threads", str(args.threads), "--reps", "1", "--prompts", "1",
                "--spec-tokens", "16", "--decode", "16"]
    else:
        target, draft, pretrain, pre_json, kd = [], ["--rounds", "3"], [], "pretrain_step.json", ["--tokens", "4096"]
        peer = ["--types", "Q4_1,Q8_0", "--threads", ",".join(sorted({"1", str(args.threads)}, key=int)),
                "--depth", "1024"]
    demo = getattr(args, "llama_cpp", None)
    lcpp = [("llama_cpp", ["bench/llama_cpp_peer.py", "--dspark", d, "--draft", os.path.join(demo, "dspark"),
                           "--prompt-file", os.path.join(demo, "prompts", "eval-chat.jsonl")] + peer,
             "llama_cpp_peer.json")] if demo else []
    return [
        ("target_fp32", ["bench/bench_target.py", "--dspark", d] + t + target, "target.json"),
        ("target_bf16", ["bench/bench_target.py", "--dspark", d] + t + ["--compute", "bf16"] + target,
         "target-bf16.json"),
        ("draft_step", ["bench/bench_draft_step.py", "--build", b] + t + ["--bf16", "--torch", "chunked:sdpa",
                        "--no-native-blas", "--no-malloc-probe"] + draft, "draft_step.json"),
        ("pretrain_step", ["bench/bench_pretrain_step.py", "--dspark", d] + t + pretrain, pre_json),
        ("kd_loss", ["bench/bench_kd_loss.py", "--dspark", d] + t + kd, "kd_loss.json"),
    ] + lcpp


# ---------------------------------------------------------------- the machine

def lscpu():
    """{"model", "family", "model_number", "flags"} from lscpu, else /proc/cpuinfo."""
    info = {"model": "unknown CPU", "family": "?", "model_number": "?", "flags": set()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, env=dict(os.environ, LC_ALL="C")).stdout
    except OSError:
        out = ""
    keys = {"Model name": "model", "CPU family": "family", "Model": "model_number", "Flags": "flags"}
    for line in out.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in keys and v.strip():
            info[keys[k.strip()]] = v.strip()
    if not out and os.path.exists("/proc/cpuinfo"):  # the first processor's entry
        cpuinfo = {"model name": "model", "cpu family": "family", "model": "model_number", "flags": "flags"}
        seen = set()
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            if k.strip() in cpuinfo and k.strip() not in seen:
                info[cpuinfo[k.strip()]] = v.strip()
                seen.add(k.strip())
    if isinstance(info["flags"], str):
        info["flags"] = set(info["flags"].split())
    return info


def cpu_heading(cpu):
    """The page's heading for a CPU, e.g. "AMD EPYC (Zen 4; family 25 model 17): AVX2, AVX-512,
    AVX512_BF16, no AMX"."""
    flags = set(cpu["flags"])
    kind = ""
    if "AMD" in cpu["model"] and str(cpu["family"]) == "25":  # family 19h: Zen 3 and Zen 4
        kind = "Zen 4; " if "avx512f" in flags else "Zen 3; "
    isa = [name for flag, name in (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_bf16", "AVX512_BF16"))
           if flag in flags]
    isa.append("AMX" if "amx_tile" in flags else "no AMX")
    return f"### {cpu['model']} ({kind}family {cpu['family']} model {cpu['model_number']}): {', '.join(isa)}"


def kernels(dspark, threads):
    """The "matmuls:", "bf16 matmuls ...:" and "frozen weights:" lines of `dspark --help` (with the
    run's threads)."""
    try:
        text = subprocess.run([dspark, "--help"], capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS=str(threads))).stdout
    except OSError:
        return "unknown (dspark --help did not run)"
    fp32 = re.search(r"^matmuls: (.*)$", text, re.M)
    bf16 = re.search(r"^bf16 matmuls[^:]*: (.*)$", text, re.M)
    frozen = re.search(r"^frozen weights: (.*)$", text, re.M)
    return "; ".join(p for p in ((f"fp32 {fp32.group(1).strip()}" if fp32 else ""),
                                 (f"bf16 {bf16.group(1).strip()}" if bf16 else ""),
                                 (f"frozen weights {frozen.group(1).strip()}" if frozen else "")) if p) or "unknown"


# ---------------------------------------------------------------- the table

def fmt_ratio(best, median=None):
    return f"{best:.2f}x" + (f" ({median:.2f}x)" if median is not None else "")


def fmt_rss(ours, peer):
    return f"{ours:.0f} / {peer:.0f}"


def rows_from(key, j, date, command, threads=2):
    """The table rows of one benchmark's JSON: [benchmark, ours, peer, ratio, rss, date, command]."""
    cmd = f"`{command}`"
    out = []
    if key.startswith("target"):
        o = j["dspark"]["environment"]
        comp = j["compute"]
        tp = f"transformers {j['transformers_version']}"
        for what, n in (("prefill", j["prefill_tokens"]), ("decode", j["decode_tokens"])):
            out.append([f"100M Qwen3 {what}, {n} tokens, {comp}, tokens/s", f"{o[what + '_tok_s']:.1f}",
                        f"{j['torch_' + what + '_tok_s']:.1f} ({tp})",
                        fmt_ratio(o[what + "_ratio_vs_torch"], o[what + "_ratio_of_medians"]),
                        fmt_rss(o["peak_rss_mib"], j["torch_peak_rss_mib"]), date, cmd])
    elif key == "draft_step":
        s = j["sides"]
        for ours, peer, label in (("ours", "torch_chunked_sdpa", "fp32"),
                                  ("ours_bf16", "torch_chunked_sdpa_autocast", "bf16")):
            if ours not in s or peer not in s:
                continue
            o, p = s[ours], s[peer]
            peer_name = "torch chunked + SDPA GQA" + (", autocast bf16" if label == "bf16" else "")
            out.append([f"draft optimizer step (d 512, V 32000, 64 x 7 rows), {label}, s",
                        f"{o['best_s']:.3f}", f"{p['best_s']:.3f} ({peer_name})",
                        fmt_ratio(p["best_s"] / o["best_s"], p["median_s"] / o["median_s"]),
                        fmt_rss(o["peak_rss_mib"], p["peak_rss_mib"]), date, cmd])
    elif key == "pretrain_step":
        out.append([f"pretraining step, {j['params'] / 1e6:.1f}M Qwen3, seq {j['seq']} x {j['batch']}, fp32, tokens/s",
                    f"{j['dspark']['tokens_per_s']:.0f}", f"{j['torch']['tokens_per_s']:.0f} (transformers + AdamW)",
                    fmt_ratio(j["speedup"]), fmt_rss(j["dspark"]["peak_rss_mib"], j["torch"]["peak_rss_mib"]),
                    date, cmd])
    elif key == "kd_loss":
        for r in j["results"]:
            if r["K"] == 64 and r["kd_loss_alpha"] == 1 and r["top_p"] == 1 and "time_s" in r.get("torch_chunked", {}):
                o, p = r["ours"], r["torch_chunked"]
                out.append([f"KD loss forward + backward, K 64, V {r['V']}, {r['tokens']} tokens, s",
                            f"{o['time_s']:.3f}", f"{p['time_s']:.3f} (PyTorch eager, 128-row chunks)",
                            fmt_ratio(p["time_s"] / o["time_s"]), fmt_rss(o["peak_rss_mib"], p["peak_rss_mib"]),
                            date, cmd])
    elif key == "llama_cpp":
        out = llama_cpp_rows(j, threads, date, cmd)
    return out


def llama_cpp_rows(j, threads, date, cmd):
    """Rows of llama_cpp_peer.json: per GGUF type, prefill, decode, decode after the context and
    speculative decoding (against llama.cpp's plain and draft-dspark decoding) at `threads`, the
    1-thread figures in brackets where the run has them."""
    out = []
    by = {(r["type"], r["threads"]): r for r in j["rows"]}
    # (what, our key, llama.cpp's key, which peak RSS pair: plain, spec or none)
    lines = ((f"prefill, {j['prefill_tokens']} tokens", "dspark_prefill", "llama_prefill", "plain"),
             (f"decode, {j['decode_tokens']} tokens", "dspark_decode", "llama_decode", "plain"),
             (f"decode after {j['depth']} tokens of context, {j['decode_tokens']} tokens",
              "dspark_decode_depth", "llama_decode_depth", None),
             ("speculative decoding with the main job's DSpark draft (the scheduler), against llama.cpp's "
              "plain decoding", "dspark_sched", "llama_decode", "spec"),
             ("speculative decoding with the same draft, the scheduler against llama.cpp's draft-dspark",
              "dspark_sched", "llama_spec", "spec"))
    for t in dict.fromkeys(r["type"] for r in j["rows"]):
        main, one = by.get((t, threads)), by.get((t, 1)) if threads != 1 else None
        if not main:
            continue
        for label, ours, peer, rss in lines:
            if ours not in main or peer not in main:
                continue
            both = one is not None and ours in one and peer in one
            bracket = (lambda f: f" (1 thread: {f(one)})") if both else (lambda f: "")
            num = "{:.0f}" if "prefill" in ours else "{:.1f}"
            mem = fmt_rss(main[f"dspark_{rss}_rss"], main[f"llama_{rss}_rss"]) if rss else "-"
            out.append([f"SmolLM2-135M {t} GGUF {label}, as stored, tokens/s",
                        num.format(main[ours]) + bracket(lambda r: num.format(r[ours])),
                        num.format(main[peer]) + bracket(lambda r: num.format(r[peer])) + " (llama.cpp)",
                        f"{main[ours] / main[peer]:.2f}x" + bracket(lambda r: f"{r[ours] / r[peer]:.2f}x"),
                        mem, date, cmd])
    return out


def table(meta, results_dir):
    """The Markdown block for one run: heading, the run's line, the table."""
    lines = [meta["heading"], ""]
    peer = meta.get("peer") or "PyTorch CPU"
    lines.append(f"{meta['threads']} threads; {meta['date']}; kernels: {meta['kernels']}; peer: {peer}; "
                 f"load average {meta['load_before']:.1f} before, {meta['load_after']:.1f} after"
                 + ("; **--quick: smaller sizes, one repetition, not the page's figures**" if meta.get("quick") else "")
                 + ". Rerun: `" + meta["command"] + "`.")
    lines += ["", HEADER]
    for key, argv, name, rc in meta["steps"]:
        command = " ".join(argv)
        path = os.path.join(results_dir, name)
        rows = []
        if rc == 0 and os.path.exists(path):
            with open(path) as f:
                rows = rows_from(key, json.load(f), meta["date"], command, meta["threads"])
        if not rows:
            rows = [[key.replace("_", " "), "failed" if rc else "no result", "", "", "", meta["date"], f"`{command}`"]]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- driver

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dspark", default="build/release/dspark",
                    help="the dspark program (bench_draft_step is taken from its folder)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one repetition: checks the set runs")
    ap.add_argument("--list", action="store_true", help="print what would run and the CPU; run nothing")
    ap.add_argument("--results", metavar="DIR", help="print the table from a finished run's folder; run nothing")
    ap.add_argument("--out", help="where the scripts' JSON goes (default bench/out/headline[-quick])")
    ap.add_argument("--llama-cpp", metavar="DEMO_DIR",
                    help="also llama.cpp on SmolLM2 (bench/llama_cpp_peer.py) with the main job's draft from "
                         "DEMO_DIR (scripts/demo.sh's folder, ~/.cache/dspark/demo-smollm2)")
    args = ap.parse_args()

    if args.results:
        with open(os.path.join(args.results, "headline.json")) as f:
            print(table(json.load(f), args.results))
        return 0

    out = args.out or os.path.join(HERE, "out", "headline-quick" if args.quick else "headline")
    plan = steps(args)
    cpu = lscpu()
    command = "bench/perf_headline.py --dspark " + args.dspark + \
        (f" --threads {args.threads}" if args.threads != 2 else "") + (" --quick" if args.quick else "") + \
        (f" --llama-cpp {args.llama_cpp}" if args.llama_cpp else "")
    if args.list:
        print(cpu_heading(cpu))
        print(f"would run, {args.threads} threads, each writing its JSON under {out}:")
        for _, argv, name in plan:
            print(f"  {' '.join(argv)}    -> {name}")
        return 0

    if not os.path.exists(args.dspark):
        sys.exit(f"{args.dspark} not found: cmake --build build/release (docs/benchmark-scripts.md)")
    os.makedirs(out, exist_ok=True)
    root = os.path.dirname(HERE)
    meta = {"heading": cpu_heading(cpu), "cpu": {**cpu, "flags": sorted(cpu["flags"])}, "threads": args.threads,
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "kernels": kernels(args.dspark, args.threads), "quick": args.quick,
            "command": command, "load_before": os.getloadavg()[0], "steps": []}
    print(meta["heading"] + f"; load average {meta['load_before']:.1f}", flush=True)
    for key, argv, name in plan:
        # paths as the user gave them, resolved from here; the scripts by their place in bench/
        full = [sys.executable, os.path.join(root, argv[0])] + argv[1:] + ["--out", out]
        print(f"\n== {' '.join(argv)}", flush=True)
        t0 = time.time()
        rc = subprocess.run(full).returncode
        print(f"== exit {rc}, {time.time() - t0:.0f} s", flush=True)
        meta["steps"].append([key, argv, name, rc])
        if key == "target_fp32" and rc == 0:
            with open(os.path.join(out, name)) as f:
                j = json.load(f)
            meta["peer"] = f"PyTorch {j['torch_version'].split('+')[0]} CPU, transformers {j['transformers_version']}"
    meta["load_after"] = os.getloadavg()[0]
    with open(os.path.join(out, "headline.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("\n" + table(meta, out))
    return 0 if all(s[3] == 0 for s in meta["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())

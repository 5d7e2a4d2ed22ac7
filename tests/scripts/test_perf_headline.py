#!/usr/bin/env python3
"""bench/perf_headline.py without running a benchmark (ctest `scripts.perf_headline`; the system
python3 is enough, under a second): `--list` names bench scripts that exist, with options those
scripts accept, in full and --quick; the table printed from a canned run's folder (`--results`)
is exactly the page's format; docs/performance.md's tables use the script's header; the CPU
heading names the instruction sets as the page does."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "perf_headline.py")

spec = importlib.util.spec_from_file_location("perf_headline", SCRIPT)
ph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ph)

CANNED = {
    "target.json": {"compute": "fp32", "prefill_tokens": 512, "decode_tokens": 64, "torch_prefill_tok_s": 1300.04,
                    "torch_decode_tok_s": 45.4, "torch_peak_rss_mib": 1177.2, "transformers_version": "5.24.0",
                    "torch_version": "2.15.0+cpu",
                    "dspark": {"environment": {"prefill_tok_s": 1459.2, "decode_tok_s": 65.5, "peak_rss_mib": 772.4,
                                               "prefill_ratio_vs_torch": 1.1224, "prefill_ratio_of_medians": 1.18,
                                               "decode_ratio_vs_torch": 1.4427, "decode_ratio_of_medians": 1.44}}},
    "draft_step.json": {"sides": {
        "ours": {"best_s": 0.451, "median_s": 0.458, "peak_rss_mib": 608},
        "torch_chunked_sdpa": {"best_s": 0.547, "median_s": 0.603, "peak_rss_mib": 1549},
        "ours_bf16": {"best_s": 0.220, "median_s": 0.229, "peak_rss_mib": 742},
        "torch_chunked_sdpa_autocast": {"best_s": 0.452, "median_s": 0.466, "peak_rss_mib": 1450}}},
    "pretrain_step.json": {"params": 29.1e6, "seq": 512, "batch": 4, "speedup": 1.3563,
                           "dspark": {"tokens_per_s": 1123.2, "peak_rss_mib": 889},
                           "torch": {"tokens_per_s": 828.1, "peak_rss_mib": 2757}},
    "kd_loss.json": {"results": [
        {"K": 16, "kd_loss_alpha": 1.0, "top_p": 1.0, "V": 151936, "tokens": 4096,
         "ours": {"time_s": 0.768, "peak_rss_mib": 4756}, "torch_chunked": {"time_s": 5.56, "peak_rss_mib": 5662}},
        {"K": 64, "kd_loss_alpha": 1.0, "top_p": 1.0, "V": 151936, "tokens": 4096,
         "ours": {"time_s": 0.784, "peak_rss_mib": 4759}, "torch_chunked": {"time_s": 5.70, "peak_rss_mib": 5664}}]},
}

EXPECTED = """### Intel(R) Xeon(R) Processor (family 6 model 167): AVX2, AVX-512, AVX512_BF16, AMX

2 threads; 2026-12-03; kernels: fp32 oneDNN 2.6.3 avx512_core_amx, 2 threads; peer: PyTorch 2.15.0 CPU, transformers 5.24.0; load average 0.7 before, 1.9 after. Rerun: `bench/perf_headline.py --dspark build/release/dspark`.

| benchmark | ours | peer | speed ratio, best (median) | peak RSS MiB ours / peer | date | command |
|---|---|---|---|---|---|---|
| 100M Qwen3 prefill, 512 tokens, fp32, tokens/s | 1459.2 | 1300.0 (transformers 5.24.0) | 1.12x (1.18x) | 772 / 1177 | 2026-12-03 | `bench/bench_target.py --dspark build/release/dspark` |
| 100M Qwen3 decode, 64 tokens, fp32, tokens/s | 65.5 | 45.4 (transformers 5.24.0) | 1.44x (1.44x) | 772 / 1177 | 2026-12-03 | `bench/bench_target.py --dspark build/release/dspark` |
| target bf16 | failed |  |  |  | 2026-12-03 | `bench/bench_target.py --dspark build/release/dspark --compute bf16` |
| draft optimizer step (d 512, V 32000, 64 x 7 rows), fp32, s | 0.451 | 0.547 (torch chunked + SDPA GQA) | 1.21x (1.32x) | 608 / 1549 | 2026-12-03 | `bench/bench_draft_step.py --build build/release --bf16 --torch chunked:sdpa --no-native-blas --no-malloc-probe --rounds 3` |
| draft optimizer step (d 512, V 32000, 64 x 7 rows), bf16, s | 0.220 | 0.452 (torch chunked + SDPA GQA, autocast bf16) | 2.05x (2.03x) | 742 / 1450 | 2026-12-03 | `bench/bench_draft_step.py --build build/release --bf16 --torch chunked:sdpa --no-native-blas --no-malloc-probe --rounds 3` |
| pretraining step, 29.1M Qwen3, seq 512 x 4, fp32, tokens/s | 1123 | 828 (transformers + AdamW) | 1.36x | 889 / 2757 | 2026-12-03 | `bench/bench_pretrain_step.py --dspark build/release/dspark` |
| KD loss forward + backward, K 64, V 151936, 4096 tokens, s | 0.784 | 5.700 (PyTorch eager, 128-row chunks) | 7.27x | 4759 / 5664 | 2026-12-03 | `bench/bench_kd_loss.py --dspark build/release/dspark --tokens 4096` |"""


class PerfHeadline(unittest.TestCase):
    def test_list_names_existing_scripts_and_their_options(self):
        for extra in ([], ["--quick"], ["--threads", "4"], ["--llama-cpp", "/demo"],
                      ["--quick", "--llama-cpp", "/demo"]):
            out = subprocess.run([sys.executable, SCRIPT, "--list", "--dspark", "/nonexistent/dspark"] + extra,
                                 capture_output=True, text=True, check=True).stdout
            cmds = [l.split("    -> ")[0].split() for l in out.splitlines() if l.startswith("  bench/")]
            self.assertEqual(len(cmds), 6 if "--llama-cpp" in extra else 5, out)
            for argv in cmds:
                src = os.path.join(ROOT, argv[0])
                self.assertTrue(os.path.exists(src), argv[0])
                with open(src, encoding="utf-8") as f:
                    accepted = set(re.findall(r'add_argument\("(--[a-z0-9-]+)"', f.read()))
                for opt in (a for a in argv[1:] if a.startswith("--")):
                    self.assertIn(opt, accepted, f"{argv[0]} has no option {opt}")
            ours = "\n".join(l for l in out.splitlines() if "llama_cpp_peer" not in l)  # its --threads is a list
            self.assertEqual("--threads" in ours, extra == ["--threads", "4"], out)

    def test_table_from_canned_results(self):
        with tempfile.TemporaryDirectory() as d:
            class A:
                dspark, threads, quick = "build/release/dspark", 2, False
            plan = ph.steps(A)
            for name, j in CANNED.items():
                with open(os.path.join(d, name), "w") as f:
                    json.dump(j, f)
            cpu = {"model": "Intel(R) Xeon(R) Processor", "family": "6", "model_number": "167",
                   "flags": {"avx2", "avx512f", "avx512_bf16", "amx_tile", "fma"}}
            meta = {"heading": ph.cpu_heading(cpu), "threads": 2, "date": "2026-12-03",
                    "kernels": "fp32 oneDNN 2.6.3 avx512_core_amx, 2 threads",
                    "peer": "PyTorch 2.15.0 CPU, transformers 5.24.0", "quick": False,
                    "command": "bench/perf_headline.py --dspark build/release/dspark",
                    "load_before": 0.71, "load_after": 1.94,
                    "steps": [[k, argv, n, 1 if k == "target_bf16" else 0] for k, argv, n in plan]}
            with open(os.path.join(d, "headline.json"), "w") as f:
                json.dump(meta, f)
            out = subprocess.run([sys.executable, SCRIPT, "--results", d], capture_output=True, text=True,
                                 check=True).stdout
        self.maxDiff = None
        self.assertEqual(out.rstrip("\n"), EXPECTED)

    def test_llama_cpp_rows(self):
        """--llama-cpp DIR adds llama_cpp_peer.py with the demo's draft and prompts; its rows: per
        type prefill, decode, decode after the context and speculation against both peers, at the
        run's threads with the 1-thread figures in brackets."""
        out = subprocess.run([sys.executable, SCRIPT, "--list", "--dspark", "build/release/dspark", "--llama-cpp",
                              "/demo"], capture_output=True, text=True, check=True).stdout
        self.assertIn("  bench/llama_cpp_peer.py --dspark build/release/dspark --draft /demo/dspark --prompt-file "
                      "/demo/prompts/eval-chat.jsonl --types Q4_1,Q8_0 --threads 1,2 --depth 1024    -> "
                      "llama_cpp_peer.json", out)
        row = {"type": "Q4_1", "llama_prefill": 300.0, "dspark_prefill": 1200.4, "llama_decode": 110.0,
               "dspark_decode": 286.0, "llama_spec": 23.7, "dspark_spec": 97.5, "dspark_sched": 330.0,
               "llama_plain_rss": 145.2, "dspark_plain_rss": 130.4, "llama_spec_rss": 339.0,
               "dspark_spec_rss": 328.0, "llama_decode_depth": 80.0, "dspark_decode_depth": 240.0}
        j = {"prefill_tokens": 512, "decode_tokens": 128, "depth": 1024,
             "rows": [dict(row, threads=2), dict(row, threads=1, dspark_prefill=700.0, llama_prefill=175.0)]}
        rows = ph.rows_from("llama_cpp", j, "2026-12-07", "CMD", 2)
        self.assertEqual([r[0] for r in rows], [
            "SmolLM2-135M Q4_1 GGUF prefill, 512 tokens, as stored, tokens/s",
            "SmolLM2-135M Q4_1 GGUF decode, 128 tokens, as stored, tokens/s",
            "SmolLM2-135M Q4_1 GGUF decode after 1024 tokens of context, 128 tokens, as stored, tokens/s",
            "SmolLM2-135M Q4_1 GGUF speculative decoding with the main job's DSpark draft (the scheduler), against "
            "llama.cpp's plain decoding, as stored, tokens/s",
            "SmolLM2-135M Q4_1 GGUF speculative decoding with the same draft, the scheduler against llama.cpp's "
            "draft-dspark, as stored, tokens/s"])
        self.assertEqual(rows[0][1:5], ["1200 (1 thread: 700)", "300 (1 thread: 175) (llama.cpp)",
                                        "4.00x (1 thread: 4.00x)", "130 / 145"])
        self.assertEqual(rows[2][3:5], ["3.00x (1 thread: 3.00x)", "-"])
        self.assertEqual(rows[3][1:5], ["330.0 (1 thread: 330.0)", "110.0 (1 thread: 110.0) (llama.cpp)",
                                        "3.00x (1 thread: 3.00x)", "328 / 339"])
        self.assertEqual(rows[4][3], "13.92x (1 thread: 13.92x)")
        one = ph.rows_from("llama_cpp", dict(j, rows=[dict(row, threads=2)]), "2026-12-07", "CMD", 2)
        self.assertEqual(one[1][1:4], ["286.0", "110.0 (llama.cpp)", "2.60x"])

    def test_page_uses_the_header(self):
        with open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8") as f:
            page = f.read()
        self.assertGreaterEqual(page.count(ph.HEADER), 3, "docs/performance.md: a table per CPU in the script's format")

    def test_cpu_heading(self):
        zen3 = {"model": "AMD EPYC 7B13", "family": "25", "model_number": "1", "flags": {"avx2", "fma"}}
        zen4 = {"model": "AMD EPYC", "family": "25", "model_number": "17", "flags": {"avx2", "avx512f", "avx512_bf16"}}
        self.assertEqual(ph.cpu_heading(zen3), "### AMD EPYC 7B13 (Zen 3; family 25 model 1): AVX2, no AMX")
        self.assertEqual(ph.cpu_heading(zen4),
                         "### AMD EPYC (Zen 4; family 25 model 17): AVX2, AVX-512, AVX512_BF16, no AMX")


if __name__ == "__main__":
    unittest.main()

"""A GGUF target with its quantized matrices used in place (`--weights as-stored`, the default of
the commands that run a frozen target) against the same file dequantized to fp32 at load
(`--weights f32`), on the real SmolLM2-135M-Instruct Q4_1 (Q4_1 layers, a Q8_0 tied embedding and
head; DSPARK_SMOLLM2_GGUF or the cache folder; exit 77, skipped, when it is not fetched):

- the prefill regime of `--compute fp32` (many rows: dequantized chunks of the weights into the
  fp32 GEMM, x in fp32): logits equal to the fp32 model's up to fp32 summation order (normwise
  <= 1e-4); the default compute (the integer path at every row count, as llama.cpp) gives
  `--compute int8`'s logits bit for bit;
- the decode regime (`forward --chunk 1`: one row per call, x rounded to int8 per block of 32 as
  llama.cpp does): logits within 6e-2 normwise (measured 2.9-4.0e-2 as kernels reorder fp32 operations) of the fp32 model's and the greedy (argmax) token
  the same at >= 90% of the positions of a greedy continuation (teacher-forced);
- `generate` runs; how many of its greedy tokens agree with the fp32 model's is printed (a
  near-tie parts them);
- `forward --chunk 8` gives `--chunk 1`'s logits bit for bit (a row's numbers do not depend on
  the rest of a call of up to 8 rows), and `speculate` with the SmolLM2 demo's trained draft
  (DSPARK_SMOLLM2_DRAFT or ~/.cache/dspark/demo-smollm2/dspark, when there) prints `generate`'s
  greedy tokens;
- `info` names the quantized dtypes and the bytes held in place; `--weights bf16` runs; a NaN
  scale in a quantized matrix is refused at load, naming the tensor and the row;
- the default KV cache is f16 for the matrices held as stored (`--kv-cache f16`'s logits bit for
  bit, within 3e-3 of an fp32 cache's) and fp32 with `--weights f32`; the comparisons above pass
  `--kv-cache f32`, so that they measure the weights' path alone.
The measured numbers are printed (docs/compute.md quotes them)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

SMOLLM2 = os.environ.get("DSPARK_SMOLLM2_GGUF") or os.path.expanduser(
    "~/.cache/dspark/models/SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPT = "504,1463,282,260,4469,7057"  # "The history of the Roman Empire"


def forward(args, weights, ids, chunk, tag, extra=(), kv=("--kv-cache", "f32")):
    """Logits of `forward`; an fp32 KV cache unless kv says otherwise (() for the default), so
    that the regimes compared below differ by the weights' path alone."""
    out = os.path.join(args.tmp, f"fw-{tag}.safetensors")
    cmd = [args.dspark, "forward", SMOLLM2, "--ids", ids, "--out", out, "--weights", weights, "--threads", "2", *kv,
           *extra]
    if chunk:
        cmd += ["--chunk", str(chunk)]
    common.run(cmd, timeout=900)
    return load_file(out)["logits.0"]


def file_pages_resident(args, ck):
    """Once loaded, the model file's pages are not resident (every matrix is read from its packed
    copy, the small tensors were converted): sampled from /proc/PID/smaps while `generate` decodes,
    from 1.5 s after its start (loading takes about 0.1 s) to its end. A read maps the whole
    page-cache folio around it (1 MiB a read on a Linux 6.18 guest): reading the norms left 40 MB of
    the quantized matrices beside them resident before the model source's pages were dropped.
    The process's peak (VmHWM) stays under twice the file: the packed copies hold the matrices
    once (about the file's size), the KV cache of 806 positions 19 MB (measured 164 MB against a
    98 MB file; 256 MB when the weights image, advised huge pages, had the norms between the
    reserved matrices and each norm faulted in the 2 MiB around it)."""
    import subprocess
    import time
    if not os.path.exists("/proc/self/smaps"):
        print("no /proc/PID/smaps: file pages not checked")
        return
    p = subprocess.Popen([args.dspark, "generate", SMOLLM2, "--prompt-ids", PROMPT, "--max-new-tokens", "800",
                          "--ignore-eos", "--threads", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start, samples, peak_kb = time.monotonic(), [], 0
    real = os.path.realpath(SMOLLM2)
    while p.poll() is None:
        time.sleep(0.05)
        if time.monotonic() - start < 1.5:
            continue
        kb, mine = 0, False
        try:
            with open(f"/proc/{p.pid}/smaps") as f:
                for line in f:
                    head = line.split()
                    if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                        mine = len(head) >= 6 and head[5] == real
                    elif mine and line.startswith("Rss:"):
                        kb += int(head[1])
            with open(f"/proc/{p.pid}/status") as f:
                hwm = [int(line.split()[1]) for line in f if line.startswith("VmHWM:")]
        except OSError:
            break
        if p.poll() is None:  # read while it still ran: a sample of the decode, not of its exit
            samples.append(kb)
            peak_kb = max([peak_kb] + hwm)
    p.wait()
    print(f"model file pages resident while decoding: {samples[:3]}... KB over {len(samples)} samples")
    ck.check(len(samples) >= 3 and max(samples) <= 4096,
             f"the model file's pages resident after loading: {samples[:5]}... KB (<= 4096 expected)")
    file_kb = os.path.getsize(SMOLLM2) // 1024
    print(f"generate's peak resident memory: {peak_kb} KB, the file {file_kb} KB")
    ck.check(0 < peak_kb <= 2 * file_kb, f"generate peaked at {peak_kb} KB, over twice the file's {file_kb} KB")


def main():
    args = common.parse_args(__doc__)
    if not os.path.exists(SMOLLM2):
        print(f"SmolLM2: {SMOLLM2} not fetched (scripts/setup.sh fetches it): skipped")
        sys.exit(77)
    ck = common.Checker()
    # a greedy continuation of the fp32 model, then the whole sequence teacher-forced
    out, _, _ = common.run([args.dspark, "generate", SMOLLM2, "--prompt-ids", PROMPT, "--max-new-tokens", "40",
                            "--print-ids", "--ignore-eos", "--weights", "f32", "--threads", "2"], timeout=900)
    cont = out.split()
    ids = PROMPT + "," + ",".join(cont)
    ref = forward(args, "f32", ids, 0, "f32")
    pre = forward(args, "as-stored", ids, 0, "q-prefill", ["--compute", "fp32"])
    dec = forward(args, "as-stored", ids, 1, "q-decode")
    e_pre = common.normwise_rel_err(pre, ref)
    e_dec = common.normwise_rel_err(dec, ref)
    agree = float(np.mean(np.argmax(dec, axis=1) == np.argmax(ref, axis=1)))
    n = ref.shape[0]
    print(f"SmolLM2 Q4_1 (Q8_0 head), {n} positions: prefill regime normwise {e_pre:.2e}; decode regime normwise "
          f"{e_dec:.2e}, max |dlogit| {np.max(np.abs(dec - ref)):.3f} of max |logit| {np.max(np.abs(ref)):.2f}, "
          f"greedy agreement {agree:.3f}")
    ck.check(e_pre <= 1e-4, f"prefill regime: {e_pre:.2e} from the fp32 model (summation order only: <= 1e-4)")
    # the default KV cache: f16 for the matrices held as stored (as llama.cpp holds a GGUF's), fp32
    # for the file dequantized to fp32 at load; each the explicit option's numbers bit for bit
    d_q, f16 = forward(args, "as-stored", ids, 0, "q-default", kv=()), forward(args, "as-stored", ids, 0, "q-f16",
                                                                              kv=("--kv-cache", "f16"))
    d_f32 = forward(args, "f32", ids, 0, "f32-default", kv=())
    f16_fp32 = forward(args, "as-stored", ids, 0, "q-f16-fp32", ["--compute", "fp32"], kv=("--kv-cache", "f16"))
    e_f16 = common.normwise_rel_err(f16_fp32, pre)
    print(f"default KV cache: as stored {e_f16:.2e} from the fp32 cache's prefill (the f16 rounding)")
    ck.check(np.array_equal(d_q, f16), "as stored, the default KV cache is not the f16 one")
    ck.check(np.array_equal(d_f32, ref), "with --weights f32, the default KV cache is not the fp32 one")
    ck.check(0 < e_f16 <= 3e-3, f"the f16 cache's prefill: {e_f16:.2e} from the fp32 cache's (0 < err <= 3e-3)")
    ck.check(e_dec <= 6e-2, f"decode regime: {e_dec:.2e} from the fp32 model (<= 6e-2)")
    ck.check(agree >= 0.9, f"decode regime: greedy agreement {agree:.3f} (>= 0.9)")
    # --compute int8: all the rows at once on the integer path (not the fp32 prefill's exact
    # products), so as far from decoding as the direct path's own chunks of 9-32 rows are (the
    # attention's summation order, amplified through the int8 rounding of the next layer's x)
    i8 = forward(args, "as-stored", ids, 0, "q-int8", ["--compute", "int8"])
    ck.check(np.array_equal(forward(args, "as-stored", ids, 0, "q-default-compute"), i8),
             "the default compute's prefill is not --compute int8's")
    c16 = forward(args, "as-stored", ids, 16, "q-chunk16")
    e_i8, e_16, e_pre = (common.normwise_rel_err(a, b) for a, b in ((i8, dec), (c16, dec), (i8, pre)))
    agree_i8 = float(np.mean(np.argmax(i8, axis=1) == np.argmax(dec, axis=1)))
    print(f"--compute int8 prefill: normwise {e_i8:.2e} from the decode regime (chunks of 16 on the direct path "
          f"{e_16:.2e}), {e_pre:.2e} from the fp32 prefill, greedy agreement with decoding {agree_i8:.3f}")
    ck.check(e_pre > 1e-4 and e_i8 <= max(2 * e_16, 1e-6) and agree_i8 >= 0.9,
             f"--compute int8 prefill: {e_i8:.2e} from the decode regime against {e_16:.2e} for chunks of 16, "
             f"{e_pre:.2e} from the fp32 prefill, greedy agreement {agree_i8:.3f}")

    # generate on the quantized weights: how long its greedy tokens follow the fp32 model's (a
    # near-tie parts them: reported, not checked; unit.test_quant checks that a row's result does
    # not depend on the other rows of its call, what keeps speculation lossless on these weights)
    out_q, _, _ = common.run([args.dspark, "generate", SMOLLM2, "--prompt-ids", PROMPT, "--max-new-tokens", "24",
                              "--print-ids", "--ignore-eos", "--threads", "2"], timeout=900)
    q = out_q.split()
    ck.check(len(q) == 24, f"generate gave {out_q!r}")
    same = next((i for i, (a, b) in enumerate(zip(q, cont)) if a != b), min(len(q), len(cont)))
    print(f"generate: the first {same} greedy tokens agree with the fp32 model's")

    # a row's numbers do not depend on the rest of its call (up to 8 rows: decode and verification
    # of short drafts), bit for bit through the whole target: what keeps speculation lossless
    c1 = forward(args, "as-stored", ids, 1, "q-chunk1")
    c8 = forward(args, "as-stored", ids, 8, "q-chunk8")
    ck.check(np.array_equal(c1, c8), f"chunks of 8 rows differ from one row at a time by {np.max(np.abs(c1 - c8))}")
    draft = os.environ.get("DSPARK_SMOLLM2_DRAFT") or os.path.expanduser("~/.cache/dspark/demo-smollm2/dspark")
    if os.path.exists(os.path.join(draft, "checkpoint.safetensors")):
        sp, _, _ = common.run([args.dspark, "speculate", "--target", SMOLLM2, "--draft", draft, "--prompt-ids", PROMPT,
                               "--max-new-tokens", "48", "--print-ids", "--ignore-eos", "--threads", "2",
                               "--policy", "fixed"], timeout=900)
        ge, _, _ = common.run([args.dspark, "generate", SMOLLM2, "--prompt-ids", PROMPT, "--max-new-tokens", "48",
                               "--print-ids", "--ignore-eos", "--threads", "2"], timeout=900)
        ck.check(sp.split() == ge.split(), f"speculate on the quantized weights: {sp.split()}\n generate: {ge.split()}")
    else:
        print(f"no trained SmolLM2 draft at {draft} (the SmolLM2 demo trains one): speculate not compared")

    file_pages_resident(args, ck)
    out_i, _, _ = common.run([args.dspark, "info", SMOLLM2], timeout=300)
    line = [x for x in out_i.splitlines() if x.startswith("weights in memory:")]
    ck.check(len(line) == 1 and "Q4_1" in line[0] and "Q8_0" in line[0] and "used in place" in line[0],
             f"info does not name the quantized weights in place: {line}")
    out_b, _, _ = common.run([args.dspark, "generate", SMOLLM2, "--prompt-ids", PROMPT, "--max-new-tokens", "4",
                              "--print-ids", "--ignore-eos", "--weights", "bf16", "--threads", "2"], timeout=900)
    ck.check(len(out_b.split()) == 4, f"--weights bf16 gave {out_b!r}")
    r = common.run([args.dspark, "generate", SMOLLM2, "--prompt-ids", PROMPT, "--weights", "int3"], expect_rc=2)
    ck.check("--weights takes" in r[1], f"a bad --weights value: {r[1][:300]}")
    # a NaN scale in a matrix kept quantized is refused at load, naming the tensor and the row
    import gguf
    import shutil
    bad = os.path.join(args.tmp, "nan-scale.gguf")
    shutil.copyfile(SMOLLM2, bad)
    t = [t for t in gguf.GGUFReader(bad).tensors if t.name == "blk.3.ffn_up.weight"][0]
    row_bytes = t.n_bytes // int(t.shape[1])
    with open(bad, "r+b") as f:
        f.seek(int(t.data_offset) + 5 * row_bytes)  # row 5's first block: its f16 d
        f.write(b"\x00\x7e")
    _, err, _ = common.run([args.dspark, "generate", bad, "--prompt-ids", PROMPT, "--max-new-tokens", "2"], expect_rc=1)
    ck.check("blk.3.ffn_up.weight" in err and "row 5" in err and "not finite" in err, f"a NaN scale: {err[-400:]}")
    ck.finish("test_quant_target")


if __name__ == "__main__":
    main()

"""bf16 compute (--compute bf16, issue 9): the large matmuls round both operands to bf16 and
accumulate in fp32 (fp32 master weights, activations and everything else in fp32). Checked here:

- a tiny Qwen3 in bf16 weights through `dspark forward --compute bf16` (whole prompts, and in
  chunks of 32 tokens, which run the packed weight copies): its logits against
  transformers on the same weights computing in fp32 and in torch.bfloat16, normwise (max abs
  difference over max abs logit): within BOUND_VS_FP32 of fp32 transformers, no farther from it
  than transformers' own bf16 run is (BF16_NO_WORSE times that), and within BOUND_VS_TORCH_BF16
  of transformers in bf16; the bf16 path really ran (its logits differ from our fp32 ones) and our
  fp32 path still matches fp32 transformers within 1e-4;
- training with --compute bf16 for a few steps (`pretrain` of a small student, `train` of a
  DSpark draft on a bf16 target) gives losses within LOSS_REL of the fp32 run's, step by step;
  run.json records the compute and the bf16 kernel; `dspark info` names the bf16 kernel; a bad
  --compute value is a usage error."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

BOUND_VS_FP32 = 2e-2        # ours (bf16 compute) vs transformers fp32, normwise on the logits
BOUND_VS_TORCH_BF16 = 5e-2  # ours (bf16 compute) vs transformers torch.bfloat16
BF16_NO_WORSE = 1.5         # ours vs fp32 <= this x (transformers bf16 vs fp32)
LOSS_REL = 2e-3             # |loss_bf16 - loss_fp32| / loss_fp32 per training step


def forward(args, mdir, ids_arg, tag, compute, extra=()):
    path = os.path.join(args.tmp, f"{tag}-{compute}.safetensors")
    common.run([args.dspark, "forward", mdir, "--ids", ids_arg, "--out", path, "--compute", compute, *extra])
    return load_file(path)


def check_forward(args, ck):
    mdir = os.path.join(args.tmp, "qwen3-bf16")
    if not os.path.exists(os.path.join(mdir, "config.json")):
        common.build_tiny_model("qwen3", mdir, seed=11, dtype="bfloat16", tied=True, vocab_size=512, hidden_size=128,
                                intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=32)
    import transformers
    m32 = transformers.AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
    m16 = transformers.AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.bfloat16).eval()
    rng = np.random.default_rng(5)
    # rows enough for the bf16 GEMM and the bf16 attention products (>= 32 query rows)
    seqs = [rng.integers(0, 512, size=n).tolist() for n in (48, 37, 80)]
    ids_arg = ";".join(",".join(map(str, s)) for s in seqs)
    ours16 = forward(args, mdir, ids_arg, "fwd", "bf16")
    ours32 = forward(args, mdir, ids_arg, "fwd", "fp32")
    # 32 tokens per sequence per forward: three forwards, so the frozen weights run in place,
    # then are packed, then are used packed; the 80-token sequence's second chunk has the bf16
    # attention over a cached prefix
    ours16c = forward(args, mdir, ids_arg, "fwd-chunked", "bf16", ("--chunk", "32"))
    for b, ids in enumerate(seqs):
        with torch.no_grad():
            hf32 = m32(input_ids=torch.tensor([ids])).logits[0].float().numpy()
            hf16 = m16(input_ids=torch.tensor([ids])).logits[0].float().numpy()
        key = f"logits.{b}"
        e_chunked = common.normwise_rel_err(ours16c[key], hf32)
        print(f"seq {b}: ours bf16 in chunks of 32 (packed weights) vs transformers fp32 {e_chunked:.2e}")
        ck.check(e_chunked <= BOUND_VS_FP32,
                 f"seq {b}: ours bf16 in chunks vs fp32 transformers {e_chunked:.2e} > {BOUND_VS_FP32}")
        e_ours = common.normwise_rel_err(ours16[key], hf32)
        e_torch16 = common.normwise_rel_err(hf16, hf32)
        e_cross = common.normwise_rel_err(ours16[key], hf16)
        e_f32 = common.normwise_rel_err(ours32[key], hf32)
        e_moved = common.normwise_rel_err(ours16[key], ours32[key])
        print(f"seq {b} ({len(ids)} tokens) logits, normwise: ours bf16 vs transformers fp32 {e_ours:.2e}; "
              f"transformers bf16 vs fp32 {e_torch16:.2e}; ours bf16 vs transformers bf16 {e_cross:.2e}; "
              f"ours fp32 vs transformers fp32 {e_f32:.2e}; ours bf16 vs ours fp32 {e_moved:.2e}")
        ck.check(e_ours <= BOUND_VS_FP32, f"seq {b}: ours bf16 vs fp32 transformers {e_ours:.2e} > {BOUND_VS_FP32}")
        ck.check(e_ours <= BF16_NO_WORSE * e_torch16,
                 f"seq {b}: ours bf16 {e_ours:.2e} farther from fp32 than {BF16_NO_WORSE} x torch's bf16 {e_torch16:.2e}")
        ck.check(e_cross <= BOUND_VS_TORCH_BF16, f"seq {b}: ours bf16 vs torch bf16 {e_cross:.2e} > {BOUND_VS_TORCH_BF16}")
        ck.check(e_f32 <= 1e-4, f"seq {b}: ours fp32 vs transformers fp32 {e_f32:.2e} > 1e-4")
        ck.check(e_moved > 1e-5, f"seq {b}: --compute bf16 gave the fp32 logits ({e_moved:.2e}): bf16 did not run")
    out, _, _ = common.run([args.dspark, "info", mdir, "--compute", "bf16"])
    line = [x for x in out.splitlines() if x.startswith("bf16 compute GEMM:")]
    ck.check(len(line) == 1 and "bf16 compute" in out, f"info names no bf16 kernel:\n{out}")
    ck.check("(bf16 compute," in out, f"info does not report the bf16 setting:\n{out}")
    print(line[0] if line else "")
    # the two routes of the bf16 products (nn/cpu_gemm_bf16.h), named as they run
    out_sg, _, _ = common.run([args.dspark, "info", mdir, "--compute", "bf16"],
                              env=dict(os.environ, DSPARK_BF16_GEMM="sgemm"))
    ck.check("bf16-rounded inputs, fp32 GEMM" in out_sg, f"DSPARK_BF16_GEMM=sgemm: info names another route:\n{out_sg}")
    _, err, _ = common.run([args.dspark, "info", mdir, "--compute", "bf16"], env=dict(os.environ, DSPARK_BF16_GEMM="x"))
    ck.check("DSPARK_BF16_GEMM=x is not auto, native or sgemm" in err, f"bad DSPARK_BF16_GEMM: no warning:\n{err}")
    native = dict(os.environ, DSPARK_BF16_GEMM="native")
    out_nat, _, _ = common.run([args.dspark, "info", mdir, "--compute", "bf16"], env=native)
    if "fp32 GEMM" not in out_nat:  # native bf16 here: the MKL choice is made (cpu_gemm_mkl.h)
        _, err, _ = common.run([args.dspark, "info", mdir, "--compute", "bf16"],
                               env=dict(native, DSPARK_MKL="/nonexistent/libmkl_rt.so.3"))
        ck.check("MKL not loaded" in err and "DSPARK_MKL" in err and "stay on oneDNN" in err,
                 f"DSPARK_MKL naming a missing library: no warning:\n{err}")
        out_none, err, _ = common.run([args.dspark, "info", mdir, "--compute", "bf16"],
                                      env=dict(native, DSPARK_MKL="none"))
        ck.check("MKL" not in err and "MKL" not in out_none, f"DSPARK_MKL=none still names MKL:\n{out_none}{err}")
    _, err, _ = common.run([args.dspark, "forward", mdir, "--ids", "1,2", "--out", os.path.join(args.tmp, "x"),
                            "--compute", "fp16"], expect_rc=2)
    ck.check("--compute takes fp32, bf16 or int8" in err, f"bad --compute: {err}")
    _, err, _ = common.run([args.dspark, "forward", mdir, "--ids", "1,2", "--out", os.path.join(args.tmp, "x"),
                            "--compute"], expect_rc=2)
    ck.check("--compute takes fp32, bf16 or int8" in err, f"--compute without a value: {err}")


def train_losses(run):
    return [json.loads(l)["loss"] for l in open(os.path.join(run, "metrics.jsonl")) if '"kind":"train"' in l]


def compare_runs(ck, what, cmd, out_dir):
    losses = {}
    for compute in ("fp32", "bf16"):
        d = f"{out_dir}-{compute}"
        shutil.rmtree(d, ignore_errors=True)
        common.run(cmd + ["--out", d, "--compute", compute])
        losses[compute] = train_losses(d)
        info = json.load(open(os.path.join(d, "run.json")))
        ck.check(info.get("compute") == compute, f"{what} {compute}: run.json compute = {info.get('compute')}")
        ck.check((compute == "bf16") == ("gemm_bf16" in info), f"{what} {compute}: run.json gemm_bf16 {info.keys()}")
    a, b = losses["fp32"], losses["bf16"]
    err = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
    print(f"{what} losses fp32 {[round(x, 5) for x in a]}\n{' ' * len(what)}        bf16 {[round(x, 5) for x in b]}"
          f"\n  worst relative difference {err:.2e}")
    ck.check(err <= LOSS_REL, f"{what}: bf16 losses differ from fp32 by {err:.2e} > {LOSS_REL}")
    ck.check(a != b, f"{what}: bf16 losses equal the fp32 ones bit for bit: bf16 did not run")


def check_training(args, ck):
    D = args.dspark
    target = common.build_bpe_target(args.tmp, name="target-bf16", dtype="bfloat16")
    data = common.stdlib_text(os.path.join(args.tmp, "data.txt"), 60, 62)
    # a DSpark draft on the bf16 target (frozen BF16 tables and target used in place)
    train = [D, "train", "--target", target, "--data", data, "--seq-len", "64", "--num-anchors", "8", "--block-size",
             "4", "--markov-rank", "16", "--steps", "4", "--batch-seqs", "2", "--eval-every", "0", "--threads", "2",
             "--quiet", "--seed", "3", "--lr", "3e-3", "--target-layers", "2"]
    compare_runs(ck, "train (draft)", train, os.path.join(args.tmp, "draft"))
    # a causal LM (fp32 trainable weights) from scratch
    student = os.path.join(args.tmp, "student")
    if not os.path.exists(os.path.join(student, "config.json")):
        vocab = json.load(open(os.path.join(target, "config.json")))["vocab_size"]
        common.build_tiny_model("qwen3", student, seed=9, vocab_size=vocab, eos_token_id=0, num_hidden_layers=2,
                                hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=16)
        shutil.copy(os.path.join(target, "tokenizer.json"), os.path.join(student, "tokenizer.json"))
    pre = [D, "pretrain", "--student", student, "--data", data, "--data-format", "text", "--seq-len", "64",
           "--steps", "5", "--batch-seqs", "4", "--lr", "3e-3", "--eval-seqs", "2", "--eval-every", "0", "--threads",
           "2", "--quiet"]
    compare_runs(ck, "pretrain", pre, os.path.join(args.tmp, "pretrain"))


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    check_forward(args, ck)
    check_training(args, ck)
    ck.finish("test_compute_bf16")


if __name__ == "__main__":
    main()

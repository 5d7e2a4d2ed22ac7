"""Frozen weights kept in their checkpoint dtype (BF16 / F16): used where they lie in the
memory-mapped checkpoint, multiplied by kernels that convert them exactly and accumulate in
fp32. Checked here:

- a bf16 (tied, Qwen3) and an f16 (untied, Llama with biases) checkpoint: logits, captured
  layers and final hidden state equal dspark's on the fp32 upcast of the same weights (converted
  at load, the fp32 path) within 1e-5 normwise (fp32 summation order only; measured below
  1e-6), prefill and decode in chunks of 1; and transformers on the upcast weights within 1e-4;
- `dspark info` reports the weight bytes held in place and their dtype; a NaN or infinity in a
  16-bit matrix is refused at load naming the tensor and the element;
- memory: the peak RSS of `dspark info` on a ~23M-parameter bf16 model is about its bf16
  size (at most 0.6x its fp32 size above a tiny model's), while the fp32 copy of it needs at
  least its fp32 size;
- a draft trained on a bf16 target keeps BF16 frozen tables: in its checkpoint, its export
  (readable by Python safetensors; `draft-forward` of the export equals that of the run), and
  the capture's target_weights.safetensors; training from an f32 cache of the bf16 target is
  bit-identical to online training (the same BF16 tables on both sides)."""
import hashlib
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

TOL_SAME_WEIGHTS = 1e-5
TOL_HF = 1e-4
CAPTURE = "-1,0,1"


def upcast_copy(src, dst):
    """The same model with every weight converted to fp32 (exactly), saved by transformers."""
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    m.save_pretrained(dst)
    for f in ("generation_config.json",):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    return m.eval()


def forward(args, mdir, ids_arg, tag, extra=()):
    path = os.path.join(args.tmp, f"{tag}.safetensors")
    common.run([args.dspark, "forward", mdir, "--ids", ids_arg, "--capture", CAPTURE, "--out", path] + list(extra))
    return load_file(path)


# Run from a fresh, small interpreter: a child forked by this (large) process would count this
# process's resident set in its own peak (Linux carries it across fork and exec).
RSS_WRAPPER = """import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
sys.stderr.write("\\nMAXRSS_KB %d\\n" % ru.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def peak_rss_mib(cmd):
    """Peak resident set of one run of cmd (its own rusage) and its stdout."""
    out, err, _ = common.run([sys.executable, "-S", "-E", "-c", RSS_WRAPPER] + cmd)
    return int(err.split("MAXRSS_KB")[-1]) / 1024.0, out


def check_same_weights(args, ck):
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, 256, size=n).tolist() for n in (23, 17)]
    ids_arg = ";".join(",".join(map(str, s)) for s in seqs)
    for name, arch, dtype, tied, over in (
            ("qwen3-bf16-tied", "qwen3", "bfloat16", True, {}),
            ("llama-f16-untied-bias", "llama", "float16", False, {"attention_bias": True, "mlp_bias": True})):
        mdir = os.path.join(args.tmp, name)
        common.build_tiny_model(arch, mdir, seed=len(name), dtype=dtype, tied=tied, **over)
        ref_model = upcast_copy(mdir, mdir + "-f32")
        out, _, _ = common.run([args.dspark, "info", mdir])
        want = "BF16" if dtype == "bfloat16" else "F16"
        ck.check(f"{want} used in place" in out, f"{name}: info does not report {want} weights in place:\n{out}")
        out32, _, _ = common.run([args.dspark, "info", mdir + "-f32"])
        ck.check("used in place" not in out32, f"{name}-f32: info reports mapped weights:\n{out32}")
        for mode, extra in (("prefill", []), ("chunk1", ["--chunk", "1"])):
            got = forward(args, mdir, ids_arg, f"{name}-{mode}", extra)
            f32 = forward(args, mdir + "-f32", ids_arg, f"{name}-f32-{mode}", extra)
            for key in sorted(got):
                err = common.normwise_rel_err(got[key], f32[key])
                print(f"{name} {mode} {key}: vs the fp32 path on the same weights rel err {err:.2e}")
                ck.check(err <= TOL_SAME_WEIGHTS, f"{name} {mode} {key}: {err:.2e} > {TOL_SAME_WEIGHTS}")
            if mode == "prefill":
                for b, ids in enumerate(seqs):
                    with torch.no_grad():
                        hf = ref_model(input_ids=torch.tensor([ids])).logits[0].numpy()
                    err = common.normwise_rel_err(got[f"logits.{b}"], hf)
                    print(f"{name} seq {b} logits vs transformers (upcast weights): rel err {err:.2e}")
                    ck.check(err <= TOL_HF, f"{name} seq {b}: vs transformers {err:.2e} > {TOL_HF}")


def check_nonfinite(args, ck):
    """A NaN or infinity in a 16-bit matrix used in place is refused at load, naming the tensor
    and the element, as the fp32 path does for converted tensors."""
    from safetensors.torch import load_file as load_torch, save_file as save_torch
    src = os.path.join(args.tmp, "qwen3-bf16-tied")
    for name, value in (("model.layers.1.mlp.down_proj.weight", float("nan")),
                        ("model.embed_tokens.weight", float("inf"))):
        bad = os.path.join(args.tmp, "qwen3-bf16-nonfinite")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(src, bad)
        t = load_torch(os.path.join(src, "model.safetensors"))
        t[name].view(-1)[5] = value
        save_torch(t, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
        _, err, _ = common.run([args.dspark, "info", bad], expect_rc=1)
        ck.check(name in err and "element 5" in err and "non-finite" in err, f"{name} = {value}: {err}")


def check_memory(args, ck):
    big = os.path.join(args.tmp, "qwen3-bf16-memory")
    if not os.path.exists(os.path.join(big, "config.json")):
        common.build_tiny_model("qwen3", big, seed=3, dtype="bfloat16", tied=True, vocab_size=32768, hidden_size=512,
                                intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8,
                                num_key_value_heads=4, head_dim=64)
        upcast_copy(big, big + "-f32")
    cfg = json.load(open(os.path.join(big, "config.json")))
    d, V, I, L = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    n_matrix = V * d + L * (d * (q + 2 * kv) + q * d + 3 * d * I)
    f32_mib = 4 * n_matrix / 2 ** 20
    base, _ = peak_rss_mib([args.dspark, "info", os.path.join(args.tmp, "qwen3-bf16-tied")])
    rss16, out = peak_rss_mib([args.dspark, "info", big])
    rss32, _ = peak_rss_mib([args.dspark, "info", big + "-f32"])
    print(f"peak RSS of dspark info: tiny model {base:.1f} MiB; {n_matrix / 1e6:.1f}M-parameter model in bf16 "
          f"{rss16:.1f} MiB, in fp32 {rss32:.1f} MiB (its matrices: {f32_mib:.1f} MiB in fp32, {f32_mib / 2:.1f} in bf16)")
    ck.check(rss16 - base <= 0.6 * f32_mib, f"bf16 model: {rss16 - base:.1f} MiB above the tiny model, more than 0.6 x "
             f"its fp32 size {f32_mib:.1f} MiB")
    ck.check(rss32 - base >= 0.9 * f32_mib, f"fp32 model: {rss32 - base:.1f} MiB above the tiny model (fp32 size "
             f"{f32_mib:.1f} MiB): the measurement does not see the weights")
    line = [x for x in out.splitlines() if x.startswith("weights in memory:")]
    ck.check(len(line) == 1 and "BF16" in line[0], f"info's weight line: {line}")


def table_dtypes(path, prefix=""):
    with safe_open(path, framework="pt") as f:
        return {k: f.get_slice(k).get_dtype() for k in (prefix + "embed_tokens.weight", prefix + "lm_head.weight")}


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def check_draft_on_bf16_target(args, ck):
    D = args.dspark
    target = common.build_bpe_target(args.tmp, name="target-bf16", dtype="bfloat16")
    data = common.stdlib_text(os.path.join(args.tmp, "data.txt"), 60, 62)
    train = ["--seq-len", "64", "--num-anchors", "8", "--block-size", "4", "--markov-rank", "16", "--steps", "4",
             "--batch-seqs", "2", "--eval-every", "2", "--eval-seqs", "2", "--threads", "2", "--quiet", "--seed", "3",
             "--lr", "3e-3", "--target-layers", "2"]

    def fresh(name):
        d = os.path.join(args.tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        return d

    on = fresh("run-online")
    common.run([D, "train", "--target", target, "--data", data, "--out", on] + train)
    ckpt = os.path.join(on, "checkpoint.safetensors")
    dt = table_dtypes(ckpt, "draft.")
    ck.check(all(v == "BF16" for v in dt.values()), f"checkpoint tables: {dt}")
    with safe_open(ckpt, framework="pt") as f:
        others = {f.get_slice(k).get_dtype() for k in f.keys() if k.startswith("draft.") and "embed" not in k
                  and "lm_head" not in k}
    ck.check(others == {"F32"}, f"trainable tensors of the checkpoint: {others}")
    ex = fresh("export")
    common.run([D, "export", on, "--out", ex])
    dt = table_dtypes(os.path.join(ex, "model.safetensors"))
    ck.check(all(v == "BF16" for v in dt.values()), f"export tables: {dt}")
    # The export and the run compute the same draft.
    cfg = json.load(open(os.path.join(ex, "config.json")))
    m, d, V = len(cfg["target_layer_ids"]), cfg["hidden_size"], cfg["vocab_size"]
    rng = np.random.default_rng(1)
    T = 20
    inp = os.path.join(args.tmp, "draft-inputs.safetensors")
    save_file({"ctx": rng.standard_normal((T, m * d)).astype(np.float32),
               "input_ids": rng.integers(0, V, size=T).astype(np.int64),
               "anchors": np.array([0, 5, 11], dtype=np.int64)}, inp)
    outs = []
    for src in (on, ex):
        o = os.path.join(args.tmp, f"draft-out-{len(outs)}.safetensors")
        common.run([D, "draft-forward", src, "--inputs", inp, "--out", o])
        outs.append(load_file(o))
    ck.check(np.array_equal(outs[0]["logits"], outs[1]["logits"]) and np.isfinite(outs[0]["logits"]).all(),
             "draft-forward: the export's logits differ from the run's")
    # From a cache of the bf16 target: its tables are BF16 and training is bit-identical.
    C = fresh("cache-f32")
    common.run([D, "capture", "--target", target, "--data", data, "--seq-len", "64", "--threads", "2", "--quiet",
                "--out", C, "--dtype", "f32", "--target-layers", "2"])
    dt = table_dtypes(os.path.join(C, "target_weights.safetensors"))
    ck.check(all(v == "BF16" for v in dt.values()), f"cache target_weights tables: {dt}")
    rc = fresh("run-cache")
    common.run([D, "train", "--cache", C, "--out", rc] + train)
    ck.check(sha(os.path.join(rc, "checkpoint.safetensors")) == sha(ckpt),
             "training from the cache of a bf16 target differs from online training")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    check_same_weights(args, ck)
    check_nonfinite(args, ck)
    check_memory(args, ck)
    check_draft_on_bf16_target(args, ck)
    ck.finish("test_target_bf16")


if __name__ == "__main__":
    main()

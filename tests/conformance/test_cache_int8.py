"""int8 caches, the size estimate and the free-space check (issue 13, "Caches a quarter the size"),
on the tiny Qwen3 target of test_train.py:

- `dspark capture --dtype int8`: the documented tensors (I8 features, F32 scales per position and
  captured layer, BF16 KD log-probs), zeros at padding, each row's absmax stored as +-127; the
  int8 tensors equal the formula of docs/caches.md "int8 features" applied (in torch) to the engine's own
  f32 features bit for bit, and the dequantized features are transformers' hidden states within
  half a quantization step (plus the f32 capture's own 1e-4 normwise tolerance);
- `dspark train --cache` on the int8 cache runs, and its first-step loss is within 0.1% of the bf16
  cache's (the features differ by < 0.4% of each row's absmax), and `dspark inspect` reads it;
- a scale changed to a negative value (checksums re-stamped) is refused by name when read;
- `dspark capture --estimate` writes nothing and its total is the written cache's bytes on disk
  (every file) within 0.1%, for int8 with KD and for bf16;
- the free-space check: with DSPARK_TEST_FREE_BYTES (test-only) below the estimate the capture
  refuses naming both numbers and writes no shard; equal to it, or with --no-space-check, it runs;
- `--dtype int8 --no-features` is a usage error."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cache_manifest  # noqa: E402
import common  # noqa: E402
from test_train import build_target  # noqa: E402


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f != ".lock")


def quantize(x):
    """docs/caches.md "int8 features", in torch: rows of the last dimension."""
    import torch
    s = x.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.where(s > 0, torch.round(x / torch.where(s > 0, s, torch.ones_like(s))), torch.zeros_like(x))
    return q.clamp(-127, 127).to(torch.int8), s.squeeze(-1)


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp = args.tmp
    target = build_target(tmp)
    data = common.stdlib_text(os.path.join(tmp, "data.txt"), 60, 62)
    D = args.dspark
    cap = [D, "capture", "--target", target, "--data", data, "--seq-len", "64", "--threads", "2", "--quiet",
           "--shard-size", "8"]
    train = ["--seq-len", "64", "--num-anchors", "8", "--block-size", "4", "--markov-rank", "16", "--steps", "2",
             "--batch-seqs", "2", "--eval-every", "0", "--eval-seqs", "2", "--threads", "2", "--quiet", "--seed", "3",
             "--lr", "3e-3"]
    env = dict(os.environ)
    env.pop("DSPARK_TEST_FREE_BYTES", None)

    def fresh(name):
        d = os.path.join(tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        return d

    def estimate(extra):  # without --quiet: the table on stderr too
        out, err, _ = common.run([a for a in cap if a != "--quiet"] + extra + ["--estimate"], env=env)
        return json.loads(out.strip().splitlines()[-1]), err

    # ---------------------------------------------------------------- estimate, then the capture
    I8 = fresh("cache-int8")
    est, err = estimate(["--out", I8, "--dtype", "int8", "--topk", "4"])
    ck.check(not os.path.exists(I8), "--estimate created the output directory")
    ck.check("free space" in err and "target_hidden_states_scale" in err and est["free_bytes"] is not None,
             f"estimate table: {err}")
    common.run(cap + ["--out", I8, "--dtype", "int8", "--topk", "4"], env=env)
    nl = len(json.load(open(os.path.join(I8, "manifest.json")))["target_layer_ids"])
    bpp = est["bytes_per_position"]
    ck.check(bpp == {"input_ids": 4, "loss_mask": 1, "target_hidden_states": nl * 64, "target_hidden_states_scale":
                     nl * 4, "target_last_hidden_states": 64, "target_last_hidden_states_scale": 4, "topk_ids": 16,
                     "topk_logprobs": 8}, f"per position {bpp}")
    actual = dir_bytes(I8)
    print(f"int8 + KD: estimate {est['total_bytes']} bytes, written {actual} bytes")
    ck.check(abs(est["total_bytes"] - actual) <= 0.001 * actual, f"estimate {est['total_bytes']} vs {actual}")
    B = fresh("cache-bf16")
    est_b, _ = estimate(["--out", B])
    common.run(cap + ["--out", B], env=env)
    print(f"bf16: estimate {est_b['total_bytes']} bytes, written {dir_bytes(B)} bytes")
    ck.check(abs(est_b["total_bytes"] - dir_bytes(B)) <= 0.001 * dir_bytes(B), "bf16 estimate")
    F = fresh("cache-f32")
    common.run(cap + ["--out", F, "--dtype", "f32"], env=env)
    feat = lambda d: sum(os.path.getsize(os.path.join(d, s)) for s in os.listdir(d) if s.startswith("shard-"))
    print(f"shard bytes: f32 {feat(F)}, bf16 {feat(B)}, int8 (with KD top-4) {feat(I8)}")

    # ---------------------------------------------------------------- the stored tensors
    import torch
    import transformers
    from safetensors.torch import load_file
    man = json.load(open(os.path.join(I8, "manifest.json")))
    fman = json.load(open(os.path.join(F, "manifest.json")))
    ck.check(man["dtype"] == "int8" and man["format_version"] == 2, f"manifest dtype {man['dtype']}")
    m, d, S = len(man["target_layer_ids"]), man["hidden_size"], man["seq_length"]
    sq_bad = deq_worst = 0.0
    for info, finfo in zip(man["shards"], fman["shards"]):
        sh, fsh = load_file(os.path.join(I8, info["file"])), load_file(os.path.join(F, finfo["file"]))
        n = info["num_samples"]
        want = {"lengths": (torch.int64, (n,)), "input_ids": (torch.int32, (n, S)),
                "loss_mask": (torch.uint8, (n, S)), "target_hidden_states": (torch.int8, (n, S, m * d)),
                "target_hidden_states_scale": (torch.float32, (n, S, m)),
                "target_last_hidden_states": (torch.int8, (n, S, d)),
                "target_last_hidden_states_scale": (torch.float32, (n, S)),
                "topk_ids": (torch.int32, (n, S, 4)), "topk_logprobs": (torch.bfloat16, (n, S, 4))}
        ok = set(sh) == set(want) and all(sh[k].dtype == t and tuple(sh[k].shape) == s for k, (t, s) in want.items())
        ck.check(ok, f"{info['file']}: {[(k, sh[k].dtype, tuple(sh[k].shape)) for k in sorted(sh)]}")
        if not ok:
            break
        # the formula on the engine's own f32 features gives the stored bytes exactly
        q, s = quantize(fsh["target_hidden_states"].view(n, S, m, d))
        ql, sl = quantize(fsh["target_last_hidden_states"])
        same = (torch.equal(q.view(n, S, m * d), sh["target_hidden_states"]) and
                torch.equal(s, sh["target_hidden_states_scale"]) and
                torch.equal(ql, sh["target_last_hidden_states"]) and
                torch.equal(sl, sh["target_last_hidden_states_scale"]))
        ck.check(same, f"{info['file']}: the int8 tensors are not the formula applied to the f32 cache's features")
        for t in range(n):
            L = int(sh["lengths"][t])
            pad_zero = (bool((sh["target_hidden_states"][t, L:] == 0).all()) and
                        bool((sh["target_hidden_states_scale"][t, L:] == 0).all()) and
                        bool((sh["target_last_hidden_states_scale"][t, L:] == 0).all()))
            ck.check(pad_zero, f"{info['file']} row {t}: padding is not zero")
            amax = sh["target_hidden_states"][t, :L].view(L, m, d).abs().amax(-1)
            ck.check(bool((amax == 127).all()), f"{info['file']} row {t}: a row's absmax is not stored as 127")
        sq_bad += float(torch.isinf(sh["target_hidden_states_scale"]).sum())
    ck.check(sq_bad == 0, "infinite scales")
    # dequantized features against transformers (captured layer l = hidden_states[l + 1])
    model = transformers.AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
    last = man["shards"][-1]
    sh = load_file(os.path.join(I8, last["file"]))
    for r in (0, last["num_samples"] - 1):
        L = int(sh["lengths"][r])
        ids = sh["input_ids"][r:r + 1, :L].long()
        with torch.no_grad():
            hs = model(ids, output_hidden_states=True).hidden_states
        ref = torch.stack([hs[l + 1][0] for l in man["target_layer_ids"]], dim=1)  # [L, m, d]
        s = sh["target_hidden_states_scale"][r, :L]
        deq = sh["target_hidden_states"][r, :L].view(L, m, d).float() * s[..., None]
        tol = s[..., None] / 2 + 1e-4 * ref.abs().amax()
        err = (deq - ref).abs()
        deq_worst = max(deq_worst, float((err / tol).max()))
        sl = sh["target_last_hidden_states_scale"][r, :L]
        deql = sh["target_last_hidden_states"][r, :L].float() * sl[:, None]
        errl = (deql - hs[-1][0]).abs()
        tol_l = sl[:, None] / 2 + 1e-4 * hs[-1][0].abs().amax()
        deq_worst = max(deq_worst, float((errl / tol_l).max()))
        step = float((err / s[..., None].clamp_min(1e-30)).max())
        print(f"row {r}: dequantized vs transformers, worst error {step:.3f} quantization steps")
    ck.check(deq_worst <= 1.0, f"dequantized features exceed half a step (+1e-4 normwise): ratio {deq_worst}")

    # ---------------------------------------------------------------- training and inspect
    def first_loss(run):
        for line in open(os.path.join(run, "metrics.jsonl")):
            j = json.loads(line)
            if j.get("kind") == "train":
                return j["loss"]
        return None

    ri, rb = fresh("run-int8"), fresh("run-bf16")
    common.run([D, "train", "--cache", I8, "--out", ri] + train)
    common.run([D, "train", "--cache", B, "--out", rb] + train)
    li, lb = first_loss(ri), first_loss(rb)
    print(f"first-step loss: int8 cache {li}, bf16 cache {lb}")
    ck.check(li is not None and lb is not None and abs(li - lb) <= 1e-3 * abs(lb), f"first losses {li} vs {lb}")
    _, err, _ = common.run([D, "train", "--cache", B, "--out", ri, "--resume"] + train, expect_rc=1)
    ck.check("feature_dtype" in err and "int8" in err, f"resuming an int8-cache run from a bf16 cache: {err}")
    out, _, _ = common.run([D, "inspect", I8])
    ck.check("int8" in out and "with scales" in out, f"inspect: {out}")

    # a negative scale (the file's checksum re-stamped: the value itself is under test)
    N = fresh("cache-neg")
    shutil.copytree(I8, N)
    from safetensors.torch import save_file
    p = os.path.join(N, last["file"])
    t = load_file(p)
    t["target_hidden_states_scale"][-1, 0, 1] = -1.0  # a held-out sequence: read by the first evaluation
    save_file(t, p)
    h = "%016x" % cache_manifest.xxh64(open(p, "rb").read())
    cache_manifest.edit(os.path.join(N, "manifest.json"),
                        lambda j: j["shards"][-1].update(xxh64=h))
    i = train.index("--eval-every")
    _, err, _ = common.run([D, "train", "--cache", N, "--out", fresh("run-neg")] + train[:i] + train[i + 2:] +
                           ["--eval-every", "1"], expect_rc=1)
    ck.check("target_hidden_states_scale" in err and last["file"] in err and "-1" in err, f"negative scale: {err}")

    # ---------------------------------------------------------------- free space
    X = fresh("cache-space")
    small = dict(env, DSPARK_TEST_FREE_BYTES="1000")
    p = subprocess.run(cap + ["--out", X, "--dtype", "int8", "--topk", "4"], capture_output=True, text=True, env=small)
    ck.check(p.returncode == 1 and str(est["total_bytes"]) in p.stderr and "1000 bytes" in p.stderr and
             "--no-space-check" in p.stderr, f"space refusal: rc {p.returncode}: {p.stderr}")
    ck.check(not os.path.exists(X), "the refused capture created its directory")
    exact = dict(env, DSPARK_TEST_FREE_BYTES=str(est["total_bytes"]))
    common.run(cap + ["--out", fresh("cache-space"), "--dtype", "int8", "--topk", "4"], env=exact)
    common.run(cap + ["--out", fresh("cache-space"), "--dtype", "int8", "--topk", "4", "--no-space-check"], env=small)
    ck.check(dir_bytes(X) == actual, "the capture with --no-space-check differs in size")

    _, err, _ = common.run(cap + ["--out", fresh("cache-x"), "--dtype", "int8", "--no-features", "--topk", "4"],
                           expect_rc=2)
    ck.check("int8" in err and "--no-features" in err, f"int8 without features: {err}")
    ck.finish("test_cache_int8")


if __name__ == "__main__":
    main()

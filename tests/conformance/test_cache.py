"""The offline cache end to end on a tiny Qwen3 target built here (transformers) with a BPE
tokenizer trained here (tokenizers), the same helper test_train.py uses:

- capture: the documented shard tensors (read with Python `safetensors`), padding and lengths,
  f32 features equal to transformers' hidden states, KD top-K full-vocabulary log-probs with
  the top-p / min_k prefix and the sentinels, `dspark inspect`;
- kill -9 during a capture, rerun: every file byte-identical to an uninterrupted capture;
- a full disk (a file-size limit, SIGXFSZ ignored by the program): a clear message saying the
  cache is resumable; rerun without the limit: byte-identical again;
- a truncated shard, a flipped byte, a missing / malformed manifest, complete=false, a shard
  whose shapes disagree with the manifest, a mismatched target / tokenizer / data / seq len /
  layer set, a cache without features: each a clear error from `dspark train --cache` and
  `dspark inspect`, never a crash, never a checkpoint;
- training from an f32 cache is bit-identical to online training (metrics and checkpoint
  sha256), also with --cache-preload and after stop + resume; from a bf16 cache the losses
  differ only by the features' rounding (reported)."""
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cache_manifest  # noqa: E402
import common  # noqa: E402
from test_train import build_target  # noqa: E402

import numpy as np  # noqa: E402


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def tree_hashes(d):
    """Every file of a cache; .lock (the last writer's pid) is not part of the cache."""
    return {name: sha(os.path.join(d, name)) for name in sorted(os.listdir(d)) if name != ".lock"}


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp = args.tmp
    target = build_target(tmp)
    data = common.stdlib_text(os.path.join(tmp, "data.txt"), 60, 62)
    D = args.dspark
    cap = [D, "capture", "--target", target, "--data", data, "--seq-len", "64", "--threads", "2", "--quiet"]
    train = ["--seq-len", "64", "--num-anchors", "8", "--block-size", "4", "--markov-rank", "16", "--steps", "6",
             "--batch-seqs", "2", "--eval-every", "3", "--eval-seqs", "2", "--threads", "2", "--quiet", "--seed", "3",
             "--lr", "3e-3"]

    def fresh(name):
        d = os.path.join(tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        return d

    # ---------------------------------------------------------------- capture, uninterrupted
    U = fresh("cache-f32")
    common.run(cap + ["--out", U, "--dtype", "f32", "--shard-size", "8"])
    ref = tree_hashes(U)
    man = json.load(open(os.path.join(U, "manifest.json")))
    ck.check(man["complete"] is True and man["dtype"] == "f32" and man["seq_length"] == 64, f"manifest: {man}")
    n, S = man["num_samples"], man["seq_length"]
    ck.check(len(man["shards"]) == (n + 7) // 8 and len(man["shards"]) >= 4, f"{len(man['shards'])} shards for {n}")
    for key in ("format_version", "target_path", "target_architecture", "target_weights_xxh64", "vocab_size",
                "hidden_size", "num_hidden_layers", "target_layer_ids", "shard_size", "data_path", "data_xxh64",
                "tokenizer_xxh64", "chat_template_xxh64", "seed", "kd", "num_tokens"):
        ck.check(key in man, f"manifest lacks {key}")
    out, _, _ = common.run([D, "inspect", U])
    ck.check("bytes per token" in out and "all %d shards" % len(man["shards"]) in out, f"inspect output:\n{out}")
    common.run(cap + ["--out", U, "--dtype", "f32", "--shard-size", "8"])
    ck.check(tree_hashes(U) == ref, "rerunning a complete capture changed it")
    _, err, _ = common.run(cap + ["--out", U, "--dtype", "bf16", "--shard-size", "8"], expect_rc=1)
    ck.check("'dtype'" in err and "f32" in err and "bf16" in err and tree_hashes(U) == ref,
             f"a different capture into an existing cache must be refused, naming the field: {err}")

    # a Python user reads a shard with safetensors and finds the documented tensors
    from safetensors.torch import load_file
    import torch
    import transformers
    m, d, V = len(man["target_layer_ids"]), man["hidden_size"], man["vocab_size"]
    last_shard = man["shards"][-1]
    sh = load_file(os.path.join(U, last_shard["file"]))
    k = last_shard["num_samples"]
    want = {"lengths": (torch.int64, (k,)), "input_ids": (torch.int32, (k, S)), "loss_mask": (torch.uint8, (k, S)),
            "target_hidden_states": (torch.float32, (k, S, m * d)),
            "target_last_hidden_states": (torch.float32, (k, S, d))}
    ck.check(set(sh) == set(want), f"shard tensors {sorted(sh)}")
    for name, (dt, shape) in want.items():
        ck.check(name in sh and sh[name].dtype == dt and tuple(sh[name].shape) == shape,
                 f"{name}: {sh[name].dtype if name in sh else None} {tuple(sh[name].shape) if name in sh else None}")
    L = int(sh["lengths"][-1])
    ck.check(L < S, f"the last plain-text window should be padded (length {L})")
    ck.check(bool((sh["input_ids"][-1, L:] == 0).all()) and bool((sh["loss_mask"][-1, L:] == 0).all()) and
             bool((sh["target_hidden_states"][-1, L:] == 0).all()), "padding is not zero")
    total = sum(int(load_file(os.path.join(U, s["file"]))["lengths"].sum()) for s in man["shards"])
    ck.check(total == man["num_tokens"], f"lengths sum {total} != num_tokens {man['num_tokens']}")
    # the features are transformers' hidden states (captured layer l = hidden_states[l + 1])
    model = transformers.AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
    ids = sh["input_ids"][-1:, :L].long()
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
        logits = model(ids).logits[0].double()
    ref_ctx = torch.cat([hs[l + 1][0] for l in man["target_layer_ids"]], dim=-1)
    e1 = common.normwise_rel_err(sh["target_hidden_states"][-1, :L].numpy(), ref_ctx.numpy())
    e2 = common.normwise_rel_err(sh["target_last_hidden_states"][-1, :L].numpy(), hs[-1][0].numpy())
    print(f"features vs transformers: captured {e1:.2e}, final-normed {e2:.2e}")
    ck.check(e1 < 1e-4 and e2 < 1e-4, f"features differ from transformers: {e1}, {e2}")

    # ---------------------------------------------------------------- KD capture (and KD only)
    KD = fresh("cache-kd")
    T, K = 0.05, 16
    common.run(cap + ["--out", KD, "--dtype", "f32", "--shard-size", "64", "--no-features", "--topk", str(K),
                      "--top-p", "0.5", "--min-k", "3", "--temperature", str(T)])
    kman = json.load(open(os.path.join(KD, "manifest.json")))
    ck.check(kman["kd"] == {"topk": K, "top_p": 0.5, "min_k": 3, "temperature": T} and kman["features"] is False,
             f"KD manifest: {kman['kd']}")
    ksh = load_file(os.path.join(KD, kman["shards"][-1]["file"]))
    ck.check(set(ksh) == {"lengths", "input_ids", "loss_mask", "topk_ids", "topk_logprobs"}, f"KD shard {sorted(ksh)}")
    row = (kman["num_samples"] - 1) % 64
    kid, klp = ksh["topk_ids"][row], ksh["topk_logprobs"][row].double()
    lp_ref = torch.log_softmax(logits / T, dim=-1)
    bad, truncated = 0, 0
    for t in range(L):
        kept = int((kid[t] >= 0).sum())
        truncated += kept < K
        ref_ids = torch.argsort(-lp_ref[t], stable=True)[:K]
        cum = torch.cumsum(lp_ref[t][ref_ids].exp(), 0) - lp_ref[t][ref_ids].exp()
        ref_kept = int(((cum < 0.5) | (torch.arange(K) < 3)).sum())
        ok = kept == ref_kept and bool((kid[t, :kept] == ref_ids[:kept].int()).all())
        ok = ok and float((klp[t, :kept] - lp_ref[t][ref_ids[:kept]]).abs().max()) < 1e-4
        ok = ok and bool((kid[t, kept:] == -1).all()) and bool(torch.isneginf(klp[t, kept:]).all())
        bad += not ok
    ck.check(bad == 0, f"{bad} of {L} positions differ from the KD reference (top-K, top-p 0.5, min_k 3, T {T})")
    ck.check(truncated > 0, "top-p 0.5 truncated nothing")
    ck.check(bool((ksh["topk_ids"][row, L:] == -1).all()) and bool(torch.isneginf(ksh["topk_logprobs"][row, L:]).all()),
             "KD padding is not the sentinel")
    _, err, _ = common.run([D, "train", "--cache", KD, "--out", fresh("run-kd")] + train, expect_rc=1)
    ck.check("features" in err, f"a KD-only cache must be refused for draft training: {err}")

    # ---------------------------------------------------------------- kill -9, resume
    Kd = fresh("cache-kill")
    p = subprocess.Popen(cap + ["--out", Kd, "--dtype", "f32", "--shard-size", "8", "--throttle-ms", "150"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    second = os.path.join(Kd, "shard-000001.safetensors")
    while time.time() < deadline and p.poll() is None and not os.path.exists(second):
        time.sleep(0.01)
    killed = p.poll() is None
    if killed:
        p.send_signal(signal.SIGKILL)
    p.wait()
    ck.check(killed, "the capture finished before the SIGKILL (throttle too short)")
    kmid = json.load(open(os.path.join(Kd, "manifest.json")))
    ck.check(kmid["complete"] is False and 1 <= len(kmid["shards"]) < len(man["shards"]),
             f"after the kill: complete {kmid['complete']}, {len(kmid['shards'])} shards")
    _, err, rc = common.run([D, "inspect", Kd], expect_rc=1)
    ck.check("incomplete" in err and "rerun" in err, f"inspect of a killed capture: {err}")
    _, err, _ = common.run([D, "train", "--cache", Kd, "--out", fresh("run-killed")] + train, expect_rc=1)
    ck.check("complete" in err and "rerun" in err, f"train from a killed capture: {err}")
    common.run(cap + ["--out", Kd, "--dtype", "f32", "--shard-size", "8"])
    ck.check(tree_hashes(Kd) == ref, "kill -9 + rerun: the cache differs from the uninterrupted capture")

    # ---------------------------------------------------------------- full disk
    F = fresh("cache-full")
    shard_bytes = os.path.getsize(os.path.join(U, "shard-000000.safetensors"))
    weights_bytes = os.path.getsize(os.path.join(U, "target_weights.safetensors"))
    limit = (shard_bytes + weights_bytes) // 2
    ck.check(weights_bytes < limit < shard_bytes, f"limit {limit} must fall between {weights_bytes} and {shard_bytes}")

    def fsize_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run(cap + ["--out", F, "--dtype", "f32", "--shard-size", "8"], capture_output=True, text=True,
                       preexec_fn=fsize_limit)
    ck.check(p.returncode == 1, f"a full disk should exit 1 (not die of SIGXFSZ): rc {p.returncode}")
    ck.check("resumable" in p.stderr and "rerun" in p.stderr and "File too large" in p.stderr,
             f"full-disk message: {p.stderr}")
    ck.check(not [f for f in os.listdir(F) if ".tmp." in f], f"temp files left: {os.listdir(F)}")
    _, err, _ = common.run([D, "inspect", F], expect_rc=1)
    ck.check("incomplete" in err, f"inspect after a full disk: {err}")
    common.run(cap + ["--out", F, "--dtype", "f32", "--shard-size", "8"])
    ck.check(tree_hashes(F) == ref, "full disk + rerun: the cache differs from the uninterrupted capture")

    # ---------------------------------------------------------------- training from the cache
    def train_lines(d):
        out = []
        for line in open(os.path.join(d, "metrics.jsonl")):
            j = json.loads(line)
            for k in ("tokens_per_s", "elapsed_s", "peak_rss_mib"):
                j.pop(k, None)
            out.append(j)
        return out

    on = fresh("run-online")
    common.run([D, "train", "--target", target, "--data", data, "--out", on] + train)
    for name, extra in (("run-cache", []), ("run-preload", ["--cache-preload"]),
                        ("run-checked", ["--target", target, "--data", data, "--cache-prefetch", "2"])):
        r = fresh(name)
        common.run([D, "train", "--cache", U, "--out", r] + train + extra)
        ck.check(sha(os.path.join(r, "checkpoint.safetensors")) == sha(os.path.join(on, "checkpoint.safetensors")),
                 f"{name}: checkpoint differs from online training")
        ck.check(train_lines(r) == train_lines(on), f"{name}: metrics differ from online training")
    ck.check(json.load(open(os.path.join(tmp, "run-cache", "run.json")))["cache"] == U,
             "run.json does not name the cache")
    r = fresh("run-cache-resume")
    common.run([D, "train", "--cache", U, "--out", r, "--stop-after", "4", "--save-every", "2"] + train)
    common.run([D, "train", "--cache", U, "--out", r, "--resume", "--save-every", "2"] + train)
    ck.check(sha(os.path.join(r, "checkpoint.safetensors")) == sha(os.path.join(on, "checkpoint.safetensors")),
             "cache: stop + resume differs from online training")

    B = fresh("cache-bf16")
    common.run(cap + ["--out", B, "--shard-size", "8"])
    rb = fresh("run-bf16")
    common.run([D, "train", "--cache", B, "--out", rb] + train)
    lo = [j["loss"] for j in train_lines(on)]
    lb = [j["loss"] for j in train_lines(rb)]
    rel = max(abs(a - b) / abs(a) for a, b in zip(lo, lb))
    print(f"bf16 cache vs online: max relative loss difference {rel:.2e} over {len(lo)} metric lines")
    ck.check(0 < rel < 1e-2, f"bf16 cache losses: relative difference {rel}")
    _, err, _ = common.run([D, "train", "--cache", U, "--out", rb, "--resume"] + train, expect_rc=1)
    ck.check("feature_dtype" in err, f"resuming a bf16-cache run from an f32 cache: {err}")

    # ---------------------------------------------------------------- mismatches
    def refused(what, cmd, words, opts=train):
        r = fresh("run-refused")
        _, err, rc = common.run(cmd + ["--out", r] + opts, expect_rc=1)
        ok = all(w in err for w in words)
        ck.check(ok, f"{what}: message should name {words}: {err}")
        ck.check(not os.path.exists(os.path.join(r, "checkpoint.safetensors")), f"{what}: a checkpoint was written")

    i = train.index("--seq-len")
    refused("seq len", [D, "train", "--cache", U], ["seq_length", "64", "32"],
            train[:i] + train[i + 2:] + ["--seq-len", "32"])
    refused("layers", [D, "train", "--cache", U, "--target-layer-ids", "0,2"], ["target_layer_ids", "[1,2]", "[0,2]"])
    other = fresh("target-other")
    shutil.copytree(target, other)
    with open(os.path.join(other, "model.safetensors"), "r+b") as f:
        f.seek(-8, 2)
        b = f.read(1)
        f.seek(-8, 2)
        f.write(bytes([b[0] ^ 0x10]))
    refused("target weights", [D, "train", "--cache", U, "--target", other], ["target_weights_xxh64"])
    shutil.copy(os.path.join(target, "model.safetensors"), os.path.join(other, "model.safetensors"))
    with open(os.path.join(other, "tokenizer.json"), "a") as f:
        f.write("\n")
    refused("tokenizer", [D, "train", "--cache", U, "--target", other], ["tokenizer_xxh64"])
    other_data = os.path.join(tmp, "other.txt")
    open(other_data, "w").write(open(data).read() + "x")
    refused("data", [D, "train", "--cache", U, "--data", other_data], ["data_xxh64"])

    # ---------------------------------------------------------------- damaged caches
    def damaged(name, damage, words):
        c = fresh("cache-" + name)
        shutil.copytree(U, c)
        damage(c)
        for cmd in ([D, "train", "--cache", c, "--out", fresh("run-" + name)] + train, [D, "inspect", c]):
            p = subprocess.run(cmd, capture_output=True, text=True)
            ok = p.returncode == 1 and all(w in p.stderr for w in words)
            ck.check(ok, f"{name} / {cmd[1]}: rc {p.returncode}, expected 1 naming {words}: {p.stderr[-600:]}")
        ck.check(not os.path.exists(os.path.join(tmp, "run-" + name, "checkpoint.safetensors")),
                 f"{name}: training wrote a checkpoint")

    last = man["shards"][-1]["file"]  # holds the held-out sequences, used at step 0

    def truncate(c):
        p = os.path.join(c, "shard-000003.safetensors")
        os.truncate(p, os.path.getsize(p) // 2)

    def flip(c):
        p = os.path.join(c, last)
        with open(p, "r+b") as f:
            f.seek(-5, 2)
            b = f.read(1)
            f.seek(-5, 2)
            f.write(bytes([b[0] ^ 0x01]))

    def edit_manifest(fn):
        def go(c):  # re-stamped: the edit itself is under test, not the manifest's checksum
            cache_manifest.edit(os.path.join(c, "manifest.json"), fn)
        return go

    def reshape(c):
        from safetensors.torch import save_file
        p = os.path.join(c, "shard-000001.safetensors")
        t = load_file(p)
        t["target_hidden_states"] = t["target_hidden_states"][:, :, :d].contiguous()
        save_file(t, p)

    damaged("truncated", truncate, ["shard-000003.safetensors"])
    damaged("flipped", flip, [last, "checksum"])
    damaged("no-manifest", lambda c: os.remove(os.path.join(c, "manifest.json")), ["manifest.json"])
    damaged("malformed", lambda c: open(os.path.join(c, "manifest.json"), "a").write("}"),
            ["manifest.json", "malformed JSON"])
    damaged("incomplete", edit_manifest(lambda j: j.update(complete=False)), ["complete", "rerun"])
    damaged("shapes", reshape, ["shard-000001.safetensors", "target_hidden_states", "manifest"])
    damaged("count", edit_manifest(lambda j: j["shards"][0].update(num_samples=7)), ["shards[0]", "shard_size"])
    damaged("weights", lambda c: open(os.path.join(c, "target_weights.safetensors"), "r+b").write(b"\0"),
            ["target_weights"])
    ck.finish("test_cache")


if __name__ == "__main__":
    main()

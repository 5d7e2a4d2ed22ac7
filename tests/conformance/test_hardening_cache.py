"""Hardening of the offline cache (issue 7), on the tiny Qwen3 target of test_train.py:

- item 20: the manifest has a checksum of its own (manifest_xxh64, docs/file-formats.md "Offline cache"): a
  hand-edited target_layer_ids is refused by `inspect`, `train --cache` and a capture rerun
  instead of flowing into training; a rerun of a complete capture verifies the cache's copies of
  target_config.json and tokenizer.json and restores a deleted or changed one instead of saying
  "already complete (every checksum verified)"; `inspect` (also --no-verify) and `train --cache`
  refuse a changed copy naming it;
- item 7 (capture): a second capture into a directory being written is refused naming the
  holder's pid, and the first one ends byte-identical to an uninterrupted capture (the second
  one's stale-temp cleanup used to delete the first one's live temp file); stale temp files of a
  killed capture are removed on the next run; the .lock file upsets neither `inspect`, nor
  resume, nor training;
- item 23 (cache part): a NaN in a shard (with a valid checksum: it came from the target) is
  named when it is read (shard, tensor, sample, position), not reported as "draft logits hold
  NaN"; a capture whose target produces an infinity / NaN names the target layer and the sample
  and writes no shard holding it;
- item 24 (file primitives): a capture into a self-looping symlink gives the reason.
"hardening" in the name makes the sanitizer build run this file too."""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cache_manifest  # noqa: E402
import common  # noqa: E402
from test_train import build_target  # noqa: E402


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def tree_hashes(d):
    return {name: sha(os.path.join(d, name)) for name in sorted(os.listdir(d)) if name != ".lock"}


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp = args.tmp
    target = build_target(tmp)
    data = common.stdlib_text(os.path.join(tmp, "data.txt"), 60, 62)
    D = args.dspark
    cap = [D, "capture", "--target", target, "--data", data, "--seq-len", "64", "--threads", "2", "--dtype", "f32",
           "--shard-size", "8"]
    train = ["--num-anchors", "8", "--block-size", "4", "--markov-rank", "16", "--steps", "2", "--batch-seqs", "2",
             "--eval-every", "0", "--eval-seqs", "2", "--threads", "2", "--quiet", "--seed", "3"]

    def fresh(name):
        d = os.path.join(tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        return d

    def expect(name, cmd, rc, needles):
        out, err, code = common.run(cmd, expect_rc=None)
        ok = code == rc and all(n in err for n in needles)
        ck.check(ok, f"{name}: exit {code} (want {rc}); stderr {err.strip()[-700:]!r} should hold {needles}")
        last = [ln for ln in err.strip().splitlines() if ln.strip()]
        print(f"{name}: exit {code}: {last[-1][:220] if last else '(no message)'}", flush=True)
        return err

    U = fresh("ref")
    common.run(cap + ["--out", U, "--quiet"])
    ref = tree_hashes(U)
    man_path = os.path.join(U, "manifest.json")
    raw = open(man_path, "rb").read()
    man = json.loads(raw)

    # ---------------------------------------------------------------- item 20: the manifest's checksum
    ck.check(list(man)[0] == "manifest_xxh64" and man.get("format_version") == 2,
             f"manifest_xxh64 must be the first field of a version-2 manifest: {list(man)[:3]}")
    ck.check(cache_manifest.expected(raw) == man.get("manifest_xxh64"),
             f"manifest_xxh64 {man.get('manifest_xxh64')} is not the documented hash {cache_manifest.expected(raw)}")
    expect("inspect of the fresh cache", [D, "inspect", U], 0, [])

    def copy_of(name):
        d = fresh(name)
        shutil.copytree(U, d)
        return d

    E = copy_of("edited-layers")
    p = os.path.join(E, "manifest.json")
    j = json.load(open(p))
    j["target_layer_ids"] = [0, 2]  # a valid edit: only the checksum can tell
    json.dump(j, open(p, "w"), indent="\t")
    for name, cmd in (("inspect", [D, "inspect", E]), ("inspect --no-verify", [D, "inspect", E, "--no-verify"]),
                      ("train --cache", [D, "train", "--cache", E, "--out", fresh("run-edited")] + train),
                      ("capture rerun", cap + ["--out", E, "--quiet"])):
        expect(f"edited target_layer_ids: {name}", cmd, 1, ["manifest.json", "manifest_xxh64", "edited"])
    ck.check(not os.path.exists(os.path.join(tmp, "run-edited", "checkpoint.safetensors")),
             "training from an edited manifest wrote a checkpoint")
    # a version-1 manifest (no checksum) is refused by its version, with the remedy
    V1 = copy_of("v1")
    p = os.path.join(V1, "manifest.json")
    j = json.load(open(p))
    j.pop("manifest_xxh64", None)
    j["format_version"] = 1
    json.dump(j, open(p, "w"), indent="\t")
    expect("version-1 manifest", [D, "inspect", V1], 1, ["format_version", "recapture"])

    # ---------------------------------------------------------------- item 20: the copied files
    for fname, damage in (("tokenizer.json", "delete"), ("target_config.json", "change"),
                          ("tokenizer.json", "change")):
        C = copy_of(f"copies-{fname}-{damage}")
        fp = os.path.join(C, fname)
        if damage == "delete":
            os.remove(fp)
        else:
            open(fp, "a").write(" ")
        expect(f"{fname} {damage}d: inspect --no-verify", [D, "inspect", C, "--no-verify"], 1, [fname])
        expect(f"{fname} {damage}d: train --cache", [D, "train", "--cache", C, "--out", fresh("run-copies")] + train,
               1, [fname])
        err = expect(f"{fname} {damage}d: capture rerun", cap + ["--out", C], 0, [fname, "rewriting"])
        ck.check("already complete" not in err, f"a rerun with {fname} {damage}d said 'already complete': {err}")
        ck.check(tree_hashes(C) == ref, f"{fname} {damage}d: the rerun did not restore the cache byte for byte")
        expect(f"{fname} {damage}d: inspect after the rerun", [D, "inspect", C], 0, [])

    # ---------------------------------------------------------------- item 7: one writer per cache
    X = fresh("two-writers")
    a = subprocess.Popen(cap + ["--out", X, "--quiet", "--throttle-ms", "300"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    lock, first = os.path.join(X, ".lock"), os.path.join(X, "shard-000000.safetensors")
    while time.time() < deadline and a.poll() is None and not (os.path.exists(first) and os.path.exists(lock)):
        time.sleep(0.02)
    running = a.poll() is None
    ck.check(running, "the first capture finished before the second started (throttle too short)")
    ck.check(os.path.exists(lock) and open(lock).read().strip() == str(a.pid),
             f".lock should name the writer's pid {a.pid}: {open(lock).read() if os.path.exists(lock) else None}")
    expect("second capture into a cache being written", cap + ["--out", X, "--quiet"], 1,
           ["in use by another dspark process", f"pid {a.pid}"])
    expect("inspect while capturing", [D, "inspect", X, "--no-verify"], 1, ["incomplete"])
    _, a_err = a.communicate(timeout=600)
    ck.check(a.returncode == 0, f"the first capture failed (exit {a.returncode}): {a_err}")
    ck.check(tree_hashes(X) == ref, "the first capture's cache differs from an uninterrupted capture")
    # .lock does not upset inspect, a rerun, nor training
    expect("inspect with .lock", [D, "inspect", X], 0, [])
    err = expect("rerun with .lock", cap + ["--out", X], 0, ["already complete"])
    expect("train --cache with .lock", [D, "train", "--cache", X, "--out", fresh("run-lock")] + train, 0, [])
    # stale temp files of a killed writer are removed under the lock, also when nothing is left to do
    stale = [os.path.join(X, n) for n in ("shard-000001.safetensors.tmp.999999", "manifest.json.tmp.4242")]
    for s in stale:
        open(s, "w").write("partial")
    common.run(cap + ["--out", X, "--quiet"])
    ck.check(not any(os.path.exists(s) for s in stale), f"stale temp files left: {os.listdir(X)}")
    ck.check(tree_hashes(X) == ref, "cleaning stale temp files changed the cache")

    # ---------------------------------------------------------------- item 23: a NaN in a shard is named
    import numpy as np
    from safetensors.numpy import load_file, save_file
    N = copy_of("nan-shard")
    sp = os.path.join(N, "shard-000001.safetensors")
    t = load_file(sp)
    t["target_hidden_states"][2, 0, 7] = np.nan  # sample 8 + 2 = 10, position 0
    save_file(t, sp, metadata={"format": "dspark-cache-shard", "format_version": "1"})
    mp = os.path.join(N, "manifest.json")
    new_hash = "%016x" % cache_manifest.xxh64(open(sp, "rb").read())
    cache_manifest.edit(mp, lambda j: j["shards"][1].update(xxh64=new_hash))  # as if captured so
    expect("NaN feature in a shard (preload)", [D, "train", "--cache", N, "--out", fresh("run-nan"), "--cache-preload"]
           + train, 1, ["shard-000001.safetensors", "target_hidden_states", "NaN", "sample 10", "position 0"])
    ck.check(not os.path.exists(os.path.join(tmp, "run-nan", "checkpoint.safetensors")),
             "training on a NaN feature wrote a checkpoint")

    # ---------------------------------------------------------------- item 23: a target that overflows
    bad = fresh("target-overflow")
    shutil.copytree(target, bad)
    wp = os.path.join(bad, "model.safetensors")
    w = load_file(wp)
    w["model.layers.1.post_attention_layernorm.weight"] *= np.float32(1e30)
    w["model.layers.1.mlp.down_proj.weight"] *= np.float32(1e30)
    save_file(w, wp, metadata={"format": "pt"})
    O = fresh("cache-overflow")
    expect("capture from an overflowing target", [D, "capture", "--target", bad, "--data", data, "--seq-len", "64",
                                                  "--out", O, "--quiet", "--threads", "2"],
           1, ["target layer 1", "hidden_states[2]", "sample 0"])
    ck.check(not glob.glob(os.path.join(O, "shard-*.safetensors")), f"a shard was written: {os.listdir(O)}")

    # ---------------------------------------------------------------- item 24: the reason, from the file primitives
    loop = os.path.join(tmp, "loop")
    if os.path.lexists(loop):
        os.remove(loop)
    os.symlink("loop", loop)
    expect("capture into a symlink loop", cap + ["--out", loop, "--quiet"], 1, ["Too many levels of symbolic links"])
    expect("capture under a file", cap + ["--out", os.path.join(data, "cache"), "--quiet"], 1, ["Not a directory"])
    ck.finish("test_hardening_cache")


if __name__ == "__main__":
    main()

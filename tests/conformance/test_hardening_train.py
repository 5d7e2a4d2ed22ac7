"""Hostile and careless use of `dspark train` / `export` (issue 7, the trainer's items), on a
tiny Qwen3 target built here. Each check names its item:

 2  a checkpoint whose draft_config disagrees with its train_config: resume and export refuse
 4  a file-size limit: exit 1 naming the file, no SIGXFSZ, no temp file left
 5  an existing run without --resume / --overwrite is refused, nothing touched
 7  a second writer into a live run directory is refused naming the holder
 8  chat data with no supervised token is refused
11  a flipped bit, a zeroed tensor, a NaN weight, a negative second moment, a forged step:
    refused by resume and by export, naming the tensor or field
13  the target by content: a moved target resumes, a changed one is refused
14  a seed of 2^53 is kept exactly and 2^53 + 1 is a different run
15  a metrics write error (full disk) stops the run naming the file
16  resuming a finished run says so
17  --seq-len beyond the target's max_position_embeddings: refused before loading the weights
18  --target-layers beyond the target, --eval-seqs leaving nothing: refused naming the limit
19  --markov-rank above the vocabulary, an identically-zero loss: refused
23  a non-finite target hidden state names the target layer; steps count from 1
24  missing parents of --out are created
25  on a terminal, evaluation lines start on a line of their own
26  stale temp files of a killed run are removed"""
import glob
import hashlib
import json
import os
import pty
import resource
import signal
import shutil
import subprocess
import sys
import sysconfig
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cache_manifest  # noqa: E402
import common  # noqa: E402

from safetensors.numpy import load_file, save_file  # noqa: E402


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def build_target(tmp):
    return common.build_bpe_target(tmp, n_files=20, vocab_size=300, seed=7, specials=("<|endoftext|>", "<|mask|>", "<|im_start|>", "<|im_end|>"))


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp = args.tmp
    target = build_target(tmp)
    tools = os.path.dirname(os.path.abspath(args.dspark))
    edit = os.path.join(tools, "checkpoint_edit")
    data = os.path.join(tmp, "data.txt")
    with open(data, "w") as f:
        for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[30:32]:
            f.write(open(p, encoding="utf-8", errors="replace").read()[:6000])
    base = ["train", "--data", data, "--seq-len", "32", "--num-anchors", "4", "--block-size", "3",
            "--markov-rank", "8", "--steps", "4", "--batch-seqs", "2", "--eval-every", "2", "--eval-seqs", "2",
            "--save-every", "2", "--threads", "1", "--quiet", "--seed", "3"]

    def train(out, *extra, target_dir=target, rc=0, **kw):
        return common.run([args.dspark] + base + ["--target", target_dir, "--out", out] + list(extra),
                          expect_rc=rc, **kw)

    def fresh(name):
        d = os.path.join(tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        return d

    # the reference run, which several items compare with
    ref = fresh("ref")
    train(ref)
    ckpt = os.path.join(ref, "checkpoint.safetensors")
    ref_sha = sha(ckpt)

    def item_00_24():
        # 24: missing parents are created
        nested = fresh("runs") + "/nested/run"
        train(nested)
        ck.check(sha(os.path.join(nested, "checkpoint.safetensors")) == ref_sha,
                 "24: train --out with missing parents did not create the run")

    def item_00_24_usage():
        # 24: an unknown --markov value is a usage error (2), as is an unexpected argument
        for extra, want in ((["--markov", "bogus"], "bogus"), (["stray"], "unexpected argument")):
            _, err, _ = train(fresh("usage"), *extra, rc=2)
            ck.check(want in err, f"24: usage error {extra}: {err}")

    def item_01_5():
        # 5: an existing run is refused without --resume / --overwrite, untouched
        _, err, _ = train(ref, rc=1)
        ck.check("--resume" in err and "--overwrite" in err, f"5: existing-run message: {err}")
        ck.check(sha(ckpt) == ref_sha, "5: the refused run touched the checkpoint")
        train(ref, "--overwrite")
        ck.check(sha(ckpt) == ref_sha, "5: --overwrite did not give the same run again")

    def item_02_16():
        # 16: resuming a finished run says so
        _, err, _ = common.run([args.dspark] + [a for a in base if a != "--quiet"] + ["--target", target, "--out", ref,
                                                                                      "--resume"])
        ck.check("already complete" in err, f"16: resuming a finished run: {err}")

    def item_03_7():
        # 7: a second writer is refused while the first holds the directory
        live = fresh("live")
        slow = [args.dspark] + base + ["--target", target, "--out", live, "--steps", "400", "--save-every", "1",
                                       "--eval-every", "0"]
        p = subprocess.Popen(slow, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and not os.path.exists(os.path.join(live, "checkpoint.safetensors")):
            time.sleep(0.05)
        _, err, _ = train(live, "--resume", rc=1)
        ck.check("in use by another dspark process" in err and str(p.pid) in err, f"7: second writer: {err}")
        p.kill()
        p.wait()
        # 26: a killed run's temp file is removed at the next start
        stale = os.path.join(live, "checkpoint.safetensors.tmp.999999")
        open(stale, "w").write("partial")
        train(live, "--resume", "--steps", "400", "--save-every", "1", "--eval-every", "0", "--stop-after", "1")
        ck.check(not os.path.exists(stale), "26: a stale temp file survived the next start")

    def item_05_4():
        # 4: a file-size limit is a reported write error, not a silent SIGXFSZ: one limit that the
        # metrics cross, one that the checkpoint crosses
        # the small limit: above run.json and target_config.json (their size depends on the paths),
        # below what metrics.jsonl reaches
        # before the first checkpoint: with it at step 4 (the last), six metrics lines (~2.5 kB) are
        # written first, where at step 2 three lines (~1.2 kB) crossed a limit above run.json by a
        # few bytes only, and a run.json a field longer let the checkpoint cross first
        small = max(os.path.getsize(os.path.join(ref, f)) for f in ("run.json", "target_config.json")) + 60
        ck.check(small < os.path.getsize(os.path.join(ref, "metrics.jsonl")), "4: the limits need a longer run")
        for size in (small, 20000):
            lim = fresh(f"fsize-{'small' if size == small else size}")
            os.makedirs(lim)

            def limit():  # Python ignores SIGXFSZ and children inherit that: restore the default, as a shell has it
                signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
                resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

            opts = [("4" if size == small and prev == "--save-every" else a) for prev, a in zip([None] + base, base)]
            out = subprocess.run([args.dspark] + opts + ["--target", target, "--out", lim], capture_output=True,
                                 text=True, preexec_fn=limit)
            first = "metrics.jsonl" if size == small else "checkpoint.safetensors"  # the first file to cross it
            ck.check(out.returncode == 1 and os.path.join(lim, first) in out.stderr,
                     f"4: file-size limit {size}: rc {out.returncode}: {out.stderr}")
            ck.check(not glob.glob(os.path.join(lim, "*.tmp.*")), f"4: temp files left: {os.listdir(lim)}")

    # corrupted checkpoints: copy the reference run, alter its checkpoint, try resume and export
    def corrupt_case(label, make, expect):
        d = fresh("corrupt")
        shutil.copytree(ref, d)
        for name in (".lock",):
            if os.path.exists(os.path.join(d, name)):
                os.remove(os.path.join(d, name))
        make(os.path.join(d, "checkpoint.safetensors"))
        _, err1, _ = train(d, "--resume", rc=1)
        _, err2, _ = common.run([args.dspark, "export", d, "--out", fresh("corrupt-export")], expect_rc=1)
        ck.check(expect in err1, f"11 ({label}): resume message lacks '{expect}': {err1}")
        ck.check(expect in err2, f"11 ({label}): export message lacks '{expect}': {err2}")

    def flip(path):
        b = bytearray(open(path, "rb").read())
        b[-5] ^= 0x04
        open(path, "wb").write(b)

    def tool(*edits):
        def f(path):
            common.run([edit, path, path + ".new"] + list(edits))
            os.replace(path + ".new", path)
        return f

    def item_06_11():
        # 11: corrupted checkpoints are refused by resume and by export
        # The ordering of tensors in the file: the last bytes belong to optim.v; a flipped bit there
        corrupt_case("flipped bit", flip, "fails its checksum")
        corrupt_case("zeroed tensor, old checksums", tool("--keep-checksums", "f32:draft.norm.weight:0=0"),
                     "'draft.norm.weight' fails its checksum")
        corrupt_case("NaN weight", tool("f32:draft.fc.weight:3=nan"), "draft.fc.weight")
        corrupt_case("forged step", tool("meta:step=99"), "inconsistent position")
        d = fresh("negv")
        shutil.copytree(ref, d)
        tool("f32:optim.v:0=-1")(os.path.join(d, "checkpoint.safetensors"))
        _, err, _ = train(d, "--resume", rc=1)
        ck.check("negative second moment" in err, f"11: negative v on resume: {err}")

    def item_07_2():
        # 2: draft_config disagreeing with train_config (checksums recomputed: only the check itself stops it)
        meta = json.loads(subprocess.run([sys.executable, "-c", "import json,sys; from safetensors import safe_open; "
                                          "f=safe_open(sys.argv[1],'np'); print(json.dumps(f.metadata()))", ckpt],
                                         capture_output=True, text=True, check=True).stdout)
        dcfg = json.loads(meta["draft_config"])
        dcfg["block_size"] = 7
        corrupt_case("draft_config block_size 7 vs train_config 3",
                     tool("meta:draft_config=" + json.dumps(dcfg)), "block_size")

    def item_07_format1():
        # issue 8: a checkpoint of the first format (no checksums) is still exported; resuming it is
        # refused naming the version this build resumes
        d = fresh("format1")
        shutil.copytree(ref, d)
        tool("--drop-checksums", "meta:format_version=1")(os.path.join(d, "checkpoint.safetensors"))
        common.run([args.dspark, "export", d, "--out", fresh("format1-export")])
        _, err, _ = train(d, "--resume", rc=1)
        ck.check("format_version 1" in err and "resumes format_version 2" in err, f"format 1 resume: {err}")

    def item_08_13():
        # 13: the target by content
        moved = os.path.join(tmp, "moved-target")
        shutil.rmtree(moved, ignore_errors=True)
        shutil.copytree(target, moved)
        stop = fresh("moved")
        train(stop, "--stop-after", "2")
        train(stop, "--resume", target_dir=moved)
        ck.check(sha(os.path.join(stop, "checkpoint.safetensors")) == ref_sha,
                 "13: resuming with the target moved elsewhere did not continue the same run")
        w = load_file(os.path.join(moved, "model.safetensors"))
        k = sorted(w)[0]
        w[k] = w[k] * 1.5
        save_file(w, os.path.join(moved, "model.safetensors"), metadata={"format": "pt"})
        stop2 = fresh("changed")
        train(stop2, "--stop-after", "2")
        _, err, _ = train(stop2, "--resume", target_dir=moved, rc=1)
        ck.check("target_weights_xxh64" in err, f"13: a changed target was not refused by name: {err}")

    def item_08_13_format():
        # 13, 10: the sequences themselves are compared on resume: another --data-format reads the
        # same file differently and is refused; and 22: a tokenizer that does not fit the model
        d = fresh("format")
        train(d, "--stop-after", "2")
        _, err, _ = train(d, "--resume", "--data-format", "jsonl", rc=1)
        ck.check("sequences_xxh64" in err or "jsonl" in err.lower() or "JSON" in err,
                 f"13: a different --data-format resumed: {err}")
        bad = os.path.join(tmp, "bad-eos-target")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(target, bad)
        cfg = json.load(open(os.path.join(bad, "config.json")))
        cfg["eos_token_id"] = cfg["vocab_size"] + 5
        json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
        _, err, _ = train(fresh("bad-eos"), target_dir=bad, rc=1)
        ck.check("eos_token_id" in err and "config.json" in err, f"22: eos outside the vocabulary: {err}")

    def item_09_14():
        # 14: 64-bit seeds are exact
        s = fresh("seed")
        big = str(2 ** 53)
        train(s, "--seed", big, "--stop-after", "1")
        ck.check(json.load(open(os.path.join(s, "run.json")))["seed"] == big, "14: run.json seed is not exact")
        _, err, _ = train(s, "--seed", str(2 ** 53 + 1), "--resume", rc=1)
        ck.check("'seed'" in err, f"14: seed 2^53 + 1 resumed a 2^53 run: {err}")

    def item_10_15():
        # 15: metrics on a full disk
        full = fresh("full")
        os.makedirs(full)
        os.symlink("/dev/full", os.path.join(full, "metrics.jsonl"))
        _, err, _ = train(full, "--resume", rc=1)
        ck.check("metrics.jsonl" in err, f"15: metrics write error: {err}")

    def item_11_18():
        # 18, 19: limits are named, never silently applied
        checks = [(["--target-layers", "5"], "--target-layers 5"), (["--eval-seqs", "100000"], "--eval-seqs 100000"),
                  (["--markov-rank", "1048576"], "exceeds the vocabulary"),
                  (["--alpha-ce", "0", "--alpha-l1", "0", "--alpha-conf", "0"], "identically 0"),
              (["--seq-len", "1000000"], "max_position_embeddings")]
        for extra, want in checks:
            _, err, _ = train(fresh("limits"), *extra, rc=1)
            ck.check(want in err, f"18/19: {' '.join(extra)}: {err}")

    def item_12_8():
        # 8: chat data without a supervised token
        chat = os.path.join(tmp, "no-assistant.jsonl")
        with open(chat, "w") as f:
            for i in range(12):
                f.write(json.dumps({"messages": [{"role": "user", "content": f"hello {i} " * 8},
                                                 {"role": "Assistant", "content": "hi " * 10}]}) + "\n")
        out = common.run([args.dspark] + base[:1] + ["--data", chat] + base[3:] + ["--target", target, "--out",
                                                                                 fresh("chat")], expect_rc=1)
        ck.check("supervised" in out[1], f"8: chat data without assistant turns: {out[1]}")

    def item_12_8_cache():
        # 8: a cache whose every loss mask is 0 (checksums made consistent) is refused too
        c = fresh("zero-mask-cache")
        common.run([args.dspark, "capture", "--target", target, "--data", data, "--out", c, "--seq-len", "32",
                    "--target-layers", "2", "--dtype", "f32", "--quiet"])
        from safetensors import safe_open
        man = json.load(open(os.path.join(c, "manifest.json")))
        for sh in man["shards"]:
            path = os.path.join(c, sh["file"])
            with safe_open(path, "np") as f:
                meta = f.metadata()
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            tensors["loss_mask"] = tensors["loss_mask"] * 0
            save_file(tensors, path, metadata=meta)
            sh["xxh64"] = "%016x" % cache_manifest.xxh64(open(path, "rb").read())
        cache_manifest.edit(os.path.join(c, "manifest.json"),
                            lambda j: j.__setitem__("shards", man["shards"]))
        _, err, _ = common.run([args.dspark] + base[:1] + base[3:] + ["--cache", c, "--out", fresh("zero-mask-run")],
                               expect_rc=1)
        ck.check("supervised" in err, f"8: an all-zero cache mask trained: {err}")

    def item_13_23():
        # 23: a non-finite target hidden state names its layer; steps count from 1
        hot = os.path.join(tmp, "hot-target")
        shutil.rmtree(hot, ignore_errors=True)
        shutil.copytree(target, hot)
        w = load_file(os.path.join(hot, "model.safetensors"))
        for name in [n for n in w if "layers.0.mlp.down_proj" in n or "layers.0.mlp.up_proj" in n]:
            w[name] = w[name] * 1e38  # finite weights whose product overflows to inf
        save_file(w, os.path.join(hot, "model.safetensors"), metadata={"format": "pt"})
        _, err, _ = train(fresh("hot"), "--eval-every", "0", target_dir=hot, rc=1)
        ck.check("target layer 1" in err and "NaN" in err, f"23: non-finite target state: {err}")

    def item_14_25():
        # 25: on a terminal the evaluation lines start on a line of their own
        tty_run = fresh("tty")
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(args.dspark, [args.dspark] + [a for a in base if a != "--quiet"] + ["--target", target,
                                                                                         "--out", tty_run])
        chunks = []
        while True:
            try:
                b = os.read(fd, 4096)
            except OSError:
                break
            if not b:
                break
            chunks.append(b)
        os.waitpid(pid, 0)
        text = b"".join(chunks).decode(errors="replace")
        glued = [i for i in range(len(text)) if text.startswith("eval at step", i) and i > 0 and text[i - 1] != "\n"]
        ck.check("eval at step" in text and not glued, f"25: an evaluation line glued to the progress line: {text!r}")

    def item_profile():
        # --profile prints the trained model's kernels at the end and changes nothing it computes
        run = fresh("profile")
        _, err, _ = train(run, "--profile")
        rows = {l.split()[0]: l.split()[1:] for l in err.splitlines() if len(l.split()) >= 4}
        ck.check("kernels of the trained model" in err and int(rows.get("linear", ["0"])[0]) > 0
                 and int(rows.get("linear_bwd", ["0"])[0]) > 0, f"--profile: no kernel table:\n{err}")
        ck.check(sha(os.path.join(run, "checkpoint.safetensors")) == ref_sha, "--profile changed the checkpoint")

    sections = [item_profile, item_00_24, item_00_24_usage, item_01_5, item_02_16, item_03_7, item_05_4, item_06_11, item_07_2, item_07_format1, item_08_13, item_08_13_format, item_09_14, item_10_15, item_11_18, item_12_8, item_12_8_cache, item_13_23, item_14_25]
    for section in sections:
        try:
            section()
        except (SystemExit, Exception) as e:  # one broken item must not hide the others
            ck.check(False, f"{section.__name__}: stopped early: {e!r}")

    ck.finish("test_hardening_train")


if __name__ == "__main__":
    main()

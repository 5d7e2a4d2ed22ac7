"""Hardening (issue 7) of model loading: the cases where dspark and transformers used to read
the same model directory differently, or where dspark misreported why it could not.

- 24: a self-looping or dangling model.safetensors symlink (or shard, or draft checkpoint) is
  reported with its real reason, never as missing."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from safetensors.numpy import load_file  # noqa: E402


def run(cmd, expect_rc=0):
    """common.run, and a sanitizer report on stderr (the sanitizer build runs these tests too)
    fails the command even when its exit status is as expected."""
    out, err, rc = common.run(cmd, expect_rc=expect_rc)
    if "runtime error:" in err or "Sanitizer" in err:
        sys.stderr.write(f"command {' '.join(map(str, cmd))}\nreported a sanitizer error:\n{err[-4000:]}\n")
        raise SystemExit(1)
    return out, err, rc


def fresh(tmp, name):
    d = os.path.join(tmp, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


# ------------------------------------------------------------------ 24: symlinks

def test_symlinks(ck, args):
    good = fresh(args.tmp, "link-good")
    common.build_tiny_model("llama", good, seed=24)

    def case(name, setup, needles):
        d = fresh(args.tmp, "link-" + name)
        shutil.copytree(good, d)
        setup(d)
        _, err, rc = run([args.dspark, "info", d], expect_rc=None)
        ok = rc == 1 and all(n in err for n in needles) and "neither" not in err and "not found" not in err
        ck.check(ok, f"24 {name}: rc {rc}: {err}")
        print(f"24 {name}: {err.strip()}")

    def self_loop(d):
        p = os.path.join(d, "model.safetensors")
        os.remove(p)
        os.symlink("model.safetensors", p)
    case("self-loop", self_loop, ["model.safetensors", "symbolic link"])

    def cycle(d):
        p = os.path.join(d, "model.safetensors")
        os.remove(p)
        os.symlink("b.safetensors", p)
        os.symlink("model.safetensors", os.path.join(d, "b.safetensors"))
    case("two-link-cycle", cycle, ["model.safetensors", "symbolic link"])

    def dangling(d):
        p = os.path.join(d, "model.safetensors")
        os.remove(p)
        os.symlink("gone.safetensors", p)
    case("dangling", dangling, ["model.safetensors", "dangling", "gone.safetensors"])

    def shard_loop(d):
        p = os.path.join(d, "model.safetensors")
        os.rename(p, os.path.join(d, "real.safetensors"))
        names = list(load_file(os.path.join(d, "real.safetensors")).keys())
        json.dump({"metadata": {}, "weight_map": {n: "shard-1.safetensors" for n in names}},
                  open(os.path.join(d, "model.safetensors.index.json"), "w"))
        os.symlink("shard-1.safetensors", os.path.join(d, "shard-1.safetensors"))
    case("index-shard-loop", shard_loop, ["shard-1.safetensors", "symbolic link"])

    # config.json and the draft checkpoint too
    def config_loop(d):
        p = os.path.join(d, "config.json")
        os.remove(p)
        os.symlink("config.json", p)
    case("config-loop", config_loop, ["config.json", "symbolic link"])

    rundir = fresh(args.tmp, "link-run")
    os.makedirs(rundir)
    os.symlink("checkpoint.safetensors", os.path.join(rundir, "checkpoint.safetensors"))
    _, err, rc = run([args.dspark, "draft-forward", rundir, "--inputs", os.path.join(rundir, "x"),
                     "--out", os.path.join(rundir, "y")], expect_rc=None)
    ck.check(rc == 1 and "checkpoint.safetensors" in err and "symbolic link" in err,
             f"24 draft-forward with a looping checkpoint symlink: rc {rc}: {err}")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    try:
        test_symlinks(ck, args)
    except SystemExit:  # common.run's unexpected exit status, already printed
        ck.check(False, "a command exited with an unexpected status (above)")
    ck.finish("test_hardening_model")


if __name__ == "__main__":
    main()

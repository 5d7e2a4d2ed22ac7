"""Outputs that must not harm inputs. (1) `dspark plot` writes every string of its gnuplot scripts
(titles from run folder names and metrics keys, labels, file names) quoted with control characters
escaped, so that a newline in a name cannot end the quoted string and run the rest as gnuplot
commands (`system(...)`); the figures are still drawn. (2) Every command that writes refuses an
output path that is one of its inputs, lies inside an input directory, or (a directory output)
holds an input, whatever the spelling (a symlink, "../", a dangling symlink), naming the option and
the input, and leaves the input byte for byte as it was; a run's own resume still works. (3) A write
failure names the option (`speculate --report DIR`), and `plot` on a folder with nothing to draw
fails saying what it looked for.

Each case is a command, its expected exit status and words its stderr must hold. "hardening" in
the name makes the sanitizer build run this file."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MARK = "PWNED"
# the newline first: gnuplot runs the line after an unterminated string before it fails on the rest
EVIL = "x\nsystem(\"touch " + MARK + "\")\n'\\\r\t`touch " + MARK + "`"


def sh(cmd, cwd=None):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd)
    return p.returncode, p.stderr


def marks_under(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f == MARK]


def is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def plot_cases(ck, dspark, tmp):
    base = os.path.join(tmp, "plot")
    shutil.rmtree(base, ignore_errors=True)
    runs = os.path.join(base, "runs")
    run = os.path.join(runs, "run" + EVIL.replace("/", "_"))
    os.makedirs(run)
    keys = ["loss", "odd" + EVIL, "quote'd", "back\\slash", "multi\nline\nsystem(\"touch " + MARK + "\")"]
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        for step in (1, 2, 3):
            rec = {"kind": "train", "step": step}
            rec.update({k: 1.0 / (step + i) for i, k in enumerate(keys)})
            f.write(json.dumps(rec) + "\n")
        f.write(json.dumps({"kind": "eval", "step": 3, EVIL: [0.5, 0.25], "loss": 0.3}) + "\n")
    rc, err = sh([dspark, "plot", run], cwd=base)
    plots = os.path.join(run, "plots")
    ck.check(rc == 0, f"plot of a run with control characters in its names failed: {err}")
    ck.check(not marks_under(base) and not os.path.exists(os.path.join(os.getcwd(), MARK)),
             f"plot ran a command written in a run or metric name: {marks_under(base)}")
    pngs = sorted(p for p in os.listdir(plots) if p.endswith(".png")) if os.path.isdir(plots) else []
    ck.check(len(pngs) == len(keys) + 1 and all(is_png(os.path.join(plots, p)) for p in pngs),
             f"plot did not draw one PNG per metric and the vector: {pngs}")
    for gp in (p for p in os.listdir(plots) if p.endswith((".gp", ".dat"))) if os.path.isdir(plots) else []:
        text = open(os.path.join(plots, gp), encoding="utf-8", errors="replace").read()
        ck.check("\r" not in text and "\t" not in text and not any(
            line.startswith("system(") or line.startswith("'") for line in text.split("\n")),
            f"{gp}: a control character of a name reached the file: {text!r}")
    loss_gp = os.path.join(plots, "loss.gp")
    if ck.check(os.path.exists(loss_gp), "loss.gp missing"):
        ck.check("\\n" in open(loss_gp).read(), "the run name's newline is not shown escaped in the title")

    # a report whose file name and policy hold the same
    rep = os.path.join(runs, "rep" + EVIL + ".json")
    with open(rep, "w") as f:
        json.dump({"policy": "fixed" + EVIL, "tau": 2.0, "accept_conditional": [0.5, 0.25],
                   "accept_unconditional": [0.5, 0.1], "tokens_per_round_histogram": [1, 2, 3],
                   "calibration": {"ece_raw": [0.1, 0.2]}}, f)
    out = os.path.join(base, "figs")
    rc, err = sh([dspark, "plot", rep, "--out", out], cwd=base)
    ck.check(rc == 0, f"plot of a report with control characters in its name failed: {err}")
    ck.check(not marks_under(base), f"plot ran a command written in a report's name: {marks_under(base)}")
    figs = sorted(p for p in os.listdir(out) if p.endswith(".png")) if os.path.isdir(out) else []
    ck.check(len(figs) == 3 and all(is_png(os.path.join(out, p)) for p in figs) and
             not any("\n" in p or "\r" in p for p in figs), f"report figures: {figs}")

    # a report named like an option reaches gnuplot as a file, not as an option
    dash = os.path.join(runs, "-e.json")
    shutil.copy(rep, dash)
    rc, err = sh([dspark, "plot", dash, "--out", out], cwd=base)
    ck.check(rc == 0 and os.path.exists(os.path.join(out, "-e-acceptance.png")),
             f"a report named -e.json: {rc} {err}")

    # a folder with nothing to draw (a JSON that is not a report) fails saying what it looked for
    empty = os.path.join(base, "nothing")
    os.makedirs(empty)
    with open(os.path.join(empty, "other.json"), "w") as f:
        f.write('{"not": "a report"}')
    rc, err = sh([dspark, "plot", empty])
    ck.check(rc != 0 and empty in err and "metrics.jsonl" in err and "report" in err,
             f"plot of a folder with nothing to draw: exit {rc}, {err!r}")

    # a figure may not replace a file given as an input
    a_json = os.path.join(base, "a.json")
    with open(a_json, "w") as f:
        json.dump({"policy": "fixed", "tau": 2.0, "accept_conditional": [0.5], "tokens_per_round_histogram": [1]}, f)
    os.makedirs(os.path.join(base, "plots"), exist_ok=True)
    victim = os.path.join(base, "plots", "a-acceptance.dat")  # where a.json's figure data go
    with open(victim, "w") as f:
        f.write("{}\n")
    rc, err = sh([dspark, "plot", a_json, victim])
    ck.check(rc != 0 and open(victim).read() == "{}\n" and "refusing" in err and victim in err,
             f"plot replaced an input file with a figure's data: exit {rc}, {err!r}")
    rc, err = sh([dspark, "plot", run, "--out", os.path.join(run, "metrics.jsonl")])
    ck.check(rc != 0 and "--out" in err, f"plot --out an input file: exit {rc}, {err!r}")
    # the default place (inside the run) and --out RUN itself still work
    rc, err = sh([dspark, "plot", run, "--out", run])
    ck.check(rc == 0 and os.path.exists(os.path.join(run, "loss.png")), f"plot --out RUN failed: {err}")


def digest(paths):
    """sha256 of every file under paths (files or directories), by path."""
    out = {}
    for p in paths:
        if os.path.isfile(p):
            out[p] = hashlib.sha256(open(p, "rb").read()).hexdigest()
        for d, _, fs in os.walk(p):
            for f in fs:
                q = os.path.join(d, f)
                out[q] = hashlib.sha256(open(q, "rb").read()).hexdigest()
    return out


def output_cases(ck, dspark, tmp):
    target = common.build_bpe_target(tmp, n_files=12, vocab_size=300, seed=7, layers=2, name="out-target")
    data = os.path.join(tmp, "out-data.txt")
    common.stdlib_text(data, 0, 3)
    prompts = os.path.join(tmp, "out-prompts.txt")
    with open(prompts, "w") as f:
        f.write("def main():\nimport os\nclass A:\nreturn x\n")
    run = os.path.join(tmp, "out-draft")
    train = [dspark, "train", "--target", target, "--data", data, "--out", run, "--seq-len", "32",
             "--num-anchors", "4", "--block-size", "4", "--batch-seqs", "2", "--eval-every", "0", "--eval-seqs", "1",
             "--save-every", "1", "--quiet", "--threads", "1"]
    if not os.path.exists(os.path.join(run, "checkpoint.safetensors")):
        common.run(train + ["--steps", "2", "--stop-after", "1", "--overwrite"])
    export = os.path.join(tmp, "out-export")
    if not os.path.exists(os.path.join(export, "model.safetensors")):
        common.run([dspark, "export", run, "--out", export, "--overwrite"])
    tensors = os.path.join(tmp, "out-tensors.safetensors")
    with open(tensors, "wb") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    link = os.path.join(tmp, "out-link")
    if not os.path.islink(link):
        os.symlink(target, link)
    dangling = os.path.join(tmp, "out-dangling")
    if not os.path.islink(dangling):
        os.symlink(os.path.join(target, "new.json"), dangling)
    pristine = os.path.join(tmp, "out-pristine")
    inputs = [target, data, prompts, run, export, tensors]
    if not os.path.exists(pristine):
        os.makedirs(pristine)
        for p in inputs:
            (shutil.copytree if os.path.isdir(p) else shutil.copy)(p, os.path.join(pristine, os.path.basename(p)))
    cfg = os.path.join(target, "config.json")
    weights = os.path.join(target, "model.safetensors")
    dotdot = os.path.join(target, "..", os.path.basename(target), "config.json")
    spec = ["--target", target, "--draft", run]
    cases = [
        ("calibrate --out TARGET/config.json", "--out",
         [dspark, "calibrate", *spec, "--data", prompts, "--max-new-tokens", "4", "--out", cfg]),
        ("profile --out TARGET/config.json", "--out",
         [dspark, "profile", "--target", target, "--max-tokens", "2", "--reps", "1", "--context", "4", "--out", cfg]),
        ("speculate --report TARGET/config.json", "--report",
         [dspark, "speculate", *spec, "--prompt", "def", "--max-new-tokens", "4", "--report", cfg]),
        ("speculate --report DRAFT export's config.json", "--report",
         [dspark, "speculate", "--target", target, "--draft", export, "--prompt", "def", "--max-new-tokens", "4",
          "--report", os.path.join(export, "config.json")]),
        ("forward --out MODEL/model.safetensors", "--out",
         [dspark, "forward", target, "--ids", "1,2,3", "--out", weights]),
        ("export RUN --out RUN", "--out", [dspark, "export", run, "--out", run, "--overwrite"]),
        ("export RUN --out RUN/sub", "--out", [dspark, "export", run, "--out", os.path.join(run, "sub")]),
        ("capture --out inside the target", "--out",
         [dspark, "capture", "--target", target, "--data", data, "--seq-len", "32", "--out",
          os.path.join(target, "cache"), "--quiet"]),
        ("regenerate --out the --data file", "--out",
         [dspark, "regenerate", "--target", target, "--data", prompts, "--completion", "--max-new-tokens", "2",
          "--out", prompts]),
        ("regenerate --summary TARGET/config.json", "--summary",
         [dspark, "regenerate", "--target", target, "--data", prompts, "--completion", "--max-new-tokens", "2",
          "--out", os.path.join(tmp, "out-regen.jsonl"), "--summary", cfg]),
        ("tokenize --ids-out the --input file", "--ids-out",
         [dspark, "tokenize", target, "--input", data, "--ids-out", data]),
        ("tokenize --ids-out TARGET/tokenizer.json", "--ids-out",
         [dspark, "tokenize", os.path.join(target, "tokenizer.json"), "--text", "hi", "--ids-out",
          os.path.join(target, "tokenizer.json")]),
        ("train --out inside the target", "--out",
         [dspark, "train", "--target", target, "--data", data, "--out", os.path.join(target, "run"), "--steps", "1",
          "--seq-len", "32", "--num-anchors", "4", "--block-size", "4", "--batch-seqs", "2", "--eval-every", "0",
          "--quiet"]),
        ("train --out holding the --data file", "--out",
         [dspark, "train", "--target", target, "--data", os.path.join(run, "metrics.jsonl"), "--out", run,
          "--resume", "--steps", "2", "--seq-len", "32", "--quiet"]),
        ("pretrain --out the model directory of --config", "--out",
         [dspark, "pretrain", "--config", cfg, "--tokenizer", os.path.join(target, "tokenizer.json"), "--data", data,
          "--out", target, "--steps", "1", "--seq-len", "32", "--batch-seqs", "1", "--eval-every", "0", "--quiet"]),
        ("distill --out inside the --teacher", "--out",
         [dspark, "distill", "--teacher", target, "--student-config", cfg, "--data", data,
          "--out", os.path.join(target, "student"), "--steps", "1", "--seq-len", "32", "--batch-seqs", "1",
          "--eval-every", "0", "--quiet"]),
        ("loss --out IN", "--out", [dspark, "loss", tensors, "--out", tensors]),
        ("kd-loss --out IN", "--out", [dspark, "kd-loss", tensors, "--out", tensors]),
        ("draft-forward --out DRAFT/model.safetensors", "--out",
         [dspark, "draft-forward", export, "--inputs", tensors, "--out", os.path.join(export, "model.safetensors")]),
        ("draft-forward --out the --inputs file", "--out",
         [dspark, "draft-forward", export, "--inputs", tensors, "--out", tensors]),
        ("profile --out through a symlink to the target", "--out",
         [dspark, "profile", "--target", target, "--max-tokens", "2", "--reps", "1", "--context", "4", "--out",
          os.path.join(link, "config.json")]),
        ("profile --out TARGET/../target/config.json", "--out",
         [dspark, "profile", "--target", target, "--max-tokens", "2", "--reps", "1", "--context", "4",
          "--out", dotdot]),
        ("profile --target through a symlink, --out the real path", "--out",
         [dspark, "profile", "--target", link, "--max-tokens", "2", "--reps", "1", "--context", "4", "--out", cfg]),
        ("profile --out a dangling symlink into the target", "--out",
         [dspark, "profile", "--target", target, "--max-tokens", "2", "--reps", "1", "--context", "4",
          "--out", dangling]),
    ]
    for name, option, cmd in cases:
        before = digest(inputs)
        rc, err = sh(cmd)
        after = digest(inputs)
        changed = sorted(set(before) ^ set(after) | {p for p in before if after.get(p) != before[p]})
        ck.check(not changed, f"{name}: inputs changed: {changed[:6]} (exit {rc}: {err[-400:]!r})")
        ck.check(rc != 0 and option in err and "refusing" in err, f"{name}: exit {rc}, stderr {err[-600:]!r}")
        if changed or os.path.lexists(os.path.join(target, "new.json")):  # the next case starts from the same inputs
            for p in inputs:
                if os.path.isdir(p):
                    shutil.rmtree(p)
                    shutil.copytree(os.path.join(pristine, os.path.basename(p)), p)
                else:
                    shutil.copy(os.path.join(pristine, os.path.basename(p)), p)
            for extra in ("cache", "run", "student"):
                shutil.rmtree(os.path.join(target, extra), ignore_errors=True)

    # the refusals are not over-eager: a run resumes in its own directory, outputs beside inputs work
    rc, err = sh(train + ["--steps", "2", "--resume"])
    ck.check(rc == 0, f"train --resume in its own run directory failed: {err[-600:]}")
    rc, err = sh([dspark, "profile", "--target", target, "--max-tokens", "2", "--reps", "1", "--context", "4",
                  "--out", os.path.join(tmp, "out-profile.json")])
    ck.check(rc == 0, f"profile --out beside the target failed: {err[-600:]}")

    # a write failure names the option and the path, not a temporary file
    report_dir = os.path.join(tmp, "out-report-dir")
    os.makedirs(report_dir, exist_ok=True)
    rc, err = sh([dspark, "speculate", *spec, "--prompt", "def", "--max-new-tokens", "4", "--report", report_dir])
    ck.check(rc != 0 and f"--report {report_dir} is a directory" in err and ".tmp." not in err,
             f"speculate --report DIR: exit {rc}, {err[-600:]!r}")
    missing = os.path.join(tmp, "out-no-such-dir", "p.json")
    rc, err = sh([dspark, "profile", "--target", target, "--max-tokens", "2", "--reps", "1", "--context", "4",
                  "--out", missing])
    ck.check(rc != 0 and f"--out {missing}" in err, f"profile --out in a missing folder: exit {rc}, {err[-600:]!r}")
    rc, err = sh([dspark, "regenerate", "--target", target, "--data", prompts, "--completion", "--max-new-tokens", "2",
                  "--out", missing])
    ck.check(rc != 0 and f"--out {missing}" in err, f"regenerate --out in a missing folder: exit {rc}, {err[-600:]!r}")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    dspark = os.path.abspath(args.dspark)
    tmp = os.path.abspath(args.tmp)
    plot_cases(ck, dspark, tmp)
    output_cases(ck, dspark, tmp)
    ck.finish("hardening_outputs")


if __name__ == "__main__":
    main()

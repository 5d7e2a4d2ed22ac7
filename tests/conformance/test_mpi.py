"""Data parallelism under `mpirun --oversubscribe -np 2` equals one process (issue 12; the loss
contract of spec/dspark.md section 4), on tiny models built here:

- the trainer core's step on a toy with uneven supervised-token counts, 2 ranks x 2
  micro-batches (tests/tools/dp_step.c): the gradient equals the single-process one and the
  closed-form full-batch gradient within 1e-5 relative, and differs from the
  per-micro-batch-normalized variant by more than 1e-2 (so the test can tell them apart);
- 20 steps of `train`, `pretrain` and `distill` on 2 ranks equal 20 steps on 1 rank, loss by
  loss: bit-identical (the trainer core keeps each item's report apart and adds them in item
  order on every rank) and the checkpoints byte-identical (each item's gradient is summed in
  fp64 before one rounding, so how the items were split does not show); the 1e-6 relative
  bound of the issue is checked as well, so a failure says how far off it is;
- 10 steps on 2 ranks, then --resume on 1 rank for 10 more, equal 20 steps on 1 rank;
- the non-finite policy: with --skip-nonfinite 2 ranks skip the same step as 1 rank; without
  it the job stops naming the step;
- a rank killed mid-run ends the job within seconds with a message naming the rank; the last
  checkpoint stays intact and --resume on 1 rank continues it;
- `capture` on 2 ranks (the shards split between them) writes the same cache, file for file,
  as on 1 rank, and training (`train --cache`, `distill --cache`: a prefetching stream of each
  rank's share) from a cache on 2 ranks equals 1 rank;
- run.json records world_size; ranks given different options are refused naming the rank.

Skipped (exit 77) when the program was built without MPI or mpirun is missing."""
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SKIP = 77


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def mpi_env():
    # CI runs as root; Open MPI refuses that without these two. Under the sanitizer build, leak
    # detection is off for MPI runs only: Open MPI's plugins leak at exit from modules already
    # unloaded, which no suppression by library name can match (the single-process runs of
    # this test keep it, and every leak report seen here was in Open MPI, none in dspark).
    asan = ":".join(x for x in [os.environ.get("ASAN_OPTIONS", ""), "detect_leaks=0"] if x)
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1",
                ASAN_OPTIONS=asan)


def mpirun(n, cmd):
    return ["mpirun", "--oversubscribe", "-np", str(n)] + cmd


def losses(run, kind="train"):
    return [json.loads(l).get("loss") for l in open(os.path.join(run, "metrics.jsonl")) if f'"kind":"{kind}"' in l]


def rel_diff(a, b):
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))


def fresh(tmp, name):
    d = os.path.join(tmp, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


def check_toy_gradient(ck, tool, tmp):
    out = {}
    for n in (1, 2):
        o, _, _ = common.run(mpirun(n, [tool, fresh(tmp, f"toy-{n}")]), env=mpi_env())
        out[n] = json.loads(o.strip().splitlines()[-1])
    g1, g2 = out[1]["grad"], out[2]["grad"]
    full, mom = out[2]["full_batch"], out[2]["mean_of_means"]
    err_ranks = common.normwise_rel_err(g2, g1)
    err_full = common.normwise_rel_err(g2, full)
    err_mom = common.normwise_rel_err(mom, full)
    print(f"toy step: 2 ranks vs 1 rank {err_ranks:.2e}, vs closed form {err_full:.2e}, "
          f"mean of means vs full batch {err_mom:.2e}")
    ck.check(out[2]["world"] == 2, "dp_step did not run on 2 ranks")
    ck.check(err_ranks < 1e-5, f"toy: the 2-rank gradient differs from the 1-rank one by {err_ranks:.2e}")
    ck.check(err_full < 1e-5, f"toy: the 2-rank gradient differs from the full-batch gradient by {err_full:.2e}")
    ck.check(err_mom > 1e-2, f"toy: the mean-of-means variant is only {err_mom:.2e} away (cannot tell them apart)")


def compare_runs(ck, label, one, two):
    a, b = losses(one), losses(two)
    err = rel_diff(a, b)
    same_ck = sha(os.path.join(one, "checkpoint.safetensors")) == sha(os.path.join(two, "checkpoint.safetensors"))
    print(f"{label}: {len(a)} steps, 2 ranks vs 1 rank: losses {err:.2e} relative "
          f"({'bit-identical' if a == b else 'not bit-identical'}), checkpoints "
          f"{'byte-identical' if same_ck else 'differ'}")
    ck.check(len(a) == 20 and err < 1e-6, f"{label}: 2-rank losses differ from 1-rank by {err:.2e}\n{a}\n{b}")
    ck.check(same_ck, f"{label}: 2-rank checkpoint differs from the 1-rank one")
    ck.check(a == b, f"{label}: 2-rank losses are not bit-identical to 1-rank ones")
    ea, eb = losses(one, "eval"), losses(two, "eval")
    ck.check(rel_diff(ea, eb) < 1e-6 if ea else True, f"{label}: evaluations differ: {ea} vs {eb}")
    w = json.load(open(os.path.join(two, "run.json"))).get("world_size")
    ck.check(w == 2, f"{label}: run.json world_size is {w}, expected 2")


def draft_train(ck, args, tmp):
    target = common.build_bpe_target(tmp)
    data = common.stdlib_text(os.path.join(tmp, "data.txt"), 60, 64)
    base = [args.dspark, "train", "--target", target, "--data", data, "--seq-len", "64", "--num-anchors", "8",
            "--block-size", "4", "--markov-rank", "16", "--steps", "20", "--batch-seqs", "4", "--eval-every", "10",
            "--eval-seqs", "3", "--save-every", "5", "--threads", "1", "--quiet", "--seed", "3", "--lr", "3e-3"]
    one, two = fresh(tmp, "train-1"), fresh(tmp, "train-2")
    common.run(base + ["--out", one])
    common.run(mpirun(2, base + ["--out", two]), env=mpi_env())
    compare_runs(ck, "train", one, two)

    # 10 steps on 2 ranks, 10 more on 1 rank
    mixed = fresh(tmp, "train-mixed")
    common.run(mpirun(2, base + ["--out", mixed, "--stop-after", "10"]), env=mpi_env())
    common.run(base + ["--out", mixed, "--resume"])
    a, b = losses(one), losses(mixed)
    err = rel_diff(a, b)
    same = sha(os.path.join(one, "checkpoint.safetensors")) == sha(os.path.join(mixed, "checkpoint.safetensors"))
    print(f"train: 10 steps on 2 ranks + 10 resumed on 1 rank vs 20 on 1 rank: losses {err:.2e}, checkpoints "
          f"{'byte-identical' if same else 'differ'}")
    ck.check(err < 1e-6 and same and a == b,
             f"train: 2-rank then 1-rank resume differs ({err:.2e}, checkpoint same: {same})")

    # ranks given different jobs (here another --lr on rank 1) are refused before any step
    odd = fresh(tmp, "train-odd")
    _, e, rc = common.run(["mpirun", "--oversubscribe", "-np", "1"] + base + ["--out", odd] +
                          [":", "-np", "1"] + base + ["--out", odd, "--lr", "1e-3"], expect_rc=None, env=mpi_env())
    ck.check(rc != 0 and "rank 1 loaded a different job than rank 0" in e,
             f"ranks with different options: rc {rc}: {e[-800:]}")

    # the non-finite policy decides on the summed gradient: every rank skips the same step
    skips = {}
    for n in (1, 2):
        skips[n] = fresh(tmp, f"train-skip-{n}")
        line = base + ["--out", skips[n], "--inject-nan-step", "4", "--skip-nonfinite"]
        common.run(mpirun(n, line) if n > 1 else line, env=mpi_env())
    a, b = losses(skips[1]), losses(skips[2])
    ck.check(len(a) == 20 and a == b and sha(os.path.join(skips[1], "checkpoint.safetensors")) ==
             sha(os.path.join(skips[2], "checkpoint.safetensors")),
             f"--skip-nonfinite: 2 ranks differ from 1 rank: {a} vs {b}")
    ck.check(a != losses(one), "--inject-nan-step with --skip-nonfinite changed nothing")

    # a non-finite gradient without the policy stops every rank, naming the step
    _, e, rc = common.run(mpirun(2, base + ["--out", fresh(tmp, "train-nan"), "--inject-nan-step", "4"]),
                          expect_rc=None, env=mpi_env())
    ck.check(rc != 0 and "non-finite gradient at step 4" in e, f"2 ranks with a NaN gradient: rc {rc}: {e[-800:]}")

    # a killed rank: the job ends within seconds naming it; the checkpoint survives
    killed = fresh(tmp, "train-killed")
    long_run = [a_ if a_ != "20" else "100000" for a_ in base]  # --steps 100000
    p = subprocess.Popen(mpirun(2, long_run + ["--out", killed, "--save-every", "2", "--eval-every", "0"]),
                         env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = os.path.join(killed, "checkpoint.safetensors")
    deadline = time.time() + 60
    while not os.path.exists(ckpt) and time.time() < deadline and p.poll() is None:
        time.sleep(0.1)
    time.sleep(0.5)
    victim = rank_pid(p.pid, 1)
    ck.check(victim is not None, "could not find rank 1's process")
    if victim is None:
        p.kill()
        p.wait()
        return
    os.kill(victim, signal.SIGKILL)
    t0 = time.time()
    try:
        _, err_text = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err_text = p.communicate()
        ck.check(False, "a killed rank left the job hanging for 30 s")
        return
    took = time.time() - t0
    print(f"killed rank 1: the job ended in {took:.1f} s with exit status {p.returncode}; "
          f"message: {' | '.join(l for l in err_text.splitlines() if 'rank' in l)[:300]}")
    ck.check(p.returncode != 0, "the job with a killed rank exited 0")
    ck.check(took < 10, f"the job took {took:.1f} s to notice the killed rank")
    ck.check("rank 1" in err_text, f"the message does not name rank 1:\n{err_text[-2000:]}")
    _, e, _ = common.run(long_run + ["--out", killed, "--save-every", "2", "--eval-every", "0", "--resume",
                                     "--stop-after", "2"])
    steps = [json.loads(l)["step"] for l in open(os.path.join(killed, "metrics.jsonl")) if '"train"' in l]
    ck.check(len(steps) >= 3 and steps == list(range(1, len(steps) + 1)),
             f"--resume after the killed rank did not continue the run: steps {steps[:5]}...{steps[-3:]}")

    # capture: 2 ranks split the shards; the cache is the 1-rank cache, file for file
    caps = {}
    for n in (1, 2):
        caps[n] = fresh(tmp, f"cache-{n}")
        line = [args.dspark, "capture", "--target", target, "--data", data, "--out", caps[n], "--seq-len", "64",
                "--shard-size", "60", "--topk", "4", "--dtype", "f32", "--threads", "1", "--quiet"]
        common.run(mpirun(n, line) if n > 1 else line, env=mpi_env())
    files = sorted(os.listdir(caps[1]))
    same = files == sorted(os.listdir(caps[2])) and all(
        sha(os.path.join(caps[1], f)) == sha(os.path.join(caps[2], f)) for f in files if f != ".lock")
    shards = [f for f in files if f.startswith("shard")]
    print(f"capture: {len(shards)} shards; 2 ranks vs 1 rank: {'byte-identical' if same else 'DIFFERENT'} "
          f"({len(files)} files)")
    ck.check(len(shards) >= 3 and same, f"capture with 2 ranks differs from 1 rank: {files} vs "
             f"{sorted(os.listdir(caps[2]))}")
    # training from it under 2 ranks equals 1 rank (the prefetch plan streams only each rank's share)
    runs = {}
    for n in (1, 2):
        runs[n] = fresh(tmp, f"cached-train-{n}")
        line = [args.dspark, "train", "--cache", caps[1], "--out", runs[n], "--num-anchors", "8", "--block-size",
                "4", "--markov-rank", "16", "--steps", "20", "--batch-seqs", "4", "--eval-every", "10",
                "--eval-seqs", "3", "--threads", "1", "--quiet", "--seed", "3", "--lr", "3e-3"]
        common.run(mpirun(n, line) if n > 1 else line, env=mpi_env())
    compare_runs(ck, "train from the cache", runs[1], runs[2])


def rank_pid(mpirun_pid, rank):
    """The pid of the process of `rank` among mpirun's descendants (Open MPI sets
    OMPI_COMM_WORLD_RANK in each rank's environment)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() not in env:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        while ppid > 1 and ppid != mpirun_pid:
            try:
                ppid = int(open(f"/proc/{ppid}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                break
        if ppid == mpirun_pid:
            return int(pid)
    return None


def lm_train(ck, args, tmp):
    teacher = common.build_bpe_target(tmp, n_files=20, vocab_size=300, seed=3, name="teacher")
    student = os.path.join(tmp, "student")
    if not os.path.exists(os.path.join(student, "config.json")):
        common.build_tiny_model("qwen3", student, seed=9,
                                vocab_size=json.load(open(os.path.join(teacher, "config.json")))["vocab_size"],
                                eos_token_id=0, num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=8)
        shutil.copy(os.path.join(teacher, "tokenizer.json"), os.path.join(student, "tokenizer.json"))
    data = os.path.join(tmp, "lm-data.txt")
    with open(data, "w") as f:
        for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[40:42]:
            f.write(open(p, encoding="utf-8", errors="replace").read()[:6000])
    opts = ["--seq-len", "32", "--steps", "20", "--batch-seqs", "4", "--lr", "3e-3", "--eval-seqs", "2",
            "--eval-every", "10", "--save-every", "5", "--threads", "1", "--quiet", "--data", data,
            "--data-format", "text", "--seed", "4"]
    for cmd, extra in (("pretrain", []), ("distill", ["--teacher", teacher])):
        one, two = fresh(tmp, f"{cmd}-1"), fresh(tmp, f"{cmd}-2")
        line = [args.dspark, cmd, "--student", student] + extra + opts
        common.run(line + ["--out", one])
        common.run(mpirun(2, line + ["--out", two]), env=mpi_env())
        compare_runs(ck, cmd, one, two)

    # distill from a KD cache captured on 2 ranks: the LM objective's prefetching stream
    cache = fresh(tmp, "kd-cache")
    common.run(mpirun(2, [args.dspark, "capture", "--target", teacher, "--data", data, "--data-format", "text",
                          "--out", cache, "--seq-len", "32", "--topk", "8", "--no-features", "--dtype", "f32",
                          "--shard-size", "16", "--quiet"]), env=mpi_env())
    cache_opts = [o for o in opts if o not in ("--data", data, "--data-format", "text")]
    one, two = fresh(tmp, "distill-cache-1"), fresh(tmp, "distill-cache-2")
    line = [args.dspark, "distill", "--cache", cache, "--student", student, "--topk", "8"] + cache_opts
    common.run(line + ["--out", one])
    common.run(mpirun(2, line + ["--out", two]), env=mpi_env())
    compare_runs(ck, "distill from a KD cache", one, two)


def main():
    args = common.parse_args(__doc__)
    help_text, _, _ = common.run([args.dspark, "--help"])
    if "data parallelism: MPI" not in help_text:
        print("SKIPPED: this dspark was built without MPI (DSPARK_MPI=OFF)")
        sys.exit(SKIP)
    if not shutil.which("mpirun"):
        print("SKIPPED: mpirun is not installed (scripts/setup.sh installs openmpi-bin)")
        sys.exit(SKIP)
    ck = common.Checker()
    tool = os.path.join(os.path.dirname(os.path.abspath(args.dspark)), "dp_step")
    check_toy_gradient(ck, tool, args.tmp)
    draft_train(ck, args, args.tmp)
    lm_train(ck, args, args.tmp)
    ck.finish("test_mpi")


if __name__ == "__main__":
    main()

"""Hardening of the data readers: every command that takes --data (train, pretrain, distill,
capture, regenerate, generate, speculate, calibrate) and `tokenize --chat` reads through one
reader, so each case below runs against all of them.

- A line is bounded (--max-line-bytes, 64 MiB by default): a small .jsonl.gz holding one line of
  512 MiB fails with the limit's message (file, line, limit, option) and a peak RSS far below the
  line; `--data /dev/zero` fails instead of growing without end; a line over a lowered limit is
  refused and passes once the option raises it; a bad value is a usage error.
- A JSONL line whose first non-blank byte is not '{' fails at that byte: a pipe feeding an
  endless line of 'a' is left after a few pipe buffers, not after the limit.
- Duplicate keys in a data line, at the top or nested (a message with two "content"), are
  refused naming the file, the line and the key.
- generate / speculate --data read .gz and .zst prompts as the plain file, and an invalid
  UTF-8 prompt line is named by file, line and column.
- An input without a record (an empty file, blank lines only) is an error naming the file."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DEFAULT_LIMIT = 64 << 20
MiB = 1 << 20
RSS_KILL = 1536 * MiB


# Runs a command under a small fresh interpreter: a child forked from this test's process
# (torch imported) would count this process's memory in its own peak RSS (Linux keeps the
# pre-exec high-water mark); forked from the small one, the peak is the command's. Kills the
# command past its time or past a memory ceiling (a reader without a bound must not take the
# machine's memory). Prints "EXIT_CODE PEAK_RSS_KIB" (EXIT_CODE "killed").
MEASURE = r"""
import os, sys, time
timeout, max_rss, cmd = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
pid = os.fork()
if pid == 0:
    os.execv(cmd[0], cmd)
t0, killed = time.time(), False
def rss():
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
while True:
    got, status, ru = os.wait4(pid, os.WNOHANG)
    if got:
        break
    if time.time() - t0 > timeout or rss() > max_rss:
        os.kill(pid, 9)
        got, status, ru = os.wait4(pid, 0)
        killed = True
        break
    time.sleep(0.02)
print("killed" if killed else os.waitstatus_to_exitcode(status), ru.ru_maxrss, file=sys.stderr)
"""


def run_measured(cmd, timeout, max_rss=RSS_KILL):
    """Runs cmd; returns (rc, stderr, peak RSS in bytes, seconds); rc None when it was killed for
    running past timeout or growing past max_rss."""
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", MEASURE, str(timeout), str(max_rss), *cmd], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    err = p.stderr.decode(errors="replace")
    last = err.rstrip("\n").rsplit("\n", 1)
    rc_text, rss_kib = last[-1].split()
    rc = None if rc_text == "killed" else int(rc_text)
    return rc, (last[0] if len(last) > 1 else ""), int(rss_kib) * 1024, time.time() - t0


def main():
    # In the sanitizer build freed blocks wait in ASan's quarantine (256 MiB by default) and count
    # in the peak RSS: a line buffer grown by reallocation would look like live memory many times.
    os.environ["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS", ""), "quarantine_size_mb=0"]))
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp, D = args.tmp, args.dspark
    target = common.build_qwen3_chat_target(tmp)
    corpus = common.stdlib_text(os.path.join(tmp, "corpus.txt"), 0, 6)
    draft = os.path.join(tmp, "draft")
    if not os.path.exists(os.path.join(draft, "checkpoint.safetensors")):
        common.run([D, "train", "--target", target, "--data", corpus, "--out", draft, "--overwrite", "--seq-len", "64",
                    "--num-anchors", "4", "--block-size", "4", "--steps", "1", "--batch-seqs", "1", "--eval-every",
                    "0", "--eval-seqs", "1", "--save-every", "1", "--quiet", "--threads", "1"])
    n_out = [0]

    def out_path(tag, suffix=""):
        n_out[0] += 1
        p = os.path.join(tmp, f"out-{tag}-{n_out[0]}{suffix}")
        shutil.rmtree(p, ignore_errors=True)
        if os.path.exists(p):
            os.remove(p)
        return p

    small = ["--seq-len", "64", "--steps", "1", "--batch-seqs", "1", "--eval-every", "0", "--eval-seqs", "1",
             "--save-every", "1", "--quiet", "--threads", "1"]

    def commands(data, extra=()):
        """Every reader of --data (and tokenize --chat) on data, with extra options."""
        x = list(extra)
        return {
            "train": [D, "train", "--target", target, "--data", data, "--out", out_path("train"), "--overwrite",
                      "--num-anchors", "4", "--block-size", "4", *small, *x],
            "pretrain": [D, "pretrain", "--student", target, "--data", data, "--out", out_path("pre"), "--overwrite",
                         *small, *x],
            "distill": [D, "distill", "--teacher", target, "--student", target, "--topk", "8", "--data", data,
                        "--out", out_path("kd"), "--overwrite", *small, *x],
            "capture": [D, "capture", "--target", target, "--data", data, "--out", out_path("cap"), "--seq-len", "64",
                        "--target-layer-ids", "0", "--dtype", "f32", "--threads", "1", "--quiet", *x],
            "regenerate": [D, "regenerate", "--target", target, "--data", data, "--out", out_path("regen", ".jsonl"),
                           "--max-new-tokens", "2", "--threads", "1", *x],
            "tokenize --chat": [D, "tokenize", target, "--chat", data, *x],
            "generate": [D, "generate", target, "--data", data, "--max-new-tokens", "2", "--print-ids", *x],
            "speculate": [D, "speculate", "--target", target, "--draft", draft, "--data", data, "--max-new-tokens", "2",
                          "--print-ids", *x],
            "calibrate": [D, "calibrate", "--target", target, "--draft", draft, "--data", data, "--out",
                          out_path("cal", ".json"), "--max-new-tokens", "4", *x],
        }

    def crashed(rc, err):
        return rc is None or rc < 0 or rc > 2 or "Sanitizer" in err or "runtime error" in err

    def refused(what, rc, err, needles, expect=1):
        if not ck.check(not crashed(rc, err), f"{what}: crashed or hung (rc {rc}): {err[-1500:]}"):
            return
        ck.check(rc == expect, f"{what}: exit status {rc}, expected {expect}: {err.strip()[-1500:]}")
        for s in needles:
            ck.check(s in err, f"{what}: the message lacks '{s}': {err.strip()[-1500:]}")

    def write(name, data):
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return p

    def conv(i, **extra):
        o = {"messages": [{"role": "user", "content": f"def f{i}(x):"},
                          {"role": "assistant", "content": f"    return x + {i}"}]}
        o.update(extra)
        return json.dumps(o)

    # ------------------------------------------------------------ item 3: a line is bounded
    # a 512 MiB line, gzip'd to well under a megabyte
    huge = os.path.join(tmp, "huge.jsonl.gz")
    if not os.path.exists(huge):
        z = zlib.compressobj(6, zlib.DEFLATED, 31)
        with open(huge + ".part", "wb") as f:
            f.write(z.compress(b'{"text": "'))
            block = b"a" * MiB
            for _ in range(512):
                f.write(z.compress(block))
            f.write(z.flush())
        os.replace(huge + ".part", huge)
    # The bound is on what the line adds to the command's own peak (a short malformed line, same
    # reader, same point of failure): at most the limit's buffer twice over plus slack, far below
    # the 512 MiB line. An absolute bound broke on the sanitizer build as the binary grew.
    small_bad = write("small-bad.jsonl", "not json\n")
    for name, cmd in commands(huge).items():
        rc, err, rss, secs = run_measured(cmd, 300)
        base = run_measured(commands(small_bad)[name], 300)[2]
        what = f"item 3: {name} --data a 512 MiB line (.gz)"
        refused(what, rc, err, ["huge.jsonl.gz:1", str(DEFAULT_LIMIT), "--max-line-bytes"])
        ck.check(rss - base < 2 * DEFAULT_LIMIT + 32 * MiB,
                 f"{what}: peak RSS {rss / MiB:.0f} MiB, {(rss - base) / MiB:.0f} MiB over a short bad line's: "
                 "not bounded well below the line")
        print(f"{what}: rc {rc}, {secs:.1f} s, peak RSS {rss / MiB:.0f} MiB ({base / MiB:.0f} MiB on a short line)",
              flush=True)

    # /dev/zero: an endless line (of bytes that start no JSON value) ends in an error, not a hang
    for name, cmd in commands("/dev/zero").items():
        rc, err, rss, secs = run_measured(cmd, 120)
        refused(f"item 3: {name} --data /dev/zero", rc, err, ["/dev/zero"])
        ck.check(rss < 256 * MiB, f"item 3: {name} --data /dev/zero: peak RSS {rss / MiB:.0f} MiB")

    # with --cache, --data is only hashed (to check the cache was made from it): the hash is
    # bounded the same way (it read /dev/zero forever); the cache is not opened before the hash
    empty_cache = os.path.join(tmp, "empty-cache")
    os.makedirs(empty_cache, exist_ok=True)
    for name, cmd in {"train --cache": [D, "train", "--cache", empty_cache, "--data", "/dev/zero", "--out",
                                        out_path("trc"), *small],
                      "distill --cache": [D, "distill", "--cache", empty_cache, "--student", target, "--data",
                                          "/dev/zero", "--out", out_path("kdc"), *small]}.items():
        rc, err, rss, secs = run_measured(cmd, 120)
        refused(f"item 3: {name} --data /dev/zero", rc, err, ["/dev/zero", "without a line break", "--max-line-bytes"])

    # a line over a lowered limit is refused; the option raised, the same data passes
    pad = "x" * (3 * MiB // 2)
    lines = [conv(i) for i in range(8)]
    lines[2] = conv(2, pad=pad)
    long_data = write("long.jsonl", "\n".join(lines) + "\n")
    for name, cmd in commands(long_data, ["--max-line-bytes", "1M"]).items():
        _, err, rc = common.run(cmd, expect_rc=None)
        refused(f"item 3: {name} --max-line-bytes 1M, a line of 1.5 MiB", rc, err,
                ["long.jsonl:3", "1048576", "--max-line-bytes"])
    for name, cmd in commands(long_data, ["--max-line-bytes", "4194304"]).items():
        _, err, rc = common.run(cmd, expect_rc=None)
        ck.check(rc == 0, f"item 3: {name} --max-line-bytes 4194304: a 1.5 MiB line still refused "
                          f"(rc {rc}): {err.strip()[-1500:]}")
    for bad in ("0", "-1", "abc", "1X", "99999999999999999999"):
        for name, cmd in commands(long_data, ["--max-line-bytes", bad]).items():
            _, err, rc = common.run(cmd, expect_rc=None)
            refused(f"item 3: {name} --max-line-bytes {bad}", rc, err, ["--max-line-bytes"], expect=2)

    for name in ("train", "pretrain", "distill", "capture", "regenerate", "generate", "speculate", "calibrate",
                 "tokenize"):
        out, _, rc = common.run([D, name, "--help"], expect_rc=None)
        ck.check(rc == 0 and "--max-line-bytes" in out and "64M" in out,
                 f"item 3: {name} --help does not document --max-line-bytes and its default")

    # a JSONL line is refused at its first byte when that byte starts no JSON object: a pipe
    # with an endless line is left at once (a pipe buffer or two read, not the limit's 64 MiB)
    for name in ("tokenize --chat", "generate"):
        fifo = os.path.join(tmp, "endless.jsonl")
        if os.path.exists(fifo):
            os.remove(fifo)
        os.mkfifo(fifo)
        written = [0]

        def feed():
            try:
                with open(fifo, "wb") as f:
                    block = b" " + b"a" * (MiB - 1)
                    while written[0] < 512 * MiB:
                        f.write(block)
                        written[0] += len(block)
            except (BrokenPipeError, OSError):
                pass

        th = threading.Thread(target=feed, daemon=True)
        th.start()
        rc, err, _, _ = run_measured(commands(fifo)[name], 120)
        if th.is_alive():  # the command never opened the pipe: let the writer go
            try:
                fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass
        th.join(10)
        refused(f"item 3: {name}, a JSONL line of 'a'", rc, err, ["endless.jsonl:1:2", "'{'"])
        ck.check(written[0] < 16 * MiB, f"item 3: {name}: {written[0] / MiB:.0f} MiB of a line that cannot be JSON "
                                        f"were read before the error")
        os.remove(fifo)
    # with --skip-bad-lines such a line is skipped and the next one read
    skip = write("skip.jsonl", "aaa not json\n" + "\n".join(conv(i) for i in range(8)) + "\n")
    out, err, rc = common.run([D, "tokenize", target, "--chat", skip, "--skip-bad-lines"], expect_rc=None)
    ck.check(rc == 0 and len(out.splitlines()) == 8 and "1 bad line" in err,
             f"item 3: --skip-bad-lines over a line that is not an object: rc {rc}, "
             f"{len(out.splitlines())} lines: {err.strip()[-800:]}")

    # ------------------------------------------------------------ item 8: duplicate keys
    ok_lines = [conv(i) for i in range(8)]
    m = '[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]'
    dup_top = ok_lines[:1] + ['{"messages": ' + m + ', "messages": 5}'] + ok_lines[2:]
    dup_nested = ok_lines[:3] + ['{"messages": [{"role": "user", "content": "a"}, '
                                 '{"role": "assistant", "content": "b", "content": "c"}]}'] + ok_lines[4:]
    dup_share = ok_lines[:1] + ['{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], '
                                '"system": "s", "system": "t"}'] + ok_lines[2:]
    cases = [("dup-top.jsonl", dup_top, ["dup-top.jsonl:2", "'messages'"]),
             ("dup-nested.jsonl", dup_nested, ["dup-nested.jsonl:4", "'content'", "messages[1]"]),
             ("dup-share.jsonl", dup_share, ["dup-share.jsonl:2", "'system'"])]
    for fname, ls, needles in cases:
        p = write(fname, "\n".join(ls) + "\n")
        for name, cmd in commands(p).items():
            _, err, rc = common.run(cmd, expect_rc=None)
            refused(f"item 8: {name} {fname}", rc, err, needles + ["twice"])

    # ------------------------------------------------------------ item 9: one reader for prompts
    prompts = [json.dumps({"prompt": p}) for p in ("def main(", "import os", "class Foo:", "for i in range(")]
    plain = write("prompts.jsonl", "\n".join(prompts) + "\n")
    gz = os.path.join(tmp, "prompts.jsonl.gz")
    with gzip.open(gz, "wb") as f:
        f.write(open(plain, "rb").read())
    zst = os.path.join(tmp, "prompts.jsonl.zst")
    subprocess.run(["zstd", "-q", "-f", plain, "-o", zst], check=True)
    txt = write("prompts.txt", "def main(\nimport os\n")
    txt_gz = os.path.join(tmp, "prompts.txt.gz")
    with gzip.open(txt_gz, "wb") as f:
        f.write(open(txt, "rb").read())
    for name in ("generate", "speculate"):
        want, err, rc = common.run(commands(plain, ["--max-new-tokens", "6"])[name], expect_rc=None)
        ck.check(rc == 0 and len(want.splitlines()) == len(prompts), f"item 9: {name} plain prompts: rc {rc}: {err}")
        for p in (gz, zst):
            got, err, rc = common.run(commands(p, ["--max-new-tokens", "6"])[name], expect_rc=None)
            ck.check(rc == 0 and got == want, f"item 9: {name} --data {os.path.basename(p)}: rc {rc}, output "
                                              f"{got[:200]!r} != the plain file's {want[:200]!r}: {err.strip()[-800:]}")
        want, _, rc = common.run(commands(txt, ["--max-new-tokens", "6"])[name], expect_rc=None)
        got, err, rc2 = common.run(commands(txt_gz, ["--max-new-tokens", "6"])[name], expect_rc=None)
        ck.check(rc == 0 and rc2 == 0 and got == want and len(got.splitlines()) == 2,
                 f"item 9: {name} --data prompts.txt.gz: rc {rc2}, {got[:200]!r} != {want[:200]!r}: {err[-800:]}")
    bad_utf8 = write("bad-utf8.txt", b"def main(\nimport \xff os\n")
    bad_json = write("bad-utf8.jsonl", b'{"prompt": "def main("}\n{"prompt": "x \xc3"}\n')
    for name in ("generate", "speculate", "calibrate"):
        _, err, rc = common.run(commands(bad_utf8)[name], expect_rc=None)
        refused(f"item 9: {name} invalid UTF-8 in a text prompt", rc, err, ["bad-utf8.txt:2:8", "UTF-8"])
        _, err, rc = common.run(commands(bad_json)[name], expect_rc=None)
        refused(f"item 9: {name} invalid UTF-8 in a JSONL prompt", rc, err, ["bad-utf8.jsonl:2:", "UTF-8"])

    # ------------------------------------------------------------ item 10: no record at all
    for fname, data in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n\t\n"), ("empty.txt", ""),
                        ("empty.jsonl.gz", gzip.compress(b""))):
        p = write(fname, data)
        for name, cmd in commands(p).items():
            out, err, rc = common.run(cmd, expect_rc=None)
            refused(f"item 10: {name} --data {fname}", rc, err, [fname])

    ck.finish("test_hardening_data")


if __name__ == "__main__":
    main()

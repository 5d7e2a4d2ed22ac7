"""Running llama.cpp's programs beside dspark: where they are, and what they print, parsed.

Shared by the llama.cpp decoding test (tests/conformance/test_llama_cpp_decode.py) and the
benchmark against llama.cpp (bench/llama_cpp_peer.py). The programs are those that
`scripts/setup_llama_cpp.sh --build` makes from the llama.cpp source vendored in
llama-cpp-python 0.3.36 (llama-simple, llama-speculative-simple, llama-bench, llama-tokenize,
llama-quantize). Every run is a subprocess whose peak resident set comes from wait4."""
import json
import os
import re
import subprocess
import time

VERSION = "0.3.36"
PROGRAMS = ("llama-simple", "llama-speculative-simple", "llama-bench", "llama-tokenize", "llama-quantize")


def cache_dir():
    return os.environ.get("DSPARK_LLAMA_CPP", os.path.expanduser("~/.cache/dspark/llama.cpp"))


def source_dir():
    """The vendored llama.cpp source (its converter, gguf-py), or None when it is not unpacked."""
    d = os.path.join(cache_dir(), f"llama_cpp_python-{VERSION}", "vendor", "llama.cpp")
    return d if os.path.isfile(os.path.join(d, "convert_hf_to_gguf.py")) else None


def bin_dir():
    """The folder of the built programs, or None when one of them is missing."""
    d = os.path.join(cache_dir(), f"build-{VERSION}", "bin")
    return d if all(os.access(os.path.join(d, p), os.X_OK) for p in PROGRAMS) else None


def smollm2_gguf():
    p = os.environ.get("DSPARK_SMOLLM2_GGUF",
                       os.path.expanduser("~/.cache/dspark/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    return p if os.path.isfile(p) else None


class Run:
    """A finished program: stdout, stderr, exit code, wall seconds, peak RSS in MiB."""

    def __init__(self, cmd, out, err, rc, seconds, rss_mib):
        self.cmd, self.out, self.err, self.rc, self.seconds, self.rss_mib = cmd, out, err, rc, seconds, rss_mib

    def must(self):
        if self.rc:
            raise RuntimeError(f"{' '.join(map(str, self.cmd))} exited {self.rc}:\n{self.err[-3000:]}")
        return self


def run(cmd, env=None):
    """Runs cmd to the end; its own peak RSS from wait4 (output through temporary files)."""
    import tempfile
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen([str(c) for c in cmd], stdout=fo, stderr=fe, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        seconds = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        return Run(cmd, fo.read().decode("utf-8", "replace"), fe.read().decode("utf-8", "replace"), p.returncode,
                   seconds, ru.ru_maxrss / 1024.0)


def quantize(bins, src, dst, qtype, threads=2):
    """The same weights as src in another GGUF type (llama-quantize dequantizes src first)."""
    if not os.path.isfile(dst):
        run([os.path.join(bins, "llama-quantize"), "--allow-requantize", src, dst + ".part", qtype,
                 str(threads)]).must()
        os.replace(dst + ".part", dst)
    return dst


def tokenize(bins, model, text):
    """llama.cpp's ids of text (special tokens parsed, BOS as the model's metadata says)."""
    r = run([os.path.join(bins, "llama-tokenize"), "-m", model, "-p", text, "--ids", "--log-disable"]).must()
    return json.loads(r.out.strip().splitlines()[-1])


def after_prompt(stdout, prompt):
    """The generated text: what the program printed after echoing the prompt (both programs echo
    it piece by piece, so the echo equals the prompt text when it holds no BOS the model adds)."""
    i = stdout.find(prompt)
    if i < 0:
        raise RuntimeError("llama.cpp's output does not echo the prompt")
    return stdout[i + len(prompt):]


def plain(bins, model, prompt, n):
    """llama-simple: greedy decoding of n tokens (stops at an end-of-generation token). The text."""
    r = run([os.path.join(bins, "llama-simple"), "-m", model, "-n", str(n), prompt]).must()
    return after_prompt(r.out, prompt).rstrip("\n"), r


def _stat(err, name, cast=float):
    m = re.search(rf"\b{name}\s*=\s*([0-9.]+)", err)
    return cast(m.group(1)) if m else None


def speculative(bins, model, draft, prompt, n, threads, n_max, spec_type="draft-dspark"):
    """llama-speculative-simple, greedy, the draft proposing n_max tokens a round (no confidence
    cut-off). Returns (text, stats, run): stats holds drafted, accepted, decoded tokens/s."""
    cmd = [os.path.join(bins, "llama-speculative-simple"), "-m", model, "-md", draft, "--spec-type", spec_type,
           "-p", prompt, "-n", str(n), "-t", str(threads), "-td", str(threads), "--temp", "0",
           "--spec-draft-p-min", "0", "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", str(n_max),
           "-c", "4096"]
    r = run(cmd).must()
    dec = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds", r.err)
    stats = {"drafted": _stat(r.err, "n_drafted", int), "accepted": _stat(r.err, "n_accept", int),
             "decoded": int(dec.group(1)) if dec else None,
             "decode_tokens_per_s": int(dec.group(1)) / float(dec.group(2)) if dec else None}
    # the program prints the prompt, the generated text, then two newlines
    text = after_prompt(r.out, prompt)
    return text.rstrip("\n"), stats, r


def bench(bins, model, threads, n_prompt, n_gen, reps=3):
    """llama-bench: prefill (pp n_prompt) and decode (tg n_gen) tokens/s: mean, stddev and the best
    repetition (the figure compared with dspark's best process of as many)."""
    r = run([os.path.join(bins, "llama-bench"), "-m", model, "-t", str(threads), "-p", str(n_prompt),
                 "-n", str(n_gen), "-r", str(reps), "-o", "json"]).must()
    rows = json.loads(r.out)
    res = {}
    for row in rows:
        key = "prefill" if row.get("n_prompt") else "decode"
        res[key] = (row["avg_ts"], row["stddev_ts"], max(row.get("samples_ts") or [row["avg_ts"]]))
    res["cpu"] = rows[0].get("cpu_info") if rows else None
    res["backend"] = rows[0].get("backends") if rows else None
    return res, r


def bench_depth(bins, model, threads, n_gen, depth, reps=3):
    """llama-bench's decode of n_gen tokens after depth tokens of context (-d: the prompt is
    processed first and its keys and values read by every decode step): the best repetition's
    tokens/s."""
    r = run([os.path.join(bins, "llama-bench"), "-m", model, "-t", str(threads), "-p", "0", "-n", str(n_gen),
             "-d", str(depth), "-r", str(reps), "-o", "json"]).must()
    rows = [row for row in json.loads(r.out) if row.get("n_gen")]
    return max(max(row.get("samples_ts") or [row["avg_ts"]]) for row in rows)

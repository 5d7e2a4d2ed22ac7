"""A .gguf file wherever a model directory is taken: every command given MODEL.gguf gives, to the
bit, what it gives with the directory `dspark convert --dtype f32` writes from the same file (with
`--weights f32` where a command takes it), and writes nothing beside the file.

- tiny Llama (tied head, its q / k rows interleaved as llama.cpp writes them), Qwen2 (q / k / v
  biases) and Qwen3 (q / k norms) models, 3 layers, written to GGUF by test_gguf_convert's writer
  in quantized types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16): `forward` logits, `generate` ids
  (greedy; and a chat prompt's text), `tokenize` ids (text, and a conversation through the
  file's chat template), `capture` (shards and copies identical, the manifests' hashes equal, the
  cache's copies of config.json / tokenizer.json byte-identical to the converted files: the texts
  a .gguf gives are the files convert writes), a few `train` steps online (the same losses and
  checkpoint; run.json names the .gguf as given), `train --cache` from the directory's cache with
  `--target FILE.gguf` (accepted: the hashes agree), `distill --teacher / --student FILE.gguf`,
  `speculate` with the trained draft, `regenerate` on 2 conversations, `info --tensors`; and each
  file's quantized matrices used in place (`--weights as-stored`) against fp32 in the prefill
  regime, equal up to summation order (llama's q / k rows used in the file's order);
- refusals: an output over the .gguf (a file output, and a directory output holding it), a
  regular file that is not a GGUF (named as such), a GGUF of another architecture or tokenizer
  model (named by key, as convert names it);
- the real SmolLM2-135M-Instruct Q4_1 file when the set-up has fetched it (DSPARK_SMOLLM2_GGUF or
  the cache folder; skipped with a message otherwise): `forward` on a few tokens, 4 greedy tokens,
  and its texts byte-identical to the converted files (a one-sequence capture's copies)."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import test_gguf_convert as conv  # noqa: E402

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

# The commands whose default (--weights as-stored) runs a GGUF's quantized matrices in place
# (test_quant_target and test_weights_capture_distill check those); here they run with
# --weights f32, what the directory holds.
WEIGHTS_COMMANDS = ("generate", "forward", "speculate", "regenerate", "calibrate", "profile", "info", "capture",
                    "distill")
TIMING = ("tokens_per_s", "elapsed_s", "peak_rss_mib", "elapsed", "seconds")
CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Wie geht's? def f(x):"},
        {"role": "assistant", "content": "Gut."}, {"role": "user", "content": "And you?"}]


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def listing(d):
    return sorted(os.listdir(d))


class Pair:
    """Runs one command twice, with the .gguf and with its converted directory, and compares."""

    def __init__(self, args, ck, label, gguf_path, conv_dir, tmp):
        self.args, self.ck, self.label, self.g, self.d, self.tmp = args, ck, label, gguf_path, conv_dir, tmp

    def run(self, cmd, expect_rc=0):
        if cmd[0] in WEIGHTS_COMMANDS and self.g in cmd:
            cmd = cmd + ["--weights", "f32"]  # as the directory: the default keeps quantized types in place
        r = subprocess.run([self.args.dspark] + cmd, capture_output=True, text=True, timeout=900)
        if expect_rc is not None and r.returncode != expect_rc:
            raise SystemExit(f"{self.label}: {' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-3000:]}")
        return r

    def both(self, make):
        """make(model, tag) -> argv; returns the two results (gguf first)."""
        return self.run(make(self.g, "g")), self.run(make(self.d, "d"))

    def out(self, name, tag):
        p = os.path.join(self.tmp, f"{self.label}-{name}-{tag}")
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
        return p

    def same(self, a, b, what):
        return self.ck.check(a == b, f"{self.label}: {what} differs between the .gguf and its converted directory\n"
                                     f"  gguf: {str(a)[:400]}\n  dir:  {str(b)[:400]}")


def train_lines(run_dir):
    out = []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        j = json.loads(line)
        for k in TIMING:
            j.pop(k, None)
        out.append(j)
    return out


def check_model(p, data, chat_data, mask_id, heavy=True, new_tokens=6):
    """The commands on one model; heavy=False keeps the quick ones (forward, generate, tokenize)."""
    ck, T = p.ck, p.label
    # forward: the logits and the captured layers, to the bit
    fw = {}
    for m, tag in ((p.g, "g"), (p.d, "d")):
        fw[tag] = p.out("forward.safetensors", tag)
        p.run(["forward", m, "--ids", "5,17,3,99,42,7;8,9,10", "--out", fw[tag], "--capture", "0", "--threads", "2"])
    p.same(sha(fw["g"]), sha(fw["d"]), "forward's output file")

    # generate: greedy ids, and a chat prompt rendered by the file's template
    a, b = p.both(lambda m, t: ["generate", m, "--prompt-ids", "5,17,3", "--max-new-tokens", str(new_tokens),
                                "--print-ids", "--ignore-eos", "--threads", "2"])
    p.same(a.stdout, b.stdout, "generate's greedy ids")
    ck.check(len(a.stdout.split()) == new_tokens, f"{T}: generate gave {a.stdout!r}")
    if heavy:
        a, b = p.both(lambda m, t: ["generate", m, "--prompt", "Hello there", "--chat", "--max-new-tokens", "5",
                                    "--threads", "2"])
        p.same(a.stdout, b.stdout, "generate's chat text")

    # tokenize: text ids and a conversation through the chat template
    a, b = p.both(lambda m, t: ["tokenize", m, "--text", conv.TEXT])
    p.same(a.stdout, b.stdout, "tokenize's ids")
    a, b = p.both(lambda m, t: ["tokenize", m, "--chat", chat_data, "--add-generation-prompt", "--show-text"])
    p.same(a.stdout, b.stdout, "tokenize --chat's ids and text")
    ck.check("<|im_start|>assistant" in a.stdout, f"{T}: the chat template of the file was not used: {a.stdout[:300]}")
    if not heavy:
        return

    # info: the same tensors (names, dtypes, shapes)
    a, b = p.both(lambda m, t: ["info", m, "--tensors"])
    p.same([x for x in a.stdout.splitlines() if x.startswith("  ")],
           [x for x in b.stdout.splitlines() if x.startswith("  ")], "info --tensors")
    ck.check(p.g in a.stdout and "GGUF" in a.stdout, f"{T}: info does not name the .gguf: {a.stdout[:200]}")

    # capture: the same cache; the manifest records the target as given
    cap = {}
    for m, tag in ((p.g, "g"), (p.d, "d")):
        cap[tag] = p.out("cache", tag)
        p.run(["capture", "--target", m, "--data", data, "--data-format", "text", "--seq-len", "32",
               "--target-layer-ids", "0,1", "--dtype", "f32", "--topk", "4", "--shard-size", "4", "--out", cap[tag],
               "--quiet", "--threads", "2"])
    files = [f for f in listing(cap["d"]) if f not in (".lock", "manifest.json")]
    p.same(files, [f for f in listing(cap["g"]) if f not in (".lock", "manifest.json")], "the cache's files")
    p.same({f: sha(os.path.join(cap["g"], f)) for f in files}, {f: sha(os.path.join(cap["d"], f)) for f in files},
           "the cache's files' bytes (shards, target weights, copies)")
    mg = json.load(open(os.path.join(cap["g"], "manifest.json")))
    md = json.load(open(os.path.join(cap["d"], "manifest.json")))
    ck.check(mg["target_path"] == p.g and md["target_path"] == p.d, f"{T}: manifests' target_path {mg['target_path']}")
    for k in ("target_weights_xxh64", "target_config_xxh64", "tokenizer_xxh64", "chat_template_xxh64"):
        ck.check(k in mg and mg[k] == md[k], f"{T}: manifest {k}: {mg.get(k)} vs {md.get(k)}")
    drop = ("target_path", "manifest_xxh64")
    p.same({k: v for k, v in mg.items() if k not in drop}, {k: v for k, v in md.items() if k not in drop},
           "the manifest (but target_path)")
    # the texts a .gguf gives are the files convert writes, byte for byte
    for copy, name in (("target_config.json", "config.json"), ("tokenizer.json", "tokenizer.json")):
        p.same(sha(os.path.join(cap["g"], copy)), sha(os.path.join(p.d, name)), f"{name} (the .gguf's text)")

    # train online: the same losses and checkpoint; run.json names the .gguf as given
    train = ["--data", data, "--data-format", "text", "--seq-len", "32", "--target-layer-ids", "0,1",
             "--num-anchors", "4", "--block-size", "3", "--markov-rank", "8", "--steps", "3", "--batch-seqs", "2",
             "--eval-every", "0", "--eval-seqs", "1", "--save-every", "3", "--mask-token-id", str(mask_id),
             "--lr", "3e-3", "--seed", "1", "--quiet", "--threads", "2"]
    run = {}
    for m, tag in ((p.g, "g"), (p.d, "d")):
        run[tag] = p.out("run", tag)
        p.run(["train", "--target", m, "--out", run[tag]] + train)
    p.same(train_lines(run["g"]), train_lines(run["d"]), "train's metrics (losses)")
    p.same(sha(os.path.join(run["g"], "checkpoint.safetensors")), sha(os.path.join(run["d"], "checkpoint.safetensors")),
           "train's checkpoint")
    ck.check(json.load(open(os.path.join(run["g"], "run.json"))).get("target") == p.g,
             f"{T}: run.json does not record the .gguf as given")
    # train --cache: the directory's cache accepts the .gguf as its target (the hashes agree), and
    # an f32 cache trains as online
    rc = p.out("run-cache", "g")
    p.run(["train", "--cache", cap["d"], "--target", p.g, "--out", rc] + train)
    p.same(train_lines(rc), train_lines(run["d"]), "train --cache --target FILE.gguf's metrics")
    # and with --draft-vocab (its stop ids come from the named target): the same vocabulary and run
    rv = {}
    for m, tag in ((p.g, "g"), (p.d, "d")):
        rv[tag] = p.out("run-cache-vocab", tag)
        p.run(["train", "--cache", cap["d"], "--target", m, "--out", rv[tag], "--draft-vocab", "24"] + train)
    vocab = [json.load(open(os.path.join(rv[t], "run.json"))).get("draft_vocab_xxh64") for t in ("g", "d")]
    ck.check(vocab[0] is not None and vocab[0] == vocab[1], f"{T}: train --cache --draft-vocab: S {vocab}")
    p.same(train_lines(rv["g"]), train_lines(rv["d"]), "train --cache --target FILE.gguf --draft-vocab's metrics")

    # distill: teacher and student from the file
    dist = {}
    for m, tag in ((p.g, "g"), (p.d, "d")):
        dist[tag] = p.out("distill", tag)
        p.run(["distill", "--teacher", m, "--student", m, "--out", dist[tag], "--data", data, "--data-format", "text",
               "--seq-len", "32", "--steps", "2", "--batch-seqs", "2", "--eval-seqs", "1", "--eval-every", "0",
               "--save-every", "2", "--topk", "4", "--kd-loss-alpha", "0.5", "--lr", "1e-3", "--quiet", "--threads", "2"])
    p.same(train_lines(dist["g"]), train_lines(dist["d"]), "distill's metrics (losses)")

    # speculate with the draft trained above
    a, b = p.both(lambda m, t: ["speculate", "--target", m, "--draft", run["g"], "--prompt-ids", "5,17,3,99",
                                "--max-new-tokens", "8", "--print-ids", "--ignore-eos", "--threads", "2", "--policy", "fixed"])
    p.same(a.stdout, b.stdout, "speculate's ids")
    a, b = p.both(lambda m, t: ["speculate", "--target", m, "--draft", run["g"], "--prompt", "Hello there", "--chat",
                                "--max-new-tokens", "6", "--threads", "2", "--policy", "fixed"])
    p.same(a.stdout, b.stdout, "speculate's chat text")

    # regenerate: 2 conversations answered by the target
    reg = {}
    for m, tag in ((p.g, "g"), (p.d, "d")):
        reg[tag] = p.out("regen.jsonl", tag)
        p.run(["regenerate", "--target", m, "--data", chat_data, "--out", reg[tag], "--max-new-tokens", "6",
               "--threads", "1"])
    lines = open(reg["g"]).read().splitlines()
    ck.check(len(lines) == 2, f"{T}: regenerate wrote {len(lines)} lines")
    p.same(open(reg["g"]).read(), open(reg["d"]).read(), "regenerate's output")


def refusals(args, ck, tmp, g, d):
    src_dir = os.path.dirname(g)
    before = sha(g)

    def run(cmd):
        return subprocess.run([args.dspark] + cmd, capture_output=True, text=True, timeout=300)

    r = run(["forward", g, "--ids", "1,2", "--out", g])
    ck.check(r.returncode == 2 and "refusing" in r.stderr and sha(g) == before, f"forward --out over the .gguf: "
             f"rc {r.returncode} {r.stderr!r}")
    r = run(["capture", "--target", g, "--data", os.path.join(tmp, "data.txt"), "--out", src_dir, "--seq-len", "32"])
    ck.check(r.returncode == 2 and "refusing" in r.stderr and sha(g) == before,
             f"capture --out the folder holding the .gguf: rc {r.returncode} {r.stderr!r}")
    r = run(["train", "--target", g, "--data", os.path.join(tmp, "data.txt"), "--out", src_dir, "--steps", "1",
             "--overwrite"])
    ck.check(r.returncode == 2 and "refusing" in r.stderr and sha(g) == before and listing(src_dir) == ["model.gguf"],
             f"train --out the folder holding the .gguf: rc {r.returncode} {r.stderr!r}")
    notes = os.path.join(tmp, "notes.txt")
    with open(notes, "w") as f:
        f.write("not a model\n")
    for cmd in (["generate", notes, "--prompt-ids", "1"], ["forward", notes, "--ids", "1", "--out",
                                                           os.path.join(tmp, "x.safetensors")],
                ["train", "--target", notes, "--data", notes, "--out", os.path.join(tmp, "run-notes")],
                ["info", notes]):
        r = run(cmd)
        ck.check(r.returncode in (1, 2) and notes in r.stderr and "not a GGUF file" in r.stderr,
                 f"{cmd[0]} on a text file: rc {r.returncode} {r.stderr!r}")
    # a GGUF the engine does not reproduce is refused by key, as convert refuses it
    reader = gguf.GGUFReader(g)
    for key, value, words in (("general.architecture", "gpt2", ["general.architecture", "gpt2"]),
                              ("tokenizer.ggml.model", "llama", ["tokenizer.ggml.model", "llama"])):
        bad = os.path.join(tmp, "bad-model.gguf")
        w = gguf.GGUFWriter(bad, "llama")
        for f in reader.fields.values():
            if f.name.startswith("GGUF.") or f.name in ("general.architecture", key):
                continue
            sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
        if key == "general.architecture":
            w.kv_data[0].pop(key, None)
        w.add_key_value(key, value, gguf.GGUFValueType.STRING)
        for t in reader.tensors:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        for cmd in (["generate", bad, "--prompt-ids", "1"], ["tokenize", bad, "--text", "hi"]):
            r = run(cmd)
            ck.check(r.returncode == 1 and all(x in r.stderr for x in words), f"{cmd[0]} on a GGUF with {key} "
                     f"{value}: rc {r.returncode} {r.stderr!r}")
    print("refusals: outputs over the .gguf, a text file, another architecture / tokenizer model")


def in_place_prefill(args, ck, arch, model, tokens, merges, pre, tmp):
    """The model written again with every matrix in a type used in place (Q4_0, Q8_0, Q4_1), its
    matrices used in place against the file dequantized to fp32 at load, in the prefill regime of
    `--compute fp32` (40 rows: dequantized chunks into the fp32 GEMM): equal up to summation order;
    the default compute (the integer path at every row count) gives `--compute int8`'s logits bit for
    bit. On llama the q / k
    rows stay in the file's interleaved order and the product's columns are put back, so a wrong
    reordering shows here without the real model."""
    g = os.path.join(tmp, f"in-place-{arch}.gguf")
    conv.write_gguf(model, arch, tokens, merges, g, pre, [Q.Q4_0, Q.Q8_0, Q.Q4_1, Q.Q5_0, Q.Q5_1])
    info = common.run([args.dspark, "info", g])[0]
    held = info.split("used in place")[0]
    ck.check(all(t in held for t in ("Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q5_1")),
             f"{arch}: the in-place file's matrices are not all held quantized:\n{info}")
    ids = ",".join(str((5 + 37 * i) % len(tokens)) for i in range(40))
    logits = {}
    for tag, w, compute in (("as-stored", "as-stored", ["--compute", "fp32"]), ("f32", "f32", []),
                            ("default", "as-stored", []), ("int8", "as-stored", ["--compute", "int8"])):
        out = os.path.join(tmp, f"{arch}-in-place-{tag}.safetensors")
        # an fp32 KV cache on every side (as stored the default is f16): the weights' path alone
        common.run([args.dspark, "forward", g, "--ids", ids, "--out", out, "--weights", w, "--threads", "2",
                    "--kv-cache", "f32"] + compute)
        logits[tag] = load_file(out)["logits.0"].astype(np.float64)
    ck.check(np.array_equal(logits["default"], logits["int8"]), f"{arch}: the default compute is not --compute int8")
    err = np.linalg.norm(logits["as-stored"] - logits["f32"]) / np.linalg.norm(logits["f32"])
    ck.check(err <= 1e-4, f"{arch}: quantized matrices in place give logits {err:.2e} from the fp32 model's (<= 1e-4)")
    return err


def check_tiny(args, ck, tmp):
    tokens, merges = conv.train_tokenizer(tmp)
    V, eos = len(tokens), tokens.index("<|im_end|>")  # noqa: N806
    data = common.stdlib_text(os.path.join(tmp, "data.txt"), 60, 61)
    with open(data, "r+") as f:  # a few dozen 32-token sequences are enough
        text = f.read()[:6000]
        f.seek(0)
        f.truncate()
        f.write(text)
    chat_data = os.path.join(tmp, "chat.jsonl")
    with open(chat_data, "w") as f:
        f.write(json.dumps({"messages": CONV}) + "\n")
        f.write(json.dumps({"messages": [{"role": "user", "content": "with open("}]}) + "\n")
    cases = [("llama", dict(tied=True), "smollm", [Q.Q8_0, Q.Q4_0, Q.Q5_1, Q.F16]),
             ("qwen2", dict(), "qwen2", [Q.Q4_1, Q.Q5_0, Q.BF16, Q.Q8_0]),
             ("qwen3", dict(head_dim=128), "qwen2", [Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.F16])]
    first = None
    for arch, kw, pre, types in cases:
        model = common.build_tiny_model(arch, os.path.join(tmp, f"hf-{arch}"), seed=7, vocab_size=V, eos_token_id=eos,
                                        bos_token_id=eos - 1, num_hidden_layers=3, intermediate_size=96,
                                        num_attention_heads=4, num_key_value_heads=2, hidden_size=64, **kw)
        src_dir = os.path.join(tmp, f"src-{arch}")
        os.makedirs(src_dir, exist_ok=True)
        g = os.path.join(src_dir, "model.gguf")
        conv.write_gguf(model, arch, tokens, merges, g, pre, types)
        d = os.path.join(tmp, f"converted-{arch}")
        shutil.rmtree(d, ignore_errors=True)
        common.run([args.dspark, "convert", g, "--out", d, "--dtype", "f32"])
        seen, t0 = listing(src_dir), time.time()
        check_model(Pair(args, ck, arch, g, d, tmp), data, chat_data, tokens.index("<|endoftext|>"))
        ck.check(listing(src_dir) == seen, f"{arch}: files appeared beside the .gguf: {listing(src_dir)}")
        err = in_place_prefill(args, ck, arch, model, tokens, merges, pre, tmp)
        print(f"{arch}: forward, generate, tokenize, info, capture, train (online and --cache), distill, speculate "
              f"and regenerate agree between the .gguf and its converted directory ({time.time() - t0:.0f} s); "
              f"in place {err:.1e} from fp32", flush=True)
        first = first or (g, d)
    refusals(args, ck, tmp, *first)


def check_16bit(args, ck, tmp):
    """A GGUF of F16 or BF16 matrices runs them in place under --weights as-stored (the 16-bit
    path a directory's BF16 / F16 weights take): the same values as --weights f32, every product
    accumulated in fp32, so logits and greedy ids agree up to fp32 summation order."""
    from safetensors.numpy import load_file
    tokens, merges = conv.train_tokenizer(tmp)
    V, eos = len(tokens), tokens.index("<|im_end|>")  # noqa: N806
    for arch, qt, name in (("llama", Q.F16, "F16"), ("qwen2", Q.BF16, "BF16")):
        model = common.build_tiny_model(arch, os.path.join(tmp, f"hf16-{arch}"), seed=9, vocab_size=V, eos_token_id=eos,
                                        bos_token_id=eos - 1, num_hidden_layers=2, intermediate_size=96,
                                        num_attention_heads=4, num_key_value_heads=2, hidden_size=64)
        g = os.path.join(tmp, f"model16-{arch}.gguf")
        conv.write_gguf(model, arch, tokens, merges, g, "smollm" if arch == "llama" else "qwen2", [qt])
        info, _, _ = common.run([args.dspark, "info", g])
        ck.check(f"{name} used in place" in info, f"{arch} {name}: info does not use the matrices in place:\n{info}")
        logits = {}
        for w in ("as-stored", "f32"):
            out = os.path.join(tmp, f"fw16-{arch}-{w}.safetensors")
            common.run([args.dspark, "forward", g, "--ids", "5,17,3,99,42,7;8,9,10", "--out", out, "--weights", w,
                        "--threads", "2"])
            logits[w] = load_file(out)
        for k in logits["f32"]:
            err = common.normwise_rel_err(logits["as-stored"][k], logits["f32"][k])
            ck.check(err < 1e-5, f"{arch} {name}: forward {k} as stored vs f32: {err:.2e}")
        ids = [common.run([args.dspark, "generate", g, "--prompt-ids", "5,17,3", "--max-new-tokens", "8", "--print-ids",
                           "--ignore-eos", "--weights", w, "--threads", "2"])[0] for w in ("as-stored", "f32")]
        ck.check(ids[0] == ids[1], f"{arch} {name}: greedy ids as stored {ids[0]!r}, f32 {ids[1]!r}")
    print("F16 / BF16 GGUF matrices run in place as stored: forward and greedy ids agree with --weights f32")


def check_smollm2(args, ck, tmp):
    path = os.environ.get("DSPARK_SMOLLM2_GGUF", conv.SMOLLM2_DEFAULT)
    if not os.path.exists(path):
        print(f"SmolLM2: {path} not fetched (scripts/setup.sh fetches it): its part is skipped")
        return
    d, t0 = os.path.join(tmp, "smollm2"), time.time()
    shutil.rmtree(d, ignore_errors=True)
    common.run([args.dspark, "convert", path, "--out", d, "--dtype", "f32"])
    chat_data = os.path.join(tmp, "smollm2-chat.jsonl")
    with open(chat_data, "w") as f:
        f.write(json.dumps({"messages": CONV}) + "\n")
    p = Pair(args, ck, "smollm2", path, d, tmp)
    check_model(p, None, chat_data, None, heavy=False, new_tokens=4)
    # its texts: a one-sequence capture copies them
    one = os.path.join(tmp, "smollm2-one.txt")
    with open(one, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog, then rests in the shade of a tree.\n")
    cache = p.out("cache", "g")
    p.run(["capture", "--target", path, "--data", one, "--data-format", "text", "--seq-len", "24", "--dtype", "f32",
           "--out", cache, "--quiet", "--threads", "2"])
    for copy, name in (("target_config.json", "config.json"), ("tokenizer.json", "tokenizer.json")):
        p.same(sha(os.path.join(cache, copy)), sha(os.path.join(d, name)), f"{name} (the .gguf's text)")
    shutil.rmtree(d, ignore_errors=True)  # 540 MB of fp32 weights
    print(f"smollm2: forward, generate, tokenize and its texts agree with the converted directory "
          f"({time.time() - t0:.0f} s)")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    check_tiny(args, ck, args.tmp)
    check_16bit(args, ck, args.tmp)
    check_smollm2(args, ck, args.tmp)
    ck.finish("test_gguf_direct")


if __name__ == "__main__":
    main()

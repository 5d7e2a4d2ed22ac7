"""`dspark capture` and `dspark distill`'s live teacher with `--weights as-stored|bf16|f32`
(docs/compute.md, "Quantized frozen weights"), on tiny llama GGUF files the test writes (a tied
Q8_0 embedding and head, every layer matrix in Q8_0, Q4_0, Q4_1, Q4_K or Q6_K; and the same model
with every matrix F32):

- capture, quantized file: `as-stored` (the default) and `f32` write the same identity (every
  hash, the copies of config.json and tokenizer.json, target_weights.safetensors byte for byte:
  a quantized table is stored dequantized, the values the target multiplies by) and
  `target_weights` "as-stored" / "f32" in the manifest; the features differ (the quantized
  kernels ran: every sample has at most 32 rows, the direct path that rounds x to 8 bits) by at
  most the documented 6e-2 normwise, and the KD top-K log-probs are within that bound of the fp32
  reference (computed here from the f32 cache's final hidden states and head), the top-1 id the
  same at >= 90% of the positions; `bf16` records "bf16" with the same identity (train --cache
  --target FILE.gguf accepts it);
- capture, F32 file: as-stored and f32 write the same cache, byte for byte (manifest included:
  "f32", as nothing is held in another type);
- a capture is resumed only with the weights it recorded (a changed --weights is refused naming
  target_weights); a manifest without the field (an older capture) is resumed by --weights f32 on
  a GGUF (what an older capture held) and refused otherwise; `inspect` prints it; `train --cache`
  records the cache's target_weights in run.json;
- distill, live teacher: run.json's teacher_weights says how the teacher ran; on the quantized
  file the losses of as-stored and f32 differ a little (the teacher's top-K), on the F32 file
  they are identical; a run is not resumed with the teacher's weights held otherwise; a student
  read from a .gguf is fp32 whatever --weights (--kd-loss-alpha 0: the same losses under bf16 and
  f32); `distill --cache` of a cache captured as stored records its weights and gives the live
  as-stored teacher's losses;
- refusals: a bad --weights value (capture, distill), and --weights with distill --cache."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cache_manifest  # noqa: E402
import common  # noqa: E402
import test_gguf_convert as conv  # noqa: E402

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

QUANT_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K]
TIMING = ("tokens_per_s", "elapsed_s", "peak_rss_mib", "elapsed", "seconds")
DECODE_BOUND = 6e-2  # docs/compute.md: the direct path (<= 32 rows, x rounded to int8) from the fp32 model


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def kquant_blocks(rng, qtype, rows, cols):
    """Raw Q4_K / Q6_K blocks (gguf.quants does not quantize them) of random codes whose scales give
    weights of the tiny model's magnitude (about 0.08), centred near zero."""
    bs, bb = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // bs
    raw = rng.integers(0, 256, size=(n, bb), dtype=np.uint8)
    if qtype == Q.Q4_K:  # d * sc * q - dmin * mn, sc, mn in 0..63, q in 0..15
        d = (np.abs(rng.standard_normal(n)) * 3e-4 + 1e-4).astype(np.float16)
        raw[:, 0:2] = d.view(np.uint8).reshape(n, 2)
        raw[:, 2:4] = (d * np.float16(7.5)).view(np.uint8).reshape(n, 2)
    else:  # Q6_K: d * scale * (q - 32), scale int8, q in 0..63
        d = (rng.standard_normal(n) * 8e-5).astype(np.float16)
        raw[:, 208:210] = d.view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // bs * bb)


def write_model(model, tokens, merges, path, types, seed):
    """test_gguf_convert's writer; the K-quant matrices get random blocks of their own."""
    rng = np.random.default_rng(seed)
    plain = gguf.quants.quantize

    def quantize(x, qtype):
        return kquant_blocks(rng, qtype, *x.shape) if qtype in (Q.Q4_K, Q.Q6_K) else plain(x, qtype)

    gguf.quants.quantize = quantize
    try:
        conv.write_gguf(model, "llama", tokens, merges, path, "smollm", types)
    finally:
        gguf.quants.quantize = plain


class Env:
    def __init__(self, args, ck, data):
        self.args, self.ck, self.data, self.tmp = args, ck, data, args.tmp

    def run(self, cmd, expect_rc=0):
        r = subprocess.run([self.args.dspark] + cmd, capture_output=True, text=True, timeout=900)
        if expect_rc is not None and r.returncode != expect_rc:
            raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}, expected {expect_rc}\n{r.stderr[-3000:]}")
        return r

    def fresh(self, name):
        p = os.path.join(self.tmp, name)
        shutil.rmtree(p, ignore_errors=True)
        return p

    def capture(self, g, out, weights, expect_rc=0, fresh=True):
        out = self.fresh(out) if fresh else os.path.join(self.tmp, out)
        cmd = ["capture", "--target", g, "--data", self.data, "--data-format", "text", "--seq-len", "64",
               "--target-layer-ids", "0,1", "--dtype", "f32", "--topk", "8", "--shard-size", "16", "--out", out,
               "--quiet"] + (weights if isinstance(weights, list) else ["--weights", weights] if weights else [])
        return out, self.run(cmd, expect_rc)

    def distill(self, g, out, weights, extra=(), expect_rc=0, fresh=True, seq_len=32, teacher=True):
        out = self.fresh(out) if fresh else os.path.join(self.tmp, out)
        source = ["--teacher", g, "--data", self.data, "--data-format", "text"] if teacher else []
        cmd = ["distill"] + source + ["--student", g, "--out", out, "--seq-len", str(seq_len), "--steps", "2",
                                      "--batch-seqs", "2", "--eval-seqs", "1", "--eval-every", "0", "--save-every",
                                      "2", "--topk", "4", "--kd-loss-alpha", "0.5", "--lr", "1e-3", "--quiet"]
        cmd += list(extra)
        return out, self.run(cmd + (["--weights", weights] if weights else []), expect_rc)


def manifest(cache):
    return json.load(open(os.path.join(cache, "manifest.json")))


def shards(cache):
    """Every shard's tensors, concatenated in order."""
    m = manifest(cache)
    parts = [load_file(os.path.join(cache, s["file"])) for s in m["shards"]]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def metrics(run_dir):
    out = []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        j = json.loads(line)
        for k in TIMING:
            j.pop(k, None)
        out.append(j)
    return out


def run_json(run_dir):
    return json.load(open(os.path.join(run_dir, "run.json")))


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def check_quant_capture(env, g):
    ck = env.ck
    c_q, _ = env.capture(g, "cache-q", None)  # the default: as stored, the integer path at every row count
    c_q32, _ = env.capture(g, "cache-q32", ["--compute", "fp32"])  # as stored, many rows in fp32
    c_f, _ = env.capture(g, "cache-f", "f32")
    mq, mf = manifest(c_q), manifest(c_f)
    ck.check(mq.get("target_weights") == "as-stored" and mf.get("target_weights") == "f32",
             f"capture: target_weights {mq.get('target_weights')!r} / {mf.get('target_weights')!r}")
    same = ("manifest_xxh64", "target_weights", "shards")
    ck.check({k: v for k, v in mq.items() if k not in same} == {k: v for k, v in mf.items() if k not in same},
             "capture as-stored / f32: the manifests differ beyond target_weights and the shards")
    for f in ("target_weights.safetensors", "target_config.json", "tokenizer.json"):
        ck.check(sha(os.path.join(c_q, f)) == sha(os.path.join(c_f, f)), f"capture as-stored / f32: {f} differs")
    tw = load_file(os.path.join(c_f, "target_weights.safetensors"))
    ck.check(tw["lm_head.weight"].dtype == np.float32, f"target_weights.safetensors: {tw['lm_head.weight'].dtype}")

    sq, sf = shards(c_q), shards(c_f)
    lengths = sf["lengths"]
    ck.check(np.array_equal(sq["input_ids"], sf["input_ids"]), "capture as-stored / f32: other sequences")
    # features: under --compute fp32 a sample of more than 32 tokens runs the prefill regime (the
    # exact dequantized weights into the fp32 GEMM: f32's numbers up to summation order), a shorter
    # one the direct path (x rounded to int8 per block of 32), which the default takes for all
    s32 = shards(c_q32)
    long_ = lengths > 32
    ck.check(long_.sum() >= 4, f"the data gives {long_.sum()} samples of more than 32 tokens")
    errs = {}
    for k in ("target_hidden_states", "target_last_hidden_states"):
        errs[k] = common.normwise_rel_err(s32[k][long_], sf[k][long_])
        ck.check(errs[k] <= 1e-4, f"capture {k}: as-stored {errs[k]:.2e} from f32 in the prefill regime (<= 1e-4)")
        e = common.normwise_rel_err(sq[k], sf[k])
        ck.check(0 < e <= 2 * DECODE_BOUND, f"capture {k}: as-stored by default {e:.2e} from f32 (0 < err <= "
                 f"{2 * DECODE_BOUND})")
        if (~long_).any():
            ck.check(np.array_equal(s32[k][~long_], sq[k][~long_]),
                     f"capture {k}: short samples differ between the default and --compute fp32")
    # KD: the head's product runs 32 rows a call (the direct path). The documented bound per output
    # (docs/compute.md): |y - y_ref| <= sum over x's blocks of 32 of step / 2 * sum |w| over the
    # block, step = max |x| / 127, y_ref the exact product of the dequantized head (the cache's
    # table) and x (the run's own final hidden state); a log-prob moves by at most its logit's
    # error plus the largest one (the logsumexp).
    real = np.arange(sf["input_ids"].shape[1])[None, :] < lengths[:, None]
    head = tw["lm_head.weight"].astype(np.float64)
    V, d = head.shape  # noqa: N806
    rows = np.arange(int(real.sum()))[:, None]
    ids_f, lp_f = sf["topk_ids"][real], sf["topk_logprobs"][real]
    ids_q, lp_q = sq["topk_ids"][real], sq["topk_logprobs"][real]
    h_f = sf["target_last_hidden_states"][real].astype(np.float64)
    e_ref = float(np.max(np.abs(lp_f - log_softmax(h_f @ head.T)[rows, ids_f])))
    ck.check(e_ref <= 1e-4, f"KD: the f32 cache's log-probs are {e_ref:.2e} from numpy's (<= 1e-4)")
    h_q = sq["target_last_hidden_states"][real].astype(np.float64)
    y = h_q @ head.T
    step = np.abs(h_q).reshape(-1, d // 32, 32).max(-1) / 127
    dy = (step / 2) @ np.abs(head).reshape(V, d // 32, 32).sum(-1).T + 1e-5 * (1 + np.abs(y))  # + fp32 rounding
    over = np.abs(lp_q - log_softmax(y)[rows, ids_q]) - (dy[rows, ids_q] + dy.max(axis=1, keepdims=True))
    e_q = float(np.max(np.abs(lp_q - log_softmax(y)[rows, ids_q])))
    ck.check(0 < e_q and float(over.max()) <= 0, f"KD: as-stored top-K log-probs {e_q:.3e} from the exact product, "
             f"over the documented bound by {float(over.max()):.3e} (the quantized head ran: > 0)")
    top1 = float(np.mean(ids_q[:, 0] == ids_f[:, 0]))
    ck.check(top1 >= 0.9, f"KD: top-1 agreement with f32 {top1:.3f} (>= 0.9)")
    print(f"quantized capture: features {errs['target_hidden_states']:.2e} / {errs['target_last_hidden_states']:.2e} "
          f"normwise from f32 (prefill regime), KD log-probs {e_q:.3e} from the exact product (bound "
          f"{float(np.max(dy)):.3e} per logit), top-1 agreement with f32 {top1:.3f}", flush=True)

    # bf16: the same identity, its own target_weights; train --cache --target FILE.gguf accepts it
    c_b, _ = env.capture(g, "cache-b", "bf16")
    mb = manifest(c_b)
    ck.check(mb.get("target_weights") == "bf16", f"capture --weights bf16: target_weights {mb.get('target_weights')!r}")
    for k in ("target_weights_xxh64", "target_config_xxh64", "tokenizer_xxh64", "chat_template_xxh64"):
        ck.check(mb[k] == mf[k], f"capture --weights bf16: {k} {mb[k]} differs from f32's {mf[k]}")
    ck.check(sha(os.path.join(c_b, "target_config.json")) == sha(os.path.join(c_f, "target_config.json")),
             "capture --weights bf16: target_config.json differs from f32's")
    e_b = common.normwise_rel_err(shards(c_b)["target_last_hidden_states"], sf["target_last_hidden_states"])
    ck.check(0 < e_b <= 5e-2, f"capture --weights bf16: final hidden {e_b:.2e} from f32 (0 < e <= 5e-2)")
    print(f"capture --weights bf16: final hidden {e_b:.2e} normwise from f32", flush=True)
    train = ["--num-anchors", "4", "--block-size", "3", "--markov-rank", "8", "--steps", "2", "--batch-seqs", "2",
             "--eval-every", "0", "--eval-seqs", "1", "--save-every", "2", "--lr", "3e-3", "--quiet"]
    for cache, want in ((c_b, "bf16"), (c_q, "as-stored")):
        run = env.fresh(f"train-{want}")
        env.run(["train", "--cache", cache, "--target", g, "--out", run] + train)
        ck.check(run_json(run).get("target_weights") == want,
                 f"train --cache ({want}): run.json target_weights {run_json(run).get('target_weights')!r}")
    return c_q, c_f


def check_resume(env, g, c_q, c_f):
    ck = env.ck
    # a finished capture rerun with its own weights: complete; with others: refused by name
    _, r = env.capture(g, "cache-f", ["--weights=f32"], fresh=False)
    ck.check("already complete" in r.stderr or r.stderr == "", f"rerun of a finished capture: {r.stderr[-300:]}")
    _, r = env.capture(g, "cache-f", None, expect_rc=1, fresh=False)
    ck.check("target_weights" in r.stderr and '"f32" in the cache but "as-stored" in this run' in r.stderr,
             f"resume with other weights: {r.stderr[-500:]}")
    # a manifest written before the field: resumed by what an older capture held (a GGUF in fp32)
    old = env.fresh("cache-old")
    shutil.copytree(c_f, old)
    cache_manifest.edit(os.path.join(old, "manifest.json"), lambda j: j.pop("target_weights"))
    out, _, _ = common.run([env.args.dspark, "inspect", old])
    ck.check("weights held:      not recorded" in out, f"inspect of an older cache: {out[:800]}")
    env.capture(g, "cache-old", "f32", fresh=False)
    _, r = env.capture(g, "cache-old", "as-stored", expect_rc=1, fresh=False)
    ck.check("target_weights" in r.stderr and "absent (an older capture" in r.stderr,
             f"an older cache resumed as stored: {r.stderr[-500:]}")
    out, _, _ = common.run([env.args.dspark, "inspect", c_q])
    ck.check("weights held:      as-stored" in out, f"inspect: {out[:800]}")
    print("capture: resumed only with the weights its manifest records; inspect prints them", flush=True)


def check_f32_file(env, g):
    ck = env.ck
    a, _ = env.capture(g, "cache-f32file-q", "as-stored")
    b, _ = env.capture(g, "cache-f32file-f", "f32")
    files = sorted(f for f in os.listdir(b) if f != ".lock")
    ck.check(files == sorted(f for f in os.listdir(a) if f != ".lock"), "F32 file: the caches' files differ")
    ck.check({f: sha(os.path.join(a, f)) for f in files} == {f: sha(os.path.join(b, f)) for f in files},
             "F32 file: capture as-stored and f32 differ (the manifest's target_weights included)")
    ck.check(manifest(a).get("target_weights") == "f32",
             f"F32 file: target_weights {manifest(a).get('target_weights')}")
    ra, _ = env.distill(g, "distill-f32file-q", "as-stored")
    rb, _ = env.distill(g, "distill-f32file-f", "f32")
    ck.check(metrics(ra) == metrics(rb), "F32 file: distill as-stored and f32 losses differ")
    ck.check(run_json(ra).get("teacher_weights") == "f32" == run_json(rb).get("teacher_weights"),
             f"F32 file: teacher_weights {run_json(ra).get('teacher_weights')} / {run_json(rb).get('teacher_weights')}")
    print("F32 file: capture and distill identical under as-stored and f32", flush=True)


def check_quant_distill(env, g, c_q):
    ck = env.ck
    rq, _ = env.distill(g, "distill-q", None)
    rf, _ = env.distill(g, "distill-f", "f32")
    jq, jf = run_json(rq), run_json(rf)
    ck.check(jq.get("teacher_weights") == "as-stored" and jf.get("teacher_weights") == "f32",
             f"distill: teacher_weights {jq.get('teacher_weights')!r} / {jf.get('teacher_weights')!r}")
    mq, mf = metrics(rq), metrics(rf)
    ck.check(len(mq) == len(mf) and len(mq) > 0, f"distill: {len(mq)} / {len(mf)} metrics lines")
    rel = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(mq, mf))
    ck.check(0 < rel <= 2e-2, f"distill: losses as-stored vs f32 differ by {rel:.2e} relative (0 < r <= 2e-2)")
    print(f"distill, quantized teacher: losses {rel:.2e} relative from the f32 teacher's", flush=True)
    # the teacher's weights define the trajectory: not resumed with them held otherwise
    _, r = env.distill(g, "distill-q", "f32", ["--resume"], expect_rc=1, fresh=False)
    ck.check("teacher_weights" in r.stderr, f"distill resumed with other teacher weights: {r.stderr[-400:]}")
    # a student read from the .gguf is fp32 whatever --weights (the teacher does not run at alpha 0)
    alpha0 = ["--kd-loss-alpha", "0"]
    ra, _ = env.distill(g, "distill-a0-b", "bf16", alpha0)
    rb, _ = env.distill(g, "distill-a0-f", "f32", alpha0)
    ck.check(metrics(ra) == metrics(rb), "distill --kd-loss-alpha 0: the student differs under --weights bf16")
    # from a cache captured as stored: its weights recorded, the live as-stored teacher's losses (the
    # same products on the same rows); --weights does not apply
    rc, _ = env.distill(g, "distill-cache", None, ["--cache", c_q], seq_len=64, teacher=False)
    ck.check(run_json(rc).get("teacher_weights") == "as-stored",
             f"distill --cache: teacher_weights {run_json(rc).get('teacher_weights')!r}")
    rl, _ = env.distill(g, "distill-live64", "as-stored", seq_len=64)
    ck.check(metrics(rc) == metrics(rl), "distill --cache (captured as stored) and the live as-stored teacher differ")
    _, r = env.distill(g, "distill-cache-w", "f32", ["--cache", c_q], expect_rc=2, seq_len=64, teacher=False)
    ck.check("--weights" in r.stderr and "--cache" in r.stderr, f"distill --cache --weights: {r.stderr[-300:]}")


def check_bad_values(env, g):
    ck = env.ck
    _, r = env.capture(g, "cache-bad", "int3", expect_rc=2)
    ck.check("--weights takes as-stored, bf16 or f32 (got 'int3')" in r.stderr, f"capture --weights int3: {r.stderr}")
    _, r = env.distill(g, "distill-bad", "q4", expect_rc=2)
    ck.check("--weights takes as-stored, bf16 or f32 (got 'q4')" in r.stderr, f"distill --weights q4: {r.stderr}")
    r = env.run(["capture", "--target", g, "--data", env.data, "--out", env.fresh("cache-bad2"), "--weights"],
                expect_rc=2)
    ck.check("--weights takes as-stored, bf16 or f32 (got no value)" in r.stderr, f"capture --weights: {r.stderr}")


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp = args.tmp
    tokens, merges = conv.train_tokenizer(tmp)
    V, eos = len(tokens), tokens.index("<|im_end|>")  # noqa: N806
    data = common.stdlib_text(os.path.join(tmp, "data.txt"), 60, 61)
    with open(data, "r+") as f:  # a few dozen sequences
        text = f.read()[:4000]
        f.seek(0)
        f.truncate()
        f.write(text)
    # K-quant rows are whole blocks of 256: hidden and intermediate sizes are multiples of 256
    model = common.build_tiny_model("llama", os.path.join(tmp, "hf"), seed=3, tied=True, vocab_size=V,
                                    eos_token_id=eos, bos_token_id=eos - 1, num_hidden_layers=3, hidden_size=256,
                                    intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    env = Env(args, ck, data)
    gq = os.path.join(tmp, "quant.gguf")
    write_model(model, tokens, merges, gq, QUANT_TYPES, seed=5)
    info, _, _ = common.run([args.dspark, "info", gq])
    held = [x for x in info.splitlines() if x.startswith("weights in memory:")]
    ck.check(len(held) == 1 and all(t.name in held[0] for t in QUANT_TYPES) and "used in place" in held[0],
             f"info does not hold every quantized type in place: {held}")
    gf = os.path.join(tmp, "f32.gguf")
    write_model(model, tokens, merges, gf, [Q.F32], seed=5)
    check_bad_values(env, gq)
    c_q, c_f = check_quant_capture(env, gq)
    check_resume(env, gq, c_q, c_f)
    check_f32_file(env, gf)
    check_quant_distill(env, gq, c_q)
    ck.finish("test_weights_capture_distill")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A target's prefill and decode on the GPU: `dspark forward / generate --device cuda` against
PyTorch eager on the same GPU, the same weights and the same tokens.

The model is a random Qwen3 of a real shape (default Qwen3-0.6B's: d 1024, 28 layers, 16 query
heads over 8 kv heads of 128, intermediate 3072, vocabulary 151936, tied head; BF16 weights
written here as safetensors). For each compute mode (fp32: no TF32 on either side; bf16: our
tensor-core GEMMs against PyTorch in bfloat16) it times
  prefill: one sequence of --prefill tokens, best of 3 (ours: `forward --logits last --repeat 3`;
           PyTorch: the same forward, logits of the last row);
  decode:  --decode greedy tokens after a 128-token prompt, one request (ours: `generate`; PyTorch:
           the same model with a preallocated KV cache, one token per forward);
and the peak GPU memory of each process (nvidia-smi, sampled every 20 ms, minus the idle level).
The PyTorch side is this file's own eager Qwen3 (SDPA attention, GQA), and transformers'
Qwen3ForCausalLM when transformers is installed. Prints a table (and --jsonl rows).

    python3 bench/gpu_target.py --dspark build/gpu/dspark --work /tmp/gpu-target [--prefill 2048]
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time

DEV = os.environ.get("GPU_TARGET_DEVICE", "cuda")  # "cpu": a check of this file's model on a machine without a GPU
SHAPES = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128),
}


# ---------------------------------------------------------------- the model files

def write_model(work, shape):
    import torch
    cfg = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", rms_norm_eps=1e-6, rope_theta=1000000.0,
               max_position_embeddings=8192, tie_word_embeddings=True, torch_dtype="bfloat16",
               attention_bias=False, hidden_act="silu", **SHAPES[shape])
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "model.safetensors")
    if os.path.exists(path):
        return cfg
    g = torch.Generator(device=DEV).manual_seed(0)
    d, I, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    H, KV, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    tensors = {"model.embed_tokens.weight": (V, d), "model.norm.weight": (d,)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        tensors.update({p + "self_attn.q_proj.weight": (H * hd, d), p + "self_attn.k_proj.weight": (KV * hd, d),
                        p + "self_attn.v_proj.weight": (KV * hd, d), p + "self_attn.o_proj.weight": (d, H * hd),
                        p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                        p + "mlp.gate_proj.weight": (I, d), p + "mlp.up_proj.weight": (I, d),
                        p + "mlp.down_proj.weight": (d, I), p + "input_layernorm.weight": (d,),
                        p + "post_attention_layernorm.weight": (d,)})
    header, blobs, off = {}, [], 0
    for name, shp in tensors.items():
        if len(shp) == 1:
            t = 1.0 + 0.1 * torch.rand(shp, device=DEV, generator=g)
        else:
            t = torch.randn(shp, device=DEV, generator=g) * 0.02
        b = t.to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes()
        header[name] = dict(dtype="BF16", shape=list(shp), data_offsets=[off, off + len(b)])
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)
    with open(os.path.join(work, "config.json"), "w") as f:
        json.dump(cfg, f)
    return cfg


def load_weights(work):
    import torch
    raw = open(os.path.join(work, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        t = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.int16).view(torch.bfloat16)
        out[name] = t.reshape(info["shape"]).to(DEV)
    return out


# ---------------------------------------------------------------- the PyTorch side (own eager Qwen3)

class EagerQwen3:
    def __init__(self, cfg, w, dtype):
        import torch
        self.c, self.dt = cfg, dtype
        self.w = {k: v.to(dtype) for k, v in w.items()}
        hd = cfg["head_dim"]
        self.inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, device=DEV, dtype=torch.float32) / hd))

    def norm(self, x, w):
        import torch
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"])).to(self.dt) * w

    def rope(self, x, pos):
        import torch
        ang = pos.float()[:, None] * self.inv[None, :]
        cos = torch.cat([ang.cos()] * 2, -1).to(self.dt)[:, None, :]  # [n, 1, hd] over x's [n, heads, hd]
        sin = torch.cat([ang.sin()] * 2, -1).to(self.dt)[:, None, :]
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return x * cos + rot * sin

    def forward(self, ids, cache, past, last_only):
        """ids [n] at positions past..past+n-1; cache: per layer (k, v) [KV, cap, hd] written in place."""
        import torch
        import torch.nn.functional as F
        c, w = self.c, self.w
        H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        n = ids.shape[0]
        pos = torch.arange(past, past + n, device=DEV)
        x = w["model.embed_tokens.weight"][ids]
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = self.norm(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].t()).view(n, H, hd)
            k = (h @ w[p + "self_attn.k_proj.weight"].t()).view(n, KV, hd)
            v = (h @ w[p + "self_attn.v_proj.weight"].t()).view(n, KV, hd)
            q = self.rope(self.norm(q, w[p + "self_attn.q_norm.weight"]), pos).transpose(0, 1)
            k = self.rope(self.norm(k, w[p + "self_attn.k_norm.weight"]), pos).transpose(0, 1)
            kc, vc = cache[l]
            kc[:, past:past + n] = k
            vc[:, past:past + n] = v.transpose(0, 1)
            a = F.scaled_dot_product_attention(q[None], kc[None, :, :past + n], vc[None, :, :past + n],
                                               is_causal=n > 1, enable_gqa=True)
            x = x + a[0].transpose(0, 1).reshape(n, H * hd) @ w[p + "self_attn.o_proj.weight"].t()
            h = self.norm(x, w[p + "post_attention_layernorm.weight"])
            gu = F.silu(h @ w[p + "mlp.gate_proj.weight"].t()) * (h @ w[p + "mlp.up_proj.weight"].t())
            x = x + gu @ w[p + "mlp.down_proj.weight"].t()
        x = self.norm(x[-1:] if last_only else x, w["model.norm.weight"])
        return x @ w["model.embed_tokens.weight"].t()

    def new_cache(self, cap):
        import torch
        c = self.c
        return [(torch.empty(c["num_key_value_heads"], cap, c["head_dim"], device=DEV, dtype=self.dt),
                 torch.empty(c["num_key_value_heads"], cap, c["head_dim"], device=DEV, dtype=self.dt))
                for _ in range(c["num_hidden_layers"])]


def sync():
    import torch
    if DEV == "cuda":
        torch.cuda.synchronize()


def sync_time(fn):
    sync()
    t0 = time.perf_counter()
    r = fn()
    sync()
    return time.perf_counter() - t0, r


def torch_side(work, mode, prefill_ids, prompt_ids, n_decode):
    """Runs in its own process; prints one JSON line."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = json.load(open(os.path.join(work, "config.json")))
    dt = torch.float32 if mode == "fp32" else torch.bfloat16
    m = EagerQwen3(cfg, load_weights(work), dt)
    res = {}
    with torch.inference_mode():
        ids = torch.tensor(prefill_ids, device=DEV)
        best = min(sync_time(lambda: m.forward(ids, m.new_cache(len(prefill_ids)), 0, True))[0] for _ in range(3))
        res["prefill_tok_s"] = len(prefill_ids) / best
        cache = m.new_cache(len(prompt_ids) + n_decode)
        p = torch.tensor(prompt_ids, device=DEV)

        def decode():
            out, past = [], len(prompt_ids)
            nxt = m.forward(p, cache, 0, True).argmax(-1)
            out.append(int(nxt))
            sync()
            t0 = time.perf_counter()
            for _ in range(n_decode - 1):
                nxt = m.forward(nxt, cache, past, True).argmax(-1)
                past += 1
                out.append(int(nxt))  # a host sync per token, as any sampler needs
            return time.perf_counter() - t0, out
        sec, out = decode()
        res["decode_tok_s"] = (n_decode - 1) / sec
        res["ids"] = out
        try:  # transformers' own model, where installed
            import transformers
            hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{k: v for k, v in cfg.items()
                                                                            if k != "architectures"}))
            hf.load_state_dict({k: v for k, v in m.w.items()}, strict=False)
            hf.tie_weights()
            hf = hf.to(DEV, dt).eval()
            x = ids[None]
            best = min(sync_time(lambda: hf(x, logits_to_keep=1))[0] for _ in range(3))
            res["hf_prefill_tok_s"] = len(prefill_ids) / best
            pp = p[None]
            sec, _ = sync_time(lambda: hf.generate(pp, max_new_tokens=n_decode, min_new_tokens=n_decode,
                                                   do_sample=False))
            t1, _ = sync_time(lambda: hf(pp, logits_to_keep=1))
            res["hf_decode_tok_s"] = (n_decode - 1) / max(sec - t1, 1e-9)
            res["hf_version"] = transformers.__version__
        except Exception as e:  # noqa: BLE001 - the eager model above is the peer then
            res["hf_error"] = f"{type(e).__name__}: {e}"[:200]
    res["torch"] = torch.__version__
    print(json.dumps(res))


# ---------------------------------------------------------------- measuring a process

def gpu_used_mib():
    if DEV != "cuda":
        return 0
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else -1


def run_measured(cmd):
    """Runs cmd; returns (CompletedProcess, peak GPU MiB above the level before it)."""
    base = gpu_used_mib()
    peak = [base]
    done = threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], gpu_used_mib())
            time.sleep(0.02)
    th = threading.Thread(target=poll)
    th.start()
    p = subprocess.run(cmd, capture_output=True, text=True)
    done.set()
    th.join()
    return p, peak[0] - base


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dspark", help="dspark of a DSPARK_CUDA build")
    ap.add_argument("--work", default="/tmp/gpu-target")
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--modes", default="fp32,bf16")
    ap.add_argument("--jsonl")
    ap.add_argument("--torch-side", help=argparse.SUPPRESS)  # internal: MODE, run in a child process
    a = ap.parse_args()
    work = os.path.join(a.work, a.shape)
    gen = __import__("random").Random(1)
    cfg_v = SHAPES[a.shape]["vocab_size"]
    prefill_ids = [gen.randrange(cfg_v) for _ in range(a.prefill)]
    prompt_ids = [gen.randrange(cfg_v) for _ in range(128)]
    if a.torch_side:
        return torch_side(work, a.torch_side, prefill_ids, prompt_ids, a.decode)
    t0 = time.time()
    write_model(work, a.shape)
    print(f"model {a.shape} written in {time.time() - t0:.1f} s ({work})", flush=True)
    rows = []
    for mode in a.modes.split(","):
        r = dict(mode=mode, shape=a.shape, prefill=a.prefill, decode=a.decode)
        out = os.path.join(a.work, "forward.safetensors")  # never inside the model directory
        p, mem = run_measured([a.dspark, "forward", work, "--device", DEV, "--compute", mode, "--ids",
                               ",".join(map(str, prefill_ids)), "--logits", "last", "--repeat", "3", "--out", out])
        m = re.search(r"best of 3 runs: [\d.]+ s \(([\d.]+) tokens/s\)", p.stderr)
        r["ours_prefill_tok_s"] = float(m.group(1)) if m else None
        r["ours_prefill_peak_mib"] = mem
        if not m:
            r["ours_prefill_error"] = p.stderr[-400:]
        p, mem = run_measured([a.dspark, "generate", work, "--device", DEV, "--compute", mode, "--prompt-ids",
                               ",".join(map(str, prompt_ids)), "--max-new-tokens", str(a.decode), "--ignore-eos",
                               "--print-ids"])
        m = re.search(r"decode: \d+ tokens, [\d.]+ s \(([\d.]+) tokens/s\)", p.stderr)
        r["ours_decode_tok_s"] = float(m.group(1)) if m else None
        r["ours_decode_peak_mib"] = mem
        ours_ids = [int(x) for x in re.findall(r"\d+", p.stdout)] if p.returncode == 0 else []
        if not m:
            r["ours_decode_error"] = p.stderr[-400:]
        p, mem = run_measured([sys.executable, __file__, "--work", a.work, "--shape", a.shape, "--prefill",
                               str(a.prefill), "--decode", str(a.decode), "--torch-side", mode])
        try:
            t = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            t = {"torch_error": p.stderr[-600:]}
        r["torch_peak_mib"] = mem
        ids = t.pop("ids", [])
        r["same_greedy_prefix"] = next((i for i, (x, y) in enumerate(zip(ours_ids, ids)) if x != y),
                                       min(len(ours_ids), len(ids)))
        r.update({("torch_" + k if not k.startswith(("hf_", "torch")) else k): v for k, v in t.items()})
        rows.append(r)
        print(json.dumps(r), flush=True)
    print("| mode | prefill tok/s ours | eager torch | transformers | decode tok/s ours | eager torch | "
          "transformers | peak MiB ours (prefill / decode) | torch | same greedy ids |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    f = lambda v: f"{v:.0f}" if isinstance(v, (int, float)) else "-"
    for r in rows:
        print(f"| {r['mode']} | {f(r.get('ours_prefill_tok_s'))} | {f(r.get('torch_prefill_tok_s'))} | "
              f"{f(r.get('hf_prefill_tok_s'))} | {f(r.get('ours_decode_tok_s'))} | {f(r.get('torch_decode_tok_s'))} | "
              f"{f(r.get('hf_decode_tok_s'))} | {r['ours_prefill_peak_mib']} / {r['ours_decode_peak_mib']} | "
              f"{r['torch_peak_mib']} | {r['same_greedy_prefix']} of {a.decode} |")
    if a.jsonl:
        with open(a.jsonl, "w") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

"""DSpark draft optimizer step benchmark: one full training step of a draft (forward, DSpark
loss, backward, grad clip 1.0, AdamW lr 6e-4 wd 0), ours (build/.../bench_draft_step) against
a PyTorch eager implementation of the same step, same machine, same thread count, one run.

Shape (defaults): a target-like d = 512, V = 32000; draft n_d = 2 layers, 8 heads over 2 kv
heads, head_dim 64, intermediate 1536, m = 5 captured layers (fc input 5*512); T = 512 tokens,
64 anchors x g = 7 (448 rows); vanilla Markov head rank 256; confidence head with Markov input;
our loss in chunks of 128 rows.

Sides, each in its own process (so each peak RSS is its own), under /usr/bin/time -v:
  ours              bench_draft_step with the environment as it is (this machine pins
                    OpenBLAS to an AVX2 kernel through OPENBLAS_CORETYPE)
  ours native-blas  the same with OpenBLAS choosing its own kernel (only when the environment
                    pins one)
  ours mmap 1M      the first with MALLOC_MMAP_THRESHOLD_=1048576: a probe of how much of our
                    peak RSS is glibc heap retention of the loss buffers ds_draft_loss_seq
                    allocates and frees on every call (not a default setting)
  torch unchunked   eager float32: blocks batched, SDPA with a boolean [B, 1, g, T+g] mask,
                    GQA by repeat_interleave, HF-style RMSNorm / rotate_half rope / SwiGLU,
                    vanilla Markov head, confidence head; the loss of spec section 4 computed
                    the straightforward way over [B*g, V] with autograd; clip_grad_norm_ and
                    torch.optim.AdamW(fused=True) (the fastest CPU AdamW; --adamw foreach|loop
                    for the others); frozen embed / lm_head (requires_grad False)
  torch chunked     the same, with the loss in 128-row chunks: h and e detached into leaves,
                    each chunk's logits + loss + backward done in turn (gradients accumulate
                    into the leaves, W2 and the confidence head), then one backward through
                    the draft from the leaves' gradients (the DeepSpec pattern)
  torch chunked +sdpa-gqa   chunked, and GQA by scaled_dot_product_attention(enable_gqa=True)
                    instead of repeat_interleave (the leanest eager variant here)
  (--torch picks the torch sides)
  --bf16 adds two sides (issue 9's bf16 compute):
  ours bf16         bench_draft_step --compute bf16 (the matmuls' operands rounded to bf16,
                    fp32 accumulation, fp32 master weights, oneDNN's bf16 matmul)
  torch ... autocast-bf16   the leanest eager variant (chunked +sdpa-gqa) with its forward and
                    loss under torch.autocast("cpu", dtype=torch.bfloat16), fp32 master weights
                    and AdamW; their first numerators are checked within TOL_BF16
Every side runs one warm-up step, then --steps timed ones, and the sides take turns for
--rounds rounds (times pooled: best and median over all; peak RSS the max), so that a change
in the machine's load does not fall on one side only. The load average is printed with the table.
All sides run the SAME numbers: ours writes its random inputs and initial weights to a
safetensors dump (in a separate run, so that the dump does not count in ours' peak RSS; the
same seed gives the same numbers), the torch workers read it straight into their parameters
(plain reads, no mmap). The first step's loss numerator (initial weights) of each torch side
is checked against ours within 1e-4 relative.

    ~/.cache/dspark/venv/bin/python bench/bench_draft_step.py --build build/release [--threads 2] [--steps 5]
        [--rounds 2] [--torch unchunked:repeat,chunked:repeat,chunked:sdpa] [--adamw fused|foreach|loop]
        [--no-native-blas] [--no-profile]

Prints a table (and our per-kernel profile) and writes bench/out/draft_step.json; exits 1 if
a torch side's first-step numerator is off by more than 1e-4 relative.
"""
import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time

TOL = 1e-4
TOL_BF16 = 2e-2  # the bf16 sides' first numerator against the fp32 dump run's


# ---------------------------------------------------------------- torch worker

def read_safetensors(path, torch):
    """Reads every tensor of a safetensors file into fresh tensors (no mmap, one copy)."""
    dtypes = {"F32": torch.float32, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8}
    out = {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", {})
        base = 8 + n
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            t = torch.empty(info["shape"], dtype=dtypes[info["dtype"]])
            b, e = info["data_offsets"]
            f.seek(base + b)
            view = memoryview(t.numpy()).cast("B")
            assert len(view) == e - b, name
            got = f.readinto(view)
            assert got == e - b, name
            out[name] = t
    return out, meta


def median(x):
    s = sorted(x)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def vm_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def worker(args):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    rss_import = vm_rss_mib()
    data, meta = read_safetensors(args.dump, torch)
    rss_loaded = vm_rss_mib()
    cfg = json.loads(meta["config"])
    D = cfg["hidden_size"]
    HQ, HKV, HD = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ND, G, EPS, THETA = cfg["num_layers"], cfg["block_size"], cfg["rms_norm_eps"], cfg["rope_theta"]
    MASK = cfg["mask_token_id"]
    assert cfg["markov_type"] == "vanilla" and cfg["enable_confidence_head"] and cfg["confidence_head_with_markov"]
    A_CE, A_L1, A_CONF, GAMMA = cfg["alpha_ce"], cfg["alpha_l1"], cfg["alpha_conf"], cfg["decay_gamma"]
    CHUNK = cfg["chunk_rows"]

    ctx, last = data.pop("input.ctx"), data.pop("input.last")
    ids = data.pop("input.ids").long()
    anchors = data.pop("input.anchors").long()
    keep = data.pop("input.block_keep").bool()
    eval_mask = data.pop("input.eval_mask").bool()
    assert bool(keep.all()), "this peer handles kept blocks only"
    T, B = ctx.shape[0], anchors.shape[0]
    R = B * G
    P = data  # every draft tensor, by export name
    params = [t.requires_grad_(True) for k, t in P.items() if not k.startswith(("embed_tokens.", "lm_head."))]
    embed, lm = P["embed_tokens.weight"], P["lm_head.weight"]

    # Step-invariant index tensors, built once (a trainer would build them in its data loader).
    ks = torch.arange(G)
    pos = anchors[:, None] + ks[None, :]                                   # [B, G]
    toks = torch.full((B, G), MASK, dtype=torch.long)
    toks[:, 0] = ids[anchors]
    prev = torch.where(pos < T, ids[pos.clamp(max=T - 1)], torch.zeros((), dtype=torch.long))  # teacher forcing
    sup = eval_mask.view(B, G) & keep[:, None]
    tgt = torch.where(sup, ids[(pos + 1).clamp(max=T - 1)], torch.zeros((), dtype=torch.long)).reshape(R)
    decay = torch.exp(-ks.double() / GAMMA) if GAMMA > 0 else torch.ones(G, dtype=torch.float64)
    w64 = torch.where(sup, decay[None, :], torch.zeros((), dtype=torch.float64)).reshape(R)
    W = float(w64.sum())
    w = w64.float()
    teacher_pos = pos.clamp(max=T - 1).reshape(R)
    # visibility: context key j iff j < anchor; the block's own g keys all
    vis = torch.cat([torch.arange(T)[None, :] < anchors[:, None], torch.ones(B, G, dtype=torch.bool)], 1)
    attn_mask = vis[:, None, None, :]                                      # [B, 1, 1, T+G] -> [B, H, G, T+G]
    inv = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))

    def cos_sin(p):
        ang = p.float()[..., None] * inv
        emb = torch.cat([ang, ang], -1)
        return emb.cos(), emb.sin()

    cos_b, sin_b = cos_sin(pos)            # [B, G, HD]
    cos_c, sin_c = cos_sin(torch.arange(T))  # [T, HD]
    cos_b, sin_b = cos_b[:, :, None, :], sin_b[:, :, None, :]  # broadcast over heads
    cos_c, sin_c = cos_c[:, None, :], sin_c[:, None, :]

    def rmsnorm(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))

    def rotate_half(x):
        return torch.cat([-x[..., HD // 2:], x[..., : HD // 2]], -1)

    def rope(x, cos, sin):
        return x * cos + rotate_half(x) * sin

    def draft_forward():
        h_ctx = rmsnorm(F.linear(ctx, P["fc.weight"]), P["hidden_norm.weight"])  # [T, D]
        H = embed[toks]                                                          # [B, G, D]
        for i in range(ND):
            pre = f"layers.{i}."
            hn = rmsnorm(H, P[pre + "input_layernorm.weight"])
            q = rmsnorm(F.linear(hn, P[pre + "self_attn.q_proj.weight"]).view(B, G, HQ, HD), P[pre + "self_attn.q_norm.weight"])
            q = rope(q, cos_b, sin_b).transpose(1, 2)                                # [B, HQ, G, HD]
            kn = P[pre + "self_attn.k_norm.weight"]
            kb = rope(rmsnorm(F.linear(hn, P[pre + "self_attn.k_proj.weight"]).view(B, G, HKV, HD), kn), cos_b, sin_b)
            vb = F.linear(hn, P[pre + "self_attn.v_proj.weight"]).view(B, G, HKV, HD)
            kc = rope(rmsnorm(F.linear(h_ctx, P[pre + "self_attn.k_proj.weight"]).view(T, HKV, HD), kn), cos_c, sin_c)
            vc = F.linear(h_ctx, P[pre + "self_attn.v_proj.weight"]).view(T, HKV, HD)
            k = torch.cat([kc.expand(B, T, HKV, HD), kb], 1).transpose(1, 2)         # [B, HKV, T+G, HD]
            v = torch.cat([vc.expand(B, T, HKV, HD), vb], 1).transpose(1, 2)
            if args.gqa == "repeat":
                k = k.repeat_interleave(HQ // HKV, dim=1)
                v = v.repeat_interleave(HQ // HKV, dim=1)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)
            H = H + F.linear(o.transpose(1, 2).reshape(B, G, HQ * HD), P[pre + "self_attn.o_proj.weight"])
            hp = rmsnorm(H, P[pre + "post_attention_layernorm.weight"])
            act = F.silu(F.linear(hp, P[pre + "mlp.gate_proj.weight"])) * F.linear(hp, P[pre + "mlp.up_proj.weight"])
            H = H + F.linear(act, P[pre + "mlp.down_proj.weight"])
        h = rmsnorm(H, P["norm.weight"]).reshape(R, D)
        e = P["markov_head.markov_w1.weight"][prev.reshape(R)]                 # [R, r]
        return h, e

    def loss_rows(h, e, rows):
        """Numerator of spec section 4 over a set of rows (a slice of [0, R)), with autograd."""
        logits = F.linear(h, lm) + F.linear(e, P["markov_head.markov_w2.weight"])   # [n, V]
        conf = F.linear(torch.cat([h, e], -1), P["confidence_head.proj.weight"], P["confidence_head.proj.bias"])[:, 0]
        with torch.no_grad():
            p = torch.softmax(F.linear(last[teacher_pos[rows]], lm), -1)             # detached teacher
        logq = torch.log_softmax(logits, -1)
        ce = -logq.gather(1, tgt[rows, None])[:, 0]
        l1 = (logq.exp() - p).abs().sum(-1)
        accept = torch.clamp(1 - 0.5 * l1.detach(), 0, 1)
        bce = F.binary_cross_entropy_with_logits(conf, accept, reduction="none")
        wr = w[rows]
        return A_CE * (wr * ce).sum() + A_L1 * (wr * l1).sum() + A_CONF * (wr * bce).sum()

    kind = {"fused": {"fused": True}, "foreach": {"foreach": True}, "loop": {"foreach": False}}[args.adamw]
    opt = torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, **kind)

    import contextlib

    def amp():  # autocast for the forward and loss parts of the bf16 peer; the backward follows it
        return torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast else contextlib.nullcontext()

    def step():
        opt.zero_grad(set_to_none=True)
        with amp():
            h, e = draft_forward()
        if args.worker == "unchunked":
            with amp():
                num = loss_rows(h, e, slice(0, R))
            (num / W).backward()
            num = float(num.detach())
        else:
            hl, el = h.detach().requires_grad_(True), e.detach().requires_grad_(True)
            num = 0.0
            for r0 in range(0, R, CHUNK):
                sl = slice(r0, min(R, r0 + CHUNK))
                with amp():
                    n = loss_rows(hl[sl], el[sl], sl).float()
                (n / W).backward()
                num += float(n.detach())
            torch.autograd.backward([h, e], [hl.grad, el.grad])
        t_mid = time.perf_counter()
        norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        opt.step()
        return num, norm, t_mid

    rss_ready = vm_rss_mib()
    if args.torch_profile:  # a warm-up step, then one under torch.profiler: the top ops on stderr
        step()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
        return 0
    times, loss_times, opt_times, nums, norm0 = [], [], [], [], None
    for s in range(args.steps + 1):
        t0 = time.perf_counter()
        num, norm, t_mid = step()
        t1 = time.perf_counter()
        if s:
            times.append(t1 - t0)
            loss_times.append(t_mid - t0)
            opt_times.append(t1 - t_mid)
        else:
            norm0 = norm
            warm = t1 - t0
        nums.append(num)
        print(f"torch {args.worker} step {s}: {t1 - t0:.3f} s (loss {t_mid - t0:.3f}, optimizer {t1 - t_mid:.3f}), "
              f"loss {num / W:.6f}, grad norm {norm:.4g}", file=sys.stderr, flush=True)
    print(json.dumps({"best_s": min(times), "median_s": median(times), "times_s": times, "warmup_s": warm,
                      "median_loss_seq_s": median(loss_times), "median_optimizer_s": median(opt_times),
                      "loss_seq_times_s": loss_times, "optimizer_times_s": opt_times,
                      "numerators": nums, "first_numerator": nums[0], "W": W, "first_loss": nums[0] / W,
                      "last_loss": nums[-1] / W, "first_grad_norm": norm0,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_after_import_mib": rss_import, "rss_loaded_mib": rss_loaded, "rss_ready_mib": rss_ready,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


# ---------------------------------------------------------------- driver

def run_timed(cmd, env):
    """Runs cmd under /usr/bin/time -v; returns (last stdout line as JSON, stderr, peak RSS MiB)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-4000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr, rss


def load_avg():
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def merge(runs):
    """One side's runs (rounds): times pooled (best = min, median over all), peak RSS = max."""
    out = dict(runs[0])
    times = [t for r in runs for t in r["times_s"]]
    out["times_s"] = times
    out["best_s"] = min(times)
    out["median_s"] = median(times)
    for part in ("loss_seq", "optimizer"):
        pooled = [t for r in runs for t in r[part + "_times_s"]]
        out[part + "_times_s"] = pooled
        out[f"median_{part}_s"] = median(pooled)
    out["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
    out["time_v_rss_mib"] = max(r["time_v_rss_mib"] for r in runs)
    out["first_numerators"] = [r["first_numerator"] for r in runs]
    out["rounds"] = len(runs)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="the build directory holding bench_draft_step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per side and round (after one warm-up)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="the sides run in turn this many times (times pooled), so a change in the machine's "
                         "load hits every side")
    ap.add_argument("--torch", default="unchunked:repeat,chunked:repeat,chunked:sdpa",
                    help="torch sides, LOSS:GQA comma-separated: LOSS unchunked|chunked, GQA repeat "
                         "(repeat_interleave of k/v, as HF eager) | sdpa (scaled_dot_product_attention's enable_gqa)")
    ap.add_argument("--gqa", choices=["repeat", "sdpa"], default="repeat", help=argparse.SUPPRESS)
    ap.add_argument("--adamw", choices=["fused", "foreach", "loop"], default="fused",
                    help="torch.optim.AdamW implementation (fused=True is the fastest on CPU)")
    ap.add_argument("--no-native-blas", action="store_true", help="skip ours with OpenBLAS's own kernel")
    ap.add_argument("--no-malloc-probe", action="store_true",
                    help="skip ours with MALLOC_MMAP_THRESHOLD_=1 MiB (shows the peak RSS our per-step loss "
                         "buffers cost through glibc's heap; not a default setting)")
    ap.add_argument("--no-profile", action="store_true", help="skip our per-kernel profile run")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    ap.add_argument("--tmp", default="/tmp/dspark-bench-draft-step")
    ap.add_argument("--worker", choices=["chunked", "unchunked"], help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true",
                    help="add ours with --compute bf16 and torch chunked +sdpa-gqa under torch.autocast(bfloat16)")
    ap.add_argument("--autocast", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    ap.add_argument("--torch-profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not args.build:
        ap.error("--build is required")
    if args.steps < 1 or args.rounds < 1 or args.threads < 1:
        ap.error("--steps, --rounds and --threads must be >= 1")
    exe = os.path.join(args.build, "bench_draft_step")
    if not os.path.exists(exe):
        sys.exit(f"{exe} not found: cmake --build {args.build} --target bench_draft_step")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.tmp, exist_ok=True)
    dump = os.path.join(args.tmp, "draft_step.safetensors")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    native_env = {k: v for k, v in env.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    common = ["--threads", str(args.threads)]
    load_before = load_avg()
    t_start = time.perf_counter()

    # The dump, in its own run: its buffers must not count in ours' peak RSS.
    p = subprocess.run([exe, "--steps", "1", "--dump", dump] + common, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{exe} --dump failed ({p.returncode}):\n{p.stderr[-4000:]}")
    dump_run = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"dump written: {os.path.getsize(dump) / 2**20:.0f} MiB, first numerator {dump_run['first_numerator']:.9g}",
          flush=True)

    sides = [("ours", "ours", [exe, "--steps", str(args.steps)] + common, env)]
    if not args.no_native_blas and native_env != env:
        sides.append(("ours_native_blas", "ours", [exe, "--steps", str(args.steps)] + common, native_env))
    if not args.no_malloc_probe:
        sides.append(("ours_mmap_1m", "ours mmap", [exe, "--steps", str(args.steps)] + common,
                      dict(env, MALLOC_MMAP_THRESHOLD_=str(1 << 20))))
    for variant in args.torch.split(","):
        mode, _, gqa = variant.partition(":")
        gqa = gqa or "repeat"
        if mode not in ("unchunked", "chunked") or gqa not in ("repeat", "sdpa"):
            ap.error(f"--torch: '{variant}' is not LOSS:GQA with LOSS unchunked|chunked and GQA repeat|sdpa")
        sides.append((f"torch_{mode}_{gqa}", f"torch {mode}" + (" +sdpa-gqa" if gqa == "sdpa" else ""),
                      [sys.executable, os.path.abspath(__file__), "--worker", mode, "--dump", dump, "--threads",
                       str(args.threads), "--steps", str(args.steps), "--gqa", gqa, "--adamw", args.adamw], env))
    if args.bf16:
        sides.append(("ours_bf16", "ours bf16", [exe, "--steps", str(args.steps), "--compute", "bf16"] + common, env))
        sides.append(("torch_chunked_sdpa_autocast", "torch chunked +sdpa autocast",
                      [sys.executable, os.path.abspath(__file__), "--worker", "chunked", "--dump", dump, "--threads",
                       str(args.threads), "--steps", str(args.steps), "--gqa", "sdpa", "--adamw", args.adamw,
                       "--autocast"], env))
    runs = {key: [] for key, _, _, _ in sides}
    labels = {}
    for rnd in range(args.rounds):
        for key, label, cmd, side_env in sides:
            res, _, rss = run_timed(cmd, side_env)
            res["time_v_rss_mib"] = rss
            labels[key] = f"ours bf16 ({res['gemm_bf16']})" if label == "ours bf16" else \
                f"ours ({res['gemm']})" if label == "ours" else \
                f"ours ({res['gemm']}) mmap 1M" if label == "ours mmap" else label
            runs[key].append(res)
            print(f"round {rnd + 1}/{args.rounds} {labels[key]}: best {res['best_s']:.3f} s, median "
                  f"{res['median_s']:.3f} s, peak RSS {res['peak_rss_mib']:.0f} MiB (load {load_avg()[0]:.1f})",
                  flush=True)
    profile = None
    if not args.no_profile:
        p = subprocess.run([exe, "--steps", "2", "--profile"] + common, capture_output=True, text=True, env=env)
        if p.returncode == 0:
            profile = p.stderr[p.stderr.find("profile of"):]
    os.remove(dump)
    load_after = load_avg()

    merged = {key: merge(r) for key, r in runs.items()}
    for key, s in merged.items():
        s["label"] = labels[key]
    ours = merged["ours"]
    ref_num = dump_run["first_numerator"]  # the initial weights' loss on the dumped numbers
    ok = True
    notes = []
    for key, s in merged.items():
        s["rel_diff_first_numerator"] = max(abs(n - ref_num) / abs(ref_num) for n in s["first_numerators"])
        bf16 = key in ("ours_bf16", "torch_chunked_sdpa_autocast")
        if key.startswith("torch") or bf16:
            s["numerator_ok"] = s["rel_diff_first_numerator"] <= (TOL_BF16 if bf16 else TOL)
            ok &= s["numerator_ok"]
        elif s["rel_diff_first_numerator"] != 0:
            notes.append(f"{s['label']}: first numerator differs from the dump run's by "
                         f"{s['rel_diff_first_numerator']:.1e} (not bit-identical across runs)")

    import torch
    print(f"\nDSpark draft optimizer step: V={ours['vocab']} d={ours['hidden']} n_d={ours['layers']} "
          f"heads {ours['heads']}/{ours['kv_heads']}x{ours['head_dim']} I={ours['inter']} m={ours['captured']} "
          f"T={ours['seq_len']} {ours['anchors']} anchors x g={ours['block']} rank {ours['rank']} "
          f"chunk {ours['chunk_rows']}; {ours['n_params'] / 1e6:.1f}M trainable parameters; "
          f"{args.threads} threads; torch {torch.__version__} (AdamW {args.adamw}); "
          f"{args.rounds} rounds x {args.steps} steps per side")
    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} CPUs)")
    hdr = (f"{'side':<26} {'best s':>7} {'median s':>9} {'fwd+bwd':>8} {'optim':>6} {'best/ours':>9} "
           f"{'med/ours':>8} {'peak RSS':>9} {'time -v':>8} {'RSS/ours':>8} {'first loss':>11} {'rel diff num':>12}")
    print(hdr)
    print("-" * len(hdr))
    for key, s in merged.items():
        print(f"{s['label']:<26} {s['best_s']:>7.3f} {s['median_s']:>9.3f} {s['median_loss_seq_s']:>8.3f} "
              f"{s['median_optimizer_s']:>6.3f} {s['best_s'] / ours['best_s']:>8.2f}x "
              f"{s['median_s'] / ours['median_s']:>7.2f}x {s['peak_rss_mib']:>9.0f} {s['time_v_rss_mib']:>8.0f} "
              f"{s['peak_rss_mib'] / ours['peak_rss_mib']:>7.2f}x {s['first_loss']:>11.6f} "
              f"{s['rel_diff_first_numerator']:>12.1e}")
    print("(a step = zero grads + forward + loss + backward + clip + AdamW, seconds; fwd+bwd and optim: medians of "
          "the two parts of a step; best/ours, med/ours, RSS/ours: that side's best time, median time and peak RSS over ours' "
          "(first row: the environment's BLAS); peak RSS in MiB from the process's own report (VmHWM / "
          "ru_maxrss), 'time -v' the /usr/bin/time cross-check; rel diff num: the first step's loss numerator "
          "(initial weights) against ours)")
    state = (4 * ours["n_params"] + 2 * ours["vocab"] * ours["hidden"]) * 4 / 2**20
    print(f"model state common to every side (params, grads, AdamW m and v, frozen embed + lm_head): {state:.0f} MiB; "
          f"ours after init (draft + inputs, before any step): {ours['rss_after_init_mib']:.0f} MiB")
    for key, s in merged.items():
        if key.startswith("torch"):
            print(f"{s['label']}: RSS after import torch {s['rss_after_import_mib']:.0f} MiB, with weights and inputs "
                  f"read {s['rss_loaded_mib']:.0f} MiB, after building torch.optim.AdamW (before any step) "
                  f"{s['rss_ready_mib']:.0f} MiB")
    if "ours_mmap_1m" in merged:
        print("mmap 1M: ours with MALLOC_MMAP_THRESHOLD_=1048576 (glibc serves every block >= 1 MiB by mmap and "
              "returns it at free), a probe of how much of our peak is heap retention, not a default setting")
    for n in notes:
        print("note: " + n)
    print(f"first-step numerator agreement with ours (<= {TOL:g} relative; bf16 sides <= {TOL_BF16:g}): "
          f"{'OK' if ok else 'FAILED'}")
    if profile:
        print("\nour per-kernel profile (environment BLAS, ds_draft_loss_seq only):\n" + profile.rstrip())
    report = {"benchmark": "dspark draft optimizer step", "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "threads": args.threads, "steps": args.steps, "rounds": args.rounds,
              "torch": torch.__version__, "adamw": args.adamw, "load_avg_before": load_before,
              "load_avg_after": load_after, "numerator_tolerance": TOL, "numerators_agree": ok,
              "dump_first_numerator": ref_num, "model_state_mib": state, "sides": merged, "runs": runs,
              "our_profile": profile, "wall_s": time.perf_counter() - t_start}
    path = os.path.join(args.out, "draft_step.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path} ({time.perf_counter() - t_start:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

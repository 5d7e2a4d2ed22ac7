#!/usr/bin/env python3
"""Student conformance: the trainable student (include/dspark/student.h) against transformers
and PyTorch autograd.

    python test_student_torch.py --dspark BUILD/dspark --tmp TMPDIR

Uses the tool next to dspark (BUILD/student_step, tests/tools/student_step.c). For random tiny
models built here by transformers, one per family and feature (Llama untied GQA; Llama tied
with attention_bias, mlp_bias and llama3 rope; Llama MHA with linear rope; Qwen2 tied; Qwen2
untied MQA with a pad_token_id that occurs in the input; Qwen3 untied GQA with q/k norms;
Qwen3 tied with attention_bias; a bf16 Qwen3 checkpoint), the tool loads the directory, runs
two packed sequences of different lengths, the loss
    mean CE of every next-token prediction + 0.01 * sum(h_1^2) / rows
(h_1 = the output of decoder layer 1 through the intermediate-layer hook) on logits computed in
row chunks, and the backward. transformers computes the same loss in float64 (each sequence
alone, hidden_states[2]) and autograd its gradients. Checked within 1e-4 normwise relative
error (max|ours - ref| / max|ref|): the loss, the logits, the hidden state and the gradient of
every parameter (names and set equal to named_parameters(); a tied table's gradient holds both
uses; the padding_idx row gets no lookup gradient, as nn.Embedding). Then the tool applies an
SGD step and exports the student: transformers loads the export and gives our logits of the
updated student (1e-4), and so does `dspark forward EXPORT` (the target loader reads a student
export unchanged). A student built from a fresh config.json (seeded init) is exported and
checked the same way, with its weights' spread against initializer_range.
Exits 1 on any failure; prints "N passed, M failed"."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

TOL = 1e-4
HIDDEN_LAYER, HIDDEN_WEIGHT, LR = 1, 0.01, 0.05
LENS = (19, 12)

LLAMA3 = {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
VARIANTS = [
    # name, arch, tied, dtype, overrides
    ("llama-untied-gqa", "llama", False, "float32", {}),
    ("llama-tied-bias-llama3", "llama", True, "float32",
     {"attention_bias": True, "mlp_bias": True, "rope_parameters": LLAMA3}),
    ("llama-mha-linear-rope", "llama", False, "float32",
     {"num_key_value_heads": 4, "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    ("qwen2-tied", "qwen2", True, "float32", {}),
    ("qwen2-untied-mqa-pad", "qwen2", False, "float32", {"num_key_value_heads": 1, "pad_token_id": 5}),
    ("qwen3-untied-gqa", "qwen3", False, "float32", {}),
    ("qwen3-tied-attn-bias", "qwen3", True, "float32", {"attention_bias": True}),
    ("qwen3-bf16", "qwen3", False, "bfloat16", {}),
]


def make_batch(rng, pad_id):
    ids = np.zeros((len(LENS), max(LENS)), dtype=np.int32)
    for b, n in enumerate(LENS):
        ids[b, :n] = rng.integers(0, 256, size=n)
    if pad_id is not None:  # the padding id occurs in the input (its lookup gets no gradient)
        ids[0, 3] = ids[1, 7] = pad_id
    return ids


def run_tool(exe, args, tmp, name, ids, extra):
    in_path = os.path.join(tmp, f"{name}-in.safetensors")
    out_path = os.path.join(tmp, f"{name}-out.safetensors")
    save_file({"input_ids": torch.from_numpy(ids), "lengths": torch.tensor(LENS, dtype=torch.int64)}, in_path)
    common.run([exe, "--in", in_path, "--out", out_path, "--chunk", "5", "--hidden-layer", str(HIDDEN_LAYER),
                "--hidden-weight", str(HIDDEN_WEIGHT)] + extra)
    return load_file(out_path)


def reference(model, ids):
    """Loss, logits, hidden state and gradients in float64, each sequence alone."""
    model.zero_grad(set_to_none=True)
    n_pred, rows = sum(n - 1 for n in LENS), sum(LENS)
    loss = torch.zeros((), dtype=torch.float64)
    logits, hidden = [], []
    for b, n in enumerate(LENS):
        x = torch.tensor(ids[b:b + 1, :n], dtype=torch.long)
        out = model(input_ids=x, output_hidden_states=True)
        lg = out.logits[0]
        h = out.hidden_states[HIDDEN_LAYER + 1][0]
        ce = torch.nn.functional.cross_entropy(lg[:-1], x[0, 1:], reduction="sum")
        loss = loss + ce / n_pred + HIDDEN_WEIGHT * (h * h).sum() / rows
        logits.append(lg.detach())
        hidden.append(h.detach())
    loss.backward()
    grads = {name: p.grad.detach().numpy() for name, p in model.named_parameters()}
    return float(loss), torch.cat(logits).numpy(), torch.cat(hidden).numpy(), grads


def hf_logits(mdir, ids):
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float64).eval()
    with torch.no_grad():
        return np.concatenate([model(input_ids=torch.tensor(ids[b:b + 1, :n], dtype=torch.long)).logits[0].numpy()
                               for b, n in enumerate(LENS)])


def dspark_logits(args, exp_dir, ids, tmp, name):
    path = os.path.join(tmp, f"{name}-forward.safetensors")
    arg = ";".join(",".join(str(int(t)) for t in ids[b, :n]) for b, n in enumerate(LENS))
    common.run([args.dspark, "forward", exp_dir, "--ids", arg, "--out", path])
    got = load_file(path)
    return np.concatenate([got[f"logits.{b}"] for b in range(len(LENS))])


def check_export(ck, args, name, exp_dir, ids, ours_after):
    err = common.normwise_rel_err(ours_after, hf_logits(exp_dir, ids))
    print(f"{name} export: transformers logits rel err {err:.2e}")
    ck.check(err <= TOL, f"{name}: transformers on the export: logits rel err {err:.2e}")
    err = common.normwise_rel_err(ours_after, dspark_logits(args, exp_dir, ids, args.tmp, name))
    ck.check(err <= TOL, f"{name}: dspark forward on the export: logits rel err {err:.2e}")


def main():
    args = common.parse_args(__doc__.splitlines()[1])
    exe = os.path.join(os.path.dirname(os.path.abspath(args.dspark)), "student_step")
    if not os.path.exists(exe):
        print(f"FAIL: {exe} not found (build the student_step target)", flush=True)
        sys.exit(1)
    import transformers
    ck = common.Checker()
    rng = np.random.default_rng(20240612)
    for name, arch, tied, dtype, over in VARIANTS:
        mdir = os.path.join(args.tmp, name)
        exp_dir = os.path.join(args.tmp, name + "-export")
        common.build_tiny_model(arch, mdir, seed=len(name) + 3, dtype=dtype, tied=tied, **over)
        ids = make_batch(rng, over.get("pad_token_id"))
        got = run_tool(exe, args, args.tmp, name, ids, ["--dir", mdir, "--sgd", str(LR), "--export", exp_dir])
        model = transformers.AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float64,
                                                                  attn_implementation="eager")
        model.train()
        loss, logits, hidden, grads = reference(model, ids)
        err = abs(float(got["loss"][0]) - loss) / abs(loss)
        ck.check(err <= TOL, f"{name}: loss {float(got['loss'][0])} vs {loss} (rel err {err:.2e})")
        for key, ref in (("logits", logits), (f"hidden.{HIDDEN_LAYER}", hidden)):
            err = common.normwise_rel_err(got[key], ref)
            ck.check(err <= TOL, f"{name}: {key} rel err {err:.2e}")
        ours = {k[len("grad."):]: v for k, v in got.items() if k.startswith("grad.")}
        ck.check(set(ours) == set(grads), f"{name}: gradient names differ: ours only {sorted(set(ours) - set(grads))}, "
                                          f"torch only {sorted(set(grads) - set(ours))}")
        worst = 0.0
        for pname, ref in grads.items():
            if pname not in ours:
                continue
            err = common.normwise_rel_err(ours[pname], ref)
            worst = max(worst, err)
            ck.check(err <= TOL, f"{name}: grad {pname} rel err {err:.2e}")
        print(f"{name}: loss {loss:.6f}, worst gradient rel err {worst:.2e}")
        if "pad_token_id" in over:  # as nn.Embedding's padding_idx: no lookup gradient on its row
            pad = over["pad_token_id"]
            ck.check(not np.any(ours["model.embed_tokens.weight"][pad]), f"{name}: padding row got a gradient")
        saved = json.load(open(os.path.join(exp_dir, "config.json")))
        ck.check(saved["tie_word_embeddings"] == tied and saved["architectures"] == [model.__class__.__name__],
                 f"{name}: exported config {saved.get('architectures')} tie {saved.get('tie_word_embeddings')}")
        check_export(ck, args, name, exp_dir, ids, got["logits_after"])

    # A fresh student from a config.json: seeded init with initializer_range, exported.
    cfg = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "max_position_embeddings": 128, "tie_word_embeddings": True, "initializer_range": 0.05,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    cfg_path = os.path.join(args.tmp, "fresh-config.json")
    json.dump(cfg, open(cfg_path, "w"))
    exp_dir = os.path.join(args.tmp, "fresh-export")
    ids = make_batch(rng, None)
    got = run_tool(exe, args, args.tmp, "fresh", ids, ["--config", cfg_path, "--seed", "7", "--export", exp_dir])
    check_export(ck, args, "fresh", exp_dir, ids, got["logits_after"])
    weights = load_file(os.path.join(exp_dir, "model.safetensors"))
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    ck.check(abs(float(q.std()) - 0.05) < 0.005 and abs(float(q.mean())) < 0.005,
             f"fresh: q_proj std {q.std():.4f} mean {q.mean():.4f}, want normal(0, 0.05)")
    ck.check(np.all(weights["model.norm.weight"] == 1) and "lm_head.weight" not in weights,
             "fresh: norms are not ones, or a tied export stores lm_head.weight")
    ck.finish("test_student_torch")


if __name__ == "__main__":
    main()

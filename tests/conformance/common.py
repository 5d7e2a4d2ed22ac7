"""Shared helpers for the conformance tests: argument parsing, running the dspark program,
building seeded random tiny HF models, and normwise error metrics."""
import argparse
import os
import subprocess
import sys


def parse_args(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--dspark", required=True, help="path to the dspark program under test")
    ap.add_argument("--tmp", required=True, help="scratch directory (created)")
    args = ap.parse_args()
    os.makedirs(args.tmp, exist_ok=True)
    return args


def stdlib_text(path, first, last):
    """Writes the Python standard library's modules first..last-1 (sorted by name) into path, a
    real-text corpus every machine with Python has; returns path."""
    import glob
    import sysconfig
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[first:last]
    with open(path, "w") as f:
        for p in files:
            with open(p, encoding="utf-8", errors="replace") as src:
                f.write(src.read())
    return path


def run(cmd, expect_rc=0, **kw):
    """Runs cmd; returns (stdout, stderr). Fails loudly when the exit code differs."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if expect_rc is not None and p.returncode != expect_rc:
        sys.stderr.write(f"command {' '.join(map(str, cmd))}\nexited {p.returncode}, expected {expect_rc}\n"
                         f"stdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}\n")
        raise SystemExit(1)
    return p.stdout, p.stderr, p.returncode


def normwise_rel_err(ours, ref):
    """max |ours - ref| / max |ref|: the infinity-norm relative error of the whole tensor."""
    import numpy as np
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        return float("inf")
    scale = np.max(np.abs(ref))
    return float(np.max(np.abs(ours - ref)) / (scale if scale > 0 else 1.0))


class Checker:
    """Collects named checks; exit status non-zero if any failed."""

    def __init__(self):
        self.failed = 0
        self.passed = 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL: {what}", flush=True)
        return ok

    def finish(self, name):
        print(f"{name}: {self.passed} passed, {self.failed} failed", flush=True)
        sys.exit(1 if self.failed else 0)


def randomize_(model, seed):
    """Gives every parameter a non-trivial random value (norm weights near 1, biases non-zero)
    so that a kernel that ignores a weight or a bias cannot pass."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


def build_tiny_model(arch, out_dir, seed=0, dtype="float32", tied=False, **overrides):
    """Builds a seeded random tiny model with transformers and saves it in HF layout."""
    import torch
    import transformers
    cfg_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "qwen3": transformers.Qwen3Config}[arch]
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "qwen3": transformers.Qwen3ForCausalLM}[arch]
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rms_norm_eps=1e-6, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)
    if arch == "qwen3":
        kw["head_dim"] = 24  # differs from hidden/heads on purpose
    kw.update(overrides)
    config = cfg_cls(**kw)
    config.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    model = model_cls(config)
    randomize_(model, seed)
    if tied:
        model.tie_weights()
    model.eval()
    if dtype in ("bfloat16", "float16"):
        model = model.to(getattr(torch, dtype))
    model.save_pretrained(out_dir)
    return model


def build_bpe_target(tmp, n_files=40, vocab_size=400, seed=5, specials=("<|endoftext|>", "<|mask|>"), layers=4,
                     name="target", dtype="float32"):
    """A tiny Qwen3 target in tmp/name with a byte-level BPE tokenizer trained (tokenizers) on the
    first n_files of the standard library's sources; specials[0] is EOS; weights saved in dtype.
    Built once per tmp."""
    import glob
    import sysconfig
    mdir = os.path.join(tmp, name)
    if os.path.exists(os.path.join(mdir, "tokenizer.json")):
        return mdir
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:n_files]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(files, tr)
    build_tiny_model("qwen3", mdir, seed=seed, vocab_size=tok.get_vocab_size(),
                     eos_token_id=tok.token_to_id(specials[0]), num_hidden_layers=layers, dtype=dtype)
    tok.save(os.path.join(mdir, "tokenizer.json"))
    return mdir


def build_qwen3_chat_target(tmp):
    """build_bpe_target with Qwen3's special tokens (<|im_end|> as EOS) and Qwen3-0.6B's chat
    template (tests/conformance/chat_templates) in its tokenizer_config.json, in tmp/qwen3-target."""
    import json
    target = build_bpe_target(tmp, specials=("<|im_end|>", "<|mask|>", "<|im_start|>", "<|endoftext|>"),
                              name="qwen3-target")
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "chat_templates", "Qwen-Qwen3-0.6B.jinja"), encoding="utf-8") as f:
        template = f.read()
    with open(os.path.join(target, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": template}, f)
    return target

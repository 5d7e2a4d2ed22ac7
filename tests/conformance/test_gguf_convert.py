"""`dspark convert MODEL.gguf --out DIR` against transformers reading the same GGUF file
(`from_pretrained(..., gguf_file=...)`, which needs the gguf and accelerate packages):

- tiny Llama (tied head, GQA, its q / k rows interleaved as llama.cpp's converter writes them),
  Qwen2 (q / k / v biases, untied) and Qwen3 (q / k norms, head_dim 128 != hidden / heads) models,
  built by transformers with a byte-level BPE tokenizer trained here, are written to GGUF by this
  test as llama.cpp lays them out, their weights in several quantized types (Q8_0, Q4_0, Q4_1,
  Q5_0, Q5_1, F16, BF16, F32); the converted directory holds transformers' dequantized weights to
  the bit, gives its logits (1e-4 normwise) through `dspark forward`, and its tokenizer gives
  transformers' ids through `dspark tokenize` on a multilingual text and on a chat conversation
  (the template from the file's metadata); a bf16 conversion holds the same weights rounded;
- files it cannot reproduce are refused naming the key or tensor (another architecture, another
  tokenizer model, an unknown pre-tokenizer, yarn rope scaling, a stray tensor, a missing one);
- the real SmolLM2-135M-Instruct Q4_1 file, when the set-up has fetched it (DSPARK_SMOLLM2_GGUF
  or the cache folder): the same weights, logits, 16 greedy tokens and chat-template ids."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXT = ("The quick brown fox jumps over the lazy dog. Ünïcödé naïve café — 日本語のテキスト, "
        "emoji 🙂 and code: def f(x):\n    return x ** 2  # 42\n\n\tEnd   of text.")
SMOLLM2_DEFAULT = os.path.expanduser("~/.cache/dspark/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def train_tokenizer(tmp):
    path = os.path.join(tmp, "bpe-tokenizer.json")
    if not os.path.exists(path):
        import glob
        import sysconfig
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:30]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train(files, trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIALS, show_progress=False,
                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.save(path)
    j = json.load(open(path))
    vocab = j["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return tokens, merges


def llama_permute(w, n_head):
    """llama.cpp's converter: each head's rows interleaved from its two rotary halves."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, arch, tokens, merges, path, pre, types):
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(path, arch)
    w.add_uint32(f"{arch}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{arch}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{arch}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_uint32(f"{arch}.attention.key_length", hd)
    w.add_uint32(f"{arch}.attention.value_length", hd)
    w.add_uint32(f"{arch}.rope.dimension_count", hd)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_float32(f"{arch}.rope.freq_base", cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta)
    w.add_uint32(f"{arch}.vocab_size", cfg.vocab_size)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [3 if t in SPECIALS else 1 for t in tokens])
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", tokens.index("<|im_start|>"))
    w.add_uint32("tokenizer.ggml.eos_token_id", tokens.index("<|im_end|>"))
    w.add_uint32("tokenizer.ggml.padding_token_id", tokens.index("<|endoftext|>"))
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", CHATML)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    k = 0
    for hf, x in sd.items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if hf in names:
            name = names[hf]
        else:
            parts = hf.split(".")  # model.layers.N.<module>.<weight|bias>
            name = f"blk.{parts[2]}.{layer['.'.join(parts[3:-1])]}.{parts[-1]}"
        if arch == "llama" and (".q_proj." in hf or ".k_proj." in hf):
            x = llama_permute(x, cfg.num_attention_heads if ".q_proj." in hf else cfg.num_key_value_heads)
        qtype = Q.F32 if x.ndim == 1 else types[k % len(types)]
        k += x.ndim == 2
        w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(x), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(args, cmd, expect_rc=0):
    r = subprocess.run([args.dspark] + cmd, capture_output=True, text=True, timeout=600)
    if expect_rc is not None and r.returncode != expect_rc:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")
    return r


def compare(args, ck, label, gguf_path, out_dir, greedy=0):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    ours = load_file(os.path.join(out_dir, "model.safetensors"))
    sd = model.state_dict()
    differ = [n for n in ours if n not in sd or not np.array_equal(ours[n].view(np.uint32), sd[n].numpy().view(np.uint32))]
    missing = [n for n in sd if n not in ours and not (n == "lm_head.weight" and model.config.tie_word_embeddings)]
    ck.check(not differ and not missing, f"{label}: weights differ from transformers' {differ[:4]}, missing {missing[:4]}")
    ids = tok(TEXT)["input_ids"]
    got = [int(x) for x in run(args, ["tokenize", out_dir, "--text", TEXT]).stdout.split()]
    ck.check(got == ids, f"{label}: tokenize ids differ from transformers'\n ours {got}\n hf   {ids}")
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    fw = os.path.join(out_dir, "..", f"{label}-forward.safetensors")
    run(args, ["forward", out_dir, "--ids", ",".join(map(str, ids)), "--out", fw, "--logits", "all"])
    lg = load_file(fw)
    lg = lg[[k for k in lg if "logits" in k][0]]
    err = common.normwise_rel_err(lg, want)
    ck.check(err < 1e-4, f"{label}: logits differ from transformers' by {err:.2e}")
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Wie geht's? 日本"},
            {"role": "assistant", "content": "Gut."}, {"role": "user", "content": "And you?"}]
    want_chat = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=True)
    want_chat = want_chat["input_ids"] if isinstance(want_chat, dict) or hasattr(want_chat, "keys") else want_chat
    chat_file = os.path.join(out_dir, "..", f"{label}-chat.jsonl")
    with open(chat_file, "w") as fh:
        fh.write(json.dumps({"messages": conv}) + "\n")
    got_chat = json.loads(run(args, ["tokenize", out_dir, "--chat", chat_file, "--add-generation-prompt"]).stdout)["ids"]
    ck.check(got_chat == list(want_chat), f"{label}: chat-template ids differ\n ours {got_chat}\n hf   {list(want_chat)}")
    if greedy:
        prompt = list(want_chat)
        with torch.no_grad():
            gen = model.generate(torch.tensor([prompt]), max_new_tokens=greedy, do_sample=False)[0][len(prompt):].tolist()
        r = run(args, ["generate", out_dir, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(greedy),
                       "--print-ids", "--ignore-eos"])
        mine = [int(x) for x in r.stdout.split()][:len(gen)]
        ck.check(mine == gen, f"{label}: greedy ids differ\n ours {mine}\n hf   {gen}")
    print(f"{label}: weights equal, logits {err:.1e}, {len(ids)} text ids and {len(want_chat)} chat ids equal")


def check_families(args, ck, tmp):
    tokens, merges = train_tokenizer(tmp)
    V = len(tokens)
    eos = tokens.index("<|im_end|>")
    cases = [("llama", dict(tied=True, num_attention_heads=4, num_key_value_heads=2, hidden_size=64), "smollm",
              [Q.Q8_0, Q.Q4_0, Q.Q5_1, Q.F16]),
             ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2, hidden_size=64), "qwen2",
              [Q.Q4_1, Q.Q5_0, Q.BF16, Q.F32]),
             # transformers takes Qwen3's head_dim from its config class (128), not from the file's
             # attention.key_length: the tiny model keeps 128 (!= hidden / heads) so both agree
             ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, hidden_size=64, head_dim=128), "qwen2",
              [Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.F16])]
    for arch, kw, pre, types in cases:
        mdir = os.path.join(tmp, f"hf-{arch}")
        model = common.build_tiny_model(arch, mdir, seed=3, vocab_size=V, eos_token_id=eos, bos_token_id=eos - 1,
                                        num_hidden_layers=2, intermediate_size=96, **kw)
        path = os.path.join(tmp, f"{arch}.gguf")
        write_gguf(model, arch, tokens, merges, path, pre, types)
        out = os.path.join(tmp, f"converted-{arch}")
        shutil.rmtree(out, ignore_errors=True)
        run(args, ["convert", path, "--out", out])
        compare(args, ck, arch, path, out)
        out16 = os.path.join(tmp, f"converted-{arch}-bf16")
        shutil.rmtree(out16, ignore_errors=True)
        run(args, ["convert", path, "--out", out16, "--dtype", "bf16"])
        from safetensors.torch import load_file as load_torch
        a, b = load_torch(os.path.join(out, "model.safetensors")), load_torch(os.path.join(out16, "model.safetensors"))
        same = all(b[n].dtype == torch.bfloat16 and torch.equal(a[n].to(torch.bfloat16).view(torch.int16),
                                                                b[n].view(torch.int16)) for n in a)
        ck.check(same, f"{arch}: the bf16 conversion is not the f32 one rounded")
    return tokens, merges


def check_refusals(args, ck, tmp, tokens, merges):
    base = os.path.join(tmp, "llama.gguf")
    reader = gguf.GGUFReader(base)

    def rewrite(path, edit_kv=None, drop=(), extra_tensor=None):
        """A copy of the llama file with metadata edited / tensors dropped or added."""
        w = gguf.GGUFWriter(path, "llama")
        for f in reader.fields.values():
            if f.name.startswith("GGUF.") or f.name == "general.architecture":
                continue
            val = f.contents()
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(f.name, val, vtype, sub_type=sub)
        for k, v in (edit_kv or {}).items():
            w.kv_data[0].pop(k, None)
            if v is not None:
                w.add_key_value(k, v[0], v[1])
        for t in reader.tensors:
            if t.name not in drop:
                w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
        if extra_tensor:
            w.add_tensor(extra_tensor, np.zeros(32, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    S, U32 = gguf.GGUFValueType.STRING, gguf.GGUFValueType.UINT32
    cases = [("architecture gpt2", {"general.architecture": ("gpt2", S)}, (), None, ["general.architecture", "gpt2"]),
             ("tokenizer llama", {"tokenizer.ggml.model": ("llama", S)}, (), None, ["tokenizer.ggml.model", "llama"]),
             ("pre unknown", {"tokenizer.ggml.pre": ("mystery", S)}, (), None, ["tokenizer.ggml.pre", "mystery"]),
             ("yarn", {"llama.rope.scaling.type": ("yarn", S)}, (), None, ["llama.rope.scaling.type", "yarn"]),
             ("stray tensor", None, (), "blk.0.mystery.weight", ["blk.0.mystery.weight"]),
             ("missing tensor", None, ("blk.1.ffn_up.weight",), None, ["weight tensors"]),
             ("rope_freqs", None, (), "rope_freqs.weight", ["rope_freqs.weight", "llama3"]),
             ("heads out of range", {"llama.attention.head_count": (738197506, U32)}, (), None,
              ["'llama.attention.head_count' is 738197506", "[1, 4096]"]),
             # within every key's range, refused by config.json's reader (LlamaConfig's rule)
             ("heads not dividing d", {"llama.attention.head_count": (3, U32), "llama.attention.head_count_kv": (1, U32)},
              (), None, ["metadata describes a model this engine refuses", "not a multiple of num_attention_heads (3)"])]
    for label, kv, drop, extra, words in cases:
        path = os.path.join(tmp, "refused.gguf")
        rewrite(path, kv, drop, extra)
        out = os.path.join(tmp, "refused-out")
        shutil.rmtree(out, ignore_errors=True)
        r = run(args, ["convert", path, "--out", out], expect_rc=None)
        ck.check(r.returncode == 1 and all(w in r.stderr for w in words), f"{label}: rc {r.returncode}, {r.stderr!r}")
        left = sorted(os.listdir(out)) if os.path.exists(out) else None
        ck.check(left is None, f"{label}: a refused file left {out} behind, holding {left}")
    r = run(args, ["convert", base, "--out", os.path.join(tmp, "converted-llama")], expect_rc=None)
    ck.check(r.returncode == 2 and "not empty" in r.stderr, f"a non-empty --out: rc {r.returncode} {r.stderr!r}")
    before = open(base, "rb").read()
    r = run(args, ["convert", base, "--out", os.path.join(base, "..", "llama.gguf")], expect_rc=None)
    ck.check(r.returncode == 2 and "refusing" in r.stderr and open(base, "rb").read() == before,
             f"--out over the input file: rc {r.returncode} {r.stderr!r}")
    print(f"{len(cases)} files it cannot reproduce refused by name")


def check_smollm2(args, ck, tmp):
    path = os.environ.get("DSPARK_SMOLLM2_GGUF", SMOLLM2_DEFAULT)
    if not os.path.exists(path):
        print(f"SmolLM2: {path} not fetched (scripts/setup.sh fetches it): skipped")
        return
    out = os.path.join(tmp, "smollm2")
    shutil.rmtree(out, ignore_errors=True)
    run(args, ["convert", path, "--out", out])
    compare(args, ck, "smollm2", path, out, greedy=16)


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tokens, merges = check_families(args, ck, args.tmp)
    check_refusals(args, ck, args.tmp, tokens, merges)
    check_smollm2(args, ck, args.tmp)
    ck.finish("test_gguf_convert")


if __name__ == "__main__":
    main()

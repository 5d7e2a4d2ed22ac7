#!/usr/bin/env python3
"""Conformance: `dspark tokenize --chat` against transformers' apply_chat_template.

For each template family (Qwen2.5, Qwen3, Llama-3.1, Llama-3.2, Phi-3.5, Mistral-Nemo; the
template texts are the models' own, in tests/conformance/chat_templates/), a BPE is trained
here with the family's special tokens and saved with a tokenizer_config.json (the template as
a string, as a list of named templates, or as chat_template.jinja beside it, to exercise each
source). Over many random conversations (system or not, multi-turn, empty and white-space
content, Unicode, reasoning_content and inline <think> blocks, add_generation_prompt on/off,
enable_thinking unset/on/off) the ids must equal apply_chat_template(tokenize=True).

Loss masks: for copies of the templates whose assistant turns are wrapped in
{% generation %} blocks, dspark's mask of the ORIGINAL template (its own rule: the assistant
turn after the template's generation prompt) must equal transformers'
return_assistant_tokens_mask of the annotated copy, and dspark's mask of the annotated copy
too (Qwen3 with enable_thinking off excepted: there the empty think block is prompt, not
generated, by the rule's design). Also checked: raise_exception's message reaches the error, an unsupported construct is
refused naming it and the line, and ChatML is used (and said) when there is no template.
"""
import json
import os
import random
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Checker, parse_args, run  # noqa: E402

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the a of to and in is you that it for on was with as I be at by this had not are but from or have an "
         "they which one were all we when your can said there use each how their if will up other about out many "
         "then them these so some her would make like him into time has look two more write go see number no way "
         "could people my than first water been call who oil its now find long down day did get come made may part "
         "think reason answer because therefore step let's compute").split()
UNICODE = ["héllo", "naïve", "日本語", "Ελληνικά", "😀", "ﬁ", "é", "Straße", "\u00a0nbsp", "тест"]


def text(rng, lo=0, hi=30):
    n = rng.randint(lo, hi)
    parts = []
    for _ in range(n):
        r = rng.random()
        parts.append(rng.choice(UNICODE) if r < 0.08 else str(rng.randint(0, 9999)) if r < 0.14 else rng.choice(WORDS))
        parts.append(rng.choice([" ", " ", " ", " ", "\n", ", ", ". ", "\n\n", "  "]))
    s = "".join(parts)
    r = rng.random()
    if r < 0.1:
        s = "  " + s
    elif r < 0.2:
        s = s + " \n"
    elif r < 0.25:
        s = "\n" + s
    return s


def conversation(rng, family):
    """Messages with user/assistant alternating (Mistral requires it)."""
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(rng, 0, 12)})
    turns = rng.randint(1, 4)
    for t in range(turns):
        msgs.append({"role": "user", "content": text(rng, 0 if rng.random() < 0.1 else 1, 20)})
        if t == turns - 1 and rng.random() < 0.4:
            break  # ends with a user turn: the prompt shape
        content = "" if rng.random() < 0.08 else text(rng, 1, 25)
        m = {"role": "assistant", "content": content}
        if family == "qwen3":
            r = rng.random()
            if r < 0.35:
                m["reasoning_content"] = text(rng, 0, 15)
            elif r < 0.5:
                m["content"] = "<think>\n" + text(rng, 1, 10) + "\n</think>\n\n" + content
        msgs.append(m)
    return msgs


def train_tokenizer(pattern, nfc, specials, added, texts):
    tok = Tokenizer(models.BPE(ignore_merges=pattern is LLAMA3_PATTERN))
    bl_only = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                                 bl_only])
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=1500, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator(texts, tr)
    if added:
        tok.add_tokens(added)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|eom_id|>", "<|python_tag|>"]
# Phi-3.5's role and end tokens strip the white space beside them (rstrip, and lstrip here too):
# text the tokens do not decode to, which the loss mask must still align across.
PHI_SPECIALS = ["<|endoftext|>"] + [AddedToken(t, rstrip=True, lstrip=t == "<|end|>", special=True, normalized=False)
                                    for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")]
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]"]

# family -> (template file, pattern, nfc, specials, non-special added tokens, config extras, template placement)
FAMILIES = {
    "qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", QWEN2_PATTERN, True, QWEN_SPECIALS, [],
                {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "string"),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", QWEN2_PATTERN, True, QWEN_SPECIALS, ["<think>", "</think>"],
              {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "jinja"),
    "llama3.1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA3_PATTERN, False, LLAMA_SPECIALS, [],
                 {"bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False, "normalized": False,
                                "rstrip": False, "single_word": False},
                  "eos_token": "<|eot_id|>"}, "string"),
    "llama3.2": ("meta-llama-Llama-3.2-3B-Instruct.jinja", LLAMA3_PATTERN, False, LLAMA_SPECIALS, [],
                 {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "jinja"),
    "phi3.5": ("microsoft-Phi-3.5-mini-instruct.jinja", LLAMA3_PATTERN, False, PHI_SPECIALS, [],
               {"bos_token": None, "eos_token": "<|endoftext|>"}, "string"),
    "mistral": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", LLAMA3_PATTERN, False, MISTRAL_SPECIALS, [],
                {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, "list"),
}

# Where each family's assistant turn is wrapped in {% generation %} for the mask reference:
# (text in the template, its annotated replacement); the render is unchanged.
ANNOTATE = {
    "llama3.1": None,  # the same line as Llama-3.2's
    "qwen2.5": [("{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
                 "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}{% generation %}"
                 "{{- message.content + '<|im_end|>\\n' }}{% endgeneration %}{%- else %}"
                 "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}")],
    "llama3.2": [("{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
                  "'<|eot_id|>' }}",
                  "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
                  "{%- if message.role == 'assistant' %}{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}"
                  "{% endgeneration %}{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}")],
    "qwen3": [("{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
               "'\\n</think>\\n\\n' + content.lstrip('\\n') }}",
               "{{- '<|im_start|>' + message.role + '\\n' }}{% generation %}{{- '<think>\\n' + "
               "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}{% endgeneration %}"),
              ("{{- '<|im_start|>' + message.role + '\\n' + content }}",
               "{{- '<|im_start|>' + message.role + '\\n' }}{% generation %}{{- content }}{% endgeneration %}"),
              ("{{- '<|im_end|>\\n' }}", "{% generation %}{{- '<|im_end|>\\n' }}{% endgeneration %}")],
    "phi3.5": [("{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}",
                "{{'<|assistant|>\n'}}{% generation %}{{ message['content'] + '<|end|>\n' }}{% endgeneration %}")],
    "mistral": [('{{- message["content"] + eos_token}}',
                 '{% generation %}{{- message["content"] + eos_token}}{% endgeneration %}')],
}


def save_family(tmp, family, texts, template_text=None, placement=None):
    fname, pattern, nfc, specials, added, extras, default_place = FAMILIES[family]
    d = os.path.join(tmp, family if template_text is None else family + "-annotated")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    tok = train_tokenizer(pattern, nfc, specials, added, texts)
    tok.save(os.path.join(d, "tokenizer.json"))
    if template_text is None:
        with open(os.path.join(HERE, "chat_templates", fname), encoding="utf-8") as f:
            template_text = f.read()
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20}
    cfg.update({k: v for k, v in extras.items() if v is not None})
    place = placement or default_place
    if place == "string":
        cfg["chat_template"] = template_text
    elif place == "list":
        cfg["chat_template"] = [{"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                                {"name": "default", "template": template_text}]
    else:
        with open(os.path.join(d, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template_text)
        cfg["chat_template"] = "{{ raise_exception('chat_template.jinja must win') }}"
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    return d, template_text


def dspark_chat(args, d, convs, path, extra):
    with open(path, "w", encoding="utf-8") as f:
        for msgs in convs:
            f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
    out, err, _ = run([args.dspark, "tokenize", os.path.join(d, "tokenizer.json"), "--chat", path] + extra)
    return [json.loads(line) for line in out.splitlines()], err


def compare(ck, what, hf, ours, msgs, hf_tok):
    if hf == ours:
        ck.check(True, what)
        return
    k = next((i for i in range(min(len(hf), len(ours))) if hf[i] != ours[i]), min(len(hf), len(ours)))
    ck.check(False, f"{what}: first difference at {k} (len hf {len(hf)}, ours {len(ours)})\n"
                    f"  messages: {json.dumps(msgs, ensure_ascii=False)[:600]}\n"
                    f"  hf:   {hf_tok.decode(hf[max(0, k - 5):k + 8])!r}\n  ours: {hf_tok.decode(ours[max(0, k - 5):k + 8])!r}")


def options(family):
    opts = [("gen off", False, None), ("gen on", True, None)]
    if family == "qwen3":
        opts += [("gen on thinking off", True, False), ("gen on thinking on", True, True),
                 ("gen off thinking off", False, False)]
    return opts


def capture_and_train(args, ck, rng):
    """`dspark capture` and `dspark train` render chat data through the same template: the
    cached sequences equal transformers' ids and `tokenize --chat`'s masks, and the training
    run records which template it used."""
    import common
    from safetensors.torch import load_file
    target = common.build_qwen3_chat_target(args.tmp)
    convs = [conversation(rng, "qwen3") for _ in range(12)]
    convs = [c for c in convs if any(m["role"] == "assistant" for m in c)]
    data = os.path.join(args.tmp, "chat-data.jsonl")
    ours, _ = dspark_chat(args, target, convs, data, [])
    S = 256
    cache = os.path.join(args.tmp, "chat-cache")
    shutil.rmtree(cache, ignore_errors=True)
    run([args.dspark, "capture", "--target", target, "--data", data, "--out", cache, "--seq-len", str(S), "--dtype", "f32",
         "--target-layers", "1", "--threads", "2", "--quiet"])
    man = json.load(open(os.path.join(cache, "manifest.json")))
    ck.check(man["chat_template"] == "jinja", f"the cache names its template: {man['chat_template']}")
    hf_tok = AutoTokenizer.from_pretrained(target)
    rows = []
    for sh in man["shards"]:
        t = load_file(os.path.join(cache, sh["file"]))
        for i in range(int(t["lengths"].shape[0])):
            n = int(t["lengths"][i])
            rows.append((t["input_ids"][i, :n].tolist(), t["loss_mask"][i, :n].tolist()))
    ck.check(len(rows) == len(convs), f"capture: {len(rows)} sequences for {len(convs)} conversations")
    for i, (ids, mask) in enumerate(rows[:len(convs)]):
        hf = list(hf_tok.apply_chat_template(convs[i], tokenize=True)["input_ids"])[:S]
        compare(ck, f"capture conversation {i} ids", hf, ids, convs[i], hf_tok)
        ck.check(mask == ours[i]["loss_mask"][:S], f"capture conversation {i}: mask differs from tokenize --chat")
    run_dir = os.path.join(args.tmp, "chat-run")
    shutil.rmtree(run_dir, ignore_errors=True)
    run([args.dspark, "train", "--target", target, "--data", data, "--out", run_dir, "--seq-len", "128", "--num-anchors",
         "8", "--block-size", "4", "--markov-rank", "16", "--steps", "1", "--batch-seqs", "2", "--eval-seqs", "2",
         "--threads", "2", "--quiet"])
    info = json.load(open(os.path.join(run_dir, "run.json")))
    ck.check(info.get("chat_template", "").startswith(os.path.join(target, "tokenizer_config.json")),
             f"run.json names the chat template: {info.get('chat_template')}")
    # pretrain renders chat data the same way, and --chat-template overrides the tokenizer's
    override = os.path.join(HERE, "chat_templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
    for extra, want in (([], os.path.join(target, "tokenizer_config.json")),
                        (["--chat-template", override, "--enable-thinking", "off"], override)):
        lm_dir = os.path.join(args.tmp, "chat-pretrain")
        shutil.rmtree(lm_dir, ignore_errors=True)
        run([args.dspark, "pretrain", "--config", os.path.join(target, "config.json"), "--tokenizer",
             os.path.join(target, "tokenizer.json"), "--data", data, "--out", lm_dir, "--seq-len", "128", "--steps", "1",
             "--batch-seqs", "2", "--eval-seqs", "2", "--threads", "2", "--quiet"] + extra)
        info = json.load(open(os.path.join(lm_dir, "run.json")))
        ck.check(info.get("chat_template", "").startswith(want),
                 f"pretrain {' '.join(extra) or '(default)'}: run.json names {info.get('chat_template')}, not {want}")


def main():
    args = parse_args(__doc__)
    ck = Checker()
    rng = random.Random(20240513)
    texts = [text(rng, 50, 400) for _ in range(400)]
    n_convs = 60
    for family in FAMILIES:
        d, template = save_family(args.tmp, family, texts)
        hf_tok = AutoTokenizer.from_pretrained(d)
        convs = [conversation(rng, family) for _ in range(n_convs)]
        for label, gen, thinking in options(family):
            extra = (["--add-generation-prompt"] if gen else []) + \
                    ([] if thinking is None else ["--enable-thinking", "on" if thinking else "off"])
            kw = {} if thinking is None else {"enable_thinking": thinking}
            ours, err = dspark_chat(args, d, convs, os.path.join(args.tmp, f"{family}.jsonl"), extra + ["--show-text"])
            ck.check(len(ours) == len(convs), f"{family} {label}: {len(ours)} lines for {len(convs)} conversations")
            for i, msgs in enumerate(convs):
                hf = hf_tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, **kw)
                hf = list(hf["input_ids"] if isinstance(hf, dict) or hasattr(hf, "keys") else hf)
                compare(ck, f"{family} {label} conversation {i} ids", hf, ours[i]["ids"] if i < len(ours) else [], msgs,
                        hf_tok)
                if i < len(ours):
                    ck.check(len(ours[i]["loss_mask"]) == len(ours[i]["ids"]), f"{family} {label} {i}: mask length")
                    rendered = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw)
                    ck.check(ours[i].get("text") == rendered, f"{family} {label} {i}: --show-text differs from the "
                             f"render\n  ours {ours[i].get('text')!r}\n  hf   {rendered!r}")
            # masks against transformers' {% generation %} masks of an annotated copy
            # With enable_thinking off, Qwen3's empty think block belongs to the prompt (the
            # generation prompt holds it), so the rule does not train it where the annotated
            # copy would: compared with thinking unset or on only.
            if family not in ANNOTATE or thinking is False:
                continue
            annotated = template
            for old, new in ANNOTATE[family] or ANNOTATE["llama3.2"]:
                ck.check(old in annotated, f"{family}: annotation anchor present")
                annotated = annotated.replace(old, new)
            da, _ = save_family(args.tmp, family, texts, annotated, "string")
            hf_ann = AutoTokenizer.from_pretrained(da)
            ours_ann, _ = dspark_chat(args, da, convs, os.path.join(args.tmp, f"{family}-ann.jsonl"), extra)
            for i, msgs in enumerate(convs):
                r = hf_ann.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, return_dict=True,
                                               return_assistant_tokens_mask=True, **kw)
                ids_ok = list(r["input_ids"]) == ours[i]["ids"]
                ck.check(ids_ok, f"{family} {label} {i}: the annotated copy renders the same ids")
                want = list(r["assistant_masks"])
                compare(ck, f"{family} {label} conversation {i} mask (rule)", want, ours[i]["loss_mask"], msgs, hf_ann)
                compare(ck, f"{family} {label} conversation {i} mask (generation)", want, ours_ann[i]["loss_mask"], msgs,
                        hf_ann)

    # raise_exception's message, Mistral's alternation check
    d = os.path.join(args.tmp, "mistral")
    bad = os.path.join(args.tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps({"messages": [{"role": "assistant", "content": "hi"}]}) + "\n")
    _, err, rc = run([args.dspark, "tokenize", os.path.join(d, "tokenizer.json"), "--chat", bad], expect_rc=None)
    ck.check(rc == 1 and "conversation roles must alternate user/assistant" in err, f"raise_exception reaches the error: {err!r}")

    # an unsupported construct is named with its line
    tmpl = os.path.join(args.tmp, "include.jinja")
    with open(tmpl, "w") as f:
        f.write("{{ bos_token }}\n{% include 'other.jinja' %}\n")
    _, err, rc = run([args.dspark, "tokenize", os.path.join(d, "tokenizer.json"), "--chat", bad, "--chat-template", tmpl],
                     expect_rc=None)
    ck.check(rc == 1 and "include.jinja:2: unsupported construct '{% include %}'" in err, f"unsupported construct: {err!r}")

    # no template at all: ChatML, said on stderr
    d0 = os.path.join(args.tmp, "no-template")
    os.makedirs(d0, exist_ok=True)
    shutil.copy(os.path.join(args.tmp, "qwen2.5", "tokenizer.json"), d0)
    conv = os.path.join(args.tmp, "one.jsonl")
    with open(conv, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n")
    out, err, rc = run([args.dspark, "tokenize", os.path.join(d0, "tokenizer.json"), "--chat", conv], expect_rc=None)
    hf_tok = AutoTokenizer.from_pretrained(os.path.join(args.tmp, "qwen2.5"))
    want = hf_tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n", add_special_tokens=False)
    ck.check(rc == 0 and "rendering ChatML" in err and json.loads(out)["ids"] == want, f"ChatML fallback: {err!r}")
    capture_and_train(args, ck, rng)
    ck.finish("test_chat_template")


if __name__ == "__main__":
    main()

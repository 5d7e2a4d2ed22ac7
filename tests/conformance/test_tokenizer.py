#!/usr/bin/env python3
"""Conformance: our byte-level BPE tokenizer against Hugging Face `tokenizers`.

Trains byte-level BPE tokenizers (vocab 8k) with HF tokenizers on Python standard library
sources found on this machine, in the layouts of GPT-2 (ByteLevel regex), Qwen2 (Split regex +
NFC) and Llama-3 (Split regex, ignore_merges, TemplateProcessing adding <|begin_of_text|>),
plus variants that exercise the rest of what we load (legacy "a b" merges, ByteLevel
add_prefix_space, every Split behaviour and invert, added tokens with lstrip / rstrip /
single_word / normalized, special tokens placed after the vocabulary). Then checks on
held-out sources (other files, >= 1 MB) and a synthetic Unicode block:
  * ids identical to HF encode(), add_special_tokens False and True;
  * decode(ids) identical to HF decode() (skip_special_tokens False and True) and equal to the
    text (its NFC form under the NFC normalizer);
  * ChatML rendering: ids identical to HF encoding the rendered string, loss mask covering
    exactly the assistant contents and their "<|im_end|>\\n".
Exits 1 on any mismatch, printing the first differing position with context.
"""
import argparse
import glob
import json
import os
import random
import struct
import subprocess
import sys
import sysconfig
import time
import unicodedata

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

# The pre-tokenizer patterns exactly as in the public tokenizer.json of Qwen2/Qwen2.5/Qwen3
# and of Llama-3/3.1/3.2.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 8000

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, flush=True)


# ---------------------------------------------------------------- text

def stdlib_sources(train_bytes=3_000_000, heldout_bytes=1_200_000):
    """Python sources of the running interpreter's standard library, sorted: even-indexed
    files train, odd-indexed ones are held out. Returns (training texts, held-out texts)."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    files = [f for f in files if "site-packages" not in f]
    if len(files) < 100:
        sys.exit(f"too few Python sources under {root} to train on")

    def take(paths, limit):
        out, size = [], 0
        for p in paths:
            try:
                with open(p, encoding="utf-8") as f:
                    t = f.read()
            except (UnicodeDecodeError, OSError):
                continue
            out.append(t)
            size += len(t.encode())
            if size >= limit:
                break
        return out, size

    train, _ = take(files[0::2], train_bytes)
    held, size = take(files[1::2], heldout_bytes)
    if size < min(heldout_bytes, 1_000_000):
        sys.exit(f"only {size} held-out bytes of Python sources under {root}")
    return train, held


SAMPLES = [
    "北京是中华人民共和国的首都，也是全国的政治中心和文化中心。", "東京都は日本の首都です。ひらがなとカタカナ、漢字。",
    "한국어 텍스트와 한글 음절입니다.", "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Ελληνικά: Καλημέρα κόσμε", "العربية: مَرْحَبًا بِالْعَالَمِ ١٢٣٤٥", "עִבְרִית: שָׁלוֹם עוֹלָם",
    "हिन्दी: नमस्ते दुनिया क्षत्रिय", "ภาษาไทย สวัสดีครับ", "Tiếng Việt: Xin chào thế giới",
    "emoji 😀😃🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🏳️‍🌈", "math ∑∫√∞ ≠ ≤ ≥ ∀x∈ℝ", "café naïve résumé Ångström façade",
    "I'm DON'T it'S we'RE they'Ve you'LL he'd ſ'S K'T", "tabs\tand\t\ttabs", "CRLF line\r\nnext\r\n\r\n",
    "fullwidth ＡＢＣ１２３ digits ①②③ Ⅻ ½ ¾ ²³", "zero\u200bwidth\u200cjoin\u200dchars\ufeffbom",
    "nbsp\u00a0ideographic\u3000space\u2028line\u2029para\u0085nel\u180emongolian\u2009thin",
    "decomposed e\u0301 a\u0308 o\u0302\u0323 q\u0307\u0323 \u1100\u1161\u11a8 \u0915\u093c",
    "out of order a\u0301\u0316 x\u0323\u0302\u0301 \u05d1\u05bc\u05b7 Å Ω K ﬁ ǆ",
    "new letters \U00010d4a\U00010d50 \U0001e4d0\U0001e4d5 \U00031350 digits \U00010d40\U00010d45 \U0001d2c0",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|><|endoftext|>",
    "partial <|im_ <|im_start <im_end|> <||> <|endoftext|x",
    "added: hello world, hello  world; ab abc cab ab_ab ab. e\u0301te\u0301 \u00e9t\u00e9 caf\u00e9 cafe\u0301 "
    "x<mask>y  <mask>  \t<mask>\n <tool> a<tool>b <tool>, <|extra_0|><|extra_1|>", "x<|endoftext|>y <|endoftext|> <|endoftext|><|endoftext|>",
]


def synthetic(seed, size):
    """Deterministic text mixing scripts, emoji, combining marks, RTL, odd whitespace, digit
    runs and inline special tokens, plus stress pieces (long runs) and every BMP code point."""
    rng = random.Random(seed)
    pool = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * 3 + " \t\n\r" * 8 +
            ".,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`" + "éüßñçøåæœ中文日本語한글ÀÉÎÕÜ" +
            "\u0301\u0308\u0323\u0316\u05bc\u064e\u0651\u093c" + "😀🎉👍🏽🇫🇷" + "\u00a0\u3000\u2028\u0085\u180e\u200b")
    parts, n = [], 0
    while n < size:
        r = rng.random()
        if r < 0.35:
            s = rng.choice(SAMPLES)
        elif r < 0.55:
            s = "".join(rng.choice(pool) for _ in range(rng.randint(1, 80)))
        elif r < 0.65:
            s = " " * rng.randint(1, 40) + rng.choice(["x", "\n", "", "\t", "9"]) + " " * rng.randint(0, 5)
        elif r < 0.72:
            s = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 60)))
        elif r < 0.80:
            s = rng.choice(SPECIALS + ["<|begin_of_text|>", "<tool>", "<mask>", " <mask> "])
        else:
            s = "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 20)))
        s = "".join(c for c in s if not 0xD800 <= ord(c) < 0xE000)
        parts.append(s)
        n += len(s.encode())
    stress = [" " * 20000, "\n" * 5000, "1" * 20000, "a" * 20000, "é" * 3000, "!" * 5000, "\t \n" * 2000,
              "ab " * 5000 + "   ", "word   \n   ", "\u0301" * 500, "e" + "\u0316\u0301" * 300]
    # Every code point of the BMP and plane 1, and the CJK blocks of Unicode 15/16: checks
    # the character classes (\s, \p{L}, \p{N}) and NFC tables code point by code point.
    every = "".join(chr(c) for c in range(0x20, 0x20000) if not 0xD800 <= c < 0xE000)
    every += "".join(chr(c) for c in list(range(0x2EBF0, 0x2EE5E)) + list(range(0x31350, 0x323B0)))
    return "".join(parts) + "".join(stress) + every + "\n end with spaces   "


# ---------------------------------------------------------------- tokenizers

def train_bpe(kind, train_texts):
    """A byte-level BPE trained by HF in the layout of kind: gpt2, qwen2 or llama3."""
    bl_only = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if kind == "gpt2":
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        pattern = QWEN2_PATTERN if kind == "qwen2" else LLAMA3_PATTERN
        pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False), bl_only])
    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
    tok.pre_tokenizer = pre
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    specials = SPECIALS + (["<|begin_of_text|>"] if kind == "llama3" else [])
    tr = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train_texts + [synthetic(1234, 200_000)], tr)  # merges beyond ASCII too
    if kind == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def train_tokenizers(tmp, train_texts):
    """name -> path of a tokenizer.json, all trained by HF on the same texts."""
    out = {}
    for name in ("gpt2", "qwen2", "llama3"):
        out[name] = os.path.join(tmp, f"{name}.json")
        train_bpe(name, train_texts).save(out[name])

    # Variants of the trained models (the BPE model does not depend on the pre-tokenizer).
    def variant(name, base, edit):
        tok = Tokenizer.from_file(out[base])
        edit(tok)
        path = os.path.join(tmp, f"{name}.json")
        tok.save(path)
        out[name] = path

    def prefix_space_and_added(tok):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False),
                                AddedToken("<tool>", single_word=True, special=True, normalized=False)])
        tok.add_tokens([AddedToken("hello world", normalized=True), AddedToken("ab", single_word=True),
                        AddedToken("e\u0301t\u00e9", normalized=True)])
    variant("gpt2_prefix_added", "gpt2", prefix_space_and_added)

    def nfc_added(tok):
        tok.add_tokens([AddedToken("e\u0301t\u00e9", normalized=True), AddedToken("caf\u00e9", normalized=False)])
        tok.add_special_tokens(["<|extra_0|>", "<|extra_1|>"])  # ids after the vocabulary
    variant("qwen2_added", "qwen2", nfc_added)

    bl_only = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for behavior in ("removed", "merged_with_previous", "merged_with_next", "contiguous"):
        for invert in (False, True):
            def split(tok, behavior=behavior, invert=invert):
                tok.pre_tokenizer = pre_tokenizers.Sequence([
                    pre_tokenizers.Split(Regex(r"\s+|\p{N}"), behavior=behavior, invert=invert), bl_only])
            variant(f"split_{behavior}{'_inv' if invert else ''}", "qwen2", split)

    def string_split(tok):
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split("  ", behavior="isolated", invert=False),
            pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+"), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    variant("split_string_multi", "gpt2", string_split)

    def edit_json(name, base, edit):
        with open(out[base], encoding="utf-8") as f:
            d = json.load(f)
        edit(d)
        out[name] = os.path.join(tmp, f"{name}.json")
        with open(out[name], "w", encoding="utf-8") as f:
            json.dump(d, f, ensure_ascii=False)

    # Legacy merges ("a b" strings, as in Meta's Llama-3 release), which HF still reads.
    edit_json("llama3_legacy_merges", "llama3",
              lambda d: d["model"].update(merges=[" ".join(m) for m in d["model"]["merges"]]))

    # The model fields as the published Qwen2 file writes them.
    def qwen_fields(d):
        d["model"].update(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
        d["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                               "use_regex": False}
    edit_json("qwen2_published_fields", "qwen2", qwen_fields)
    return out


# ---------------------------------------------------------------- our side

def ours(dspark, args, stdin_bytes=None):
    r = subprocess.run([dspark, "tokenize"] + args, capture_output=True, input=stdin_bytes)
    if r.returncode != 0:
        raise RuntimeError(f"dspark tokenize {' '.join(args)} failed ({r.returncode}): "
                           f"{r.stderr.decode(errors='replace')}")
    return r.stdout


def read_ids(path):
    with open(path, "rb") as f:
        b = f.read()
    return list(struct.unpack(f"<{len(b) // 4}i", b))


def write_ids(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}i", *ids))


def show_diff(label, got, want, tok, enc=None, text=None):
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    lo = max(0, i - 4)
    msg = (f"{label}: {len(got)} ids vs HF {len(want)}; first difference at id {i}\n"
           f"    ours: {got[lo:i + 4]} {[tok.id_to_token(x) for x in got[lo:i + 4]]}\n"
           f"    HF:   {want[lo:i + 4]} {[tok.id_to_token(x) for x in want[lo:i + 4]]}")
    if enc is not None and text is not None and i < len(enc.offsets):
        a = enc.offsets[i][0]
        msg += f"\n    text around char {a}: {text[max(0, a - 40):a + 40]!r}"
    fail(msg)


def check_text(name, tok_path, text, tmp, dspark, full=True):
    """Encode + decode checks of one text with one tokenizer; returns bytes checked."""
    tok = Tokenizer.from_file(tok_path)
    src = os.path.join(tmp, f"{name}.txt")
    with open(src, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    # HF's own NFC (its Unicode tables are older than Python's unicodedata).
    want_text = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
    # A prefix space or a Removed split changes the text, and so does an added token made of
    # byte-level alphabet characters ("café": HF's ByteLevel decoder turns its é into the
    # byte 0xE9, then U+FFFD): no round trip for those.
    lossless = "prefix" not in name and "removed" not in name and "added" not in name
    for add in ((False, True) if full else (False,)):
        enc = tok.encode(text, add_special_tokens=add)
        out = os.path.join(tmp, f"{name}.{int(add)}.bin")
        ours(dspark, [tok_path, "--input", src, "--ids-out", out] + (["--add-special"] if add else []))
        got = read_ids(out)
        if got != enc.ids:
            show_diff(f"{name} encode(add_special_tokens={add})", got, enc.ids, tok, enc, text)
            return 0
        for skip in ((False, True) if full else (False,)):
            dec = ours(dspark, [tok_path, "--decode", out] + (["--skip-special"] if skip else []))
            ref = tok.decode(enc.ids, skip_special_tokens=skip).encode()
            if dec != ref:
                k = next((j for j, (a, b) in enumerate(zip(dec, ref)) if a != b), min(len(dec), len(ref)))
                fail(f"{name} decode(skip_special={skip}, add_special={add}): differs from HF at byte {k}: "
                     f"ours {dec[max(0, k - 30):k + 30]!r} HF {ref[max(0, k - 30):k + 30]!r}")
                return 0
            if lossless and not skip and not add and dec != want_text.encode():
                fail(f"{name}: decode(encode(x)) != {'NFC(x)' if tok.normalizer else 'x'}")
                return 0
    return len(text.encode())


# ---------------------------------------------------------------- chat

CONVERSATIONS = [
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "2 + 2 = 4."}],
    [{"role": "user", "content": "Écris un poème sur 北京 🎉"},
     {"role": "assistant", "content": "\n\nVoici:\n  Les rues de 北京…\n"},
     {"role": "user", "content": "  merci  "},
     {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "inline <|im_end|> and <|endoftext|> tokens"},
     {"role": "assistant", "content": "def f(x):\n    return x * 2  # café e\u0301\n"},
     {"role": "tool", "content": "{\"ok\": true}"},
     {"role": "assistant", "content": " leading space and trailing newline\n"}],
]


def render(conv, gen):
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conv)
    return s + ("<|im_start|>assistant\n" if gen else "")


def check_chat(name, tok_path, tmp, dspark):
    tok = Tokenizer.from_file(tok_path)
    path = os.path.join(tmp, f"{name}.chat.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for conv in CONVERSATIONS:
            f.write(json.dumps({"messages": conv}, ensure_ascii=False) + "\n")
    n = 0
    for gen in (False, True):
        lines = ours(dspark, [tok_path, "--chat", path] + (["--add-generation-prompt"] if gen else []))
        rows = [json.loads(x) for x in lines.decode().splitlines() if x.strip()]
        if len(rows) != len(CONVERSATIONS):
            fail(f"{name} chat: {len(rows)} output lines for {len(CONVERSATIONS)} conversations")
            return n
        for conv, row in zip(CONVERSATIONS, rows):
            want = tok.encode(render(conv, gen), add_special_tokens=False).ids
            if row["ids"] != want:
                show_diff(f"{name} chat ids", row["ids"], want, tok)
                return n
            mask = row["loss_mask"]
            if len(mask) != len(want) or set(mask) - {0, 1}:
                fail(f"{name} chat: loss_mask has {len(mask)} entries for {len(want)} ids or values other than 0/1")
                return n
            # Expected mask from HF's offsets: a token of an assistant message is trained on
            # when it ends inside the content or the closing (a content starting with "\n" can
            # merge with the template's "\n"; that token holds content, so it counts).
            enc = tok.encode(render(conv, gen), add_special_tokens=False)
            regions, pos = [], 0
            for m in conv:
                head = len(f"<|im_start|>{m['role']}\n")
                end = pos + head + len(m["content"]) + len("<|im_end|>\n")
                regions.append((pos, pos + head, end, m["role"] == "assistant"))
                pos = end
            expect = []
            for (a, b) in enc.offsets:
                r = next((r for r in regions if r[0] <= a < r[2]), None)
                expect.append(1 if r and r[3] and b > r[1] else 0)
            if mask != expect:
                show_diff(f"{name} chat loss_mask", mask, expect, tok)
                return n
            trained = tok.decode([i for i, m in zip(want, mask) if m], skip_special_tokens=False)
            contents = "".join(m["content"] + "<|im_end|>\n" for m in conv if m["role"] == "assistant")
            if unicodedata.normalize("NFC", trained.replace("\n\n\n", "\n\n")) != unicodedata.normalize("NFC", contents):
                fail(f"{name} chat: the loss mask selects {trained!r}, expected {contents!r}")
                return n
            n += 1
    return n


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--keep", action="store_true", help="keep going after the first failure")
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    os.environ.setdefault("RAYON_NUM_THREADS", "2")
    t0 = time.time()
    train_texts, held = stdlib_sources()
    heldout = "".join(held)
    synth = synthetic(42, 300_000)
    paths = train_tokenizers(a.tmp, train_texts)
    print(f"trained {len(paths)} tokenizers in {time.time() - t0:.1f} s; held-out {len(heldout.encode()) / 1e6:.2f} MB, "
          f"synthetic {len(synth.encode()) / 1e6:.2f} MB", flush=True)
    checked = {}
    for name, path in paths.items():
        main_cfg = name in ("gpt2", "qwen2", "llama3")
        n = 0
        try:
            if main_cfg:
                n += check_text(f"{name}.heldout", path, heldout, a.tmp, a.dspark)
            n += check_text(f"{name}.synthetic", path, synth, a.tmp, a.dspark, full=main_cfg or "added" in name)
            chats = check_chat(name, path, a.tmp, a.dspark) if main_cfg else 0
        except RuntimeError as e:
            fail(f"{name}: {e}")
            chats = 0
        checked[name] = (n, chats)
        print(f"  {name:28s} ids+decode identical on {n / 1e6:6.2f} MB" + (f", {chats} chats" if chats else ""),
              flush=True)
        if failures and not a.keep:
            break
    total = sum(n for n, _ in checked.values())
    print(f"summary: {len(checked)} tokenizers, {total / 1e6:.2f} MB compared, {len(failures)} failures, "
          f"{time.time() - t0:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Pre-tokenizer regex classes against HF tokenizers (issue 7, item 27).

HF runs Split patterns with Oniguruma and its Unicode 16 tables; we run them with the system
PCRE2 (Unicode 14 in 10.42), translating every class to HF's measured tables
(src/text/tok_regex.c). Checked here against the installed `tokenizers`:

- every class a pattern can use (each general category and aggregate, short and long names,
  \\P{..} and \\p{^..}, \\s \\d \\w \\h and their negations, \\v, brackets mixing them as the
  GPT-4o / o200k and DeepSeek patterns do, \\b and \\B): a Split(..., "removed") tokenizer over
  every code point of planes 0-3 and 14 and a sample of the others gives HF's ids;
- o200k-style and DeepSeek-style tokenizers (BPE trained here) on text with the characters the
  issue names (U+0CF3, U+11F00, "Wi-Fi \U0001F6DC, ok") and every code point of planes 0-1 in
  context: ids identical to HF's;
- an added token with single_word next to characters whose word-ness changed (the regex
  crate's \\w): ids identical to HF's;
- classes that cannot follow HF's tables (\\p{Han}, [[:alpha:]], \\X, \\p{Lu} under (?i)) are
  refused at load naming the class."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK = [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
            r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+"]

CATEGORIES = ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "LC", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "Pc",
              "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So", "Z", "Zs", "Zl", "Zp", "C", "Cc",
              "Cf", "Co", "Cn"]
CLASSES = ([r"\p{%s}" % c for c in CATEGORIES] +
           [r"\p{Letter}", r"\p{Other_Symbol}", r"\p{combining mark}", r"\p{Decimal-Number}", r"\p{punctuation}",
            r"\P{L}", r"\P{Mn}", r"\p{^So}", r"\P{^M}", r"\s", r"\S", r"\d", r"\D", r"\w", r"\W", r"\h", r"\H", r"\v",
            r"[^\s\p{L}\p{N}]", r"[^\r\n\p{L}\p{N}]", r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]",
            r"[^\r\n\p{L}\p{P}\p{S}]", r"[\p{P}\p{S}]", r"[\p{L}\p{M}]", r"[\P{L}a]", r"[\S\d]", r"[^\S]",
            r"[\W\p{Cn}]", r"[\p{Mn}x-z]", r"\w\b", r"\b\w", r"\B\W"])


def sample_text():
    cps = [c for c in range(0x110000) if not (0xD800 <= c < 0xE000) and
           (c < 0x40000 or 0xE0000 <= c < 0xE1000 or c % 257 == 0 or (c & 0xFFFF) >= 0xFFFE)]
    return "".join(map(chr, cps))


def byte_tokenizer(pre):
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return tok


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp, D = args.tmp, args.dspark
    n = [0]

    def ours(tok_path, text_path, expect_rc=0):
        n[0] += 1
        out = os.path.join(tmp, "ids%d.bin" % (n[0] % 4))
        _, err, rc = common.run([D, "tokenize", tok_path, "--input", text_path, "--ids-out", out], expect_rc=None)
        if rc != expect_rc:
            return None, err, rc
        if rc:
            return None, err, rc
        data = open(out, "rb").read()
        return list(struct.unpack("<%di" % (len(data) // 4), data)), err, rc

    def compare(what, tok, text, text_path):
        path = os.path.join(tmp, "tok.json")
        tok.save(path)
        want = tok.encode(text, add_special_tokens=False).ids
        got, err, rc = ours(path, text_path)
        if got is None:
            ck.check(False, f"{what}: dspark tokenize exit {rc}: {err.strip()}")
            return
        if got == want:
            ck.check(True, what)
            return
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        g, w = tok.decode(got[:i + 8]), tok.decode(want[:i + 8])
        k = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        ctx = w[max(0, k - 2):k + 3]
        ck.check(False, f"{what}: ids differ from HF at id {i} of {len(want)}; around "
                        f"{' '.join('U+%04X' % ord(c) for c in ctx)} (ours {len(got)} ids)")

    # ---------------------------------------------------------------- every class, every code point
    text = sample_text()
    text_path = os.path.join(tmp, "codepoints.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(text)
    for pat in CLASSES:
        tok = byte_tokenizer(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pat), behavior="removed"),
                                                      pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                               use_regex=False)]))
        compare(f"class {pat}", tok, text, text_path)

    # ---------------------------------------------------------------- real-world patterns
    context = "".join(f"a{chr(c)}b {chr(c)}1, x{chr(c)}{chr(c)} " for c in range(0x20, 0x20000)
                      if not (0xD800 <= c < 0xE000))
    named = ("Wi-Fi \U0001F6DC, ok. \u0C95\u0CF3 \u0CF3x Kawi \U00011F00\U00011F04\U00011F34 "
             "\u1C89\u1C8A A\uA7CB\uA7CC \U0001E5D0\U0001E5F1 ok\u0897 !\U0001F6DC\U0001F6DC\n")
    corpus = [named * 3, "def f(x):\n    return x + 1  # hello, world\n" * 20, context[:200000]]
    probe = named + context
    probe_path = os.path.join(tmp, "probe.txt")
    with open(probe_path, "w", encoding="utf-8") as f:
        f.write(probe)
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for name, splits in (("o200k", [O200K]), ("deepseek", DEEPSEEK)):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in splits] + [bl])
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1200, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        path = os.path.join(tmp, f"{name}.json")
        tok.save(path)
        named_path = os.path.join(tmp, "named.txt")
        with open(named_path, "w", encoding="utf-8") as f:
            f.write(named)
        compare(f"{name}: the issue's examples", tok, named, named_path)
        compare(f"{name}: every code point of planes 0-1 in context", tok, probe, probe_path)

    # ---------------------------------------------------------------- single_word neighbours
    tok = byte_tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.add_tokens([AddedToken("tok", single_word=True, normalized=False)])
    neighbours = [0x200C, 0x200D, 0x24B6, 0x1F130, 0xB2, 0xBC, 0x0CF3, 0x11F00, 0x1C89, 0x10D69, 0x0897, 0x1171E,
                  0x1E5F1, 0x16D40, ord("a"), ord("1"), ord("_"), ord("-"), 0x300, 0x2160]
    sw = "".join(f"{chr(c)}tok tok{chr(c)} {chr(c)}tok{chr(c)} . " for c in neighbours)
    sw_path = os.path.join(tmp, "single_word.txt")
    with open(sw_path, "w", encoding="utf-8") as f:
        f.write(sw)
    compare("single_word next to changed characters", tok, sw, sw_path)

    # ---------------------------------------------------------------- refused classes
    for pat, needle in ((r"\p{Han}+", r"\p{Han}"), (r"[[:alpha:]]+", "[:alpha:]"), (r"\X", r"\X"),
                        (r"(?i)\p{Lu}", "(?i)"), (r"[a-z&&[^aeiou]]", "&&")):
        tok = byte_tokenizer(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pat), behavior="isolated"), bl]))
        path = os.path.join(tmp, "refused.json")
        tok.save(path)
        got, err, rc = ours(path, sw_path, expect_rc=1)
        ck.check(rc == 1 and needle in err and "pre_tokenizer" in err,
                 f"refused {pat}: exit {rc}, message {err.strip()} (expected exit 1 naming {needle})")
    ck.finish("test_hardening_text_regex")


if __name__ == "__main__":
    main()

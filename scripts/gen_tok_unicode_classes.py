#!/usr/bin/env python3
# $VENV/bin/python scripts/gen_tok_unicode_classes.py src/text
# Generates src/text/tok_uprops_*.c: the character classes of pre-tokenizer regexes as Hugging
# Face tokenizers matches them, MEASURED code point by code point with the installed
# `tokenizers` (its Oniguruma runs the Split patterns; the `regex` crate decides single_word):
#   - the 29 measured general categories (Cs is the surrogates by definition), checked to
#     partition the code points, with the aggregates (L, M, N, P, S, Z, C, LC) and every long
#     name the tokenizer accepts checked against their unions;
#   - \s \d \w \h (and \S \D \W \H checked to be their complements; \v \V \O checked to be
#     Ruby's vertical tab, letter V and any character), and the \w that decides an added
#     token's single_word;
#   - for each category, the code points where the system PCRE2's own \p{..} (Unicode
#     PCRE2_CONFIG_UNICODE_VERSION) differs, so the compiled patterns can use PCRE2's fast
#     property tables plus a short list of exceptions when the PCRE2 at run time has the same
#     Unicode version (tok_uclass.c checks; otherwise every class is written out in full).
import ctypes
import os
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

N = 0x110000
CPS = [c for c in range(N) if not (0xD800 <= c < 0xE000)]
ALL = "".join(map(chr, CPS))
SURR = set(range(0xD800, 0xE000))

LEAVES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf",
          "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cn"]
AGGREGATES = {"L": ["Lu", "Ll", "Lt", "Lm", "Lo"], "LC": ["Lu", "Ll", "Lt"], "M": ["Mn", "Mc", "Me"],
              "N": ["Nd", "Nl", "No"], "P": ["Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"],
              "S": ["Sm", "Sc", "Sk", "So"], "Z": ["Zs", "Zl", "Zp"], "C": ["Cc", "Cf", "Cs", "Co", "Cn"]}
LONG = {"Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
        "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo", "Mark": "M",
        "Combining_Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me",
        "Number": "N", "Decimal_Number": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
        "Punctuation": "P", "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Open_Punctuation": "Ps",
        "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi", "Final_Punctuation": "Pf",
        "Other_Punctuation": "Po", "Symbol": "S", "Math_Symbol": "Sm", "Currency_Symbol": "Sc",
        "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Separator": "Z", "Space_Separator": "Zs",
        "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C", "Control": "Cc", "Format": "Cf",
        "Surrogate": "Cs", "Private_Use": "Co", "Unassigned": "Cn"}
# Code points first assigned in each Unicode version, to name the version HF's tables have.
VERSION_PROBES = [("15.0", 0x1F6DC), ("15.1", 0x2EBF0), ("16.0", 0x1C89), ("17.0", 0x323B0)]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def hf_set(pat):
    """Code points (surrogates excluded) that the one-character pattern matches in HF."""
    pieces = pre_tokenizers.Split(Regex(pat), behavior="removed").pre_tokenize_str(ALL)
    kept = set()
    for p, _ in pieces:
        kept.update(map(ord, p))
    return set(CPS) - kept


def single_word_set():
    """Code points c for which an added single_word token right after c is NOT matched,
    i.e. c is a word character for the `regex` crate's \\w (what single_word checks)."""
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.add_tokens([AddedToken("\u2603", single_word=True, normalized=False)])
    tid = tok.token_to_id("\u2603")
    word = set()
    step = 20000
    for i in range(0, len(CPS), step):
        chunk = CPS[i:i + step]
        enc = tok.encode_batch(["." + chr(c) + "\u2603." for c in chunk], add_special_tokens=False)
        for c, e in zip(chunk, enc):
            if c == 0x2603:
                continue  # the token itself: decided by the neighbours of the whole match
            if tid not in e.ids:
                word.add(c)
    return word


# ---- PCRE2 (the system library, through ctypes) ----
pcre = ctypes.CDLL("libpcre2-8.so.0")
pcre.pcre2_compile_8.restype = ctypes.c_void_p
pcre.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int),
                                 ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
pcre.pcre2_match_data_create_from_pattern_8.restype = ctypes.c_void_p
pcre.pcre2_match_data_create_from_pattern_8.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
pcre.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                               ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p]
pcre.pcre2_get_ovector_pointer_8.restype = ctypes.POINTER(ctypes.c_size_t)
pcre.pcre2_get_ovector_pointer_8.argtypes = [ctypes.c_void_p]
pcre.pcre2_config_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
PCRE2_UTF, PCRE2_UCP, PCRE2_CONFIG_UNICODE_VERSION, PCRE2_CONFIG_VERSION = 0x00080000, 0x00020000, 10, 11
UTF8 = ALL.encode("utf-8")


def pcre_config_str(what):
    buf = ctypes.create_string_buffer(64)
    pcre.pcre2_config_8(what, buf)
    return buf.value.decode()


def pcre_set(pat):
    """Code points (surrogates excluded) PCRE2 matches with (?:pat)+ run over every code point."""
    p = ("(?:" + pat + ")+").encode()
    err, off = ctypes.c_int(), ctypes.c_size_t()
    re = pcre.pcre2_compile_8(p, len(p), PCRE2_UTF | PCRE2_UCP, ctypes.byref(err), ctypes.byref(off), None)
    assert re, pat
    md = pcre.pcre2_match_data_create_from_pattern_8(re, None)
    out, pos = set(), 0
    while pcre.pcre2_match_8(re, UTF8, len(UTF8), pos, 0, md, None) >= 0:
        ov = pcre.pcre2_get_ovector_pointer_8(md)
        out.update(map(ord, UTF8[ov[0]:ov[1]].decode()))
        pos = ov[1] if ov[1] > ov[0] else ov[1] + 1
    return out


def ranges(s):
    out = []
    for c in sorted(s):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "src/text"
    hf = {}
    for g in LEAVES:
        hf[g] = hf_set(r"\p{%s}" % g)
        log(g, len(hf[g]))
    union = set()
    for g in LEAVES:
        assert not (union & hf[g]), g + " overlaps another category"
        union |= hf[g]
    assert union == set(CPS), "the categories do not cover every code point"
    hf["Cs"] = set()  # surrogates never occur in UTF-8 text
    for a, members in AGGREGATES.items():
        assert hf_set(r"\p{%s}" % a) == set().union(*(hf[m] for m in members)), a
        hf[a] = set().union(*(hf[m] for m in members))
    names = {g.lower(): g for g in LEAVES + ["Cs"] + list(AGGREGATES)}
    for long, short in LONG.items():
        try:
            ok = hf_set(r"\p{%s}" % long) == hf[short]
        except Exception as e:  # noqa: BLE001 (the tokenizer refuses the name)
            ok = False
            log("HF refuses", long, e)
        if ok:
            names[long.replace("_", "").lower()] = short
        else:
            log("left out (differs from", short, "in HF):", long)
    version = [v for v, cp in VERSION_PROBES if cp not in hf["Cn"]]
    unicode_version = version[-1] if version else "before 15.0"
    log("HF's tables: Unicode", unicode_version)

    esc = {e: hf_set("\\" + e) for e in "sSdDwWhHvVO"}
    for e in "sdwh":
        assert esc[e.upper()] == set(CPS) - esc[e], "\\" + e.upper() + " is not the complement of \\" + e
    # Ruby syntax: \v is the vertical tab alone, \V a plain 'V', \O any character (tok_regex.c).
    assert esc["v"] == {0x0B} and esc["V"] == {ord("V")} and esc["O"] == set(CPS), "\\v \\V \\O changed"
    assert esc["d"] == hf["Nd"], "\\d differs from \\p{Nd}"
    # Inside [...] Oniguruma's \w leaves out the Latin-1 superscripts and fractions that the
    # \w outside a bracket matches; \s \d \h are the same in both places.
    word_in_bracket = hf_set(r"[\w]")
    assert hf_set(r"[\W]") == set(CPS) - word_in_bracket, "[\\W] is not the complement of [\\w]"
    for e in "sdh":
        assert hf_set("[\\%s]" % e) == esc[e], "[\\" + e + "] differs from \\" + e
    base_w = hf["L"] | hf["M"] | hf["Nd"] | hf["Nl"] | hf["Pc"]
    word = single_word_set()
    log("\\w", len(esc["w"]), "single_word \\w", len(word))

    pcre_version = pcre_config_str(PCRE2_CONFIG_UNICODE_VERSION)
    log("PCRE2", pcre_config_str(PCRE2_CONFIG_VERSION), "Unicode", pcre_version)
    native = {g: pcre_set(r"\p{%s}" % g) for g in LEAVES}
    nat_union = set().union(*native.values())
    assert nat_union == set(CPS), "PCRE2's categories do not cover every code point"
    for a, members in AGGREGATES.items():
        if a != "LC":
            assert pcre_set(r"\p{%s}" % a) == set().union(*(native[m] for m in members if m != "Cs")), a

    families = [("letters", "Letters", ["Lu", "Ll", "Lt", "Lm", "Lo"]),
                ("marks_numbers", "Marks and numbers", ["Mn", "Mc", "Me", "Nd", "Nl", "No"]),
                ("punct_symbols", "Punctuation and symbols", ["Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm",
                                                              "Sc", "Sk", "So"]),
                ("other", "Separators and other", ["Zs", "Zl", "Zp", "Cc", "Cf", "Co"])]
    OPEN, CLOSE = "/" + "*", "*" + "/"
    head = (OPEN + " %s of HF tokenizers' regex classes. GENERATED by scripts/gen_tok_unicode_classes.py\n"
            " * (run it with the conformance venv's Python; do not edit by hand): measured with tokenizers %s\n"
            " * (Unicode %s tables), PCRE2 %s (Unicode %s). " + CLOSE + "\n#include \"text/tok_uprops.h\"\n") % (
        "%s", tokenizers.__version__, unicode_version, pcre_config_str(PCRE2_CONFIG_VERSION), pcre_version)

    def table(o, name, s):
        rs = ranges(s)
        o.write("const tk_urange %s[] = {\n" % name)
        for i in range(0, len(rs), 5):
            o.write("   " + "".join(" {0x%04X, 0x%04X}," % tuple(r) for r in rs[i:i + 5]) + "\n")
        if not rs:
            o.write("    {1, 0}, " + OPEN + " empty (a range no code point is in) " + CLOSE + "\n")
        o.write("};\nconst size_t %s_n = %d;\n" % (name, len(rs)))

    for fname, title, cats in families:
        path = os.path.join(outdir, "tok_uprops_%s.c" % fname)
        with open(path, "w") as o:
            o.write(head % (title + ": the general categories"))
            for g in cats:
                o.write("\n")
                table(o, "tk_ugc_%s" % g, hf[g])
        log(path, sum(1 for _ in open(path)), "lines")

    path = os.path.join(outdir, "tok_uprops_index.c")
    with open(path, "w") as o:
        o.write(head % "Index, escapes and PCRE2 exceptions")
        o.write("\nconst char tk_uprops_hf_unicode[] = \"%s\";\nconst char tk_uprops_pcre2_unicode[] = \"%s\";\n"
                % (unicode_version, pcre_version))
        o.write("\n" + OPEN + " Where PCRE2 %s's \\p{..} differs: HF only (add) and PCRE2 only (rem). " % pcre_version
                + CLOSE + "\n")
        for g in LEAVES:
            if g == "Cn":
                continue  # the complement of the others, on both sides
            table(o, "tk_ugc_%s_add" % g, hf[g] - native[g])
            table(o, "tk_ugc_%s_rem" % g, native[g] - hf[g])
        o.write("\n" + OPEN + " The measured categories; Cn is the complement of the others and Cs the surrogates. "
                + CLOSE + "\n")
        for fname, _, cats in families:
            o.write(OPEN + " tok_uprops_%s.c " % fname + CLOSE + "\n")
            for g in cats:
                o.write("extern const tk_urange tk_ugc_%s[];\nextern const size_t tk_ugc_%s_n;\n" % (g, g))
        o.write("const tk_ugc tk_ugc_leaves[] = {\n")
        for g in LEAVES:
            if g == "Cn":
                continue
            o.write("    {\"%s\", tk_ugc_%s, &tk_ugc_%s_n, tk_ugc_%s_add, &tk_ugc_%s_add_n, tk_ugc_%s_rem, "
                    "&tk_ugc_%s_rem_n},\n" % ((g,) * 7))
        o.write("};\nconst size_t tk_ugc_leaves_n = sizeof tk_ugc_leaves / sizeof tk_ugc_leaves[0];\n")
        o.write("\n" + OPEN + " Property names HF accepts, lower case without '_', ' ' or '-' -> category. " + CLOSE
                + "\n")
        o.write("const tk_ugc_name tk_ugc_names[] = {\n")
        items = sorted(names.items())
        for i in range(0, len(items), 4):
            o.write("   " + "".join(" {\"%s\", \"%s\"}," % kv for kv in items[i:i + 4]) + "\n")
        o.write("};\nconst size_t tk_ugc_names_n = sizeof tk_ugc_names / sizeof tk_ugc_names[0];\n")
        o.write("\n" + OPEN + " \\s and \\h as HF's Oniguruma matches them. " + CLOSE + "\n")
        table(o, "tk_uesc_s", esc["s"])
        table(o, "tk_uesc_h", esc["h"])
        o.write("\n" + OPEN + " \\w = L|M|Nd|Nl|Pc plus _add minus _rem: Oniguruma's outside [...] (w) and inside "
                "(wb), and the regex crate's (single_word). " + CLOSE + "\n")
        table(o, "tk_uesc_w_add", esc["w"] - base_w)
        table(o, "tk_uesc_w_rem", base_w - esc["w"])
        table(o, "tk_uesc_wb_add", word_in_bracket - base_w)
        table(o, "tk_uesc_wb_rem", base_w - word_in_bracket)
        table(o, "tk_uword_add", word - base_w)
        table(o, "tk_uword_rem", base_w - word)
    log(path, sum(1 for _ in open(path)), "lines")


if __name__ == "__main__":
    main()

"""The GGUF reader (include/dspark/gguf.h) against the gguf Python package, which writes the files:

- every tensor type the engine converts (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
  Q6_K) dequantizes to the bits of gguf.quants.dequantize, on random raw blocks (every nibble,
  scale and high-bit pattern; the halves set to finite random values, subnormals included) and on
  real values quantized by gguf.quants where it quantizes that type; 1-, 2- and 3-D tensors;
- every metadata value type (integers at their limits, floats, bools, strings, arrays of each)
  reads back equal; a custom general.alignment is honoured; a version-2 file reads as version 3;
- a type it does not convert (Q2_K) is refused naming the type and the tensor;
- malformed files built by hand are refused with exit 1 and a message naming the file and the
  key or tensor, never a crash: every truncation of a small file, bad magic, versions 1 and 4, a
  big-endian file, counts larger than the file, an unknown value type, a nested array, a bool
  that is 2, duplicate keys and tensor names, 0 or 5 dimensions, a zero dimension, a row that is
  not whole blocks, an unknown tensor type, a misaligned or out-of-file offset, overlapping
  tensors, a non-power-of-two alignment, a non-finite value."""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

# the half-precision fields of each block type: (byte offset, ...) within a block
HALVES = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.Q4_K: (0, 2),
          Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
CONVERTED = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def random_blocks(rng, qtype, n_blocks):
    """Raw blocks of random bytes whose half fields are finite random values (normal and subnormal)."""
    bs, bb = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, bb), dtype=np.uint8)
    for off in HALVES[qtype]:
        mag = rng.choice([1e-3, 1e-1, 1.0, 30.0, 6e-6], size=n_blocks)  # 6e-6: a half subnormal
        h = (rng.standard_normal(n_blocks) * mag).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return raw


def dump(args, path, tmp, expect_rc=0):
    st, js = os.path.join(tmp, "dump.safetensors"), os.path.join(tmp, "dump.json")
    for p in (st, js):
        if os.path.exists(p):
            os.remove(p)
    r = subprocess.run([args.tool, path, st, js], capture_output=True, text=True, timeout=60)
    return r, (load_file(st) if r.returncode == 0 and os.path.exists(st) else None), \
        (json.load(open(js)) if r.returncode == 0 and os.path.exists(js) else None)


def write_package_file(path, tensors, kvs=None, alignment=None):
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    for add in (kvs or []):
        add(w)
    for name, arr, qtype in tensors:
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_types(args, ck, tmp):
    rng = np.random.default_rng(7)
    tensors, want = [], {}
    for qtype in CONVERTED:
        bs, bb = gguf.GGML_QUANT_SIZES[qtype]
        for shape in ((3, 2 * max(bs, 32)), (2 * max(bs, 32),), (2, 2, max(bs, 32))):
            name = f"{qtype.name}.{len(shape)}d"
            if qtype in HALVES:
                n_blocks = int(np.prod(shape)) // bs
                raw = random_blocks(rng, qtype, n_blocks).reshape(shape[:-1] + (shape[-1] // bs * bb,))
            elif qtype == Q.BF16:
                x = (rng.standard_normal(shape) * 3).astype(np.float32)
                raw = gguf.quants.quantize(x, qtype)
            else:
                raw = (rng.standard_normal(shape) * 3).astype(np.float32)
                raw.flat[0] = 1e-42  # a subnormal
                raw = gguf.quants.quantize(raw, qtype)
            tensors.append((name, raw, qtype))
            want[name] = gguf.quants.dequantize(raw, qtype).reshape(shape).astype(np.float32)
        if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):  # real values through the package's quantizer
            x = (rng.standard_normal((4, 64)) * 0.05).astype(np.float32)
            raw = gguf.quants.quantize(x, qtype)
            tensors.append((f"{qtype.name}.real", raw, qtype))
            want[f"{qtype.name}.real"] = gguf.quants.dequantize(raw, qtype).reshape(4, 64).astype(np.float32)
    # a type the layout knows but the engine does not convert
    q2 = rng.integers(0, 256, size=(1, 84), dtype=np.uint8)
    q2[:, 80:84] = np.array([0.5, 0.25], dtype=np.float16).view(np.uint8)
    tensors.append(("Q2_K.unconverted", q2, Q.Q2_K))
    path = os.path.join(tmp, "types.gguf")
    write_package_file(path, tensors)
    r, got, meta = dump(args, path, tmp)
    ck.check(r.returncode == 0, f"types.gguf refused: {r.stderr}")
    if got is None:
        return
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            ck.check(False, f"{name}: not dequantized ({meta['tensors'].get(name, {}).get('error')})")
            continue
        same = g.shape == w.shape and np.array_equal(g.view(np.uint32), w.view(np.uint32))
        bad = "" if same or g.shape != w.shape else f", first differing element {int(np.argmax(g.view(np.uint32).ravel() != w.view(np.uint32).ravel()))}"
        ck.check(same, f"{name}: our dequantization differs from gguf.quants (shapes {g.shape} {w.shape}{bad})")
    err = meta["tensors"]["Q2_K.unconverted"].get("error", "")
    ck.check("Q2_K" in err and "Q2_K.unconverted" in err and "Q2_K.unconverted" not in got,
             f"Q2_K: not refused by name: {err!r}")
    print(f"{len(want)} tensors of {len(CONVERTED)} types dequantized to gguf.quants' bits")


def check_metadata(args, ck, tmp):
    V = gguf.GGUFValueType
    kvs = [lambda w: w.add_uint8("t.u8", 255), lambda w: w.add_int8("t.i8", -128),
           lambda w: w.add_uint16("t.u16", 65535), lambda w: w.add_int16("t.i16", -32768),
           lambda w: w.add_uint32("t.u32", 4294967295), lambda w: w.add_int32("t.i32", -2147483648),
           lambda w: w.add_uint64("t.u64", 18446744073709551615), lambda w: w.add_int64("t.i64", -9223372036854775808),
           lambda w: w.add_float32("t.f32", 0.1), lambda w: w.add_float64("t.f64", -1e300),
           lambda w: w.add_bool("t.bool", True), lambda w: w.add_string("t.str", "héllo \n \"x\" 日本"),
           lambda w: w.add_key_value("t.empty", "", V.STRING),
           lambda w: w.add_array("t.strs", ["a", "", "Ġthe", "<|im_end|>"]),
           lambda w: w.add_key_value("t.i32s", [1, -2, 3], V.ARRAY, sub_type=V.INT32),
           lambda w: w.add_key_value("t.f32s", [0.5, -1.25], V.ARRAY, sub_type=V.FLOAT32),
           lambda w: w.add_key_value("t.bools", [True, False], V.ARRAY, sub_type=V.BOOL)]
    path = os.path.join(tmp, "meta.gguf")
    write_package_file(path, [("x", np.arange(32, dtype=np.float32), Q.F32)], kvs, alignment=64)
    r, got, meta = dump(args, path, tmp)
    ck.check(r.returncode == 0, f"meta.gguf refused: {r.stderr}")
    if meta is None:
        return
    want = {"t.u8": ("u8", "255"), "t.i8": ("i8", "-128"), "t.u16": ("u16", "65535"), "t.i16": ("i16", "-32768"),
            "t.u32": ("u32", "4294967295"), "t.i32": ("i32", "-2147483648"), "t.u64": ("u64", "18446744073709551615"),
            "t.i64": ("i64", "-9223372036854775808"), "t.f32": ("f32", float(np.float32(0.1))),
            "t.f64": ("f64", -1e300), "t.bool": ("bool", True), "t.str": ("string", "héllo \n \"x\" 日本"),
            "t.empty": ("string", ""), "t.strs": ("array", ["a", "", "Ġthe", "<|im_end|>"]),
            "t.i32s": ("array", ["1", "-2", "3"]), "t.f32s": ("array", [0.5, -1.25]),
            "t.bools": ("array", [True, False]),
            "general.alignment": ("u32", "64"), "general.architecture": ("string", "llama")}
    for k, (t, v) in want.items():
        e = meta["kv"].get(k)
        ck.check(e is not None and e["type"] == t and e["value"] == v, f"metadata {k}: got {e}, want {t} {v!r}")
    ck.check(meta["alignment"] == 64 and meta["version"] == 3, f"alignment / version: {meta['alignment']} {meta['version']}")
    ck.check(np.array_equal(got["x"], np.arange(32, dtype=np.float32)), "the tensor after a 64-byte alignment")
    # version 2 has the same layout
    data = bytearray(open(path, "rb").read())
    data[4:8] = struct.pack("<I", 2)
    p2 = os.path.join(tmp, "v2.gguf")
    open(p2, "wb").write(data)
    r, got2, meta2 = dump(args, p2, tmp)
    ck.check(r.returncode == 0 and meta2["version"] == 2 and meta2["kv"] == meta["kv"], f"version 2: {r.stderr}")
    print(f"{len(want)} metadata values read back; alignment 64; version 2")


# ---------------------------------------------------------------- hand-built files


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def tinfo(name, dims, ttype, offset):
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ttype, offset)


def build(kvs, infos, data, version=3, align=32, n_kv=None, n_t=None, magic=b"GGUF"):
    head = magic + struct.pack("<IQQ", version, len(infos) if n_t is None else n_t, len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    body += b"\0" * ((-len(body)) % align)
    return body + data


def good_parts():
    kvs = [kv("general.architecture", 8, s("llama")), kv("a.u32", 4, struct.pack("<I", 7)),
           kv("a.arr", 9, struct.pack("<IQ", 8, 2) + s("x") + s("yz"))]
    infos = [tinfo("w", [4, 2], 0, 0), tinfo("b", [32], 8, 32)]
    data = np.arange(8, dtype=np.float32).tobytes() + b"\0" * 0 + struct.pack("<e", 0.5) + bytes(range(32))
    return kvs, infos, data


def check_malformed(args, ck, tmp):
    kvs, infos, data = good_parts()
    good = build(kvs, infos, data)
    path = os.path.join(tmp, "bad.gguf")
    open(path, "wb").write(good)
    r, got, _ = dump(args, path, tmp)
    ck.check(r.returncode == 0 and got is not None and np.array_equal(got["w"], np.arange(8, dtype=np.float32).reshape(2, 4)),
             f"the hand-built file is refused or misread: {r.stderr}")
    cases = []
    # every truncation of the header part, and a sample inside the data
    header_len = len(good) - len(data)
    for n in list(range(0, header_len, 3)) + [header_len + 5, len(good) - 1]:
        cases.append((f"truncated to {n} bytes", good[:n], ["bad.gguf"]))
    cases += [
        ("bad magic", build(kvs, infos, data, magic=b"GGUE"), ["not a GGUF file"]),
        ("version 1", build(kvs, infos, data, version=1), ["version 1"]),
        ("version 4", build(kvs, infos, data, version=4), ["version 4"]),
        ("big-endian", build(kvs, infos, data, version=0x03000000), ["big-endian"]),
        ("huge kv count", build(kvs, infos, data, n_kv=1 << 60), ["key-values"]),
        ("huge tensor count", build(kvs, infos, data, n_t=1 << 60), ["tensors"]),
        ("unknown value type", build(kvs + [kv("k.bad", 13, b"")], infos, data), ["k.bad", "13"]),
        ("nested array", build(kvs + [kv("k.nest", 9, struct.pack("<IQ", 9, 1))], infos, data), ["k.nest", "array of arrays"]),
        ("bool 2", build(kvs + [kv("k.b", 7, b"\x02")], infos, data), ["k.b", "bool"]),
        ("huge string", build(kvs + [kv("k.s", 8, struct.pack("<Q", 1 << 62))], infos, data), ["k.s"]),
        ("huge array", build(kvs + [kv("k.a", 9, struct.pack("<IQ", 4, 1 << 61))], infos, data), ["k.a"]),
        ("duplicate key", build(kvs + [kv("a.u32", 4, struct.pack("<I", 8))], infos, data), ["a.u32", "twice"]),
        ("duplicate tensor", build(kvs, infos + [tinfo("w", [32], 0, 64)], data + bytes(128)), ["'w'", "twice"]),
        ("0 dimensions", build(kvs, [tinfo("w", [], 0, 0), infos[1]], data), ["'w'", "dimensions"]),
        ("5 dimensions", build(kvs, [tinfo("w", [1, 1, 1, 1, 8], 0, 0), infos[1]], data), ["'w'", "dimensions"]),
        ("zero dimension", build(kvs, [tinfo("w", [4, 0], 0, 0), infos[1]], data), ["'w'", "dimension 1"]),
        ("dimension overflow", build(kvs, [tinfo("w", [1 << 40, 1 << 40], 0, 0), infos[1]], data), ["'w'"]),
        ("row not whole blocks", build(kvs, [infos[0], tinfo("b", [16], 8, 32)], data), ["'b'", "Q8_0", "blocks"]),
        ("unknown tensor type", build(kvs, [infos[0], tinfo("b", [32], 99, 32)], data), ["'b'", "type 99"]),
        ("misaligned offset", build(kvs, [infos[0], tinfo("b", [32], 8, 36)], data + bytes(4)), ["'b'", "alignment"]),
        ("offset past the end", build(kvs, [infos[0], tinfo("b", [32], 8, 1 << 40)], data), ["'b'", "past the end"]),
        ("overlapping", build(kvs, [infos[0], tinfo("b", [8], 0, 0)], data), ["overlap"]),
        ("alignment 3", build([kv("general.alignment", 4, struct.pack("<I", 3))] + kvs, infos, data), ["alignment", "power of two"]),
        ("alignment as u64", build([kv("general.alignment", 10, struct.pack("<Q", 32))] + kvs, infos, data), ["general.alignment", "u32"]),
        ("empty key", build(kvs + [kv("", 4, struct.pack("<I", 1))], infos, data), ["key"]),
        ("NUL in a name", build(kvs, [tinfo("w\0x", [4, 2], 0, 0), infos[1]], data), ["NUL"]),
    ]
    for label, blob, words in cases:
        open(path, "wb").write(blob)
        r, _, _ = dump(args, path, tmp)
        ok = r.returncode == 1 and all(w in r.stderr for w in words) and "bad.gguf" in r.stderr
        ck.check(ok, f"{label}: rc {r.returncode} (want 1), stderr {r.stderr.strip()!r} should name {words}")
    # a non-finite value: the file is well formed, the tensor is refused naming it and the element
    nan = build(kvs, [tinfo("w", [4, 2], 0, 0), infos[1]], np.array([0, 1, 2, np.inf, 4, 5, 6, 7], np.float32).tobytes() + data[32:])
    open(path, "wb").write(nan)
    r, got, meta = dump(args, path, tmp)
    err = (meta or {}).get("tensors", {}).get("w", {}).get("error", "")
    ck.check(r.returncode == 0 and "'w'" in err and "element 3" in err, f"an inf in an F32 tensor: {err!r} {r.stderr}")
    print(f"{len(cases)} malformed files refused by name")


def main():
    args = common.parse_args(__doc__)
    args.tool = os.path.join(os.path.dirname(os.path.abspath(args.dspark)), "gguf_dump")
    ck = common.Checker()
    os.makedirs(args.tmp, exist_ok=True)
    check_types(args, ck, args.tmp)
    check_metadata(args, ck, args.tmp)
    check_malformed(args, ck, args.tmp)
    ck.finish("test_gguf")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Interop of dspark's safetensors reader/writer with the Python `safetensors` package.

    python test_safetensors_py.py --dspark BUILD/dspark --tmp TMPDIR

Uses the unit-test binary next to dspark (BUILD/test_safetensors --roundtrip IN OUT: read IN
with ds_st_open, rewrite every tensor and the metadata with ds_st_writer to OUT):
  1. Python writes F32/F16/F64/I64/I32/I16/I8/U8/BOOL (numpy) and BF16 (torch) tensors with
     metadata; dspark reads them and writes them back; Python reads dspark's file and every
     tensor's dtype, shape and bytes, and the metadata, must be identical.
  2. Hand-built files, valid and malformed (gap, overlap, trailing bytes, truncation, size
     mismatch, ...): dspark must accept exactly what Python accepts, and name the file when it
     refuses. Known, deliberate difference: dspark refuses duplicate tensor names, which
     Python silently resolves to the last entry.
Exits non-zero on any mismatch and prints a one-line summary.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as np_load_bytes
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file

failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)


def raw_file(path):
    """(header dict without __metadata__, metadata dict or None, data bytes, header length)."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    return header, meta, blob[8 + n:], n


def raw_tensors(path):
    header, meta, data, n = raw_file(path)
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], list(info["shape"]), data[b:e])
    return out, meta or {}, n


def run_roundtrip(helper, src, dst):
    return subprocess.run([helper, "--roundtrip", src, dst], capture_output=True, text=True, timeout=120)


def check_roundtrip(helper, src, dst, label):
    if os.path.exists(dst):
        os.unlink(dst)
    p = run_roundtrip(helper, src, dst)
    check(p.returncode == 0, f"{label}: dspark failed to read/rewrite {src}: {p.stderr.strip()}")
    if p.returncode != 0:
        return
    want, want_meta, _ = raw_tensors(src)
    got, got_meta, hlen = raw_tensors(dst)
    check(hlen % 8 == 0, f"{label}: dspark header length {hlen} is not a multiple of 8")
    check(sorted(got) == sorted(want), f"{label}: tensor names differ: {sorted(got)} vs {sorted(want)}")
    check(got_meta == want_meta, f"{label}: metadata differs: {got_meta} vs {want_meta}")
    for name in want:
        if name not in got:
            continue
        check(got[name][0] == want[name][0], f"{label}: '{name}' dtype {got[name][0]} != {want[name][0]}")
        check(got[name][1] == want[name][1], f"{label}: '{name}' shape {got[name][1]} != {want[name][1]}")
        check(got[name][2] == want[name][2], f"{label}: '{name}' bytes differ")
    # Python's own (strict) reader must accept dspark's file.
    try:
        from safetensors import safe_open
        with safe_open(dst, framework="np" if label == "numpy" else "pt") as f:
            check(sorted(f.keys()) == sorted(want), f"{label}: safe_open keys differ")
            check((f.metadata() or {}) == want_meta, f"{label}: safe_open metadata differs")
    except Exception as e:  # noqa: BLE001 - any failure to read is a conformance failure
        check(False, f"{label}: Python safetensors cannot read dspark's file: {e}")


def test_numpy(helper, tmp):
    rng = np.random.default_rng(0)
    tensors = {
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "half": rng.standard_normal((5,)).astype(np.float16),
        "double": rng.standard_normal((2, 2)).astype(np.float64),
        "ids": np.array([-1, 1 << 40, 7], dtype=np.int64),
        "pos": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
        "i16": np.array([-32768, 32767], dtype=np.int16),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "mask": np.array([0, 1, 127, 128, 255, 3, 9], dtype=np.uint8),
        "flags": np.array([True, False, True, True]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "specials": np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32),
    }
    meta = {"format": "np", "note": "quote \" backslash \\ newline \n unicode \u00e9\u20ac"}
    src, dst = os.path.join(tmp, "np_in.safetensors"), os.path.join(tmp, "np_out.safetensors")
    np_save_file(tensors, src, metadata=meta)
    check_roundtrip(helper, src, dst, "numpy")
    if os.path.exists(dst):
        back = np_load_file(dst)
        for k, v in tensors.items():
            check(k in back and back[k].dtype == v.dtype and back[k].shape == v.shape
                  and back[k].tobytes() == v.tobytes(), f"numpy: '{k}' differs after the round trip")


def test_torch(helper, tmp):
    try:
        import torch
        from safetensors.torch import load_file, save_file
    except ImportError:
        print("note: torch not importable; BF16 interop skipped", file=sys.stderr)
        return
    g = torch.Generator().manual_seed(0)
    bf = torch.randn(3, 5, generator=g).to(torch.bfloat16)
    bf[0, 0] = float("nan")
    bf[0, 1] = float("inf")
    tensors = {
        "lm_head.weight": bf,
        "norm.weight": torch.randn(7, generator=g).to(torch.float16),
        "embed.weight": torch.randn(4, 2, generator=g),
        "ids": torch.arange(5, dtype=torch.int64),
    }
    src, dst = os.path.join(tmp, "pt_in.safetensors"), os.path.join(tmp, "pt_out.safetensors")
    save_file(tensors, src, metadata={"format": "pt"})
    check_roundtrip(helper, src, dst, "torch")
    if os.path.exists(dst):
        back = load_file(dst)
        for k, v in tensors.items():
            ok = k in back and back[k].dtype == v.dtype and back[k].shape == v.shape
            # bitwise (NaN-safe) comparison through an integer view of the same width
            ok = ok and bytes(back[k].contiguous().view(torch.uint8).numpy()) == bytes(
                v.contiguous().view(torch.uint8).numpy())
            check(ok, f"torch: '{k}' differs after the round trip")


def st_blob(header, data_len, raw=False):
    h = header.encode() if raw else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + bytes(i % 251 for i in range(data_len))


def test_agreement(helper, tmp):
    a = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    b_at = lambda off: {"dtype": "F32", "shape": [4], "data_offsets": [off, off + 16]}  # noqa: E731
    cases = {
        # valid
        "valid_basic": st_blob({"a": a}, 16),
        "valid_header_order_not_offset_order": st_blob({"b": b_at(16), "a": a}, 32),
        "valid_zero_sized": st_blob({"z": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}, "a": a}, 16),
        "valid_whitespace": st_blob(' \n{"a": %s}\t  ' % json.dumps(a), 16, raw=True),
        "valid_empty": st_blob({}, 0),
        "valid_null_metadata": st_blob({"__metadata__": None, "a": a}, 16),
        "valid_unknown_field": st_blob({"a": dict(a, extra=1)}, 16),
        # invalid
        "gap": st_blob({"a": a, "b": b_at(20)}, 36),
        "not_from_zero": st_blob({"b": b_at(4)}, 20),
        "overlap": st_blob({"a": a, "b": b_at(8)}, 24),
        "trailing_bytes": st_blob({"a": a}, 20),
        "truncated_data": st_blob({"a": a, "b": b_at(16)}, 27),
        "size_mismatch": st_blob({"a": {"dtype": "F32", "shape": [4, 8], "data_offsets": [0, 96]}}, 96),
        "begin_after_end": st_blob({"a": {"dtype": "F32", "shape": [0], "data_offsets": [16, 0]}}, 16),
        "negative_dim": st_blob({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, 16),
        "unknown_dtype": st_blob({"a": {"dtype": "F33", "shape": [4], "data_offsets": [0, 16]}}, 16),
        "metadata_not_string": st_blob({"__metadata__": {"k": 1}}, 0),
        "malformed_json": st_blob('{"a": {"dtype": "F32", ', 0, raw=True),
        "not_an_object": st_blob("[1, 2, 3]", 0, raw=True),
        "header_past_end": struct.pack("<Q", 1000) + b"{}",
        "short_file": b"\x01\x02\x03",
        "shape_overflow": st_blob({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16],
                                         "data_offsets": [0, 16]}}, 16),
    }
    for name, blob in cases.items():
        path = os.path.join(tmp, f"agree_{name}.safetensors")
        with open(path, "wb") as f:
            f.write(blob)
        try:
            np_load_bytes(blob)
            py_ok = True
        except (SafetensorError, Exception):  # noqa: BLE001
            py_ok = False
        p = run_roundtrip(helper, path, os.path.join(tmp, "agree_out.safetensors"))
        ours_ok = p.returncode == 0
        check(py_ok == ours_ok, f"agreement '{name}': Python {'accepts' if py_ok else 'refuses'}, "
                                f"dspark {'accepts' if ours_ok else 'refuses'} ({p.stderr.strip()})")
        if not ours_ok:
            check(os.path.basename(path) in p.stderr, f"agreement '{name}': error does not name the file: "
                                                      f"{p.stderr.strip()}")
        check(p.returncode in (0, 1), f"agreement '{name}': helper exited with {p.returncode} (crash?)")

    # Deliberate difference: duplicate names are an error for dspark.
    dup = os.path.join(tmp, "agree_duplicate.safetensors")
    with open(dup, "wb") as f:
        f.write(st_blob('{"a": %s, "a": %s}' % (json.dumps(a), json.dumps(a)), 16, raw=True))
    p = run_roundtrip(helper, dup, os.path.join(tmp, "agree_out.safetensors"))
    check(p.returncode == 1 and "'a'" in p.stderr, f"duplicate names: dspark should refuse: {p.stderr.strip()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dspark", required=True, help="the dspark binary; test_safetensors must sit next to it")
    ap.add_argument("--tmp", required=True, help="scratch directory")
    args = ap.parse_args()
    helper = os.path.join(os.path.dirname(os.path.abspath(args.dspark)), "test_safetensors")
    if not os.access(helper, os.X_OK):
        print(f"safetensors interop: FAILED: {helper} not found (build the test_safetensors target)")
        return 1
    os.makedirs(args.tmp, exist_ok=True)
    test_numpy(helper, args.tmp)
    test_torch(helper, args.tmp)
    test_agreement(helper, args.tmp)
    status = "ok" if not failures else "FAILED"
    print(f"safetensors interop: {status}: {checks} checks, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_safetensors: small valid files laid out as the Python
`safetensors` package writes them (u64 LE header length, JSON header padded with spaces to a
multiple of 8, contiguous little-endian data). Needs only the standard library.

    python3 fuzz/make_seed_corpus.py fuzz/corpus/safetensors
"""
import json
import os
import struct
import sys


def st_bytes(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes), laid out in this order."""
    header, data, off = {}, b"", 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus/safetensors"
    os.makedirs(out, exist_ok=True)
    seeds = {
        "f32_matrix.safetensors": st_bytes(
            [("layers.0.q.weight", "F32", [2, 3], struct.pack("<6f", 1, -2.5, 3.25, 0, 1e-3, -7))],
            {"format": "pt"}),
        "mixed_dtypes.safetensors": st_bytes([
            ("emb", "BF16", [4], struct.pack("<4H", 0x3fc0, 0xc000, 0x3e80, 0x4040)),
            ("norm", "F16", [2, 2], struct.pack("<4H", 0x3e00, 0xc000, 0x3400, 0x4200)),
            ("ids", "I64", [3], struct.pack("<3q", -1, 1 << 40, 7)),
            ("pos", "I32", [2], struct.pack("<2i", 5, -6)),
            ("mask", "U8", [5], bytes([0, 1, 127, 128, 255])),
            ("scalar", "F64", [], struct.pack("<d", 0.5)),
            ("empty", "F32", [0, 3], b""),
        ], {"format": "np", "note": "seed"}),
        "empty.safetensors": st_bytes([]),
    }
    for name, blob in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()

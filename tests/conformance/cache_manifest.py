"""The cache manifest's own checksum (docs/file-formats.md "Offline cache": manifest_xxh64), for tests that
edit a manifest on purpose and must re-stamp it so the edit is judged on its own merits: xxh64
(seed 0) of manifest.json's bytes with the leading manifest_xxh64 field's 16 hex digits
replaced by '0'. xxh64 comes from the system libxxhash (the engine links the same library), so
no Python package is needed."""
import ctypes
import ctypes.util
import json
import re

_lib = None
_FIELD = re.compile(rb'^\s*\{\s*"manifest_xxh64"\s*:\s*"([0-9a-f]{16})"')


def xxh64(data):
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
        _lib.XXH64.restype = ctypes.c_uint64
        _lib.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    return _lib.XXH64(data, len(data), 0)


def expected(raw):
    """The checksum raw (the manifest's bytes) should carry, or None without the field."""
    m = _FIELD.match(raw)
    if not m:
        return None
    zeroed = raw[:m.start(1)] + b"0" * 16 + raw[m.end(1):]
    return "%016x" % xxh64(zeroed)


def stamp(path):
    """Re-computes the checksum of the manifest at path in place."""
    raw = open(path, "rb").read()
    m = _FIELD.match(raw)
    assert m, f"{path}: manifest_xxh64 is not the first field"
    h = expected(raw).encode()
    open(path, "wb").write(raw[:m.start(1)] + h + raw[m.end(1):])


def edit(path, fn):
    """json-loads the manifest, applies fn, writes it back (key order kept) and re-stamps it."""
    j = json.load(open(path))
    fn(j)
    json.dump(j, open(path, "w"), indent=1)
    stamp(path)

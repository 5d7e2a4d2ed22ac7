#!/usr/bin/env python3
"""The house rules, checked on every build (ctest `house.layers`):

1. Every `#include "..."` under src/ and include/ points down the layer order or stays in its
   own folder:   core < io, text, nn, comm < model < loss < train, capture, decode < cli
   (folders of one rank may not include each other: io must not reach into text).
   A public header include/dspark/X.h belongs to the folder that implements it (HEADER_LAYER).
2. No file-level cycles: the objects of the library, read with `nm`, must not call each other
   both ways (directly or round a longer loop), and no call points up the order either.
3. No source file over MAX_LINES lines (src/, include/, tests/, bench/, fuzz/).

Usage: test_layers.py --root REPO --lib path/to/libdspark.a
Exits 1 naming each offending file and include (or symbol), 0 when the house is in order."""
import argparse
import os
import re
import subprocess
import sys

MAX_LINES = 800

RANK = {"core": 0, "io": 1, "text": 1, "nn": 1, "comm": 1, "model": 2, "loss": 3, "train": 4, "capture": 4,
        "decode": 4, "cli": 5}

# Which folder each public header belongs to (the folder whose .c files implement it).
HEADER_LAYER = {
    "common.h": "core", "dtype.h": "core", "rng.h": "core", "fileio.h": "core", "progress.h": "core",
    "sequences.h": "core", "ggml_quant.h": "core",
    "safetensors.h": "io", "hfconfig.h": "io", "cache.h": "io", "gguf.h": "io", "gguf_write.h": "io", "gguf_model.h": "model",
    "tokenizer.h": "text", "dataset.h": "text", "chat_template.h": "text",
    "backend.h": "nn", "profile.h": "nn",
    "comm.h": "comm",
    "target.h": "model", "draft.h": "model", "model_source.h": "model", "sampling.h": "model", "student.h": "model",
    "dspark_loss.h": "loss", "draft_loss.h": "loss", "kd_select.h": "loss", "kd_loss.h": "loss",
    "kd_intermediate.h": "loss",
    "trainer.h": "train", "draft_trainer.h": "train", "lm_trainer.h": "train", "anchors.h": "train", "optim.h": "train", "checkpoint.h": "train",
    "capture.h": "capture",
    "speculate.h": "decode", "ngram.h": "decode", "spec_schedule.h": "decode", "regenerate.h": "decode", "prompts.h": "decode",
    "spec_files.h": "decode",
}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of_include(inc):
    """The folder an include "a/b.h" resolves to, or None when it is not one of ours."""
    parts = inc.split("/")
    if parts[0] == "dspark" and len(parts) == 2:
        return HEADER_LAYER.get(parts[1], "?unmapped")
    if parts[0] in RANK:
        return parts[0]
    return None


def folder_of_file(root, path):
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[0] == "include":
        return HEADER_LAYER.get(rel[-1], "?unmapped")
    return rel[1]


def check_includes(root):
    errors = []
    files = []
    for top in ("src", "include"):
        for d, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.join(d, n) for n in names if n.endswith((".c", ".h", ".cu"))]
    for path in sorted(files):
        rel = os.path.relpath(path, root)
        me = folder_of_file(root, path)
        if me == "?unmapped":
            errors.append(f"{rel}: public header not assigned to a layer (add it to HEADER_LAYER in {__file__})")
            continue
        if me not in RANK:
            errors.append(f"{rel}: folder '{me}' is not in the layer order")
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for inc in INCLUDE_RE.findall(text):
            other = folder_of_include(inc)
            if other is None:
                continue
            if other == "?unmapped":
                errors.append(f"{rel}: includes \"{inc}\", a public header not assigned to a layer")
            elif other != me and RANK[other] >= RANK[me]:
                how = "sideways" if RANK[other] == RANK[me] else "up"
                errors.append(f"{rel}: includes \"{inc}\" ({other}, rank {RANK[other]}) from {me} "
                              f"(rank {RANK[me]}): points {how} the layer order")
    return errors


def object_symbols(lib):
    """{object name: (defined globals, undefined)} of a static library, via nm."""
    out = subprocess.run(["nm", "-A", "--defined-only", "-g", lib], capture_output=True, text=True, check=True).stdout
    undef = subprocess.run(["nm", "-A", "-u", lib], capture_output=True, text=True, check=True).stdout
    objs = {}
    for line in out.splitlines():
        m = re.match(r"^[^:]+:([^:]+):\s*\S*\s+\w\s+(\S+)$", line)
        if m:
            objs.setdefault(m.group(1), (set(), set()))[0].add(m.group(2))
    for line in undef.splitlines():
        m = re.match(r"^[^:]+:([^:]+):\s+U\s+(\S+)$", line)
        if m:
            objs.setdefault(m.group(1), (set(), set()))[1].add(m.group(2))
    return objs


def source_folders(root):
    """{object name 'x.c.o': folder} for every library source (object names must be unique)."""
    where, dup = {}, []
    for d, _, names in os.walk(os.path.join(root, "src")):
        for n in names:
            if n.endswith((".c", ".cu")):  # .cu: the CUDA backend (DSPARK_CUDA=ON builds)
                key = n + ".o"
                if key in where:
                    dup.append(n)
                where[key] = os.path.relpath(d, os.path.join(root, "src")).split(os.sep)[0]
    return where, dup


def strongly_connected(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def check_calls(root, lib):
    errors = []
    objs = object_symbols(lib)
    folders, dup = source_folders(root)
    for n in dup:
        errors.append(f"two library sources are named {n}: object names must be unique for this check")
    owner = {}
    for obj, (defs, _) in objs.items():
        for s in defs:
            owner[s] = obj
    edges, why = {}, {}
    for obj, (_, uses) in objs.items():
        for s in uses:
            o = owner.get(s)
            if o and o != obj:
                edges.setdefault(obj, set()).add(o)
                why.setdefault((obj, o), s)
    for obj, outs in sorted(edges.items()):
        a = folders.get(obj)
        for o in sorted(outs):
            b = folders.get(o)
            if a and b and a != b and RANK[b] >= RANK[a]:
                errors.append(f"{a}/{obj[:-2]} calls {why[(obj, o)]} in {b}/{o[:-2]}: points "
                              f"{'sideways' if RANK[a] == RANK[b] else 'up'} the layer order")
    for comp in strongly_connected(set(objs), edges):
        if len(comp) > 1:
            names = sorted(comp)
            pairs = [f"{x[:-2]} -> {y[:-2]} ({why[(x, y)]})" for x in names for y in names if (x, y) in why]
            errors.append("file-level cycle: " + "; ".join(pairs))
    return errors


def check_lengths(root):
    errors = []
    for top in ("src", "include", "tests", "bench", "fuzz"):
        for d, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith((".c", ".h", ".py", ".sh", ".cu")):
                    p = os.path.join(d, n)
                    with open(p, encoding="utf-8", errors="replace") as f:
                        count = sum(1 for _ in f)
                    if count > MAX_LINES:
                        errors.append(f"{os.path.relpath(p, root)}: {count} lines (limit {MAX_LINES}): split it "
                                      "along a seam that has a name")
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--lib", required=True)
    a = ap.parse_args()
    errors = check_includes(a.root) + check_calls(a.root, a.lib) + check_lengths(a.root)
    for e in errors:
        print(e)
    print(f"house: {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

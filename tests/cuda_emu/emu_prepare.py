#!/usr/bin/env python3
"""Rewrites a .cu file of src/nn/cuda/ into C++ for the CPU emulation (emu_runtime.cpp):
kernel<<<grid, block, smem, stream>>>(args); becomes emu_launch(grid, block, smem, [&] {
kernel(args); }); and the dynamic shared memory declaration becomes a pointer to the
emulation's buffer. Usage: emu_prepare.py in.cu out.cpp"""
import os
import re
import sys


def split_top(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def launch(m):
    name, cfg, args = m.group(1), split_top(m.group(2)), m.group(3)
    grid, block = cfg[0], cfg[1]
    smem = cfg[2] if len(cfg) > 2 else "0"
    return f"emu_launch(dim3({grid}), dim3({block}), (size_t)({smem}), [&] {{ {name}({args}); }});"


src = open(sys.argv[1]).read()
out = re.sub(r"extern __shared__ float (\w+)\[\];", r"float *\1 = emu_dynamic_smem();", src)
out, _ = re.subn(r"(\w+)<<<(.*?)>>>\((.*?)\);", launch, out, flags=re.S)
if "<<<" in out:
    sys.exit(f"{sys.argv[1]}: a launch the rewrite did not understand")
os.makedirs(os.path.dirname(os.path.abspath(sys.argv[2])), exist_ok=True)
open(sys.argv[2], "w").write(f'#line 1 "{sys.argv[1]}"\n' + out)

#!/usr/bin/env bash
# bf16 GEMM libraries side by side (issue 9): the oneDNN the build uses (Debian's libdnnl-dev),
# the newest CPU-only, GNU-OpenMP oneDNN on PyPI (onednn-cpu-gomp, 3.x), MKL from PyPI, and
# PyTorch's own bf16 linear (its bundled oneDNN) on the same shapes and threads. The wheels are
# downloaded, not installed, into $DSPARK_LIBS (default ~/.cache/dspark/libs); nothing of them
# reaches the engine's build. Each library's line: GFLOP/s per shape (bench/libs/gemm_bf16_libs.c),
# once with one weight in cache and once streaming a model's layers of distinct weights.
#   bench/gemm_bf16_libs.sh [threads]              (default 2)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
threads=${1:-2}
libs=${DSPARK_LIBS:-$HOME/.cache/dspark/libs}
py=${DSPARK_PYTHON:-$HOME/.cache/dspark/venv/bin/python}
src=$here/libs/gemm_bf16_libs.c
mkdir -p "$libs"

fetch() { # fetch NAME==VERSION DIR: the wheel unpacked into $libs/DIR
  [ -d "$libs/$2" ] && return 0
  "$py" -m pip download --quiet --no-deps "$1" -d "$libs/wheels"
  local whl
  whl=$(ls "$libs/wheels/$(echo "${1%%==*}" | tr - _)"-"${1##*==}"-*.whl)
  mkdir -p "$libs/$2.tmp" && (cd "$libs/$2.tmp" && "$py" -m zipfile -e "$whl" .) && mv "$libs/$2.tmp" "$libs/$2"
}
fetch onednn-cpu-gomp==2023.2.0 dnnl3
fetch onednn-devel-cpu-gomp==2023.2.0 dnnl3-devel
fetch mkl==2026.2.0 mkl
dnnl3_lib=$(dirname "$(find "$libs/dnnl3" -name 'libdnnl.so.3' | head -1)")
dnnl3_inc=$(find "$libs/dnnl3-devel" -path "*oneapi/dnnl/dnnl.h" | head -1); dnnl3_inc=${dnnl3_inc%/oneapi/dnnl/dnnl.h}
mkl_lib=$(dirname "$(find "$libs/mkl" -name 'libmkl_rt.so*' | head -1)")
mkl_rt=$(basename "$(find "$libs/mkl" -name 'libmkl_rt.so*' | head -1)")

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc=${CC:-cc}
flags="-std=c11 -O2 -Wall -Wextra"
$cc $flags "$src" -o "$out/dnnl_system" -ldnnl
$cc $flags -I"$dnnl3_inc" "$src" -o "$out/dnnl_pypi" -L"$dnnl3_lib" -l:libdnnl.so.3 -Wl,-rpath,"$dnnl3_lib"
$cc $flags -DUSE_MKL "$src" -o "$out/mkl" -L"$mkl_lib" -l:"$mkl_rt" -Wl,-rpath,"$mkl_lib" -fopenmp

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' '))"
export OMP_NUM_THREADS=$threads
mkl_env=(env MKL_THREADING_LAYER=GNU MKL_NUM_THREADS="$threads")
echo "== one weight per shape, in cache (best of runs)"
"$out/dnnl_system" | tee "$out/shapes.txt"
"$out/dnnl_pypi"
"${mkl_env[@]}" "$out/mkl"
echo "== a forward's order over layers of distinct weights (100M: 12 layers, 1.7B: 28; as in the engine)"
for set in "100m 12" "1.7b 28"; do
  read -r shapes layers <<<"$set"
  "$out/dnnl_system" --shapes "$shapes" --layers "$layers"
  "$out/dnnl_pypi" --shapes "$shapes" --layers "$layers"
  "${mkl_env[@]}" "$out/mkl" --shapes "$shapes" --layers "$layers"
done
# PyTorch on the same shapes (the labels end in ROWSxOUTxIN), one weight in cache
cat >"$out/torch_side.py" <<'EOF2'
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
print(f"library PyTorch {torch.__version__} torch.nn.Linear in bfloat16 (its bundled oneDNN; bf16 output) | threads {sys.argv[1]}")
for label in sys.stdin.read().splitlines():
    m, n, k = map(int, label.split()[-1].split("x"))
    x = torch.randn(m, k).bfloat16()
    lin = torch.nn.Linear(k, n, bias=False).bfloat16()
    with torch.no_grad():
        lin(x)
        best, spent, runs = 1e30, 0.0, 0
        while spent < 0.4 or runs < 3:
            t0 = time.perf_counter(); lin(x); t = time.perf_counter() - t0
            best, spent, runs = min(best, t), spent + t, runs + 1
    print(f"{label:30s} {2 * m * n * k / best / 1e9:8.1f} GFLOP/s  ({runs} runs)")
EOF2
grep -o '^[0-9a-z.]\+ \+[a-z]\+ \+[0-9]\+x[0-9]\+x[0-9]\+' "$out/shapes.txt" | "$py" "$out/torch_side.py" "$threads"

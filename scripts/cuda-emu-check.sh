#!/usr/bin/env bash
# The CUDA backend's kernels run in a CPU emulation of the CUDA execution model
# (tests/cuda_emu/), checked by the same tests/tools/cuda_kernel_check.c against the cpu
# backend: a machine without a GPU can find indexing, tiling, masking and barrier bugs before
# a device run (scripts/gpu-check.sh). It checks logic, not speed or the device's rounding.
# Slow (a block's threads run one at a time on one core): about a minute. Needs g++ and python3.
#   scripts/cuda-emu-check.sh [seed]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="$root/build/cuda-emu"
mkdir -p "$build"
# The library without CUDA and without a GEMM library (self-contained); its cuda_absent.c is
# not pulled in, since the emulated objects, linked first, define what it would.
cmake -S . -B "$build/lib" -DCMAKE_BUILD_TYPE=Release -DDSPARK_GEMM=none -DDSPARK_OPENMP=OFF -DDSPARK_MPI=OFF \
      >"$build/configure.log"
cmake --build "$build/lib" -j "$(nproc)" --target dspark_lib >"$build/build.log"
cxx=(g++ -std=c++17 -O2 -g -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=0 -Wall -Wno-unknown-pragmas -Wno-unused-parameter
     -I tests/cuda_emu/include -I include -I src)
objs=()
for cu in src/nn/cuda/*.cu; do
  name="$(basename "$cu" .cu)"
  python3 tests/cuda_emu/emu_prepare.py "$cu" "$build/$name.cpp" >/dev/null
  "${cxx[@]}" -c "$build/$name.cpp" -o "$build/$name.o"
  objs+=("$build/$name.o")
done
"${cxx[@]}" -c tests/cuda_emu/emu_runtime.cpp -o "$build/emu_runtime.o"
gcc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -I include -c tests/tools/cuda_kernel_check.c -o "$build/cuda_kernel_check.o"
g++ -o "$build/cuda_kernel_check_emu" "$build/cuda_kernel_check.o" "${objs[@]}" "$build/emu_runtime.o" \
    "$build/lib/libdspark.a" -lcjson -lpcre2-8 -lxxhash -lm -lpthread
"$build/cuda_kernel_check_emu" "$@"

#!/usr/bin/env bash
# The CUDA backend's check on a GPU machine (issue 14). That machine has nvcc, CMake and
# PyTorch but none of our -dev packages and no network, so the libraries come as .deb files
# fetched beforehand by scripts/gpu-debs.sh (build/gpu-debs/) and are unpacked here with
# `dpkg -x` (or, without dpkg, Python's ar/tar reading) into a prefix that pkg-config and CMake
# are pointed at. Then: configure with DSPARK_CUDA=ON (DSPARK_GEMM=none: no BLAS there), build
# the library, the checker and unit.test_backend_memory, run them (the memory entries on the
# device; every kernel of the CUDA backend against the cpu backend), and write the logs and a
# summary under $OUT; the target's forward on the device against the cpu (target_device_check);
# then the kernels and a target's prefill and decode timed against PyTorch on the same GPU
# (bench/gpu_kernels.py, bench/gpu_target.py).
#   scripts/gpu-check.sh [--build-only] [--no-bench]
#     --build-only   unpack, configure and build, run nothing (what a machine without a GPU can check)
#     --no-bench     the checks only
# Environment: OUT (default build/gpu-check-out), DSPARK_GPU_DEBS (default build/gpu-debs),
#   DSPARK_CUDA_ARCH (default 90), DSPARK_GPU_BUILD (build dir, default build/gpu).
# Exit status: the checker's (0 all pass, 1 a kernel failed, 2 no device), or the failing step's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build_only=0
bench=1
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    --no-bench) bench=0 ;;
    *) echo "gpu-check.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done
out="${OUT:-$root/build/gpu-check-out}"
debs="${DSPARK_GPU_DEBS:-$root/build/gpu-debs}"
build="${DSPARK_GPU_BUILD:-$root/build/gpu}"
prefix="$build/prefix"
arch="${DSPARK_CUDA_ARCH:-90}"
mkdir -p "$out" "$prefix"
summary="$out/summary.txt"
: >"$summary"
note() { echo "gpu-check: $*" | tee -a "$summary"; }
t_start=$(date +%s)

# ---- the machine
{ date -u; uname -a; (nvidia-smi || echo "nvidia-smi: not available") 2>&1; } >"$out/machine.txt"
nvcc_bin="$(command -v nvcc || true)"
[ -n "$nvcc_bin" ] || nvcc_bin=/usr/local/cuda/bin/nvcc
[ -x "$nvcc_bin" ] || { note "no nvcc (looked in PATH and /usr/local/cuda/bin)"; exit 3; }
note "nvcc: $nvcc_bin ($("$nvcc_bin" --version | grep -o 'release [0-9.]*'))"

# ---- unpack the carried packages
compgen -G "$debs/*.deb" >/dev/null || { note "no .deb files in $debs: run scripts/gpu-debs.sh first (and carry build/gpu-debs)"; exit 3; }
for deb in "$debs"/*.deb; do
  if command -v dpkg >/dev/null; then
    dpkg -x "$deb" "$prefix"
  else # a .deb is an ar archive holding data.tar.*: read it with Python's standard library
    python3 - "$deb" "$prefix" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", deb + ": not an ar archive"
off = 8
while off < len(data):
    name, size = data[off:off + 16].decode().strip(), int(data[off + 48:off + 58].decode().strip())
    body = data[off + 60:off + 60 + size]
    if name.rstrip("/").startswith("data.tar"):
        tar = tarfile.open(fileobj=io.BytesIO(body))
        # our own packages: extract as dpkg -x would (newer Pythons filter links by default)
        if hasattr(tarfile, "fully_trusted_filter"):
            tar.extractall(dest, filter="fully_trusted")
        else:
            tar.extractall(dest)
    off += 60 + size + (size & 1)
PY
  fi
done
libdir="$prefix/usr/lib/x86_64-linux-gnu"
note "unpacked $(ls "$debs"/*.deb | wc -l) packages into $prefix"

# ---- pkg-config that sees only the prefix: the carried pkgconf when it runs here, else the
# machine's. The .pc files say prefix=/usr; PKG_CONFIG_SYSROOT_DIR maps that into the prefix.
mkdir -p "$build/bin"
cat >"$build/bin/pkg-config" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH="$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$prefix/usr/bin/pkgconf" "\$@"
WRAP
chmod +x "$build/bin/pkg-config"
pkgconfig="$build/bin/pkg-config"
if ! "$pkgconfig" --version >/dev/null 2>&1; then
  pkgconfig="$(command -v pkg-config || true)"
  [ -n "$pkgconfig" ] || { note "neither the carried pkgconf nor a pkg-config runs here"; exit 3; }
fi
export PKG_CONFIG_SYSROOT_DIR="$prefix"
export PKG_CONFIG_LIBDIR="$libdir/pkgconfig:$prefix/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
note "pkg-config: $pkgconfig; cjson $("$pkgconfig" --modversion libcjson), pcre2 $("$pkgconfig" --modversion libpcre2-8), xxhash $("$pkgconfig" --modversion libxxhash), zlib $("$pkgconfig" --modversion zlib), zstd $("$pkgconfig" --modversion libzstd)"

# ---- OpenMP only when the compiler has it (omp.h and libgomp come with gcc, not with us)
openmp=OFF
if echo 'int main(void){return 0;}' | cc -fopenmp -x c - -o "$build/omp-probe" >/dev/null 2>&1; then openmp=ON; fi

# ---- configure and build (warnings are not errors here: another gcc may warn where CI's does
# not, and one device run must not be lost to that; CI builds the same code with -Werror)
t0=$(date +%s)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDSPARK_CUDA=ON -DDSPARK_GEMM=none -DDSPARK_MPI=OFF \
      -DDSPARK_OPENMP="$openmp" -DDSPARK_WERROR=OFF -DCMAKE_CUDA_COMPILER="$nvcc_bin" \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" -DPKG_CONFIG_EXECUTABLE="$pkgconfig" \
      -DCMAKE_PREFIX_PATH="$prefix/usr" >"$out/configure.log" 2>&1 \
  || { note "configure failed (tail of $out/configure.log):"; tail -20 "$out/configure.log" | tee -a "$summary"; exit 4; }
cmake --build "$build" -j "$(nproc)" --target dspark dspark_lib cuda_kernel_check target_device_check test_backend_memory bench_cuda_kernels >"$out/build.log" 2>&1 \
  || { note "build failed (tail of $out/build.log):"; grep -E "error|Error" "$out/build.log" | tail -20 | tee -a "$summary"; exit 4; }
note "configured and built in $(( $(date +%s) - t0 )) s (sm_$arch, OpenMP $openmp, GEMM none)"
# The headers really came from the prefix, not from a system copy.
if grep -rhs "cJSON.h" "$build"/CMakeFiles/dspark_lib.dir/src/io/*.d | grep -q "$prefix"; then
  note "cJSON.h taken from the prefix"
else
  note "cJSON.h NOT taken from the prefix (a system copy masks it)"
fi
[ "$build_only" = 1 ] && { note "--build-only: nothing run ($(( $(date +%s) - t_start )) s)"; exit 0; }

# ---- the seam's memory entries on the device, then the kernel check
set +e
"$build/test_backend_memory" >"$out/test_backend_memory.txt" 2>&1
note "test_backend_memory (alloc / copies / memset on the device): exit $?"
rc=0
for seed in 14 1 2; do # the shapes are fixed, the values drawn from the seed
  "$build/cuda_kernel_check" "$seed" >"$out/cuda_kernel_check.$seed.txt" 2>&1
  r=$?
  grep -E ' FAIL$|no CUDA|error' "$out/cuda_kernel_check.$seed.txt" | head -20
  [ "$r" = 0 ] || rc=$r
  note "cuda_kernel_check seed $seed: exit $r, $(grep -c ' PASS$' "$out/cuda_kernel_check.$seed.txt") PASS, $(grep -c ' FAIL$' "$out/cuda_kernel_check.$seed.txt") FAIL"
done
"$build/target_device_check" --tiny "$build/tiny-target" >"$out/target_device_check.txt" 2>&1
r=$?
[ "$r" = 0 ] || rc=$r
grep -E 'FAIL|error|no CUDA' "$out/target_device_check.txt" | head -10
note "target_device_check (the target's forward on the device against the cpu): exit $r"
if [ "$bench" = 1 ]; then
  if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    t0=$(date +%s)
    timeout 240 python3 "$root/bench/gpu_kernels.py" --bin "$build/bench_cuda_kernels" --jsonl "$out/gpu_kernels.jsonl" \
      >"$out/gpu_kernels.md" 2>"$out/gpu_kernels.err"
    note "bench/gpu_kernels.py: exit $? in $(( $(date +%s) - t0 )) s ($out/gpu_kernels.md)"
    cat "$out/gpu_kernels.md"; tail -5 "$out/gpu_kernels.err"
    t0=$(date +%s)
    timeout 300 python3 "$root/bench/gpu_target.py" --dspark "$build/dspark" --work "$build/gpu-target" \
      --jsonl "$out/gpu_target.jsonl" >"$out/gpu_target.md" 2>"$out/gpu_target.err"
    note "bench/gpu_target.py: exit $? in $(( $(date +%s) - t0 )) s ($out/gpu_target.md)"
    cat "$out/gpu_target.md"; tail -5 "$out/gpu_target.err"
  else
    note "bench skipped: no PyTorch with CUDA here"
  fi
fi
set -e
note "total $(( $(date +%s) - t_start )) s"
exit "$rc"

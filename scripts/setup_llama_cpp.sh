#!/usr/bin/env bash
# The llama.cpp source the GGUF draft tests compare with: the llama.cpp tree vendored in the PyPI
# source distribution of llama-cpp-python (vendor/llama.cpp: convert_hf_to_gguf.py, gguf-py, the
# C++ sources), downloaded once with pip and unpacked into a cache outside the checkout.
# Idempotent; prints the llama.cpp directory last. With --build it also builds, CPU only and
# with no network code, the programs the llama.cpp tests and benchmarks use (llama-simple: plain
# greedy decoding; llama-speculative-simple: speculative decoding, --spec-type draft-dspark;
# llama-bench: prefill and decode tokens/s; llama-tokenize; llama-quantize: other types of the same
# weights; llama-batched-bench) into $DSPARK_LLAMA_CPP/build-0.3.36/bin.
#
#   DSPARK_LLAMA_CPP_JOBS   parallel build jobs (default 1)
#   DSPARK_LLAMA_CPP        cache folder (default ~/.cache/dspark/llama.cpp)
#   DSPARK_LLAMA_CPP_SDIST  an already downloaded llama_cpp_python-0.3.36.tar.gz (offline set-up)
#   DSPARK_VENV             the venv whose pip downloads it (default ~/.cache/dspark/venv)
set -euo pipefail

build=0
[ "${1:-}" = "--build" ] && build=1

version="0.3.36"
sum="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
cache="${DSPARK_LLAMA_CPP:-$HOME/.cache/dspark/llama.cpp}"
venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
name="llama_cpp_python-$version"
src="$cache/$name/vendor/llama.cpp"

build_programs() {
  ((build)) || return 0
  local bdir="$cache/build-$version" t missing=0
  local targets=(llama-simple llama-speculative-simple llama-bench llama-tokenize llama-quantize llama-batched-bench)
  for t in "${targets[@]}"; do [ -x "$bdir/bin/$t" ] || missing=1; done
  if ((!missing)); then
    echo "setup: llama.cpp programs present ($bdir/bin)"
    return 0
  fi
  echo "setup: building ${targets[*]} (CPU only) into $bdir"
  nice -n 19 cmake -S "$src" -B "$bdir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DBUILD_SHARED_LIBS=OFF >/dev/null
  nice -n 19 cmake --build "$bdir" -j "${DSPARK_LLAMA_CPP_JOBS:-1}" --target "${targets[@]}" >"$bdir/build.log" 2>&1 ||
    { echo "setup: the llama.cpp build failed: $bdir/build.log" >&2; return 1; }
}

if [ -f "$cache/$name/.dspark-unpacked" ] && [ -f "$src/convert_hf_to_gguf.py" ]; then
  echo "setup: llama.cpp source present ($src)"
  build_programs
  echo "$src"
  exit 0
fi

mkdir -p "$cache"
tarball="$cache/$name.tar.gz"
if ! { [ -f "$tarball" ] && echo "$sum  $tarball" | sha256sum -c --status; }; then
  if [ -n "${DSPARK_LLAMA_CPP_SDIST:-}" ]; then
    cp "$DSPARK_LLAMA_CPP_SDIST" "$tarball.part"
  else
    echo "setup: downloading the llama-cpp-python $version source distribution (about 75 MB)"
    py="$venv/bin/python"
    [ -x "$py" ] || py=python3
    tmp="$(mktemp -d)"
    "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
      -d "$tmp" "llama-cpp-python==$version" || { rm -rf "$tmp"; echo "setup: pip download failed" >&2; exit 1; }
    mv "$tmp/$name.tar.gz" "$tarball.part"
    rm -rf "$tmp"
  fi
  echo "$sum  $tarball.part" | sha256sum -c --status || { echo "setup: $name.tar.gz: checksum mismatch" >&2; exit 1; }
  mv "$tarball.part" "$tarball"
fi

echo "setup: unpacking $name into $cache"
tmp="$(mktemp -d "$cache/unpack.XXXXXX")"
tar -xzf "$tarball" -C "$tmp"
rm -rf "${cache:?}/$name"
mv "$tmp/$name" "$cache/$name"
rmdir "$tmp"
touch "$cache/$name/.dspark-unpacked"
build_programs
echo "$src"

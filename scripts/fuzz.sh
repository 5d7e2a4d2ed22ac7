#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each on its seed corpus
# for a bounded time.   scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
bash scripts/setup.sh --no-venv
CC=clang cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=Debug -DDSPARK_FUZZ=ON -DDSPARK_GEMM=none -DDSPARK_OPENMP=OFF >/dev/null
cmake --build build/fuzz -j "$(nproc)"
status=0
for src in fuzz/fuzz_*.c; do
  name="$(basename "$src" .c)"
  corpus="fuzz/corpus/${name#fuzz_}"
  work="build/fuzz/corpus-${name#fuzz_}"
  mkdir -p "$work"
  echo "== $name for ${secs}s (seeds: $corpus)"
  if ! build/fuzz/"$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       "$work" "$corpus" 2>&1 | tail -n 12; then
    status=1
  fi
done
exit $status

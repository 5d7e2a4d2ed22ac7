#!/usr/bin/env bash
# The test command: set up (idempotent), build the release and the sanitizer builds, run
# every test. The release run comes last, so its ctest summary is the final line.
#   scripts/test.sh [ctest args...]     e.g. scripts/test.sh -R tokenizer
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

bash scripts/setup.sh
venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
py="$venv/bin/python"
jobs="$(nproc)"

# Sanitizer build: ASan + UBSan, and the portable paths (no BLAS, no OpenMP) so they are
# exercised too. It runs the C unit tests, the command-line tests, the bad-input suite, the
# draft, loss, student, KD-loss and regenerate conformance tests, the hardening tests
# (test_hardening_*.py) and the data-parallel test (test_mpi.py, 2 ranks), so the C paths they
# drive run under the sanitizers.
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DDSPARK_SANITIZE=ON -DDSPARK_GEMM=none -DDSPARK_OPENMP=OFF \
      -DDSPARK_WERROR=ON -DDSPARK_PYTHON="$py" >/dev/null
cmake --build build/asan -j "$jobs"
(cd build/asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" -R '^(unit|cli)\.|bad_input|hardening|draft_torch|dspark_loss_torch|student_torch|kd_loss_torch|test_regenerate|test_mpi' "$@")

cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DDSPARK_WERROR=ON -DDSPARK_PYTHON="$py" >/dev/null
cmake --build build/release -j "$jobs"
(cd build/release && ctest --output-on-failure -j "$jobs" "$@")

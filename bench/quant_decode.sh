#!/usr/bin/env bash
# Decode speed of a quantized GGUF target held as stored (issue 27) against the same file
# dequantized to bf16 and to f32 at load: `dspark generate MODEL --weights W --threads T`, greedy,
# --ignore-eos, a fixed prompt, $QBENCH_TOKENS new tokens (default 128), best of $QBENCH_REPS runs
# (default 3) of the decode tokens/s generate prints, for 1 and 2 threads. Prints the CPU, the
# kernels that ran (dspark info), the load average before and after (the machine is shared: a
# load above 1 means the numbers are lower bounds), the bytes of weights each mode reads per
# token, and the share of the memory's streaming rate that decode reaches: the rate is read by
# `bench_linear16 --stream-only` (1 GiB in 2 MiB pages, the same threads) right before each
# mode's runs, because a shared host's rate moves by 2x within minutes; $QBENCH_GBS fixes it
# instead, and $QBENCH_WEIGHTS picks the modes (default "as-stored bf16 f32").
#   bench/quant_decode.sh [BUILD_DIR] [MODEL.gguf]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/dev}"
model="${2:-$HOME/.cache/dspark/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
tokens="${QBENCH_TOKENS:-128}"
reps="${QBENCH_REPS:-3}"
gbs_fixed="${QBENCH_GBS:-}"
dspark="$build/dspark"
[ -x "$dspark" ] || { echo "no $dspark: build the dspark target first" >&2; exit 1; }
[ -f "$model" ] || { echo "no $model (scripts/setup.sh fetches SmolLM2)" >&2; exit 1; }
# OpenMP's wait policy is left as the environment has it (printed): with PASSIVE, 2 threads wake
# up for each of a decode step's ~150 small matmuls and ran slower than 1 (measured 79 against 96
# tokens/s as stored; 161 with the default, spinning, policy).
echo "OMP_WAIT_POLICY: ${OMP_WAIT_POLICY:-unset, the runtime default}"
echo "model: $model"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') ($(nproc) cores)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$dspark" info "$model" 2>/dev/null | grep -iE "weights|kernel|GEMM" | sed 's/^/info: /' || true
printf "%-10s %7s %10s %12s %14s %12s %8s\n" weights threads "MB/token" "stream GB/s" "roofline t/s" "decode t/s" share
for threads in 1 2; do
  for w in ${QBENCH_WEIGHTS:-as-stored bf16 f32}; do
    gbs=$gbs_fixed
    if [ -z "$gbs" ]; then
      gbs=$("$build/bench_linear16" --stream-only --threads "$threads" 2>/dev/null |
            sed -n 's/.*: \([0-9.]*\) GB\/s.*/\1/p' | tail -1)
      [ -n "$gbs" ] || { echo "no stream rate from $build/bench_linear16: build it, or set QBENCH_GBS" >&2; exit 1; }
    fi
    best=0
    for ((r = 0; r < reps; r++)); do
      line=$(OMP_NUM_THREADS=$threads "$dspark" generate "$model" --weights "$w" --threads "$threads" \
             --prompt "Write a short story about a lighthouse keeper." --max-new-tokens "$tokens" --ignore-eos \
             2>&1 >/dev/null | grep -o 'decode: [0-9]* tokens, [0-9.]* s ([0-9.]* tokens/s)' || true)
      tps=$(echo "$line" | sed -n 's/.*(\([0-9.]*\) tokens\/s).*/\1/p')
      [ -n "$tps" ] && best=$(python3 -c "print(max($best, $tps))")
    done
    mb=$("$dspark" info "$model" --weights "$w" 2>/dev/null | python3 -c '
import re, sys
unit = dict(B=1e-6, kB=1e-3, MB=1.0, GB=1e3)
m = re.search(r"weights in memory:\s+([0-9.]+) (B|kB|MB|GB)", sys.stdin.read())
print("%.0f" % (float(m.group(1)) * unit[m.group(2)]) if m else "?")' || echo "?")
    roof=$(python3 -c "print(f'{$gbs * 1000 / $mb:.0f}' if '$mb' not in ('?', '0') else '?')" 2>/dev/null || echo "?")
    share=$(python3 -c "print(f'{100 * $best * $mb / ($gbs * 1000):.0f}%' if '$mb' not in ('?', '0') else '?')" 2>/dev/null || echo "?")
    printf "%-10s %7s %10s %12s %14s %12s %8s\n" "$w" "$threads" "$mb" "$gbs" "$roof" "$best" "$share"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Two dspark builds' decoding, alternated: a change to a decode path measured on a shared host,
# where the memory's rate moves by 10-50% from minute to minute. Each pair runs `generate MODEL
# --prompt-ids 1 --max-new-tokens N --ignore-eos --threads T` with binary A then B (B then A on
# every other pair, under `chrt -f 1` when allowed); prints each side's median and best decode
# tokens/s and the median (and range) of the pairs' ratios B / A, the figure to report.
#   bench/decode_ab.sh MODEL THREADS PAIRS DSPARK_A DSPARK_B [generate options...]
#   (AB_TOKENS: new tokens a run, default 128)
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
model=$1 threads=$2 pairs=$3 a=$4 b=$5
shift 5
tokens="${AB_TOKENS:-128}"
rt=(); chrt -f 1 true 2>/dev/null && rt=(chrt -f 1)
decode() { # binary, options: the decode tokens/s generate prints
  local bin=$1; shift
  "${rt[@]}" "$bin" generate "$model" --prompt-ids 1 --max-new-tokens "$tokens" --ignore-eos --threads "$threads" "$@" 2>&1 |
    sed -n 's/.*decode: .*(\([0-9.]*\) tokens\/s).*/\1/p'
}
for ((p = 1; p <= pairs; p++)); do
  if ((p % 2)); then x=$(decode "$a" "$@"); y=$(decode "$b" "$@"); else y=$(decode "$b" "$@"); x=$(decode "$a" "$@"); fi
  [ -n "$x" ] && [ -n "$y" ] || { echo "decode_ab: a run printed no decode rate" >&2; exit 1; }
  echo "$x $y"
done | python3 -c '
import statistics as st, sys
a, b = zip(*(map(float, l.split()) for l in sys.stdin))
r = [y / x for x, y in zip(a, b)]
print(f"A median {st.median(a):.1f} best {max(a):.1f} | B median {st.median(b):.1f} best {max(b):.1f} tokens/s | "
      f"B/A median {st.median(r):.3f} ({min(r):.3f}-{max(r):.3f}), {len(r)} pairs")'

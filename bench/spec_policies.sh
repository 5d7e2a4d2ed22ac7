#!/usr/bin/env bash
# `dspark speculate`'s policies on one draft, alternated: the fixed length (the draft's own
# acceptance), the command's default (the scheduler with nothing given: the verification costs
# measured in-process, the confidences corrected by the run's outcomes) and, when a profile and a
# calibration are given, the scheduler with them. Each round runs the three one after the other
# (the order rotated every round, under `chrt -f 1` when allowed) over PROMPTS one request at a
# time with `--baseline`, and prints tau, decode tokens/s and the speedup over the plain decoding
# of the same run; then each policy's median tokens/s and speedup.
#   bench/spec_policies.sh DSPARK TARGET DRAFT PROMPTS ROUNDS [PROFILE.json CALIBRATION.json]
#   (SP_TOKENS: new tokens a prompt, default 96; SP_OPTIONS: more speculate options, e.g. --ignore-eos)
set -euo pipefail
[ $# -eq 5 ] || [ $# -eq 7 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
ds=$1 target=$2 draft=$3 prompts=$4 rounds=$5 profile=${6:-} cal=${7:-}
tokens="${SP_TOKENS:-96}"
read -r -a more <<< "${SP_OPTIONS:-}"
rt=(); chrt -f 1 true 2>/dev/null && rt=(chrt -f 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
names=(fixed default)
[ -n "$profile" ] && names+=(files)
one() { # NAME: one speculate run, one line "NAME tau tokens/s speedup"
  local name=$1 extra=()
  case $name in
    fixed) extra=(--policy fixed) ;;
    files) extra=(--policy scheduler --profile "$profile" --calibration "$cal") ;;
  esac
  "${rt[@]}" "$ds" speculate --target "$target" --draft "$draft" --data "$prompts" --one-at-a-time \
      --max-new-tokens "$tokens" --baseline --report "$tmp/r.json" "${extra[@]}" "${more[@]}" > /dev/null 2> "$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  python3 -c 'import json, sys; r = json.load(open(sys.argv[2]))
print(sys.argv[1], r["policy"], round(r["tau"], 3), round(r["decode_tokens_per_s"], 1),
      round(r["plain_decode_tokens_per_s"], 1), round(r["speedup"], 3))' "$name" "$tmp/r.json"
}
for ((k = 0; k < rounds; k++)); do
  for ((i = 0; i < ${#names[@]}; i++)); do one "${names[(i + k) % ${#names[@]}]}"; done
done | tee "$tmp/all" >&2
python3 - "$tmp/all" <<'PY'
import statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    name, policy, tau, tps, plain, speedup = line.split()
    rows.setdefault(name, []).append((float(tau), float(tps), float(plain), float(speedup)))
print(f"{'policy':<8} {'runs':>4} {'tau':>6} {'tokens/s (median)':>18} {'plain (median)':>15} {'speedup (median, range)':>25}")
for name, r in rows.items():
    s = [x[3] for x in r]
    print(f"{name:<8} {len(r):>4} {st.median(x[0] for x in r):>6.3f} {st.median(x[1] for x in r):>18.1f} "
          f"{st.median(x[2] for x in r):>15.1f} {st.median(s):>12.2f}x ({min(s):.2f}-{max(s):.2f})")
PY

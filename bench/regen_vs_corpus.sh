#!/usr/bin/env bash
# Does a draft learn more from its target's own answers than from the corpus? (issue 13's
# regeneration comparison, on the demo). Two DSpark drafts, identical but for their text:
#   corpus       the demo's draft corpus (text the target never saw), cut to about as many
#                256-token windows as the regenerated set has sequences
#   regenerated  `dspark regenerate --completion`: the target continues the demo's 1024
#                generation prompts (160 tokens each, greedy), i.e. what the target says
# Each is captured by the target (bf16 features of 2 layers, as the demo), trained for the same
# steps, seed and batch as the demo's DSpark draft, and decodes the demo's held-out prompts one
# at a time (greedy, 128 tokens) with `dspark speculate`: tau (tokens per round, bonus
# included) and speedup against plain decoding in the same run.
# Needs the demo target: run scripts/demo_toy.sh first (or set DSPARK_DEMO_DIR to its folder).
#   bench/regen_vs_corpus.sh [--steps N] [--build DIR] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=300
build=build/release
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--build DIR] [--out DIR]" >&2; exit 2 ;;
  esac
done
demo="${DSPARK_DEMO_DIR:-$HOME/.cache/dspark/demo}"
out="${out:-$demo/regen-vs-corpus}"
ds="$build/dspark"
venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
[ -f "$demo/target/model.safetensors" ] || { echo "no demo target in $demo/target: run scripts/demo_toy.sh first" >&2; exit 1; }
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "== [$(($(date +%s) - t0)) s] $*"; }
echo "$($ds --help | grep '^matmuls'); CPU: $(lscpu | sed -n 's/^Model name: *//p'); load: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ ! -f "$out/regenerated.jsonl.done" ]; then
  stamp "the target regenerates the text (dspark regenerate --completion, 1024 prompts)"
  $ds regenerate --target "$demo/target" --data "$demo/data/gen-prompts.txt" --out "$out/regenerated.jsonl" \
      --completion --ignore-eos --max-new-tokens 160 --batch 64 --summary "$out/regenerate-summary.json"
  touch "$out/regenerated.jsonl.done"
fi
n_seqs=$(wc -l < "$out/regenerated.jsonl")
if [ ! -f "$out/corpus.txt" ]; then
  # about n_seqs windows of 256 tokens (the demo tokenizer averages ~3.5 bytes per token here)
  head -c "$((n_seqs * 256 * 7 / 2))" "$demo/data/draft-corpus.txt" > "$out/corpus.txt"
fi

for arm in corpus regenerated; do
  data="$out/corpus.txt"; [ $arm = regenerated ] && data="$out/regenerated.jsonl"
  if [ ! -f "$out/cache-$arm/manifest.json" ] || ! grep -Eq '"complete":[[:space:]]*true' "$out/cache-$arm/manifest.json"; then
    stamp "capture ($arm)"
    $ds capture --target "$demo/target" --data "$data" --out "$out/cache-$arm" --seq-len 256 --target-layers 2 \
        --dtype bf16 --quiet
  fi
  if [ ! -f "$out/draft-$arm/checkpoint.safetensors" ]; then
    stamp "train the DSpark draft on the $arm text ($steps steps, the demo's options)"
    $ds train --cache "$out/cache-$arm" --out "$out/draft-$arm" --overwrite --num-anchors 64 --batch-seqs 4 \
        --draft-layers 1 --steps "$steps" --eval-every "$steps" --eval-seqs 8 --save-every "$steps" --lr 2e-3 \
        --seed 1 --markov vanilla --markov-rank 64 --quiet
  fi
  stamp "speculate with the $arm draft (held-out prompts, one at a time, greedy)"
  $ds speculate --target "$demo/target" --draft "$out/draft-$arm" --data "$demo/data/prompts.txt" --one-at-a-time \
      --policy fixed --max-new-tokens 128 --ignore-eos --baseline --report "$out/speculate-$arm.json" > /dev/null 2> "$out/speculate-$arm.log" \
      || { cat "$out/speculate-$arm.log"; exit 1; }
done

"$venv/bin/python" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'draft text':<12} {'sequences':>9} {'tau':>6} {'tokens/s':>9} {'plain tok/s':>11} {'speedup':>8}")
for arm in ("corpus", "regenerated"):
    r = json.load(open(f"{out}/speculate-{arm}.json"))
    m = json.load(open(f"{out}/cache-{arm}/manifest.json"))
    n = sum(s["num_samples"] for s in m["shards"])
    print(f"{arm:<12} {n:9d} {r['tau']:6.3f} {r['decode_tokens_per_s']:9.1f} {r['plain_decode_tokens_per_s']:11.1f} "
          f"{r['speedup']:7.2f}x")
PY
stamp "done ($out)"

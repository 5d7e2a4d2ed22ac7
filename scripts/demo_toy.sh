#!/usr/bin/env bash
# The quick option of the main job: the whole pipeline in C on a toy target the engine pretrains
# itself in a few minutes (the main job, scripts/demo.sh, runs it on SmolLM2-135M-Instruct):
#   1. set up and build;
#   2. the demo data (Python standard library sources, scripts/demo_data.py): a BPE tokenizer,
#      the target's corpus (first half), prompts from the second half;
#   3. `dspark pretrain` trains the demo target from scripts/demo_target_config.json;
#   4. `dspark generate --data` has the target continue 1024 prompts: its drafts' training text
#      (a draft is trained to predict what its target says);
#   5. `dspark capture` runs the target once over that text into a feature cache;
#   6. `dspark train --cache` trains a DSpark draft (vanilla Markov head, CE + L1 + confidence)
#      and a DFlash-style draft (rank 0, CE only) for the same steps, and an untrained draft;
#   7. `dspark profile` and `dspark calibrate` measure this machine's verification costs and fit
#      the DSpark draft's confidence (STS) for the prefix scheduler;
#   8. `dspark speculate` decodes the held-out prompts one request at a time with each draft,
#      against plain decoding of the same prompts in the same run, and the table is printed;
#   9. `dspark plot` draws the training curves and the reports' figures.
# Environment: DSPARK_DEMO_DIR (default ~/.cache/dspark/demo), DEMO_TARGET_STEPS (240),
# DEMO_DRAFT_STEPS (300), DEMO_NEW_TOKENS (128 per held-out prompt), DEMO_COMPUTE (unset: fp32 here, or
# bf16: every model command with --compute bf16, docs/compute.md "bf16 compute"). Reruns reuse what is done
# (delete the folder to start over).
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
bash scripts/setup.sh
venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)" >/dev/null
ds=build/release/dspark
compute="${DEMO_COMPUTE:-}" # empty: the engine's default (fp32, a GGUF's quantized matrices in int8)
dsc() { local cmd=$1; shift; "$ds" "$cmd" ${compute:+--compute "$compute"} "$@"; } # a model command at the chosen precision
demo="${DSPARK_DEMO_DIR:-$HOME/.cache/dspark/demo}"
tsteps="${DEMO_TARGET_STEPS:-240}"
dsteps="${DEMO_DRAFT_STEPS:-300}"
new_tokens="${DEMO_NEW_TOKENS:-128}"
mkdir -p "$demo"
stamp() { echo "== [$(($(date +%s) - t_start)) s] $*"; }
echo "$($ds --help | grep '^matmuls'); --compute ${compute:-default}; CPU: $(lscpu | sed -n 's/^Model name: *//p')"

stamp "demo data"
"$venv/bin/python" scripts/demo_data.py "$demo/data"

if [ ! -f "$demo/target/model.safetensors" ]; then
  stamp "pretraining the demo target ($tsteps steps; dspark pretrain)"
  dsc pretrain --config scripts/demo_target_config.json --tokenizer "$demo/data/tokenizer.json" \
      --data "$demo/data/target-corpus.txt" --out "$demo/target-run" --overwrite --seq-len 256 --batch-seqs 8 \
      --steps "$tsteps" --lr 3e-3 --warmup 0.05 --eval-every "$((tsteps / 2))" --eval-seqs 8 --save-every "$tsteps"
  rm -rf "$demo/target"
  $ds export "$demo/target-run" --out "$demo/target"
fi

if [ ! -f "$demo/data/draft-text.jsonl" ]; then
  stamp "the target writes its drafts' training text (dspark generate --data, 1024 prompts)"
  dsc generate "$demo/target" --data "$demo/data/gen-prompts.txt" --max-new-tokens 160 --ignore-eos \
      > "$demo/data/draft-gen.txt"
  "$venv/bin/python" - "$demo/data" <<'PY'
import json, sys
d = sys.argv[1]
prompts = open(f"{d}/gen-prompts.txt").read().splitlines()
with open(f"{d}/draft-text.jsonl.tmp", "w") as f:
    for p, line in zip(prompts, open(f"{d}/draft-gen.txt")):
        f.write(json.dumps({"text": p + json.loads(line)}) + "\n")
PY
  mv "$demo/data/draft-text.jsonl.tmp" "$demo/data/draft-text.jsonl"
fi

if [ ! -f "$demo/cache/manifest.json" ] || ! grep -Eq '"complete":[[:space:]]*true' "$demo/cache/manifest.json"; then
  stamp "capturing the target's features once (dspark capture)"
  dsc capture --target "$demo/target" --data "$demo/data/draft-text.jsonl" --out "$demo/cache" --seq-len 256 \
      --target-layers 2 --dtype bf16
fi

train_draft() { # NAME STEPS extra options...
  local name=$1 steps=$2; shift 2
  if [ ! -f "$demo/$name/checkpoint.safetensors" ]; then
    stamp "training the $name draft ($steps steps from the cache)"
    dsc train --cache "$demo/cache" --out "$demo/$name" --overwrite --num-anchors 64 --batch-seqs 4 \
        --draft-layers 1 --steps "$steps" --eval-every "$((steps > 1 ? steps / 3 : 1))" --eval-seqs 8 \
        --save-every "$steps" --lr 2e-3 --seed 1 "$@"
  fi
}
train_draft dspark "$dsteps" --markov vanilla --markov-rank 64
train_draft dflash "$dsteps" --markov none --ce-only
train_draft untrained 1 --markov vanilla --markov-rank 64 --lr 0

stamp "profiling this machine's verification cost and calibrating the DSpark draft's confidence"
dsc profile --target "$demo/target" --draft "$demo/dspark" --out "$demo/profile.json" --max-tokens 16
dsc calibrate --target "$demo/target" --draft "$demo/dspark" --data "$demo/data/calib-prompts.txt" \
    --max-new-tokens 64 --ignore-eos --out "$demo/calibration.json" 2>&1 | tail -n 4

stamp "speculative decoding of the held-out prompts, one request at a time (dspark speculate)"
# One request at a time: a verification pass of L+1 tokens then costs little more than one
# decoding step; a batch of requests already fills the cores (docs/speculative-decoding.md "Speculative decoding").
spec() { # NAME DRAFT extra options...
  local name=$1 draft=$2; shift 2
  dsc speculate --target "$demo/target" --draft "$demo/$draft" --data "$demo/data/prompts.txt" --one-at-a-time \
      --max-new-tokens "$new_tokens" --ignore-eos --baseline --report "$demo/speculate-$name.json" "$@" > /dev/null \
      2> "$demo/speculate-$name.log" || { cat "$demo/speculate-$name.log"; exit 1; }
}
spec untrained untrained --policy fixed
spec dflash dflash --policy fixed
spec dspark dspark --policy fixed
spec dspark-scheduler dspark --policy scheduler --profile "$demo/profile.json" --calibration "$demo/calibration.json"
"$venv/bin/python" - "$demo" <<'PY'
import json, sys
demo = sys.argv[1]
print(f"{'draft':<18} {'tau':>6} {'tokens/s':>9} {'plain tok/s':>11} {'speedup':>8}   (greedy, the held-out prompts one at a time)")
for name in ("untrained", "dflash", "dspark", "dspark-scheduler"):
    r = json.load(open(f"{demo}/speculate-{name}.json"))
    print(f"{name:<18} {r['tau']:6.3f} {r['decode_tokens_per_s']:9.1f} {r['plain_decode_tokens_per_s']:11.1f} "
          f"{r['speedup']:7.2f}x")
cal = json.load(open(f"{demo}/calibration.json"))
e = cal["ece"]
print(f"DSpark confidence, mean ECE of the cumulative acceptance over positions: fit rounds {e['fit']['before_mean']:.4f} -> "
      f"{e['fit']['after_mean']:.4f} after STS; held-out rounds {e['heldout']['before_mean']:.4f} -> {e['heldout']['after_mean']:.4f}")
PY
stamp "plots (dspark plot): training curves of every run, acceptance and calibration of every report"
$ds plot "$demo" > /dev/null 2> "$demo/plot.log" || { cat "$demo/plot.log"; exit 1; }
stamp "done; reports, runs and their plots (RUN/plots, plots/speculate-*.png) in $demo"

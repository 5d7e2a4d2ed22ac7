#!/usr/bin/env bash
# Writes the seed corpus of fuzz_draft_dir: two drafts exported by `dspark export --out` (a vanilla
# Markov head over a reduced vocabulary of 32 ids, a gated head over the whole vocabulary), trained
# for one step on the tiny models of fuzz/corpus/gguf_model, each joined in the fuzzer's layout
# (config.json, "\n\x01\n", model.safetensors).
#     fuzz/make_draft_dir_seeds.sh build/release/dspark fuzz/corpus/draft_dir
set -euo pipefail
. "$(dirname "$0")/seed_setup.sh"
seed_setup "${1:-}" "${2:-}" fuzz/corpus/draft_dir 21
seed() { # NAME MODEL TRAIN-OPTIONS...
  local name="$1" model="$2"
  shift 2
  "$dspark" train --target "$models/$model.gguf" --data "$tmp/data.jsonl" --out "$tmp/$name" --steps 1 --seq-len 32 \
    --num-anchors 2 --block-size 3 --markov-rank 4 --batch-seqs 2 --eval-seqs 2 --target-layers 1 --eval-every 0 \
    "$@" >/dev/null 2>&1
  "$dspark" export "$tmp/$name" --out "$tmp/$name-export" >/dev/null 2>&1
  { cat "$tmp/$name-export/config.json"; printf '\n\001\n'; cat "$tmp/$name-export/model.safetensors"; } > "$out/$name.seed"
}
seed vanilla-vocab32 llama --draft-vocab 32
seed gated-fullvocab qwen3 --markov gated

#!/usr/bin/env bash
# Writes the seed corpus of fuzz_cache_dir: small caches captured by `dspark capture` on the tiny
# models of fuzz/corpus/gguf_model (f32 features with KD top-4 in two shards; int8 features;
# bf16 KD data alone), each joined in the fuzzer's layout: manifest.json, target_config.json,
# tokenizer.json, target_weights.safetensors, shard-000000.safetensors, shard-000001.safetensors,
# separated by "\n\x01\n".
#     fuzz/make_cache_dir_seeds.sh build/release/dspark fuzz/corpus/cache_dir
set -euo pipefail
. "$(dirname "$0")/seed_setup.sh"
seed_setup "${1:-}" "${2:-}" fuzz/corpus/cache_dir 3
seed() { # NAME MODEL CAPTURE-OPTIONS...
  local name="$1" model="$2" c="$tmp/$1"
  shift 2
  "$dspark" capture --target "$models/$model.gguf" --data "$tmp/data.jsonl" --out "$c" --seq-len 32 \
    --target-layers 1 --shard-size 2 --quiet "$@" >/dev/null
  {
    first=1
    for f in manifest.json target_config.json tokenizer.json target_weights.safetensors shard-000000.safetensors \
      shard-000001.safetensors; do
      [ -f "$c/$f" ] || break
      [ "$first" = 1 ] || printf '\n\001\n'
      first=0
      cat "$c/$f"
    done
  } > "$out/$name.seed"
}
seed f32-kd4-two-shards llama --dtype f32 --topk 4
seed int8-features qwen3 --dtype int8
seed bf16-kd-only qwen2 --no-features --topk 3 --top-p 0.9

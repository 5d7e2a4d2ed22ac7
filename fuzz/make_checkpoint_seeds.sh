#!/usr/bin/env bash
# Writes the seed corpus of fuzz_checkpoint: the checkpoint.safetensors of a one-step draft run
# (a vanilla Markov head over 32 draft ids, on the tiny llama of fuzz/corpus/gguf_model) and of a
# one-step pretraining run of a tiny Qwen3, rewritten as format 1 (its metadata's format_version
# "1", no checksums), which mutations can change without failing a checksum, and the draft's as
# written (format 2, checksummed).
#     fuzz/make_checkpoint_seeds.sh build/release/dspark fuzz/corpus/checkpoint
set -euo pipefail
. "$(dirname "$0")/seed_setup.sh"
seed_setup "${1:-}" "${2:-}" fuzz/corpus/checkpoint 12
"$dspark" train --target "$models/llama.gguf" --data "$tmp/data.jsonl" --out "$tmp/draft" --steps 1 --seq-len 32 \
  --num-anchors 2 --block-size 3 --markov-rank 4 --batch-seqs 2 --eval-seqs 2 --target-layers 1 --eval-every 0 \
  --draft-vocab 32 --quiet
"$dspark" convert "$models/qwen3.gguf" --out "$tmp/qwen3" > /dev/null 2>&1
"$dspark" pretrain --config "$tmp/qwen3/config.json" --tokenizer "$tmp/qwen3/tokenizer.json" --data "$tmp/data.jsonl" \
  --out "$tmp/student" --steps 1 --seq-len 32 --batch-seqs 2 --eval-seqs 2 --eval-every 0 --quiet
# format 1: the same file with format_version "1" and without the checksums
as_format1() { # IN OUT
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
meta = head["__metadata__"]
meta["format_version"] = "1"
meta.pop("checksums", None)
text = json.dumps(head, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
}
cp "$tmp/draft/checkpoint.safetensors" "$out/draft-vocab32.seed"
as_format1 "$tmp/draft/checkpoint.safetensors" "$out/draft-vocab32-format1.seed"
as_format1 "$tmp/student/checkpoint.safetensors" "$out/student-qwen3-format1.seed"

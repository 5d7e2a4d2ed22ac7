#!/usr/bin/env bash
# The main job on the built-in demo: train a DSpark draft for a small target.
#   1. set up and build;
#   2. build the demo target once (cached): a BPE tokenizer and a small Qwen3 trained with
#      PyTorch on the first half of the Python standard library's sources;
#   3. train a DSpark draft for it online on the second half (held out from the target),
#      with progress, held-out acceptance/tau evaluations and metrics.jsonl;
#   4. export the draft in the HF layout and show the before/after acceptance.
# Environment: DSPARK_DEMO_DIR (default ~/.cache/dspark/demo), DEMO_STEPS (default 200).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)"
demo="${DSPARK_DEMO_DIR:-$HOME/.cache/dspark/demo}"
steps="${DEMO_STEPS:-200}"
mkdir -p "$demo"
echo "== demo target (built once; later runs reuse it)"
HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error "$venv/bin/python" scripts/make_demo_model.py "$demo/target" \
    --corpus-out "$demo/draft-corpus.txt"
build/release/dspark info "$demo/target"
echo "== the target generating from a prompt"
build/release/dspark generate "$demo/target" --prompt "def __init__(self" --max-new-tokens 32
echo "== training a DSpark draft ($steps steps)"
rm -rf "$demo/run"
build/release/dspark train --target "$demo/target" --data "$demo/draft-corpus.txt" --out "$demo/run" \
    --seq-len 256 --num-anchors 64 --batch-seqs 4 --draft-layers 1 --markov vanilla --markov-rank 64 \
    --steps "$steps" --eval-every "$((steps / 2))" --eval-seqs 32 --save-every "$steps" --lr 2e-3 --seed 1
build/release/dspark export "$demo/run" --out "$demo/draft"
echo "== held-out acceptance (metrics in $demo/run/metrics.jsonl, draft in $demo/draft)"
grep '"kind":"eval"' "$demo/run/metrics.jsonl" | "$venv/bin/python" -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    print("step %5d: accept rate %.3f, tau %.3f" % (m["step"], m["accept_rate"], m["tau"]))'

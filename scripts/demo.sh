#!/usr/bin/env bash
# The main job on the built-in demo: set up, build, make the demo target (tokenizer trained on
# real text + a small Qwen3), show it, and generate from a prompt with tokens/s.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)"
model="${DSPARK_DEMO_MODEL:-$HOME/.cache/dspark/demo-qwen3}"
HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error "$venv/bin/python" scripts/make_demo_model.py "$model"
build/release/dspark info "$model"
build/release/dspark generate "$model" --prompt "def fibonacci(n):" --max-new-tokens 48 --temperature 0.8 --seed 1

#!/usr/bin/env bash
# Distillation quality on the demo (issue 10's "done when"): one student (a Qwen3 of about a
# quarter of the demo target's parameters) trained from the same seed, data, steps and tokens
#   lm        the LM loss alone (dspark pretrain)
#   k64       ghost-token top-64 KD from the live demo target, mixed with the LM loss by --alpha
#   k64-noghost  the same, both sides renormalized over the 64 kept entries (--no-ghost ablation)
#   k1024     ghost-token top-1024 KD (a quarter of the 4096-token vocabulary)
# (300 steps of 4 x 256 tokens by default) and prints each run's held-out cross-entropy on the true next token (and perplexity).
# Needs the demo target: run scripts/demo_toy.sh first (or set DSPARK_DEMO_DIR to its folder).
#   bench/distill_quality.sh [--steps N] [--alpha A] [--build DIR] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=300
alpha=0.5
build=build/release
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --alpha) alpha=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--alpha A] [--build DIR] [--out DIR]" >&2; exit 2 ;;
  esac
done
demo="${DSPARK_DEMO_DIR:-$HOME/.cache/dspark/demo}"
out="${out:-$demo/distill}"
ds="$build/dspark"
[ -f "$demo/target/model.safetensors" ] || { echo "no demo target in $demo/target: run scripts/demo_toy.sh first" >&2; exit 1; }
mkdir -p "$out"
# about a quarter of the demo target's 14.2M parameters: 3.9M (1.0M of them the tied embedding)
cat > "$out/student_config.json" <<'EOF'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 4096, "hidden_size": 256,
 "intermediate_size": 704, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
 "head_dim": 64, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
 "tie_word_embeddings": true, "eos_token_id": 0, "initializer_range": 0.02}
EOF
common=(--data "$demo/data/draft-corpus.txt" --tokenizer "$demo/data/tokenizer.json" --seq-len 256 --batch-seqs 4
        --steps "$steps" --lr 3e-3 --warmup 0.05 --eval-every "$((steps / 3))" --eval-seqs 32 --save-every "$steps"
        --seed 7 --overwrite --quiet)
echo "$($ds --help | grep '^matmuls'); CPU: $(lscpu | sed -n 's/^Model name: *//p')"
run() { # NAME command...
  local name=$1; shift
  local t0; t0=$(date +%s)
  "$@" --out "$out/$name" "${common[@]}"
  echo "$name: $(($(date +%s) - t0)) s"
}
run lm "$ds" pretrain --config "$out/student_config.json"
kd=(--teacher "$demo/target" --student-config "$out/student_config.json" --kd-loss-alpha "$alpha")
run k64 "$ds" distill "${kd[@]}" --topk 64
run k64-noghost "$ds" distill "${kd[@]}" --topk 64 --no-ghost
run k1024 "$ds" distill "${kd[@]}" --topk 1024
"${DSPARK_VENV:-$HOME/.cache/dspark/venv}/bin/python" - "$out" <<'PY'
import json, math, sys
out = sys.argv[1]
print(f"{'student':<12} {'held-out CE':>11} {'ppl':>8}   (last evaluation, the true next token)")
for name in ("lm", "k64", "k64-noghost", "k1024"):
    evals = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if '"eval"' in l]
    ce = evals[-1]["lm"]
    print(f"{name:<12} {ce:11.4f} {math.exp(ce):8.2f}")
PY

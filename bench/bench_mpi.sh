#!/usr/bin/env bash
# Data-parallel step throughput on this machine (issue 12): `dspark train` (online: the target
# runs inside the step, as each rank's share of it) on one mid-size shape, three ways:
#   1 rank x 1 thread      the baseline
#   2 ranks x 1 thread     mpirun -np 2 (each rank half of every step's sequences)
#   1 rank x 2 threads     the same two cores used by OpenMP inside one process
# and, from the 2-rank run, the all-reduce time per step, its share of the step and the bytes
# each rank hands to all-reduce per step (the fp64 gradient sum + the per-item report rows).
#
#   bench/bench_mpi.sh [BUILD_DIR (build/release)] [STEPS (12)]
#
# Shape: a random Qwen3 target d = 512, 4 layers, intermediate 1536, V ~ 2000 (a BPE trained on
# the standard library), seq_len 256, 8 sequences per step, 64 anchors x block 7, 1 draft
# layer, Markov rank 256. Every side runs the same trajectory (checked: same final loss). The
# first 2 steps are warm-up; the rate is over the rest, from metrics.jsonl's elapsed_s.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${1:-build/release}"
steps="${2:-12}"
dspark="$root/$build/dspark"
py="${DSPARK_VENV:-$HOME/.cache/dspark/venv}/bin/python"
work="${BENCH_TMP:-/tmp/dspark-bench-mpi}"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

"$dspark" --help | grep -q "data parallelism: MPI" || { echo "bench_mpi: $dspark was built without MPI" >&2; exit 1; }

# the target and the data (built once)
"$py" - "$work" <<'EOF'
import glob, os, shutil, sys, sysconfig
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "conformance"))  # the scripts runs from the repository root
import common
work = sys.argv[1]
tok_dir = common.build_bpe_target(work, n_files=60, vocab_size=2000, name="tok")
target = os.path.join(work, "target")
if not os.path.exists(os.path.join(target, "tokenizer.json")):
    import json
    v = json.load(open(os.path.join(tok_dir, "config.json")))["vocab_size"]
    eos = json.load(open(os.path.join(tok_dir, "config.json")))["eos_token_id"]
    common.build_tiny_model("qwen3", target, seed=1, vocab_size=v, eos_token_id=eos, hidden_size=512,
                            intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=2, head_dim=64, max_position_embeddings=1024)
    shutil.copy(os.path.join(tok_dir, "tokenizer.json"), os.path.join(target, "tokenizer.json"))
data = os.path.join(work, "data.txt")
if not os.path.exists(data):
    with open(data, "w") as f:
        for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[100:140]:
            f.write(open(p, encoding="utf-8", errors="replace").read())
EOF

base=("$dspark" train --target "$work/target" --data "$work/data.txt" --seq-len 256 --num-anchors 64
      --block-size 7 --markov-rank 256 --draft-layers 1 --steps "$steps" --batch-seqs 8 --eval-every 0
      --save-every 100000 --seed 1 --lr 6e-4 --overwrite)

# seconds per step over steps 3..N from metrics.jsonl
rate() {
  "$py" - "$1" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"train"' in l]
t = {r["step"]: r["elapsed_s"] for r in rows}
n = max(t)
print(f"{(t[n] - t[2]) / (n - 2):.4f} {rows[-1]['loss']!r}")
EOF
}

echo "# bench_mpi: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
"${base[@]}" --out "$work/r1x1" --threads 1 2>"$work/r1x1.log"
read -r s11 l11 < <(rate "$work/r1x1")
mpirun --oversubscribe --bind-to core -np 2 "${base[@]}" --out "$work/r2x1" --threads 1 2>"$work/r2x1.log"
read -r s21 l21 < <(rate "$work/r2x1")
"${base[@]}" --out "$work/r1x2" --threads 2 2>"$work/r1x2.log"
read -r s12 l12 < <(rate "$work/r1x2")

# the rank-0 note: "data parallel: 2 ranks (mpi), N all-reduces of X MB in all, Y s in them on rank 0"
note="$(grep -o 'data parallel:.*' "$work/r2x1.log" | tail -1)"
"$py" - "$steps" "$s11" "$s21" "$s12" "$l11" "$l21" "$l12" "$note" <<'EOF'
import re, sys
steps = int(sys.argv[1]); s11, s21, s12 = map(float, sys.argv[2:5]); l11, l21, l12 = sys.argv[5:8]; note = sys.argv[8]
m = re.search(r"(\d+) all-reduces of ([\d.]+) MB in all, ([\d.]+) s", note)
calls, mb, secs = int(m.group(1)), float(m.group(2)), float(m.group(3))
print("| configuration | s / step | steps / s | vs 1 rank x 1 thread |")
print("|---|---|---|---|")
for name, s in (("1 rank x 1 thread", s11), ("2 ranks x 1 thread (mpirun)", s21), ("1 rank x 2 threads (OpenMP)", s12)):
    print(f"| {name} | {s:.4f} | {1 / s:.2f} | {s11 / s:.2f}x |")
print()
print(f"2 ranks: {mb / steps:.2f} MB handed to all-reduce per step per rank ({calls / steps:.1f} calls per step), "
      f"{secs / steps * 1e3:.2f} ms per step in all-reduce on rank 0 = {secs / steps / s21 * 100:.1f}% of the step "
      f"(wait for the slower rank included)")
print(f"final losses: {l11} (1x1), {l21} (2x1), {l12} (1x2): "
      f"{'2 ranks identical to 1 rank' if l11 == l21 else 'DIFFERENT'}")
EOF

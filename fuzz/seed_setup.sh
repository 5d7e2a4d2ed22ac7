# Sourced by the fuzz/make_*_seeds.sh scripts that run dspark on the tiny models of
# fuzz/corpus/gguf_model: seed_setup DSPARK OUT DEFAULT_OUT LINES sets $dspark, $out (created),
# $models and $tmp (removed at exit), and writes LINES chat lines to $tmp/data.jsonl.
seed_setup() {
  dspark="$(realpath "${1:-build/release/dspark}")"
  out="$(realpath -m "${2:-$3}")"
  models="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/corpus/gguf_model"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$out"
  for i in $(seq "$4"); do
    echo "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi the $i\"},{\"role\":\"assistant\",\"content\":\"the the in he $i the in\"}]}"
  done > "$tmp/data.jsonl"
}

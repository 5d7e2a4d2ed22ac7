#!/usr/bin/env bash
# Fetches, here, the Debian packages the build needs on the GPU machine (issue 14), whose image
# has nvcc, CMake and PyTorch but none of our -dev packages and no network: the libraries and
# headers of cJSON, PCRE2, xxHash, zlib and zstd, and pkgconf (CMake finds them through pkg-config). They
# land in build/gpu-debs/ (ignored by git; the device tool carries it) and scripts/gpu-check.sh
# unpacks them there with `dpkg -x`. The device build uses DSPARK_GEMM=none, so no BLAS.
#   scripts/gpu-debs.sh [dest]      (default build/gpu-debs)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$root/build/gpu-debs}"
mkdir -p "$dest"
cd "$dest"
packages=(
  libcjson1 libcjson-dev            # cJSON: library, headers, libcjson.pc
  libpcre2-8-0 libpcre2-dev         # PCRE2 (8-bit): library, headers, libpcre2-8.pc
  libxxhash0 libxxhash-dev          # xxHash: library, headers, libxxhash.pc
  zlib1g zlib1g-dev                 # zlib (.jsonl.gz data): library, headers, zlib.pc
  libzstd1 libzstd-dev              # zstd (.jsonl.zst data): library, headers, libzstd.pc
  pkgconf pkgconf-bin libpkgconf3   # pkg-config, for a machine that has none
)
rm -f ./*.deb
# apt-get download fetches exactly these (no dependencies): the rest is in any base image.
apt-get download "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
missing=0
for p in "${packages[@]}"; do
  if ! compgen -G "${p}_*.deb" >/dev/null; then
    echo "gpu-debs.sh: $p was not downloaded" >&2
    missing=1
  fi
done
[ "$missing" = 0 ] || exit 1
ls -1 "$dest"/*.deb
echo "gpu-debs.sh: ${#packages[@]} packages in $dest ($(du -sh "$dest" | cut -f1))"

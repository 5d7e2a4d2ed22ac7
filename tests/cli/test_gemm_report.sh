#!/usr/bin/env bash
# The program names the GEMM library and kernel that runs, and says once on stderr when the
# matmuls would run a slow path on a CPU that has a faster one (issue 9): oneDNN capped below
# AVX-512 by DNNL_MAX_CPU_ISA on an AVX-512 machine warns, the uncapped one does not; a build
# without a GEMM library warns on any AVX2 machine.
#   test_gemm_report.sh DSPARK TMPDIR
set -euo pipefail
dspark="$1"
fail=0
name="$("$dspark" --help | sed -n 's/^matmuls: \(.*\), [0-9]* threads$/\1/p')"
[ -n "$name" ] || { echo "FAIL: dspark --help does not name the GEMM library"; exit 1; }
echo "GEMM: $name"
avx512=0; grep -qw avx512f /proc/cpuinfo && avx512=1
avx2=0; grep -qw avx2 /proc/cpuinfo && avx2=1
# the CPU as the program sees it: DSPARK_MAX_ISA caps it (a run as on a CPU without AVX-512)
case "${DSPARK_MAX_ISA:-}" in avx2) avx512=0 ;; portable) avx512=0; avx2=0 ;; esac
plain="$("$dspark" info --help 2>&1 >/dev/null || true)"
case "$name" in
  oneDNN*)
    if grep -q 'warning: matmuls' <<<"$plain"; then echo "FAIL: warning without a cap: $plain"; fail=1; fi
    if ((avx512)); then
      capped="$(DNNL_MAX_CPU_ISA=AVX2 "$dspark" info --help 2>&1 >/dev/null || true)"
      grep -q "warning: matmuls run oneDNN's avx2 kernels on a CPU with AVX-512" <<<"$capped" ||
        { echo "FAIL: no warning under DNNL_MAX_CPU_ISA=AVX2: $capped"; fail=1; }
      [ "$(grep -c 'warning: matmuls' <<<"$capped")" = 1 ] || { echo "FAIL: the warning is not said once"; fail=1; }
    fi ;;
  loops*)
    if ((avx2)) && ! grep -q 'no GEMM library' <<<"$plain"; then echo "FAIL: no warning for the loops: $plain"; fail=1; fi ;;
esac
# a bad DSPARK_BF16_GEMM is reported on every build and CPU (it once went unread where the CPU or
# the build had no native bf16 kernels)
bad="$(DSPARK_BF16_GEMM=x "$dspark" --help 2>&1 >/dev/null || true)"
grep -q 'DSPARK_BF16_GEMM=x is not auto, native or sgemm' <<<"$bad" ||
  { echo "FAIL: DSPARK_BF16_GEMM=x: no warning: $bad"; fail=1; }
# commands that run no matmul stay quiet
if "$dspark" export --help 2>&1 | grep -q 'warning: matmuls'; then echo "FAIL: export warns"; fail=1; fi
((fail)) && exit 1
echo "test_gemm_report: ok"

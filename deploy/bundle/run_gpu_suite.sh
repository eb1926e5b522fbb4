#!/usr/bin/env bash
# Runs a bundle's test and benchmark binaries on the GPU host and writes their logs to OUTDIR.
# Usage: deploy/bundle/run_gpu_suite.sh BUNDLE OUTDIR [TEST_REGEX] [-- BENCH COMMAND...]
#   Every bin/*_test whose name matches TEST_REGEX (default: all) runs with the repository's
#   tests/data; then each BENCH COMMAND (quoted, e.g. "vamp_bench_memory --backend cuda") runs
#   from BUNDLE/bin. Exit status: the number of failed test binaries (0 = all passed).
set -uo pipefail
bundle=$1 outdir=$2 regex=${3:-.}
shift $(( $# >= 3 ? 3 : $# ))
[[ ${1:-} == -- ]] && shift
here=$(cd "$(dirname "$0")/../.." && pwd)
export VAMP_TEST_DATA=$here/tests/data
mkdir -p "$outdir"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$outdir/gpu.txt" 2>&1
failed=0
for t in "$bundle"/bin/*_test; do
  name=$(basename "$t")
  [[ $name =~ $regex ]] || continue
  if "$t" --gtest_color=no > "$outdir/$name.log" 2>&1; then
    echo "PASS $name ($(grep -c '^\[       OK \]' "$outdir/$name.log") ok, $(grep -c '^\[  SKIPPED \]' "$outdir/$name.log") skipped)"
  else
    echo "FAIL $name"; failed=$((failed + 1)); tail -30 "$outdir/$name.log"
  fi
done
for cmd in "$@"; do
  echo "== bench: $cmd"
  (cd "$bundle/bin" && eval "./$cmd") 2>&1 | tee -a "$outdir/bench.log"
done
exit $failed

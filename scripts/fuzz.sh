#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (preset "fuzz") and runs each for a bounded time over
# its seed corpus. Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "fuzz.sh: '$seconds' is not a number of seconds" >&2; exit 2; }
bash scripts/install-deps.sh
exec 9>/tmp/vamp-build.lock
flock 9
cmake --preset fuzz -DVAMP_FUZZ_SECONDS="$seconds" >/dev/null
targets=$(cmake --build build/fuzz --target help | sed -n 's/^\(fuzz_[a-z_]*\): .*/\1/p')
echo "==> building fuzzers: $targets"
cmake --build build/fuzz -j "$(nproc)" --target $targets
flock -u 9
echo "==> fuzzing, ${seconds}s per target"
ctest --test-dir build/fuzz -L fuzz --output-on-failure -j "$(nproc)"

#!/usr/bin/env bash
# Installs dependencies, builds everything and runs the default test suite (CPU; GPU tests skip
# themselves without a device). Extra arguments go to ctest, e.g. scripts/test.sh -R config.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${VAMP_BUILD_PRESET:-release}
bash scripts/install-deps.sh
bash scripts/fetch-tokenizers.sh  # Qwen3's tokenizer for the goldens (cached; offline after once)
bash scripts/fetch-openai-sdk.sh  # the openai npm SDK for tests/sdk (cached; offline after once)
echo "==> building ($preset)"
bash scripts/build.sh --preset "$preset"
echo "==> testing"
ctest --test-dir "build/$preset" --output-on-failure -j "$(nproc)" --timeout 600 "$@"

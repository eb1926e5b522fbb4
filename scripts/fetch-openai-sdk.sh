#!/usr/bin/env bash
# Set-up for the OpenAI SDK suite (tests/sdk): installs the official `openai` npm package, pinned
# by tests/sdk/package-lock.json, into .cache/openai-sdk/node_modules (gitignored). Idempotent: it
# reinstalls only when the lock file changed; later runs work offline. Without npm it says so and
# exits 0 (the suite then skips). Usage: scripts/fetch-openai-sdk.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/openai-sdk
if cmp -s tests/sdk/package-lock.json "$dest/package-lock.json" && [[ -f $dest/node_modules/openai/package.json ]]; then
  echo "fetch-openai-sdk: $dest has the pinned openai SDK"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-openai-sdk: npm not found; the OpenAI SDK suite will be skipped (apt-get install npm)" >&2
  exit 0
fi
mkdir -p "$dest"
cp tests/sdk/package.json tests/sdk/package-lock.json "$dest/"
# A failed install removes the lock copy, so the next run retries.
(cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund --cache "$PWD/../npm" >/dev/null) || {
  rm -f "$dest/package-lock.json"
  echo "fetch-openai-sdk: npm ci failed" >&2
  exit 1
}
echo "fetch-openai-sdk: installed openai $(node -p "require('./$dest/node_modules/openai/package.json').version" 2>/dev/null) in $dest"

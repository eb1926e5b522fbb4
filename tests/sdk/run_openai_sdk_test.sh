#!/usr/bin/env bash
# CTest driver of the OpenAI SDK suite: starts vamp-controller with one spawned CPU agent serving
# tests/data/tiny-qwen3-vocab, waits until it serves, runs openai_sdk_test.js with node's test
# runner, and stops the controller. Exits 77 (CTest's skip) when node or the SDK (installed by
# scripts/fetch-openai-sdk.sh, the fixture) is missing. Usage: run_openai_sdk_test.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$1
sdk=$root/.cache/openai-sdk/node_modules
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed"
  exit 77
fi
if [[ ! -f $sdk/openai/package.json ]]; then
  echo "SKIP: the openai SDK is not installed (scripts/fetch-openai-sdk.sh)"
  exit 77
fi
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
"$build/controller/vamp-controller" --grpc_address=127.0.0.1:0 --admin_address=127.0.0.1:0 \
  --http_address="127.0.0.1:$port" --metrics_address= \
  --model_path="$root/tests/data/tiny-qwen3-vocab" --load_format=dummy --spawn_agents=1 \
  --agent_binary="$build/agent/vamp-agent" --agent_host_memory_bytes=536870912 \
  --agent_host_page_bytes=4096 --step_timeout_s=20 --log_level=warning >"$log" 2>&1 &
controller=$!
cleanup() {
  kill "$controller" 2>/dev/null || true
  wait "$controller" 2>/dev/null || true
  rm -f "$log"
}
trap cleanup EXIT
base=http://127.0.0.1:$port
for _ in $(seq 1 240); do
  if curl -sf "$base/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$controller" 2>/dev/null; then
    echo "vamp-controller exited:"; cat "$log"; exit 1
  fi
  sleep 0.5
done
curl -sf "$base/health" >/dev/null || { echo "vamp-controller never served:"; cat "$log"; exit 1; }
status=0
VAMP_BASE_URL=$base NODE_PATH=$sdk node --test --test-reporter=spec "$here/openai_sdk_test.js" || status=$?
if ((status != 0)); then echo "--- vamp-controller log"; cat "$log"; fi
exit "$status"

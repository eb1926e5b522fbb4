#!/usr/bin/env bash
# The main job: installs dependencies, builds VAMP and runs the whole system on its embedded
# default — vamp-controller spawning CPU vamp-agents that serve the tiny qwen3_moe checkpoint in
# tests/data — then sends one request and keeps serving until Ctrl-C.
#   scripts/run.sh           serve in the foreground (HTTP on 127.0.0.1:8000)
#   scripts/run.sh --check   start, check health, status and one completion, then stop
#   scripts/run.sh --demo    the prefix-cache cliff and its removal on CPU agents, in about a
#                            minute: vamp-bench ab runs the multi-turn workload at 2, 4 and 6
#                            sessions against static, VAMP-75 (shipped cost model) and the
#                            paper's cost model, each on a fresh system with a small KV budget,
#                            and prints where the report and charts are (VAMP_DEMO_OUT, default
#                            out/demo; VAMP_DEMO_QUICK=1: 2 and 6 sessions only, for CI)
# Environment: VAMP_HTTP_PORT (8000), VAMP_GRPC_PORT (50051), VAMP_ADMIN_PORT (50052),
# VAMP_AGENTS (1; 2 runs tensor-parallel), VAMP_MODEL_PATH (tests/data/tiny-qwen3-moe),
# VAMP_BUILD_PRESET (release).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=serve
case "${1:-}" in
  --check) mode=check ;;
  --demo) mode=demo ;;
  "") ;;
  -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
preset=${VAMP_BUILD_PRESET:-release}
http_port=${VAMP_HTTP_PORT:-8000}
grpc_port=${VAMP_GRPC_PORT:-50051}
admin_port=${VAMP_ADMIN_PORT:-50052}
agents=${VAMP_AGENTS:-1}
model=${VAMP_MODEL_PATH:-tests/data/tiny-qwen3-moe}
if [[ $mode == check ]]; then http_port=0; grpc_port=0; admin_port=0; fi

bash scripts/install-deps.sh
bash scripts/fetch-tokenizers.sh  # model tokenizers (cached; offline after once)
echo "==> building ($preset)"
if [[ $mode == demo ]]; then
  bash scripts/build.sh --preset "$preset" vamp-controller vamp-agent vamp-bench
else
  bash scripts/build.sh --preset "$preset" vamp-controller vamp-agent vampctl
fi
bin=build/$preset

if [[ $mode == demo ]]; then
  # The demo model: the tiny checkpoint's shapes with 12 layers (dummy weights), so that what an
  # offload frees outweighs the staging buffers (with 3 layers they cancel out). 16 MiB of agent
  # memory and a 64-token step budget leave a static pool of 90 blocks (1,440 tokens); 12-turn
  # sessions end at about 32 blocks each, so static falls off the cliff between 2 and 6
  # sessions, while offloading 75% of the experts adds about 130 blocks.
  out=${VAMP_DEMO_OUT:-out/demo}
  sweep=2,4,6
  [[ ${VAMP_DEMO_QUICK:-0} == 1 ]] && sweep=2,6
  rm -rf "$out"
  echo "==> vamp-bench ab: static vs VAMP on CPU agents, $sweep sessions (about a minute)"
  "$bin/bench/vamp_bench/vamp-bench" ab --out "$out" --title demo \
    --model_path bench/vamp_bench/demo-model --configs static,vamp-75,paper-75 \
    --sessions_sweep "$sweep" --turns 12 --first_turn_tokens 64 --growth_tokens 32 \
    --output_tokens 8 --think_time_s 0.2 --progress=false --startup_timeout_s 120 \
    --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --system_flags "--load_format=dummy --agent_host_memory_bytes=16777216 \
      --agent_host_page_bytes=4096 --max_num_batched_tokens=64 --max_num_seqs=8 \
      --log_level=warning"
  echo "==> results (client-measured; hit rate and offload from the server's metrics)"
  sed -n '/^| config/,/^$/p' "$out/demo.md" | cut -d'|' -f2-8,13-17
  cat <<EOT
==> report: $out/demo.md (charts: $out/demo-*.svg, raw data: $out/demo.json,
    controller logs: $out/logs/). Past the cliff static's prefix-cache hit rate collapses and
    TTFT rises; the paper's cost model (paper-75) offloads experts early and keeps both low. The
    shipped tax model (vamp-75) does not remove this CPU cliff: it offloads late, if at all
    (bench/results/2026-12-01-vamp-bench-cpu-demo/README.md).
EOT
  exit 0
fi

ready=$(mktemp)
rm -f "$ready"
"$bin/controller/vamp-controller" --model_path "$model" --spawn_agents "$agents" \
  --http_address "127.0.0.1:$http_port" --grpc_address "127.0.0.1:$grpc_port" \
  --admin_address "127.0.0.1:$admin_port" --metrics_address "" \
  --agent_host_memory_bytes 268435456 --agent_host_page_bytes 4096 --max_offload_ratio 0.5 \
  --ready_file "$ready" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$ready"' EXIT
for _ in $(seq 100); do
  [[ -s $ready ]] && break
  kill -0 $pid 2>/dev/null || { echo "run.sh: vamp-controller exited during start-up" >&2; exit 1; }
  sleep 0.1
done
[[ -s $ready ]] || { echo "run.sh: vamp-controller did not start listening in 10 s" >&2; exit 1; }
port_of() { sed -E "s/.*\"$1\": ([0-9]+).*/\1/" "$ready"; }
http=$(port_of http_port)
export VAMPCTL_ENDPOINT=127.0.0.1:$(port_of admin_port)
echo "==> waiting for $agents agent(s) to load $model"
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$http/health" >/dev/null && break
  kill -0 $pid 2>/dev/null || { echo "run.sh: vamp-controller exited" >&2; exit 1; }
  sleep 0.1
done
curl -sf "http://127.0.0.1:$http/health" >/dev/null ||
  { echo "run.sh: the model is not being served after 30 s" >&2; exit 1; }
echo "==> vampctl status"
"$bin/cli/vampctl" status
echo "==> POST /v1/completions"
request='{"prompt": "Hello, ", "max_tokens": 16, "temperature": 0, "ignore_eos": true}'
echo "    $request"
response=$(curl -sf "http://127.0.0.1:$http/v1/completions" -H 'Content-Type: application/json' \
  -d "$request")
echo "    $response"
grep -q '"completion_tokens":16' <<<"$response" ||
  { echo "run.sh: unexpected completion response" >&2; exit 1; }
if [[ $mode == check ]]; then
  echo "run.sh: system healthy, completion served"
  exit 0
fi
cat <<EOT
==> serving on http://127.0.0.1:$http (OpenAI-compatible); Ctrl-C stops. Try:
    curl -s http://127.0.0.1:$http/v1/completions -H 'Content-Type: application/json' \\
      -d '{"prompt": "Hi", "max_tokens": 8, "stream": true}'
    $bin/cli/vampctl status      # admin at $VAMPCTL_ENDPOINT
EOT
wait $pid

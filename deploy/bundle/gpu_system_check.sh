#!/usr/bin/env bash
# End-to-end check of VAMP on one GPU from a bundle (deploy/bundle/make_bundle.sh): vamp-controller
# spawns one vamp-agent on the device, serving the dummy-weight model tests/data/small-qwen3-moe-gpu
# (1.5 MiB float32 experts: groups of 4 on 2 MiB pages, so experts can be offloaded). It sends a
# greedy completion, offloads 2 expert groups (vampctl offload 2), sends it again, shows vampctl
# status, restores (vampctl restore 2), sends it a third time, and checks that the sampled token
# ids never change. Prints each step; exits non-zero on any failure or mismatch.
#
# Usage: gpu_system_check.sh [--bundle DIR] [--device cuda:0|cpu] [--model_path DIR] [--groups N]
#   --bundle      folder with bin/vamp-controller, bin/vamp-agent, bin/vampctl (default: the
#                 current folder)
#   --device      the spawned agent's --device (default cuda:0; cpu proves the script on a CPU host)
#   --model_path  default: tests/data/small-qwen3-moe-gpu of the repository holding this script
#   --groups      groups to offload and restore (default 2)
#   --no_agent_metrics  spawn the agent through a wrapper that turns its /metrics listener off
#                 (a workaround for bundles built before /metrics moved off civetweb, which could
#                 not start in a process that loads cuBLAS)
# Environment: VAMP_CHECK_TIMEOUT_S (start-up wait, default 300), VAMP_CHECK_KEEP_LOG=1 keeps the
# controller's log.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle=$PWD
device=cuda:0
model=$here/../../tests/data/small-qwen3-moe-gpu
groups=2
no_agent_metrics=0
while (($#)); do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --model_path) model=$2; shift 2 ;;
    --groups) groups=$2; shift 2 ;;
    --no_agent_metrics) no_agent_metrics=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_system_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bundle=$(cd "$bundle" && pwd)
for b in vamp-controller vamp-agent vampctl; do
  [[ -x $bundle/bin/$b ]] || { echo "gpu_system_check: $bundle/bin/$b is missing" >&2; exit 2; }
done
[[ -f $model/config.json ]] || { echo "gpu_system_check: no config.json in '$model'" >&2; exit 2; }
model=$(cd "$model" && pwd)
timeout_s=${VAMP_CHECK_TIMEOUT_S:-300}

step() { echo "==> $*"; }
fail() { echo "gpu_system_check: FAILED: $*" >&2; exit 1; }

work=$(mktemp -d)
ready=$work/ready.json
log=$work/controller.log
pid=""
cleanup() {
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  if [[ ${VAMP_CHECK_KEEP_LOG:-0} == 1 ]]; then
    echo "gpu_system_check: controller log kept in $log"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
on_error() {
  echo "---- last lines of the controller log ($log) ----" >&2
  tail -n 40 "$log" >&2 2>/dev/null || true
}
trap on_error ERR

# A CPU agent (the script's own test) gets a 16 GiB "device" on 2 MiB pages, like a GPU's, so the
# same 5% utilisation holds the model (pages are committed on first touch); a GPU agent plans from
# the device's memory.
device_flags=()
if [[ $device == cpu ]]; then
  device_flags=(--agent_host_memory_bytes 17179869184 --agent_host_page_bytes 2097152)
fi
agent_binary=$bundle/bin/vamp-agent
if ((no_agent_metrics)); then
  agent_binary=$work/vamp-agent
  cat >"$agent_binary" <<EOT
#!/usr/bin/env bash
# Runs $bundle/bin/vamp-agent with an empty --metrics_address (no /metrics listener).
args=(); skip=0
for a in "\$@"; do
  if ((skip)); then skip=0; args+=(""); continue; fi
  args+=("\$a"); [[ \$a == --metrics_address ]] && skip=1
done
exec "$bundle/bin/vamp-agent" "\${args[@]}"
EOT
  chmod +x "$agent_binary"
fi
step "starting vamp-controller (1 agent on $device, $model, dummy weights, VAMP-r 0.5)"
"$bundle/bin/vamp-controller" --spawn_agents 1 --agent_device "$device" \
  --agent_binary "$agent_binary" --model "$(basename "$model")" --model_path "$model" \
  --load_format dummy \
  --max_offload_ratio 0.5 --gpu_memory_utilization 0.05 "${device_flags[@]}" \
  --http_address 127.0.0.1:0 --grpc_address 127.0.0.1:0 --admin_address 127.0.0.1:0 \
  --metrics_address "" --ready_file "$ready" >"$log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  [[ -s $ready ]] && break
  kill -0 "$pid" 2>/dev/null || fail "vamp-controller exited during start-up"
  sleep 0.1
done
[[ -s $ready ]] || fail "vamp-controller did not write $ready in 30 s"
port_of() { sed -E "s/.*\"$1\": *([0-9]+).*/\1/" "$ready"; }
http=127.0.0.1:$(port_of http_port)
export VAMPCTL_ENDPOINT=127.0.0.1:$(port_of admin_port)
echo "    HTTP $http, admin $VAMPCTL_ENDPOINT"

step "waiting for GET /health = 200 (the agent loads the model; up to $timeout_s s)"
deadline=$((SECONDS + timeout_s))
until [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$http/health" || true) == 200 ]]; do
  kill -0 "$pid" 2>/dev/null || fail "vamp-controller exited while the agent was loading"
  if (($(grep -c "agent rank 0 (pid [0-9]*) exited" "$log") >= 3)); then
    fail "the agent keeps exiting at start-up: $(grep -m1 "cannot start" "$log")"
  fi
  if grep -q "cannot serve with the registered agents" "$log"; then
    fail "the agent's Init failed: $(grep -m1 "cannot serve with the registered agents" "$log")"
  fi
  ((SECONDS < deadline)) || fail "/health is not 200 after $timeout_s s"
  sleep 0.2
done
echo "    healthy"

request='{"prompt": [1, 72, 101, 108, 108, 111, 44, 32, 86, 65, 77, 80], "max_tokens": 32, "temperature": 0, "ignore_eos": true}'
# Prints the completion's token ids (choices[0].token_ids) on one line.
complete() {
  local response ids
  response=$(curl -sS --max-time 120 "http://$http/v1/completions" \
    -H 'Content-Type: application/json' -d "$request") || fail "POST /v1/completions failed"
  ids=$(grep -o '"token_ids": *\[[0-9, ]*\]' <<<"$response" | head -n 1 | sed -E 's/.*\[(.*)\]/\1/' |
    tr -d ' ')
  [[ -n $ids ]] || fail "no token_ids in the completion response: $response"
  local n
  n=$(tr ',' '\n' <<<"$ids" | grep -c .)
  [[ $n == 32 ]] || fail "expected 32 completion tokens, got $n: $response"
  echo "$ids"
}

step "POST /v1/completions (greedy, 32 tokens, prompt as token ids)"
echo "    $request"
want=$(complete)
echo "    token ids: $want"

step "vampctl offload $groups"
"$bundle/bin/vampctl" offload "$groups" || fail "vampctl offload $groups"

step "POST /v1/completions again ($groups group(s) offloaded)"
got=$(complete)
echo "    token ids: $got"
[[ $got == "$want" ]] || fail "tokens changed after the offload: want $want, got $got"
echo "    identical"

step "vampctl status"
"$bundle/bin/vampctl" status || fail "vampctl status"

step "vampctl restore $groups"
"$bundle/bin/vampctl" restore "$groups" || fail "vampctl restore $groups"

step "POST /v1/completions once more (restored)"
got=$(complete)
echo "    token ids: $got"
[[ $got == "$want" ]] || fail "tokens changed after the restore: want $want, got $got"
echo "    identical"

step "stopping vamp-controller"
kill "$pid"
wait "$pid" 2>/dev/null || true
pid=""
echo "gpu_system_check: PASSED on $device (offload/restore of $groups group(s) kept the tokens)"

#!/usr/bin/env bash
# End-to-end check of VAMP on GPUs from a bundle (deploy/bundle/make_bundle.sh): vamp-controller
# spawns one vamp-agent per tensor-parallel rank (TP=1: on --device; TP=2: on cuda:0 and cuda:1,
# all-reducing through NCCL), serving a dummy-weight model. It sends a greedy completion, offloads
# expert groups on every rank (vampctl offload N), sends it again, shows vampctl status, restores
# (vampctl restore N), sends it a third time, and checks that the sampled token ids never change.
# Prints each step; exits non-zero on any failure or mismatch.
#
# Usage: gpu_system_check.sh [--bundle DIR] [--tp 1|2] [--device cuda:0|cpu] [--model PATH|dummy-30b]
#                            [--dtype auto|bfloat16|float32] [--groups N] [--gpu_memory_utilization F]
#                            [--max_offload_ratio R]
#   --bundle      folder with bin/vamp-controller, bin/vamp-agent, bin/vampctl (default: the
#                 current folder)
#   --tp          tensor-parallel ranks (default 1). 2: two agents, rank r on cuda:r (needs 2 GPUs),
#                 or two CPU agents over TCP with --device cpu
#   --device      TP=1: the agent's --device (default cuda:0); cpu (TP=1 or 2) proves the script
#                 on a CPU host
#   --model       a model folder (config.json; weights are dummy), or dummy-30b for Qwen3-30B-A3B's
#                 shapes (tests/data/qwen3-30b-a3b). Default: tests/data/small-qwen3-moe-gpu of the
#                 repository holding this script (--model_path is the same flag)
#   --dtype       the controller's --dtype (default: float32 for the small model, whose page-sized
#                 experts assume float32; auto, i.e. bfloat16 on GPUs, otherwise)
#   --groups      groups to offload and restore (default: 2, or 1 for the small model at TP=2, whose
#                 rank-local experts fill a 2 MiB page only in groups of 8 of its 16)
#   --gpu_memory_utilization  default 0.05 (small model), 0.9 (dummy-30b)
#   --max_offload_ratio       default 0.5 (small model), 0.25 (dummy-30b)
#   --no_agent_metrics  spawn the agents through a wrapper that turns their /metrics listener off
#                 (a workaround for bundles built before /metrics moved off civetweb, which could
#                 not start in a process that loads cuBLAS)
# Environment: VAMP_CHECK_TIMEOUT_S (start-up wait; default 300, 1200 for dummy-30b),
# VAMP_CHECK_KEEP_LOG=1 keeps the controller's log. NCCL_NVLS_ENABLE defaults to 0 (NVLink
# multicast off, as the shared GPU hosts require). The bundle leaves libnccl.so.2 out (like the
# other CUDA libraries): it must be on the loader's path, in /usr/local/cuda/lib64, or in a Python
# environment's nvidia-nccl package; the script finds it there or says so.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle=$PWD
device=cuda:0
model=small
tp=1
dtype=""
groups=""
util=""
ratio=""
no_agent_metrics=0
while (($#)); do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --model|--model_path) model=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --groups) groups=$2; shift 2 ;;
    --gpu_memory_utilization) util=$2; shift 2 ;;
    --max_offload_ratio) ratio=$2; shift 2 ;;
    --no_agent_metrics) no_agent_metrics=1; shift ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_system_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $tp == 1 || $tp == 2 ]] || { echo "gpu_system_check: --tp must be 1 or 2, got '$tp'" >&2; exit 2; }
bundle=$(cd "$bundle" && pwd)
for b in vamp-controller vamp-agent vampctl; do
  [[ -x $bundle/bin/$b ]] || { echo "gpu_system_check: $bundle/bin/$b is missing" >&2; exit 2; }
done

# The model and the defaults that suit it.
big=0
case "$model" in
  small) model=$here/../../tests/data/small-qwen3-moe-gpu ;;
  dummy-30b) model=$here/../../tests/data/qwen3-30b-a3b; big=1 ;;
esac
[[ -f $model/config.json ]] || { echo "gpu_system_check: no config.json in '$model'" >&2; exit 2; }
model=$(cd "$model" && pwd)
small=0
[[ $(basename "$model") == small-qwen3-moe-gpu ]] && small=1
if [[ -z $dtype ]]; then dtype=auto; ((small)) && dtype=float32; fi
if [[ -z $groups ]]; then groups=2; ((small && tp == 2)) && groups=1; fi
if [[ -z $util ]]; then util=0.05; ((big)) && util=0.9; fi
if [[ -z $ratio ]]; then ratio=0.5; ((big)) && ratio=0.25; fi
timeout_s=${VAMP_CHECK_TIMEOUT_S:-$((big ? 1200 : 300))}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

# TP=2 on GPUs: the spawned agents get --device cuda, which vamp-agent reads as cuda:<rank>.
agent_device=$device
if ((tp == 2)) && [[ $device != cpu ]]; then
  agent_device=cuda
  if command -v nvidia-smi >/dev/null; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    ((gpus >= 2)) || { echo "gpu_system_check: --tp 2 needs 2 GPUs, nvidia-smi lists $gpus" >&2; exit 2; }
  fi
fi

step() { echo "==> $*"; }
fail() { echo "gpu_system_check: FAILED: $*" >&2; exit 1; }

# vamp-agent links libnccl.so.2 (tensor parallelism between GPUs), which the bundle does not carry:
# find it before anything starts, so a missing library is one clear line, not an agent that keeps
# exiting.
if ldd "$bundle/bin/vamp-agent" 2>/dev/null | grep -q 'libnccl.so.2 => not found'; then
  nccl_dir=""
  candidates=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu)
  if command -v python3 >/dev/null; then
    py=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
      2>/dev/null || true)
    [[ -n $py ]] && candidates+=("$py")
  fi
  for d in "${candidates[@]}"; do
    if [[ -e $d/libnccl.so.2 ]]; then nccl_dir=$d; break; fi
  done
  if [[ -z $nccl_dir ]]; then
    echo "gpu_system_check: libnccl.so.2 cannot be found: $bundle/bin/vamp-agent needs it (NCCL" >&2
    echo "  tensor parallelism) and the bundle leaves it out. Looked on the loader's path and in" >&2
    echo "  ${candidates[*]}. Install NCCL for CUDA 13 or point LD_LIBRARY_PATH at its lib folder." >&2
    exit 2
  fi
  export LD_LIBRARY_PATH=$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "gpu_system_check: libnccl.so.2 from $nccl_dir (added to LD_LIBRARY_PATH)"
  if ldd "$bundle/bin/vamp-agent" | grep -q 'not found'; then
    fail "vamp-agent still misses libraries: $(ldd "$bundle/bin/vamp-agent" | grep 'not found' | tr -s ' \t' ' ')"
  fi
fi

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
if ((tp == 2)); then
  where=$([[ $device == cpu ]] && echo "2 CPU agents (TCP)" || echo "cuda:0 and cuda:1 (NCCL)")
else
  where="1 agent on $device"
fi
step "starting vamp-controller (TP=$tp: $where; $model, dummy weights, dtype $dtype, VAMP-r $ratio)"
"$bundle/bin/vamp-controller" --spawn_agents "$tp" --agent_device "$agent_device" \
  --agent_binary "$agent_binary" --model_path "$model" \
  --load_format dummy --dtype "$dtype" \
  --max_offload_ratio "$ratio" --gpu_memory_utilization "$util" "${device_flags[@]}" \
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
VAMPCTL_ENDPOINT=127.0.0.1:$(port_of admin_port)
export VAMPCTL_ENDPOINT
echo "    HTTP $http, admin $VAMPCTL_ENDPOINT"

step "waiting for GET /health = 200 (the agents load the model; up to $timeout_s s)"
deadline=$((SECONDS + timeout_s))
until [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$http/health" || true) == 200 ]]; do
  kill -0 "$pid" 2>/dev/null || fail "vamp-controller exited while the agents were loading"
  if (($(grep -c "agent rank [0-9]* (pid [0-9]*) exited" "$log") >= 3)); then
    fail "an agent keeps exiting at start-up: $(grep -m1 -E "cannot start|error while loading" "$log" || grep -m1 "exited" "$log")"
  fi
  if grep -q "cannot serve with the registered agents" "$log"; then
    fail "the agents' Init failed: $(grep -m1 "cannot serve with the registered agents" "$log")"
  fi
  ((SECONDS < deadline)) || fail "/health is not 200 after $timeout_s s"
  sleep 0.2
done
echo "    healthy"
grep -m1 "all-reduce over" "$log" | sed 's/^.*\] /    /' || true

request='{"prompt": [1, 72, 101, 108, 108, 111, 44, 32, 86, 65, 77, 80], "max_tokens": 32, "temperature": 0, "ignore_eos": true}'
# Prints the completion's token ids (choices[0].token_ids) on one line.
complete() {
  local response ids
  response=$(curl -sS --max-time 300 "http://$http/v1/completions" \
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
echo "gpu_system_check: PASSED with TP=$tp on $where, $(basename "$model"), dtype $dtype (offload/restore of $groups group(s) kept the tokens)"

#!/usr/bin/env bash
# The headline A/B on one GPU from a portable bundle (deploy/bundle/make_bundle.sh): vamp-bench
# ab sweeps the paper's multi-turn workload across the prefix-cache cliff on the dummy
# Qwen3-30B-A3B (tests/data/qwen3-30b-a3b, random weights of the real shapes), static vs VAMP
# (shipped defaults) vs VAMP-15 / VAMP-25 vs the paper's cost model, and writes the report
# (markdown, SVG charts, raw JSON, controller logs) to OUT. Sized for 8-10 minutes: each
# configuration's system starts once (--one_system_per_config; a seed per sweep point, so no
# prefix carries over) and each run is cut off after --max_run_s (unfinished turns count as
# misses in Q(T, P)).
#
# Build and bundle here:
#   scripts/build.sh --preset release vamp-controller vamp-agent vamp-bench
#   deploy/bundle/make_bundle.sh --out .bundle controller/vamp-controller agent/vamp-agent \
#     bench/vamp_bench/vamp-bench
# On the GPU host, from the repository root:
#   export LD_LIBRARY_PATH=/usr/local/cuda/lib64
#   bench/vamp_bench/run_gpu_ab.sh --bundle .bundle --out out/gpu-ab
#
# Usage: run_gpu_ab.sh --bundle DIR --out DIR [--device cuda:0] [--util F] [--sweep LIST]
#                      [--configs LIST] [--turns N] [--max_run_s S] [--repeats N] [-- VAMP_BENCH_FLAGS...]
#   --model     model folder (config.json; weights are dummy), default tests/data/qwen3-30b-a3b
#   --device    the agent's device (default cuda:0; cpu with --model tests/data/tiny-qwen3-moe and
#               small prompts after -- makes a dry run on a machine without a GPU)
#   --util      --gpu_memory_utilization (default 0.47: the static pool holds about 83k tokens;
#               lower it to move the cliff to fewer sessions)
#   --sweep     concurrent sessions (default 4,8,12)
#   --configs   vamp-bench configurations (default static,vamp,vamp-15,vamp-25,paper)
#   --turns     turns per session (default 6; turn 0 4,096 tokens, +2,048 a turn, 32 output
#               tokens, 0.5 s think time: the last prompt is about 14k tokens, so the static pool
#               of about 83k tokens holds 5 to 6 sessions' contexts)
#   --max_run_s cut each run off after this many seconds (default 15)
#   anything after -- goes to vamp-bench ab as is (e.g. --workload mooncake --max_requests 300)
# Time: the dummy 30B system took 50-75 s to start on an H200 (bench/results), so the defaults
# take about 5 x (60 + 3 x 18) s, 9-10 minutes; --configs static,vamp,paper or --sweep 4,10
# brings it under 8.
# Environment: NCCL_NVLS_ENABLE defaults to 0; VAMP_AB_STARTUP_S (default 900) bounds each
# system's start-up.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
model="" bundle="" out="" device=cuda:0 util=0.47 sweep=4,8,12 turns=6 max_run_s=15 repeats=1
configs=static,vamp,vamp-15,vamp-25,paper
extra=()
while (($#)); do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --util) util=$2; shift 2 ;;
    --sweep) sweep=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --turns) turns=$2; shift 2 ;;
    --max_run_s) max_run_s=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_gpu_ab: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n $bundle && -n $out ]] || { echo "run_gpu_ab: --bundle and --out are required (see --help)" >&2; exit 2; }
bundle=$(cd "$bundle" && pwd)
for b in vamp-controller vamp-agent vamp-bench; do
  [[ -x $bundle/bin/$b ]] || { echo "run_gpu_ab: $bundle/bin/$b is missing (make_bundle.sh)" >&2; exit 2; }
done
model=$(cd "${model:-$here/tests/data/qwen3-30b-a3b}" && pwd)
[[ -f $model/config.json ]] || { echo "run_gpu_ab: no config.json in '$model'" >&2; exit 2; }
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# vamp-agent links libnccl.so.2, which bundles leave to the host.
if ldd "$bundle/bin/vamp-agent" 2>/dev/null | grep -q 'libnccl.so.2 => not found'; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu \
    "$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"; do
    if [[ -n $d && -e $d/libnccl.so.2 ]]; then
      export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      echo "run_gpu_ab: libnccl.so.2 from $d"
      break
    fi
  done
fi
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1 || true
n_configs=$(tr ',' '\n' <<<"$configs" | grep -c .)
n_points=$(tr ',' '\n' <<<"$sweep" | grep -c .)
echo "run_gpu_ab: $n_configs configurations x $n_points points x $repeats run(s), each cut off after" \
  "${max_run_s} s, plus one start-up per configuration: about" \
  "$((n_configs * (n_points * repeats * (max_run_s + 3) + 60) / 60)) min if a start-up takes a minute"
commit=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "run_gpu_ab: the report goes to $out/gpu-ab.md (charts $out/gpu-ab-*.svg, raw $out/gpu-ab.json," \
  "controller logs $out/logs/), rewritten after every run"
# exec: a signal for this script reaches vamp-bench, whose controllers end with it.
exec "$bundle/bin/vamp-bench" ab --out "$out" --title gpu-ab --commit "$commit" \
  --controller_binary "$bundle/bin/vamp-controller" --agent_binary "$bundle/bin/vamp-agent" \
  --model_path "$model" --configs "$configs" --sessions_sweep "$sweep" \
  --repeats "$repeats" --one_system_per_config --startup_timeout_s "${VAMP_AB_STARTUP_S:-900}" \
  --turns "$turns" --first_turn_tokens 4096 --growth_tokens 2048 --output_tokens 32 \
  --think_time_s 0.5 --max_duration_s "$max_run_s" --request_timeout_s 300 \
  --system_flags "--agent_device=$device --load_format=dummy \
    --gpu_memory_utilization=$util --step_timeout_s=120 --log_level=warning" \
  "${extra[@]}"

#!/usr/bin/env bash
# The main job: installs dependencies, builds VAMP and runs the whole system on its embedded
# default, then keeps serving until Ctrl-C.
#   scripts/run.sh           serve in the foreground
#   scripts/run.sh --check   start, check health and status, then stop (exit 0 when healthy)
# Environment: VAMP_GRPC_PORT (50051), VAMP_METRICS_PORT (9400), VAMP_BUILD_PRESET (release).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=serve
case "${1:-}" in
  --check) mode=check ;;
  "") ;;
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
preset=${VAMP_BUILD_PRESET:-release}
grpc_port=${VAMP_GRPC_PORT:-50051}
metrics_port=${VAMP_METRICS_PORT:-9400}
if [[ $mode == check ]]; then grpc_port=0; metrics_port=0; fi

bash scripts/install-deps.sh
echo "==> building ($preset)"
bash scripts/build.sh --preset "$preset" vamp-controller vampctl
bin=build/$preset

ready=$(mktemp)
rm -f "$ready"
"$bin/controller/vamp-controller" --grpc_address "127.0.0.1:$grpc_port" \
  --metrics_address "127.0.0.1:$metrics_port" --ready_file "$ready" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$ready"' EXIT
for _ in $(seq 100); do
  [[ -s $ready ]] && break
  kill -0 $pid 2>/dev/null || { echo "run.sh: vamp-controller exited during start-up" >&2; exit 1; }
  sleep 0.1
done
[[ -s $ready ]] || { echo "run.sh: vamp-controller did not become ready in 10 s" >&2; exit 1; }
port=$(sed -E 's/.*"grpc_port": ([0-9]+).*/\1/' "$ready")
mport=$(sed -E 's/.*"metrics_port": ([0-9]+).*/\1/' "$ready")
export VAMPCTL_ENDPOINT=127.0.0.1:$port
echo "==> vampctl health"
"$bin/cli/vampctl" health
echo "==> vampctl status"
"$bin/cli/vampctl" status
echo "==> metrics at http://127.0.0.1:$mport/metrics"
if [[ $mode == check ]]; then
  echo "run.sh: controller healthy"
  exit 0
fi
echo "==> serving on 127.0.0.1:$port (gRPC); Ctrl-C stops"
wait $pid

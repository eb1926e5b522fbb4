#!/usr/bin/env bash
# Local observability: runs a Prometheus server (Debian's `prometheus` package) that scrapes a local
# vamp-controller and its agents, found through the target list the controller publishes
# (GET /metrics/targets, Prometheus HTTP service discovery), and evaluates VAMP's recording and
# alerting rules (dashboards/prometheus/vamp-rules.yml). Point a Grafana at it and import
# dashboards/*.json (see README, "Observe"). Runs in the foreground; Ctrl-C stops it.
#   scripts/observe.sh [--controller URL] [--port PORT] [--dir DIR] [--scrape-interval DURATION]
# --controller  the controller's HTTP API (default http://127.0.0.1:8000, as scripts/run.sh serves)
# --port        where Prometheus listens, on loopback (default 9090)
# --dir         configuration and TSDB folder (default .observe/ in the repository; kept between runs)
# --scrape-interval  scrape and rule evaluation interval (default 5s)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
controller=http://127.0.0.1:8000
port=9090
dir=$root/.observe
interval=5s
while (($#)); do
  case "$1" in
    --controller) controller=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --scrape-interval) interval=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "observe.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v prometheus >/dev/null ||
  { echo "observe.sh: prometheus is missing; run scripts/install-deps.sh" >&2; exit 1; }
controller=${controller%/}
if ! curl -sf "$controller/metrics/targets" >/dev/null; then
  echo "observe.sh: warning: no target list at $controller/metrics/targets yet (is vamp-controller" \
       "running? scripts/run.sh starts one); Prometheus keeps asking" >&2
fi
mkdir -p "$dir/tsdb"
cat >"$dir/prometheus.yml" <<YML
# Written by scripts/observe.sh.
global:
  scrape_interval: $interval
  evaluation_interval: $interval
rule_files:
  - $root/dashboards/prometheus/vamp-rules.yml
scrape_configs:
  - job_name: vamp
    # The controller lists itself and every registered agent, labelled replica, vamp_role and
    # (agents) rank: the labels the dashboards and rules use.
    http_sd_configs:
      - url: $controller/metrics/targets
        refresh_interval: $interval
YML
echo "observe.sh: Prometheus on http://127.0.0.1:$port scraping the targets of $controller"
echo "observe.sh: in Grafana, add a Prometheus data source with URL http://127.0.0.1:$port and" \
     "import $root/dashboards/*.json"
exec prometheus --config.file "$dir/prometheus.yml" --storage.tsdb.path "$dir/tsdb" \
  --web.listen-address "127.0.0.1:$port" --log.level warn

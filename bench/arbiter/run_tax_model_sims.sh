#!/usr/bin/env bash
# Reproduces the tax-model report (bench/results/sim-<date>-tax-*.md and the summary
# bench/results/<date>-tax-model.md): every workload family under static, VAMP with the shipped
# defaults (cost model "tax") at several caps, and the paper's cost model, in vamp-sim.
# Deterministic; about two minutes on 2 cores. Usage: bench/arbiter/run_tax_model_sims.sh [DATE]
# To try settings without touching the committed reports: VAMP_SIM_OUT=/tmp/x (where the reports
# go) and VAMP_SIM_ARGS="--vamp_margin=0.5 ..." (added to every run).
set -euo pipefail
cd "$(dirname "$0")/../.."
date=${1:-$(date -u +%F)}
out=${VAMP_SIM_OUT:-bench/results}
source bench/arbiter/sim_suite.sh
# High reuse: the paper's Figure 9 sweep (H100 TP2, Qwen3-Next shapes) and its phased extension.
run fig9 "Tax model vs paper: Figure 9 multi-turn sweep, H100 TP2" --paper_figure9
run phased "Tax model vs paper: c = 28, then 6 sessions from t = 600 s" \
  --concurrency=28 --tail_sessions=6 --tail_start_s=600 --phase_split_s=600
# Mooncake synthetic trace at 4x, 2x, 1x, 1/2x, 1/3x and 1/4x its recorded rate (time scale
# 0.25 .. 4), on the paper's H100 TP2 setting and on one H200 with Qwen3-30B-A3B.
for ts in 0.25 0.5 1 2 3 4; do
  run "mooncake-h100-ts$ts" "Tax model vs paper: Mooncake trace, time scale $ts, H100 TP2" \
    --workload=mooncake --mooncake_time_scale=$ts
  run "mooncake-h200-30b-ts$ts" "Tax model vs paper: Mooncake trace, time scale $ts, H200 Qwen3-30B-A3B" \
    --workload=mooncake --mooncake_time_scale=$ts --calibration=qwen3-30b-a3b --max_model_len=65536
done
# The low-reuse family: three loads, three reuse distances.
for rate in 1 2 4; do
  for d in 20 200 2000; do
    run "lowreuse-r$rate-d$d" "Tax model vs paper: low-reuse family, $rate req/s, mean reuse distance $d" \
      --workload=low-reuse --low_reuse_rate=$rate --low_reuse_distance=$d
  done
done
# LMCache agent traces under KV pressure (1 GiB pool per GPU, sessions 1 s apart).
for t in miniswe magagent; do
  run "lmcache-$t" "Tax model vs paper: LMCache $t traces, 1 GiB KV pool, stagger 1 s" \
    --workload=lmcache --lmcache_dir=../shared/traces/lmcache-agent-trace/$t --kv_pool_gib=1 \
    --lmcache_stagger_s=1 --max_model_len=65536
done
# One H200 at this engine's measured speed (sim/calibrations/h200-vamp-engine.json, which predicts
# the GPU A/B within 25 %: bench/results/2026-12-02-sim-vs-gpu.md): the A/B's multi-turn shape in
# one wave, and in two (8 more sessions from t = 30 s). Not tuned on.
h200=(--calibration=qwen3-30b-a3b --calibration_file=sim/calibrations/h200-vamp-engine.json
      --kv_pool_gib=7.638 --turns=8 --first_turn_tokens=4096 --growth_tokens=2048
      --output_tokens=32 --think_time_s=0.5 --max_model_len=65536)
run h200-engine-one-wave "Tax model vs paper: GPU A/B multi-turn shape, one wave, H200 engine calibration" \
  "${h200[@]}" --concurrency=4,8,10,12
run h200-engine-two-waves "Tax model vs paper: GPU A/B multi-turn shape, a second wave of 8 sessions at 30 s, H200 engine calibration" \
  "${h200[@]}" --concurrency=8,10,12 --tail_sessions=8 --tail_start_s=30
# Alternating phases: multi-turn (high reuse), then low-reuse traffic from t = 300 s.
run mixed "Tax model vs paper: 20 multi-turn sessions, then low-reuse traffic from t = 300 s" \
  --concurrency=20 --turns=8 --mix_low_reuse --low_reuse_start_s=300 --low_reuse_requests=1200 \
  --low_reuse_rate=2 --phase_split_s=400
python3 bench/arbiter/summarize_tax_model.py "$date" "$out" > "$out/$date-tax-model-tables.md"
echo "wrote $out/sim-$date-tax-*.md and $out/$date-tax-model-tables.md" >&2

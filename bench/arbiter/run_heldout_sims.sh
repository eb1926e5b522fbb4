#!/usr/bin/env bash
# The held-out suite: workloads and loads that the tax model's defaults were NOT chosen on, to
# check a change to the arbiter against traffic it was not tuned on (the developers' guide:
# "prove decisions on workloads you did not tune on"). Same policies as run_tax_model_sims.sh
# (static, VAMP-10/15/25 with the shipped defaults, the paper's cost model at 15 and 25):
#   - the Figure 9 multi-turn shape at concurrencies the sweep skips (18, 22, 26, 32);
#   - the Mooncake trace at time scales between and beyond the suite's (1.5, 2.5, 6), on the
#     paper's H100 TP2 setting and on one H200 with Qwen3-30B-A3B;
#   - the low-reuse family at other rates and reuse distances (3/100, 8/50, 1.5/500);
#   - the LMCache traces at other pool sizes and staggers (miniswe 2 GiB / 2 s, magagent
#     0.75 GiB / 0.5 s);
#   - one H200 at this engine's measured speed with longer turns (6 turns, 6k tokens growing by
#     3k, 64 out, 1 s think time) at c = 6, 9, 14.
# Deterministic; about a minute on 2 cores. Usage: bench/arbiter/run_heldout_sims.sh [DATE]
# VAMP_SIM_OUT (default bench/results/<DATE>-heldout) and VAMP_SIM_ARGS as in
# run_tax_model_sims.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
date=${1:-$(date -u +%F)}
out=${VAMP_SIM_OUT:-bench/results/$date-heldout}
source bench/arbiter/sim_suite.sh
run fig9-odd "Held out: the Figure 9 shape at c = 18, 22, 26, 32, H100 TP2" \
  --paper_figure9 --concurrency=18,22,26,32
for ts in 1.5 2.5 6; do
  run "mooncake-h100-ts$ts" "Held out: Mooncake trace, time scale $ts, H100 TP2" \
    --workload=mooncake --mooncake_time_scale=$ts
  run "mooncake-h200-30b-ts$ts" "Held out: Mooncake trace, time scale $ts, H200 Qwen3-30B-A3B" \
    --workload=mooncake --mooncake_time_scale=$ts --calibration=qwen3-30b-a3b --max_model_len=65536
done
for rd in 3:100 8:50 1.5:500; do
  rate=${rd%:*} d=${rd#*:}
  run "lowreuse-r$rate-d$d" "Held out: low-reuse family, $rate req/s, mean reuse distance $d" \
    --workload=low-reuse --low_reuse_rate=$rate --low_reuse_distance=$d
done
run lmcache-miniswe-2g "Held out: LMCache miniswe traces, 2 GiB KV pool, stagger 2 s" \
  --workload=lmcache --lmcache_dir=../shared/traces/lmcache-agent-trace/miniswe --kv_pool_gib=2 \
  --lmcache_stagger_s=2 --max_model_len=65536
run lmcache-magagent-075g "Held out: LMCache magagent traces, 0.75 GiB KV pool, stagger 0.5 s" \
  --workload=lmcache --lmcache_dir=../shared/traces/lmcache-agent-trace/magagent \
  --kv_pool_gib=0.75 --lmcache_stagger_s=0.5 --max_model_len=65536
run h200-engine-long "Held out: H200 engine calibration, 6 turns of 6k tokens growing by 3k, 64 out" \
  --calibration=qwen3-30b-a3b --calibration_file=sim/calibrations/h200-vamp-engine.json \
  --kv_pool_gib=7.638 --max_model_len=65536 --turns=6 --first_turn_tokens=6144 \
  --growth_tokens=3072 --output_tokens=64 --think_time_s=1 --concurrency=6,9,14
python3 bench/arbiter/summarize_tax_model.py "$date" "$out" > "$out/$date-heldout-tables.md"
echo "wrote $out/sim-$date-tax-*.md and $out/$date-heldout-tables.md" >&2

#!/usr/bin/env bash
# Runs the engine-level GPU benchmarks on one GPU and writes OUT_DIR/report.md:
#   1. vamp_gpu_step_bench: decode and mixed step times of the bf16 engine (dummy Qwen3-30B-A3B)
#      at each offload ratio, the HBM decode floor and the staging floor (bandwidths measured in the
#      same process);
#   2. hf_step_baseline.py: HF transformers' decode step of the same model, batch and context, and
#      its forward of the same new prompt (the mixed step's other half);
#   3. the report: decode and mixed steps vs floor vs HF, and the staging table with the TPOT
#      overhead per ratio next to the paper's +31.1 % at VAMP-15.
#
# Usage: bench/engine/run_gpu_step_bench.sh BUNDLE_OR_BUILD_DIR OUT_DIR
#   BUNDLE_OR_BUILD_DIR: a deploy/bundle folder (bin/vamp_gpu_step_bench) or a build folder
#   (bench/engine/vamp_gpu_step_bench). Run from anywhere; the model config is this repository's
#   tests/data/qwen3-30b-a3b unless MODEL is set.
# Environment (defaults in brackets): MODEL [tests/data/qwen3-30b-a3b], BATCH [64], CONTEXT [2048],
#   PREFILL_TOKENS [2048], RATIOS [0,0.05,0.10,0.15,0.20,0.25], STEPS [20], WARMUP [3],
#   GPU_MEMORY_UTILIZATION [0.90], VAMP_ARGS (more flags for the binary), HF_ARGS (more flags for
#   the baseline), VAMP_TIMEOUT [360] and HF_TIMEOUT [210] seconds (together under the
#   device tool's 10-minute limit), SKIP_HF (1: no baseline).
# Either part may fail; the report then shows "-" for what is missing and the logs say why.
set -uo pipefail
if [[ $# -ne 2 || $1 == -h || $1 == --help ]]; then
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dir=$1
out=$2
mkdir -p "$out" || { echo "run_gpu_step_bench: cannot create '$out'" >&2; exit 2; }
out=$(cd "$out" && pwd)
rm -f "$out/vamp.json" "$out/hf.json"  # never report a previous run's results

bin=""
for candidate in "$dir/bin/vamp_gpu_step_bench" "$dir/bench/engine/vamp_gpu_step_bench" \
                 "$dir/vamp_gpu_step_bench"; do
  if [[ -x $candidate ]]; then bin=$candidate; break; fi
done
if [[ -z $bin ]]; then
  echo "run_gpu_step_bench: no vamp_gpu_step_bench in '$dir' (looked in bin/, bench/engine/, .)" >&2
  exit 2
fi
# cuBLAS and NCCL come from the host's CUDA installation (bundles leave them out).
for lib in /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d $lib ]] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done

model=${MODEL:-$repo/tests/data/qwen3-30b-a3b}
batch=${BATCH:-64}
context=${CONTEXT:-2048}
steps=${STEPS:-20}
warmup=${WARMUP:-3}
vamp_status=0
hf_status=skipped

echo "== vamp_gpu_step_bench ($bin)"
# shellcheck disable=SC2086  # VAMP_ARGS is a list of flags
timeout "${VAMP_TIMEOUT:-360}" "$bin" --model="$model" --batch="$batch" --context="$context" \
  --prefill_tokens="${PREFILL_TOKENS:-2048}" --ratios="${RATIOS:-0,0.05,0.10,0.15,0.20,0.25}" \
  --steps="$steps" --warmup="$warmup" \
  --gpu_memory_utilization="${GPU_MEMORY_UTILIZATION:-0.90}" --json="$out/vamp.json" \
  ${VAMP_ARGS:-} 2>&1 | tee "$out/vamp.log"
vamp_status=${PIPESTATUS[0]}
[[ $vamp_status -eq 0 ]] || echo "run_gpu_step_bench: vamp_gpu_step_bench exited $vamp_status" >&2

if [[ ${SKIP_HF:-0} != 1 ]]; then
  echo "== hf_step_baseline.py"
  # shellcheck disable=SC2086  # HF_ARGS is a list of flags
  timeout "${HF_TIMEOUT:-210}" python3 "$here/hf_step_baseline.py" --config="$model" \
    --batch="$batch" --context="$context" --prefill_tokens="${PREFILL_TOKENS:-2048}" \
    --steps="$steps" --warmup="$warmup" \
    --json="$out/hf.json" ${HF_ARGS:-} 2>&1 | tee "$out/hf.log"
  hf_status=${PIPESTATUS[0]}
  [[ $hf_status == 0 ]] || echo "run_gpu_step_bench: hf_step_baseline.py exited $hf_status" >&2
fi

python3 - "$out/vamp.json" "$out/hf.json" "$out/report.md" "$vamp_status" "$hf_status" <<'EOF'
"""Turns vamp.json and hf.json into report.md (either may be missing)."""
import json
import os
import sys

vamp_path, hf_path, report_path, vamp_status, hf_status = sys.argv[1:6]


def load(path):
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"report: cannot read {path}: {e}", file=sys.stderr)
        return None


def num(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


vamp = load(vamp_path)
hf = load(hf_path)
lines = ["# GPU engine step benchmarks", ""]
if vamp:
    d, w, m = vamp["device"], vamp["workload"], vamp["model"]
    lines += [
        f"- device: {d['name']}, {d['memory_bytes'] / 2**30:.0f} GiB; measured in the same run: "
        f"HBM {d['hbm_gbps']:.0f} GB/s (device copy of {d['hbm_copy_bytes'] / 2**30:.1f} GiB, "
        f"2 x bytes / time), pinned host->device {d['h2d_peak_gbps']:.1f} GB/s "
        "(" + ", ".join(f"{h['gbps']:.1f} GB/s at {h['bytes'] / 2**20:.0f} MiB"
                        for h in d["h2d_pinned"]) + ")",
        f"- model: {m['dir']} with dummy weights in bfloat16: {m['layers']} layers, "
        f"{m['experts']} experts top-{m['top_k']}, expert {m['expert_bytes'] / 2**20:.0f} MiB, "
        f"groups of {m['group_experts']}, {m['eligible_layers']} eligible layers; "
        f"non-expert weights {m['non_expert_weight_bytes'] / 2**30:.2f} GiB; loaded in "
        f"{m['load_seconds']:.0f} s",
        f"- workload: decode batch {w['batch']} at {w['context']} tokens of context; mixed steps "
        f"add a new {w['prefill_tokens']}-token prompt; {w['steps']} timed steps after "
        f"{w['warmup']} warm-up steps per point (p50 reported)",
        "",
    ]
else:
    lines += [f"vamp_gpu_step_bench produced no results (exit status {vamp_status}; see vamp.log).",
              ""]

# Decode step vs floor vs HF.
lines += ["## Decode step: floor and HF transformers", ""]
resident = None
if vamp:
    resident = next((p for p in vamp["points"] if p["mode"] == "decode" and p["groups"] == 0),
                    None)
floor = vamp["decode_floor"] if vamp else None
hf_best = hf.get("best") if hf else None
hf_ms = hf_best["step_ms_p50"] if hf_best else None
fwd = resident["forward_ms"]["p50"] if resident else None
step = resident["step_ms"]["p50"] if resident else None
lines += ["| | ms | vs floor | VAMP / HF |", "| --- | ---: | ---: | ---: |"]
if floor:
    lines.append(f"| floor: {floor['total_bytes'] / 2**30:.2f} GiB / HBM "
                 f"({floor['non_expert_bytes'] / 2**30:.2f} non-expert + "
                 f"{floor['expert_bytes'] / 2**30:.2f} experts + {floor['kv_bytes'] / 2**30:.2f} "
                 f"KV + {floor.get('state_bytes', 0) / 2**30:.2f} recurrent state) | "
                 f"{floor['ms']:.2f} | 1.00 | |")
lines.append(f"| VAMP forward (resident) | {num(fwd)} | {num(ratio(fwd, floor and floor['ms']))} | "
             f"{num(ratio(fwd, hf_ms))} |")
lines.append(f"| VAMP step incl. sampling and runner bookkeeping | {num(step)} | "
             f"{num(ratio(step, floor and floor['ms']))} | {num(ratio(step, hf_ms))} |")
if hf and "error" in hf:
    lines.append(f"| HF transformers failed: {hf['error'][:200]} | - | - | - |")
elif hf:
    for b in hf.get("backends", []):
        ms = b.get("step_ms", {}).get("p50")
        label = f"HF transformers {hf.get('transformers', '?')}, experts '{b['experts_implementation']}'"
        if "error" in b:
            lines.append(f"| {label}: {b['error'][:120]} | - | - | - |")
        else:
            lines.append(f"| {label} | {num(ms)} | {num(ratio(ms, floor and floor['ms']))} | |")
else:
    why = "skipped (SKIP_HF=1)" if hf_status == "skipped" else f"exit status {hf_status}; see hf.log"
    lines.append(f"| HF transformers: no result ({why}) | - | - | - |")
lines.append("")
if floor:
    lines.append(f"Floor estimate: {floor['estimate']}. VAMP / HF compares with HF's fastest "
                 "experts backend (forward plus greedy argmax on the GPU).")
if vamp:
    d = vamp["device"]
    lines.append(f"VAMP samples on the GPU, so no logits leave the device; copying the "
                 f"{d['logits_d2h_bytes'] / 2**20:.0f} MiB of float32 logits to the host for "
                 f"host-side sampling would add {d['logits_d2h_ms']:.2f} ms (measured alone).")
if hf and "context_used" in hf:
    if hf.get("context_used") != hf.get("context_requested"):
        lines.append(f"HF decoded at {hf.get('context_used')} tokens of context, not "
                     f"{hf.get('context_requested')}.")
    for n in hf.get("notes", []):
        lines.append(f"HF note: {n}.")
lines.append("")

# Mixed step vs HF: VAMP runs the decodes and the new prompt in one forward, HF in two.
mixed = None
if vamp:
    mixed = next((p for p in vamp["points"] if p["mode"] == "mixed" and p["groups"] == 0), None)
hf_mixed = [b for b in (hf or {}).get("backends", []) if "mixed_ms_sum" in b]
if mixed or hf_mixed:
    prompt = vamp["workload"]["prefill_tokens"] if vamp else hf.get("prefill_tokens")
    hf_best_mixed = (hf or {}).get("best_mixed", {}).get("mixed_ms_sum")
    mfwd = mixed["forward_ms"]["p50"] if mixed else None
    mstep = mixed["step_ms"]["p50"] if mixed else None
    lines += ["## Mixed step: the decode batch plus a new prompt, against HF transformers", "",
              f"VAMP runs the {num(vamp and vamp['workload']['batch'], '{}')} decodes and the new "
              f"{prompt}-token prompt in one forward. HF's model API cannot mix them in one "
              "forward, so its figure is its decode step plus its forward of the same prompt "
              "(empty cache, last position's logits, greedy argmax): the same tokens through the "
              "same model. Prompt tokens/s = prompt tokens / (mixed - decode) for VAMP, "
              "/ prompt forward for HF.", "",
              "| | decode ms | prompt ms | mixed ms | prompt tokens/s | VAMP / HF |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    if mixed and resident:
        extra = mfwd - fwd
        lines.append(f"| VAMP forward (resident) | {num(fwd)} | {num(extra)} (in the same forward) "
                     f"| {num(mfwd)} | {num(prompt / (extra / 1e3) if extra > 0 else None, '{:.0f}')} "
                     f"| {num(ratio(mfwd, hf_best_mixed))} |")
        lines.append(f"| VAMP step incl. sampling and runner bookkeeping | {num(step)} | | "
                     f"{num(mstep)} | | {num(ratio(mstep, hf_best_mixed))} |")
    for b in hf_mixed:
        pm = b["prompt_ms"]["p50"]
        lines.append(f"| HF transformers {hf.get('transformers', '?')}, experts "
                     f"'{b['experts_implementation']}' | {num(b['step_ms']['p50'])} | {num(pm)} | "
                     f"{num(b['mixed_ms_sum'])} | {num(prompt / (pm / 1e3), '{:.0f}')} | |")
    if hf and hf.get("linear_attention_kernels"):
        lines.append("")
        lines.append(f"HF's linear-attention kernels: {hf['linear_attention_kernels']}.")
    lines.append("")

# Staging.
if vamp:
    d = vamp["device"]
    paper = vamp.get("paper_tpot_overhead_pct_vamp15", 31.1)
    lines += [
        "## Expert staging: step time vs offloaded bytes", "",
        f"floor = max(resident forward of the same mode, staged bytes per step / "
        f"{d['h2d_peak_gbps']:.1f} GB/s pinned H2D). 'copies alone' replays the step's staging "
        "copies back to back with nothing else running. 'H2D reached' = staged bytes / forward "
        "time, a lower bound on the copy stream's bandwidth (close to it when copies dominate); "
        "target >= 90 % of the measured pinned bandwidth, step within 1.05x of the floor. "
        f"Paper: TPOT +{paper:.1f} % at VAMP-15 (Qwen3-Next-80B, TP2, H100).", "",
        "| mode | VAMP-r | offloaded / layer | MiB / layer | staged MiB / step | copies alone ms "
        "| forward ms | step ms | floor ms | forward / floor | H2D reached GB/s (% of measured) "
        "| TPOT overhead vs resident (forward / step) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in vamp["points"]:
        gbps = p["staging_gbps_lower_bound"]
        copy_ms = p["staged_bytes_per_step"] / (d["h2d_peak_gbps"] * 1e6)
        reached = "-" if gbps == 0 else f"{gbps:.1f} ({100 * gbps / d['h2d_peak_gbps']:.0f} %)"
        if gbps and copy_ms < p["floor_ms"]:
            reached += ", compute-bound"
        lines.append(
            f"| {p['mode']} | {p['ratio']:.2f} | {p['offloaded_experts_per_layer']} "
            f"({100 * p['offloaded_fraction']:.1f} %) | "
            f"{p['offloaded_bytes_per_layer'] / 2**20:.0f} | "
            f"{p['staged_bytes_per_step'] / 2**20:.0f} | {p['copies_alone_ms']:.2f} | "
            f"{p['forward_ms']['p50']:.2f} | {p['step_ms']['p50']:.2f} | {p['floor_ms']:.2f} | "
            f"{p['forward_over_floor']:.3f} | {reached} | "
            f"{p['forward_overhead_pct']:+.1f} % / {p['step_overhead_pct']:+.1f} % |")
    lines += ["", f"Paper reference: +{paper:.1f} % TPOT at VAMP-15.", ""]

text = "\n".join(lines) + "\n"
with open(report_path, "w") as f:
    f.write(text)
print(text)
EOF
report_status=$?
echo "run_gpu_step_bench: wrote $out/report.md (vamp $vamp_status, hf $hf_status)"
if [[ $vamp_status != 0 || ($hf_status != 0 && $hf_status != skipped) || $report_status != 0 ]]; then
  exit 1
fi

#!/usr/bin/env python3
"""The gated delta rule: VAMP's CUDA kernels (vamp_delta_rule_bench) next to HF's torch fallback.

Runs the vamp_delta_rule_bench binary (--json: one line per case on Qwen3-Next shapes, see its
header), then times transformers' torch_chunk_gated_delta_rule (the chunked form that HF's
Qwen3-Next runs without flash-linear-attention; from transformers.models.qwen3_next.
modeling_qwen3_next) on the same shapes on the GPU in float32:
  prefill   one sequence of the case's tokens, [1, T, value heads, dim] (q and k repeated to the
            value heads, as HF's layer does before the call), use_qk_l2norm_in_kernel=True,
            chunks of 64, a random initial state and output_final_state=True (as ours, which
            continues from a state and writes it back);
  mixed     HF has no varlen batch: the prompt alone through the chunked fallback plus the 64
            one-token decodes as one batch through torch_recurrent_gated_delta_rule (the calls HF
            makes for a prefill and a decode step);
  decode    torch_recurrent_gated_delta_rule on [64, 1, heads, dim].
Timing as in the binary: CUDA events, warm-up runs, median. GFLOP/s uses the binary's flop count
(the chunked form's useful work) for both sides, so the ratio is a time ratio: torch / ours time
(above 1: VAMP is faster).

Usage (on the GPU host, from the repository root):
  python3 bench/kernels/delta_rule_vs_torch.py build/release/bench/kernels/vamp_delta_rule_bench \\
      --out bench/results/delta-rule-vs-torch.md
torch and transformers are the only dependencies. Failures (binary, torch API) are listed and
leave "-" cells.
"""
import argparse
import inspect
import json
import sys
import time

from bench_binary import run_json_lines
from torch_timing import median_us


def run_ours(args):
    cmd = [args.binary, "--json", f"--iters={args.iters}", f"--warmup={args.warmup}",
           f"--k_heads={args.k_heads}", f"--v_heads={args.v_heads}", f"--k_dim={args.k_dim}",
           f"--v_dim={args.v_dim}"] + args.bench_args
    records, errors = run_json_lines(cmd, args.timeout)
    cases = []
    for r in records:
        if "error" in r:
            errors.append(f"{r.get('case')}: {r['error']}")
        else:
            cases.append(r)
    return cases, errors
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            errors.append(f"unparsable line: {line}")
            continue
        print(line, file=sys.stderr)
        if "error" in r:
            errors.append(f"{r.get('case')}: {r['error']}")
        else:
            cases.append(r)
    if proc.returncode != 0:
        errors.append(f"vamp_delta_rule_bench exited {proc.returncode}: "
                      f"{proc.stderr.strip()[-2000:]}")
    return cases, errors


def hf_functions(notes):
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    chunk, recurrent = m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule
    notes.append(f"torch_chunk_gated_delta_rule{inspect.signature(chunk)}")
    notes.append(f"torch_recurrent_gated_delta_rule{inspect.signature(recurrent)}")
    return chunk, recurrent


def hf_inputs(torch, batch, tokens, args, gen):
    """q, k (repeated to the value heads), v, g, beta and an initial state, float32 on the GPU."""
    f32 = torch.float32
    hv, hk = args.v_heads, args.k_heads
    q = torch.randn(batch, tokens, hk, args.k_dim, device="cuda", dtype=f32, generator=gen)
    k = torch.randn(batch, tokens, hk, args.k_dim, device="cuda", dtype=f32, generator=gen)
    q = q.repeat_interleave(hv // hk, dim=2)
    k = k.repeat_interleave(hv // hk, dim=2)
    v = torch.randn(batch, tokens, hv, args.v_dim, device="cuda", dtype=f32, generator=gen)
    g = -2 * torch.rand(batch, tokens, hv, device="cuda", dtype=f32, generator=gen)
    beta = torch.rand(batch, tokens, hv, device="cuda", dtype=f32, generator=gen)
    state = torch.rand(batch, hv, args.k_dim, args.v_dim, device="cuda", dtype=f32,
                       generator=gen) - 0.5
    return q, k, v, g, beta, state


def torch_time(torch, case, fns, args):
    """Median µs of HF's fallback on the case's shapes."""
    chunk_fn, recurrent_fn = fns
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    calls = []
    if case["kind"] in ("prefill", "mixed"):
        prompt = case["tokens"] - (case["seqs"] - 1)  # the mixed case's decodes are one token each
        q, k, v, g, beta, state = hf_inputs(torch, 1, prompt, args, gen)
        calls.append(lambda: chunk_fn(q, k, v, g=g, beta=beta, chunk_size=64,
                                      initial_state=state, output_final_state=True,
                                      use_qk_l2norm_in_kernel=True))
    decodes = {"mixed": case["seqs"] - 1, "decode": case["seqs"]}.get(case["kind"], 0)
    if decodes > 0:
        dq, dk, dv, dg, dbeta, dstate = hf_inputs(torch, decodes, 1, args, gen)
        calls.append(lambda: recurrent_fn(dq, dk, dv, g=dg, beta=dbeta, initial_state=dstate,
                                          output_final_state=True, use_qk_l2norm_in_kernel=True))

    def run():
        for c in calls:
            c()

    with torch.no_grad():
        run()
        return median_us(torch, run, args.warmup, args.iters)


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary", nargs="?",
                        default="build/release/bench/kernels/vamp_delta_rule_bench",
                        help="path of the vamp_delta_rule_bench binary")
    parser.add_argument("--out", default=None, help="write the markdown report here")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the binary")
    parser.add_argument("--bench-args", nargs=argparse.REMAINDER, default=[],
                        help="further flags passed to the binary (e.g. --cases=prefill)")
    # The binary's shapes (its defaults: Qwen3-Next); the torch side uses the same.
    parser.add_argument("--k-heads", type=int, default=16)
    parser.add_argument("--v-heads", type=int, default=32)
    parser.add_argument("--k-dim", type=int, default=128)
    parser.add_argument("--v-dim", type=int, default=128)
    args = parser.parse_args()
    began = time.time()

    cases, errors = run_ours(args)
    notes = []
    theirs, torch_info = {}, "torch not run"
    try:
        import torch
        import transformers

        torch_info = (f"torch {torch.__version__}, transformers {transformers.__version__}, "
                      f"CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
        fns = hf_functions(notes)
        for case in cases:
            try:
                theirs[case["case"]] = torch_time(torch, case, fns, args)
            except Exception as e:
                errors.append(f"torch {case['case']}: {type(e).__name__}: {e}")
            torch.cuda.empty_cache()
    except Exception as e:
        errors.append(f"torch: {type(e).__name__}: {e}")

    table = ["| case | tokens | sequences | ours ms | ours GFLOP/s | torch ms | torch GFLOP/s "
             "| torch / ours time |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cases:
        t_us = theirs.get(c["case"])
        t_ms = t_us and t_us / 1e3
        t_gflops = t_ms and c["flops"] / t_ms / 1e6
        ratio = t_ms and c["ms"] and t_ms / c["ms"]
        table.append(f"| {c['case']} | {c['tokens']} | {c['seqs']} | {fmt(c['ms'], 3)} "
                     f"| {fmt(c['gflops'])} | {fmt(t_ms, 3)} | {fmt(t_gflops)} "
                     f"| {fmt(ratio, 2)} |")
    report = "\n\n".join([
        "## Gated delta rule: VAMP vs HF's torch fallback (float32)",
        f"{torch_info}; heads: {args.k_heads} key / {args.v_heads} value, dims {args.k_dim} / "
        f"{args.v_dim}, chunks of 64; median of {args.iters} runs after {args.warmup} warm-up "
        f"runs. GFLOP/s: the chunked form's useful work (the binary's count) per time, for both "
        f"sides; decode cases count 3 k_dim x v_dim multiply-adds per token and head.",
        "\n".join(table),
        "### Notes\n\n" + ("\n".join(f"- {n}" for n in notes) or "(none)"),
        "### Problems\n\n" + ("\n".join(f"- {e}" for e in errors) or "(none)"),
        f"Total time {time.time() - began:.0f} s.",
    ])
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())

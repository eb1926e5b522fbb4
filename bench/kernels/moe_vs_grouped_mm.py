#!/usr/bin/env python3
"""One bf16 MoE layer: VAMP's expert-GEMM paths (vamp_moe_bench) next to torch._grouped_mm.

Runs the vamp_moe_bench binary (JSON lines), then times the same layer in PyTorch on the same GPU:
softmax top-k router with renormalisation, a stable sort of the (token, choice) pairs by expert,
gather, torch._grouped_mm for w13 ([E, 2*inter, hidden] stacked, passed transposed), SiLU-and-mul,
torch._grouped_mm for w2, and the weighted un-permutation. Same shapes, token counts, warm-up and
median over CUDA events as the binary. Prints markdown tables (whole layer, expert GEMMs alone)
with the ratios ours / torch (below 1: ours is faster) and writes them to --out when given.

Usage (on the GPU host, from the repository root):
  python3 bench/kernels/moe_vs_grouped_mm.py --bin build/release/bench/kernels/vamp_moe_bench \
      --out bench/results/moe-grouped-gemm.md
Torch is the only dependency. Failures (binary, torch API) are printed and leave "-" cells.
"""
import argparse
import json
import sys
import time

from bench_binary import run_json_lines
from torch_timing import median_us

SHAPES = {
    # name: (hidden, inter, experts, top_k), as in bench/kernels/moe_bench.cc
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "qwen3-next": (2048, 512, 512, 10),
}
OUR_PATHS = ["grouped", "grouped_fused", "cublas", "cublas_grouped", "grouped_fused_mma"]


def run_ours(args):
    cmd = [args.bin, f"--tokens={args.tokens}", f"--iters={args.iters}",
           f"--warmup={args.warmup}", f"--shapes={args.shapes}"]
    records, errors = run_json_lines(cmd, args.timeout, echo=sys.stdout)
    results = {}
    for r in records:
        if "error" in r:
            errors.append(f"{r['shape']} tokens {r['tokens']} {r['path']} {r['scope']}: {r['error']}")
            continue
        results[(r["shape"], r["tokens"], r["path"], r["scope"])] = r
    return results, errors
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            errors.append(f"unparsable line: {line}")
            continue
        print(line)
        if "error" in r:
            errors.append(f"{r['shape']} tokens {r['tokens']} {r['path']} {r['scope']}: {r['error']}")
            continue
        results[(r["shape"], r["tokens"], r["path"], r["scope"])] = r
    if proc.returncode != 0:
        errors.append(f"vamp_moe_bench exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return results, errors


def probe_grouped_mm(torch, errors):
    """Checks torch._grouped_mm on a small problem; returns how to lay out the weights."""
    doc = getattr(torch._grouped_mm, "__doc__", None)
    if doc:
        print("torch._grouped_mm doc:", " ".join(doc.split())[:600], file=sys.stderr)
    a = torch.randn(48, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3, 32, 64, device="cuda", dtype=torch.bfloat16)  # [E, n, k]
    offs = torch.tensor([16, 16, 48], device="cuda", dtype=torch.int32)
    want = torch.cat([a[:16].float() @ w[0].float().t(),
                      torch.zeros(0, 32, device="cuda"),
                      a[16:].float() @ w[2].float().t()])
    for layout in ("transposed", "contiguous"):
        b = w.transpose(-2, -1) if layout == "transposed" else w.transpose(-2, -1).contiguous()
        try:
            got = torch._grouped_mm(a, b, offs=offs).float()
            err = (got - want).abs().max().item()
            print(f"torch._grouped_mm probe ({layout} [E, k, n] weights): max |err| {err:.3g}",
                  file=sys.stderr)
            if err < 0.5:
                return layout
            errors.append(f"torch._grouped_mm probe ({layout}): max |err| {err:.3g}")
        except Exception as e:  # report and try the other layout
            errors.append(f"torch._grouped_mm probe ({layout}) failed: {type(e).__name__}: {e}")
    return None


def torch_layer_times(torch, name, token_counts, args, layout, errors):
    import torch.nn.functional as F

    hidden, inter, experts, top_k = SHAPES[name]
    bf16 = torch.bfloat16
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    w13 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=bf16, generator=gen).mul_(0.02)
    w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=bf16, generator=gen).mul_(0.02)
    b13, b2 = w13.transpose(-2, -1), w2.transpose(-2, -1)  # [E, k, n] views, as F.linear
    if layout == "contiguous":
        b13, b2 = b13.contiguous(), b2.contiguous()
        del w13, w2
    out = {}
    for tokens in token_counts:
        x = torch.randn(tokens, hidden, device="cuda", dtype=bf16, generator=gen)
        logits = torch.randn(tokens, experts, device="cuda", dtype=torch.float32, generator=gen)
        ones = torch.ones(tokens * top_k, device="cuda", dtype=torch.int32)

        def route():
            probs = torch.softmax(logits, dim=-1)
            topw, topi = torch.topk(probs, top_k, dim=-1)
            topw = topw / topw.sum(dim=-1, keepdim=True)
            flat = topi.flatten()
            order = torch.argsort(flat, stable=True)  # row -> pair
            # Counts without bincount (which synchronises to size its output).
            counts = torch.zeros(experts, device="cuda", dtype=torch.int32).index_add_(0, flat, ones)
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            return topw, order, offs

        def gemms(xs, offs):
            h = torch._grouped_mm(xs, b13, offs=offs)
            act = F.silu(h[:, :inter]) * h[:, inter:]
            return torch._grouped_mm(act, b2, offs=offs)

        def layer():
            topw, order, offs = route()
            y = gemms(x.index_select(0, order // top_k), offs)
            per_pair = torch.empty_like(y).index_copy_(0, order, y)
            return (per_pair.view(tokens, top_k, hidden).float() * topw.unsqueeze(-1)).sum(1).to(bf16)

        try:
            _, order, offs = route()
            xs = x.index_select(0, order // top_k)
            out[(name, tokens, "layer")] = median_us(torch, layer, args.warmup, args.iters)
            out[(name, tokens, "gemms")] = median_us(torch, lambda: gemms(xs, offs), args.warmup,
                                                     args.iters)
        except Exception as e:
            errors.append(f"torch {name} tokens {tokens}: {type(e).__name__}: {e}")
    return out


def fmt(v):
    return "-" if v is None else f"{v:.1f}"


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def table(scope, ours, theirs, shapes, token_counts):
    title = "whole MoE layer" if scope == "layer" else "expert GEMMs alone (w13, SiLU-and-mul, w2)"
    lines = [f"### {title}, median µs", "",
             "| shape | tokens | torch._grouped_mm | grouped | grouped_fused | cublas | cublas_grouped "
             "| fused, mma.sync only "
             "| grouped / torch | fused / torch | fused TFLOP/s | fused / mma.sync |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in shapes:
        for tokens in token_counts:
            t = theirs.get((name, tokens, scope))
            us = {p: ours.get((name, tokens, p, scope), {}).get("us") for p in OUR_PATHS}
            g = ours.get((name, tokens, "grouped_fused", scope), {})
            lines.append(
                f"| {name} | {tokens} | {fmt(t)} | {fmt(us['grouped'])} | {fmt(us['grouped_fused'])} "
                f"| {fmt(us['cublas'])} | {fmt(us['cublas_grouped'])} "
                f"| {fmt(us['grouped_fused_mma'])} | {ratio(us['grouped'], t)} "
                f"| {ratio(us['grouped_fused'], t)} | {fmt(g.get('tflops'))} "
                f"| {ratio(us['grouped_fused'], us['grouped_fused_mma'])} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default="build/release/bench/kernels/vamp_moe_bench",
                        help="path of the vamp_moe_bench binary")
    parser.add_argument("--tokens", default="16,128,1024,8192")
    parser.add_argument("--shapes", default="all", choices=["all"] + list(SHAPES))
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the binary")
    parser.add_argument("--out", default=None, help="write the markdown report here")
    args = parser.parse_args()
    token_counts = [int(t) for t in args.tokens.split(",")]
    shapes = list(SHAPES) if args.shapes == "all" else [args.shapes]
    began = time.time()

    ours, errors = run_ours(args)
    theirs, torch_info = {}, "torch not run"
    try:
        import torch

        torch_info = (f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                      f"{torch.cuda.get_device_name(0)}")
        layout = probe_grouped_mm(torch, errors)
        if layout is None:
            errors.append("torch._grouped_mm unusable: no torch column")
        else:
            for name in shapes:
                theirs.update(torch_layer_times(torch, name, token_counts, args, layout, errors))
                torch.cuda.empty_cache()
    except Exception as e:
        errors.append(f"torch: {type(e).__name__}: {e}")

    checks = [f"- {k[0]} tokens {k[1]} {k[2]}: max |out - cublas out| = "
              f"{r['max_abs_diff_vs_cublas']:.3g} (max |out| {r['max_abs_out']:.3g})"
              for k, r in sorted(ours.items()) if "max_abs_diff_vs_cublas" in r]
    report = "\n\n".join([
        "## MoE layer: VAMP expert-GEMM paths vs torch._grouped_mm (bf16)",
        f"{torch_info}; median of {args.iters} runs after {args.warmup} warm-up runs; "
        f"ratios below 1 mean VAMP is faster. grouped = cuda::GroupedExpertGemm (device offsets, "
        f"no host sync), grouped_fused = w13 with SiLU-and-mul fused (wgmma on Hopper above 32 rows "
        f"per expert; 'mma.sync only' = the same on the earlier tiles), cublas = per-expert cuBLAS "
        f"after copying the offsets to the host (stream sync), cublas_grouped = "
        f"cublasGemmGroupedBatchedEx (host offsets too). TFLOP/s count the expert GEMMs "
        f"(6 x rows x hidden x inter).",
        table("layer", ours, theirs, shapes, token_counts),
        table("gemms", ours, theirs, shapes, token_counts),
        "### Output agreement with the cublas path\n\n" + ("\n".join(checks) or "(none)"),
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

#!/usr/bin/env python3
"""bf16 paged attention: VAMP's kernels (vamp_attention_bench) next to PyTorch SDPA.

Runs the vamp_attention_bench binary (JSON lines: the device's copy bandwidth, then decode and
prefill cases on Qwen3-30B-A3B shapes with shuffled block tables), then times
torch.nn.functional.scaled_dot_product_attention on the same shapes with contiguous, non-paged
K/V (bf16, [batch, heads, tokens, head_dim]):
  decode              one query row per sequence attending to the whole context (no mask);
  prefill, no prefix  is_causal=True;
  prefill after a cached prefix
                      the bottom-right aligned causal mask torch.nn.attention.bias.causal_lower_right
                      (flash-attn's convention: query row r sees keys [0, prefix + r]).
SDPA runs under sdpa_kernel(SDPBackend.FLASH_ATTENTION) with enable_gqa=True; when that is
rejected, K/V heads are expanded to the query heads, then the efficient, cuDNN and math backends
are tried in turn; the table names the backend that ran. Timing as in the binary: CUDA events,
warm-up runs, median. Throughput uses the binary's flop and byte counts for both sides, so the
ratio is a time ratio: ours / SDPA throughput (above 1: VAMP is faster). Decode is also reported
as a fraction of the measured copy bandwidth.

Usage (on the GPU host, from the repository root):
  python3 bench/kernels/attention_vs_sdpa.py build/release/bench/kernels/vamp_attention_bench \\
      --out bench/results/attention-vs-sdpa.md
Torch is the only dependency. Failures (binary, torch API) are listed and leave "-" cells.
"""
import argparse
import sys
import time

from bench_binary import run_json_lines
from torch_timing import median_us


def run_ours(args):
    cmd = [args.binary, f"--iters={args.iters}", f"--warmup={args.warmup}"] + args.bench_args
    records, errors = run_json_lines(cmd, args.timeout)
    hbm, cases = None, []
    for r in records:
        if "error" in r:
            errors.append(f"{r.get('case')}: {r['error']}")
        elif r.get("kind") == "hbm":
            hbm = r
        else:
            cases.append(r)
    return hbm, cases, errors


def sdpa_time(torch, case, args, notes):
    """Median µs of SDPA on the case's shapes and the backend that ran (None, None on failure)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, q_len, ctx = case["batch"], case["q_len"], case["ctx"]
    prefix = ctx - q_len
    hq, hkv, hd = args.q_heads, args.kv_heads, args.head_dim
    bf16 = torch.bfloat16
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    q = torch.randn(batch, hq, q_len, hd, device="cuda", dtype=bf16, generator=gen)
    k = torch.randn(batch, hkv, ctx, hd, device="cuda", dtype=bf16, generator=gen)
    v = torch.randn(batch, hkv, ctx, hd, device="cuda", dtype=bf16, generator=gen)
    mask, is_causal, mask_name = None, False, "none"
    if case["kind"] == "prefill":
        if prefix == 0:
            is_causal, mask_name = True, "is_causal"
        else:
            from torch.nn.attention.bias import causal_lower_right
            mask, mask_name = causal_lower_right(q_len, ctx), "causal_lower_right"

    def call(kk, vv, gqa):
        extra = {"enable_gqa": True} if gqa else {}
        return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=is_causal,
                                              **extra)

    backends = [("flash", SDPBackend.FLASH_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    backends.append(("math", SDPBackend.MATH))
    expanded = None
    failures = []
    for name, backend in backends:
        if name == "math" and batch * hq * q_len * ctx * 4 > 8 << 30:
            failures.append("math: score matrix too large, skipped")
            continue
        for gqa in (True, False):
            if not gqa:
                if expanded is None:
                    bytes_needed = 2 * batch * hq * ctx * hd * 2
                    if bytes_needed > args.max_expand_gib * (1 << 30):
                        failures.append(f"{name}: expanding K/V would take "
                                        f"{bytes_needed / (1 << 30):.0f} GiB, skipped")
                        continue
                    expanded = (k.repeat_interleave(hq // hkv, dim=1),
                                v.repeat_interleave(hq // hkv, dim=1))
                kk, vv = expanded
            else:
                kk, vv = k, v
            try:
                with sdpa_kernel(backend):
                    call(kk, vv, gqa)
                    us = median_us(torch, lambda: call(kk, vv, gqa), args.warmup, args.iters)
                label = f"{name}, {'enable_gqa' if gqa else 'K/V expanded'}, mask {mask_name}"
                if failures:
                    notes.append(f"{case['case']}: SDPA fell back to {label} after: "
                                 + "; ".join(failures))
                return us, label
            except Exception as e:  # try the next combination
                failures.append(f"{name} ({'gqa' if gqa else 'expanded'}): "
                                f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    notes.append(f"{case['case']}: no SDPA backend ran: " + "; ".join(failures))
    return None, None


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary", nargs="?",
                        default="build/release/bench/kernels/vamp_attention_bench",
                        help="path of the vamp_attention_bench binary")
    parser.add_argument("--out", default=None, help="write the markdown report here")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the binary")
    parser.add_argument("--max-expand-gib", type=float, default=24,
                        help="largest K+V expansion to query heads tried when GQA is rejected")
    parser.add_argument("--bench-args", nargs=argparse.REMAINDER, default=[],
                        help="further flags passed to the binary (e.g. --cases=decode)")
    # The binary's head configuration (its defaults); the SDPA side uses the same.
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    began = time.time()

    hbm, cases, errors = run_ours(args)
    notes = []
    theirs, torch_info = {}, "torch not run"
    try:
        import torch

        torch_info = (f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                      f"{torch.cuda.get_device_name(0)}")
        for case in cases:
            try:
                theirs[case["case"]] = sdpa_time(torch, case, args, notes)
            except Exception as e:
                errors.append(f"torch {case['case']}: {type(e).__name__}: {e}")
            torch.cuda.empty_cache()
    except Exception as e:
        errors.append(f"torch: {type(e).__name__}: {e}")

    hbm_gbps = hbm["gbps"] if hbm else None
    decode = ["### Decode (one query row per sequence), median µs", "",
              "| case | batch | context | ours µs | ours GB/s | ours / copy bandwidth | kernel, splits "
              "| SDPA µs | SDPA GB/s | SDPA / copy bandwidth | SDPA backend | ours / SDPA throughput |",
              "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|"]
    prefill = ["### Prefill (one chunk after a cached prefix), median µs", "",
               "| case | chunk | prefix | ours µs | ours TFLOP/s | kernel | SDPA µs | SDPA TFLOP/s "
               "| SDPA backend | ours / SDPA throughput |",
               "|---|---:|---:|---:|---:|---|---:|---:|---|---:|"]
    for c in cases:
        t_us, backend = theirs.get(c["case"], (None, None))
        ratio = c["us"] and t_us and t_us / c["us"]
        if c["kind"] == "decode":
            t_gbps = t_us and c["bytes"] / t_us / 1e3
            decode.append(
                f"| {c['case']} | {c['batch']} | {c['ctx']} | {fmt(c['us'])} | {fmt(c['gbps'])} "
                f"| {fmt(c['hbm_fraction'], 3)} | {c.get('kernel')}, {c.get('splits')} "
                f"| {fmt(t_us)} | {fmt(t_gbps)} "
                f"| {fmt(t_gbps and hbm_gbps and t_gbps / hbm_gbps, 3)} | {backend or '-'} "
                f"| {fmt(ratio, 2)} |")
        else:
            t_tflops = t_us and c["flops"] / t_us / 1e6
            prefill.append(
                f"| {c['case']} | {c['q_len']} | {c['ctx'] - c['q_len']} | {fmt(c['us'])} "
                f"| {fmt(c['tflops'])} | {c.get('kernel')} | {fmt(t_us)} | {fmt(t_tflops)} "
                f"| {backend or '-'} | {fmt(ratio, 2)} |")
    report = "\n\n".join([
        "## bf16 paged attention: VAMP vs torch SDPA",
        f"{torch_info}; heads: {args.q_heads} query / {args.kv_heads} KV, head_dim "
        f"{args.head_dim}; median of {args.iters} runs after {args.warmup} warm-up runs. Ours "
        f"reads a paged cache (blocks of 16 tokens, shuffled block tables); SDPA reads contiguous "
        f"K/V. Device copy bandwidth (1 GiB device-to-device cudaMemcpy, read + written): "
        f"{fmt(hbm_gbps)} GB/s. Decode bytes = K/V read + q + out; prefill FLOPs = 4 x heads x "
        f"head_dim x visible keys (causal). Targets: decode >= 0.70 of the copy bandwidth on long "
        f"contexts; prefill >= 0.50 of SDPA (flash) throughput.",
        "\n".join(decode),
        "\n".join(prefill),
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

#!/usr/bin/env python3
"""HF transformers baseline of vamp_gpu_step_bench: the decode and mixed steps of the same model.

Builds Qwen3MoeForCausalLM or Qwen3NextForCausalLM from a config.json (no checkpoint, no hub access:
random weights, made in bfloat16 directly on the GPU), fills a KV cache of `--batch` sequences x
`--context` tokens by running the decoder over random tokens (in chunks, without the LM head), then
times, once per experts backend the installed transformers offers (transformers 5: "eager",
"grouped_mm", "batched_mm"; older versions have one built-in MoE loop, reported as "default"):
  - decode steps: `model(input_ids=next_tokens, past_key_values=cache)` for the whole batch followed
    by the greedy argmax on the GPU (the next step's input);
  - with --prefill_tokens P > 0, prompt forwards: one new P-token prompt from an empty cache, the
    logits of its last position only, and the greedy argmax of its first token.
torch.cuda.synchronize brackets each timed call; the medians of --steps (decode) and --prompt_steps
(prompt) timed calls after untimed ones are reported. vamp_gpu_step_bench's mixed step runs the
decode batch and the new prompt in one forward; HF's model API has no such step (the rows of one
forward share a length), so its mixed figure is the sum of the two medians: the same tokens
through the same model. The cache is cropped back to `context` before each backend when the cache
supports it, so every backend decodes at the same context.

If the prefill runs out of memory the context is halved until it fits; the JSON says which context
was used. For Qwen3-Next the JSON also says whether transformers found its fast linear-attention
kernels (fla's delta rule, causal-conv1d) or runs its torch fallbacks.

Usage (on the GPU host, from the repository root):
  python3 bench/engine/hf_step_baseline.py --config tests/data/qwen3-30b-a3b \
      --batch 64 --context 2048 --prefill_tokens 2048 --json /tmp/hf.json
Only torch and transformers are needed. Prints one JSON object (also written to --json).
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="tests/data/qwen3-30b-a3b",
                   help="model directory with config.json, or the file itself")
    p.add_argument("--batch", type=int, default=64, help="decoding sequences")
    p.add_argument("--context", type=int, default=2048, help="tokens of context per sequence")
    p.add_argument("--prefill_tokens", type=int, default=0,
                   help="tokens of the new prompt timed for the mixed step (0: decode only)")
    p.add_argument("--steps", type=int, default=20, help="timed decode steps per backend")
    p.add_argument("--warmup", type=int, default=3, help="untimed decode steps per backend")
    p.add_argument("--prompt_steps", type=int, default=5,
                   help="timed prompt forwards per backend (after one untimed)")
    p.add_argument("--prefill_chunk_tokens", type=int, default=16384,
                   help="tokens (batch x chunk length) per prefill forward")
    p.add_argument("--experts_impls", default="auto",
                   help="comma-separated experts backends to time (transformers 5), or 'auto': "
                        "every one of eager, grouped_mm, batched_mm that the model accepts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="also write the result to this file")
    args = p.parse_args()
    for name in ("batch", "context", "steps", "prompt_steps", "prefill_chunk_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.prefill_tokens < 0:
        p.error("--prefill_tokens must be >= 0")
    return args


def fail(result, args, message):
    result["error"] = message
    emit(result, args)
    sys.exit(1)


def emit(result, args):
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


def build_model(torch, transformers, config_path):
    """The model in bf16 on the GPU, random weights, SDPA attention."""
    path = config_path if os.path.isdir(config_path) else os.path.dirname(config_path)
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    if getattr(config, "model_type", "") not in ("qwen3_moe", "qwen3_next"):
        raise ValueError(f"{path}: model_type {getattr(config, 'model_type', None)!r}, "
                         "expected 'qwen3_moe' or 'qwen3_next'")
    config._attn_implementation = "sdpa"
    config.output_router_logits = False
    config.use_cache = True
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            try:
                model = transformers.AutoModelForCausalLM.from_config(
                    config, attn_implementation="sdpa")
            except TypeError:  # older from_config without attn_implementation
                model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    return model, config


def expert_backends(model, requested):
    """(name, setter) pairs; setter None = the model's only (built-in) MoE path."""
    setter = getattr(model, "set_experts_implementation", None)
    if setter is None:
        return [("default", None)]
    names = ["eager", "grouped_mm", "batched_mm"] if requested == "auto" else [
        n.strip() for n in requested.split(",") if n.strip()]
    return [(n, setter) for n in names]


def prefill(torch, model, tokens, chunk_len):
    """Runs the decoder (no LM head) over `tokens` [B, L] in chunks; returns the KV cache."""
    cache = None
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    for start in range(0, tokens.shape[1], chunk_len):
        out = base(input_ids=tokens[:, start:start + chunk_len], past_key_values=cache,
                   use_cache=True)
        cache = out.past_key_values
        del out
    torch.cuda.synchronize()
    return cache


def cache_length(cache):
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    return int(cache[0][0].shape[-2])


def time_decode(torch, model, cache, next_tokens, warmup, steps):
    """Milliseconds per decode step (forward + greedy argmax), one value per timed step."""
    times = []
    for s in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=next_tokens, past_key_values=cache, use_cache=True)
        next_tokens = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        cache = out.past_key_values
        torch.cuda.synchronize()
        if s >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        del out
    return times, cache


def time_prompt(torch, model, vocab_size, prompt_tokens, steps):
    """Milliseconds per prompt forward (empty cache, last position's logits, greedy argmax), one
    value per timed call after one untimed call; and whether only the last position's logits were
    computed."""
    times = []
    keep = {"logits_to_keep": 1}
    for s in range(1 + steps):
        tokens = torch.randint(0, vocab_size, (1, prompt_tokens), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            out = model(input_ids=tokens, use_cache=True, **keep)
        except TypeError:  # no logits_to_keep in this transformers: every position's logits
            keep = {}
            out = model(input_ids=tokens, use_cache=True)
        first = out.logits[:, -1, :].argmax(dim=-1)
        torch.cuda.synchronize()
        if s >= 1:
            times.append((time.perf_counter() - t0) * 1e3)
        del out, first
    return times, bool(keep)


def linear_attention_kernels(transformers, config):
    """For Qwen3-Next: which of its fast kernels transformers finds (fla's delta rule,
    causal-conv1d) and so whether it runs them or its torch fallbacks; None for other models."""
    if getattr(config, "model_type", "") != "qwen3_next":
        return None
    utils = getattr(transformers.utils, "import_utils", None)
    found = {}
    for package, probe in (("flash-linear-attention", "is_flash_linear_attention_available"),
                           ("causal-conv1d", "is_causal_conv1d_available")):
        check = getattr(utils, probe, None)
        found[package] = bool(check()) if check is not None else None
    if all(v is None for v in found.values()):
        return "unknown (this transformers has no availability probes)"
    words = {True: "installed", False: "not installed, torch fallback", None: "unknown"}
    return ", ".join(f"{k}: {words[v]}" for k, v in found.items())


def main():
    args = parse_args()
    result = {"bench": "hf_step_baseline", "config": args.config, "batch": args.batch,
              "context_requested": args.context, "prefill_tokens": args.prefill_tokens,
              "steps": args.steps, "warmup": args.warmup, "prompt_steps": args.prompt_steps}
    try:
        import torch
        import transformers
    except ImportError as e:
        fail(result, args, f"needs torch and transformers: {e}")
    result["torch"] = torch.__version__
    result["transformers"] = transformers.__version__
    if not torch.cuda.is_available():
        fail(result, args, "no CUDA device")
    result["device"] = torch.cuda.get_device_name(0)
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    try:
        model, config = build_model(torch, transformers, args.config)
    except Exception as e:  # report whatever the installed transformers says
        fail(result, args, f"building the model failed: {type(e).__name__}: {e}")
    torch.cuda.synchronize()
    result["build_seconds"] = round(time.perf_counter() - t0, 1)
    result["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    kernels = linear_attention_kernels(transformers, config)
    if kernels is not None:
        result["linear_attention_kernels"] = kernels
    print(f"hf: built {type(model).__name__} ({result['weight_bytes'] / 2**30:.1f} GiB bf16) in "
          f"{result['build_seconds']} s", file=sys.stderr)

    notes = []
    context = args.context
    cache = None
    with torch.inference_mode():
        while True:
            tokens = torch.randint(0, config.vocab_size, (args.batch, context), device="cuda")
            chunk_len = max(1, args.prefill_chunk_tokens // args.batch)
            try:
                t0 = time.perf_counter()
                cache = prefill(torch, model, tokens, chunk_len)
                result["prefill_seconds"] = round(time.perf_counter() - t0, 1)
                break
            except torch.cuda.OutOfMemoryError:
                cache = None
                torch.cuda.empty_cache()
                if context <= 16:
                    fail(result, args, "prefill ran out of memory even at 16 tokens of context")
                notes.append(f"prefill of {args.batch} x {context} tokens ran out of memory; "
                             f"halved the context")
                context //= 2
        result["context_used"] = context
        print(f"hf: prefilled {args.batch} x {context} tokens in {result['prefill_seconds']} s",
              file=sys.stderr)

        backends = []
        next_tokens = torch.randint(0, config.vocab_size, (args.batch, 1), device="cuda")
        for name, setter in expert_backends(model, args.experts_impls):
            entry = {"experts_implementation": name}
            try:
                if setter is not None:
                    setter(name)
                if backends:
                    # Qwen3-Next's hybrid cache refuses crop (its linear-attention state cannot be
                    # rolled back); the context then grows by the earlier backends' steps.
                    try:
                        cache.crop(context)
                    except (AttributeError, RuntimeError, NotImplementedError):
                        notes.append("the cache cannot be cropped: later backends decode at a "
                                     "longer context")
                entry["context_at_start"] = cache_length(cache)
                times, cache = time_decode(torch, model, cache, next_tokens, args.warmup,
                                           args.steps)
                entry["step_ms"] = {"p50": statistics.median(times), "mean": statistics.mean(times),
                                    "min": min(times)}
                print(f"hf: {name}: decode step p50 {entry['step_ms']['p50']:.2f} ms",
                      file=sys.stderr)
                if args.prefill_tokens > 0:
                    times, last_only = time_prompt(torch, model, config.vocab_size,
                                                   args.prefill_tokens, args.prompt_steps)
                    entry["prompt_ms"] = {"p50": statistics.median(times),
                                          "mean": statistics.mean(times), "min": min(times)}
                    entry["prompt_logits"] = "last position" if last_only else "every position"
                    entry["mixed_ms_sum"] = entry["step_ms"]["p50"] + entry["prompt_ms"]["p50"]
                    print(f"hf: {name}: {args.prefill_tokens}-token prompt p50 "
                          f"{entry['prompt_ms']['p50']:.2f} ms; decode + prompt "
                          f"{entry['mixed_ms_sum']:.2f} ms", file=sys.stderr)
            except Exception as e:  # one backend failing must not hide the others
                entry["error"] = f"{type(e).__name__}: {e}"
                print(f"hf: {name}: {entry['error']}", file=sys.stderr)
                torch.cuda.empty_cache()
            backends.append(entry)
    result["backends"] = backends
    timed = [b for b in backends if "step_ms" in b]
    if not timed:
        fail(result, args, "no experts backend could be timed")
    best = min(timed, key=lambda b: b["step_ms"]["p50"])
    result["best"] = {"experts_implementation": best["experts_implementation"],
                      "step_ms_p50": best["step_ms"]["p50"]}
    mixed = [b for b in timed if "mixed_ms_sum" in b]
    if mixed:
        best_mixed = min(mixed, key=lambda b: b["mixed_ms_sum"])
        result["best_mixed"] = {"experts_implementation": best_mixed["experts_implementation"],
                                "mixed_ms_sum": best_mixed["mixed_ms_sum"],
                                "prompt_ms_p50": best_mixed["prompt_ms"]["p50"]}
    result["notes"] = notes
    emit(result, args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Records HF transformers' bfloat16 logits for a tiny checkpoint's golden prompts.

The GPU engine computes in bfloat16 by default. Against the float32 goldens its logits move by
bf16 rounding, and on the tiny checkpoint (weights of std 0.15, chosen to separate routing
decisions) a rounding can flip an expert choice, which moves a position's logits a lot. How much
is inherent to bfloat16 is what HF itself shows when it runs the same checkpoint in bfloat16: this
script records those logits (every prompt position) and HF's own deviation from the float32
goldens, so the GPU test can hold the engine to "no worse than the reference implementation".

  tiny-<model>-goldens-bf16.safetensors  logits_<i> [len(prompt_i), vocab], bf16 values as f32
  tiny-<model>-goldens-bf16.json         device, versions, and HF-bf16 vs float32 goldens:
                                         worst scaled error and argmax agreement

<model> is qwen3-moe (checkpoint tiny-qwen3-moe-fused) or qwen3-next (tiny-qwen3-next, whose
Gated DeltaNet layers HF runs with its torch implementations when the fla kernels are absent).

Run on the GPU host (torch + transformers, a CUDA device):
  python3 tests/data/make_tiny_bf16_goldens.py --out tests/data [--model qwen3-next]
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def scaled_error(got, want):
    """max |got - want| / max(1, max |want|) per position, then the worst position."""
    err = (got - want).abs().amax(dim=-1)
    rng = want.abs().amax(dim=-1).clamp(min=1.0)
    return float((err / rng).max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--model", choices=["qwen3-moe", "qwen3-next"], default="qwen3-moe")
    ap.add_argument("--checkpoint", default="",
                    help="default: tiny-qwen3-moe-fused or tiny-qwen3-next next to this script")
    args = ap.parse_args()
    stem = f"tiny-{args.model}-goldens"
    checkpoint = args.checkpoint or os.path.join(
        HERE, "tiny-qwen3-moe-fused" if args.model == "qwen3-moe" else "tiny-qwen3-next")
    if not torch.cuda.is_available():
        raise SystemExit("make_tiny_bf16_goldens: needs a CUDA device")
    with open(os.path.join(HERE, f"{stem}.json")) as f:
        prompts = json.load(f)["prompts"]
    f32 = load_file(os.path.join(HERE, f"{stem}.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.bfloat16).to("cuda").eval()
    out, worst, agree, total = {}, 0.0, 0, 0
    with torch.no_grad():
        for i, p in enumerate(prompts):
            logits = model(torch.tensor([p], device="cuda")).logits[0].float().cpu()
            want = f32[f"logits_{i}"]
            out[f"logits_{i}"] = logits.contiguous()
            worst = max(worst, scaled_error(logits, want))
            agree += int((logits.argmax(-1) == want.argmax(-1)).sum())
            total += want.shape[0]
    save_file(out, os.path.join(args.out, f"{stem}-bf16.safetensors"))
    summary = {
        "description": f"HF transformers bfloat16 logits of {os.path.basename(checkpoint)}'s "
                       "golden prompts "
                       "(full-prompt forward, every position) and their deviation from the "
                       "float32 goldens",
        "device": torch.cuda.get_device_name(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "hf_bf16_worst_scaled_error": worst,
        "hf_bf16_argmax_agreement": agree / total,
        "positions": total,
    }
    with open(os.path.join(args.out, f"{stem}-bf16.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

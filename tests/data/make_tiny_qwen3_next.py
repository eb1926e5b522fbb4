#!/usr/bin/env python3
"""Makes the tiny qwen3_next checkpoint and the golden outputs the CPU engine is tested against.

HF transformers is the reference implementation: this script builds a Qwen3NextForCausalLM with
random weights (fixed seed), saves its config as transformers writes it and its weights in the
per-expert layout of the released checkpoints, and records logits and greedy continuations that
transformers computes in float32 on the CPU, with its pure-torch Gated DeltaNet path (the chunked
delta rule for every forward pass here: each call runs a whole sequence without a cache).

  tiny-qwen3-next/                     config.json (transformers' serialisation) + model.safetensors
  tiny-qwen3-next-goldens.json         prompts, greedy continuations, versions, cross-checks
  tiny-qwen3-next-goldens.safetensors  logits_<i> [len(prompt_i), vocab] float32, all positions

The C++ test reading them is Qwen3NextTest.LogitsAndGreedyContinuationsMatchHfTransformersGoldens
(tests/engine/model/qwen3_next_test.cc); it skips while these files are absent. The multi-token
prediction head (mtp.*) is not part of the HF model class and is not generated.

Run where torch and transformers exist (the GPU host has both; the CPU is used):
  python3 tests/data/make_tiny_qwen3_next.py --out tests/data
"""
import argparse
import copy
import json
import sys
import os
import re

import torch
import transformers
from safetensors.torch import save_file
from transformers.models.qwen3_next import modeling_qwen3_next as hf

# Must match TinyQwen3NextConfig() in tests/engine/model/tiny_qwen3_next.h (the no-golden tests
# run that config with dummy weights). 4 layers, full attention in layers 1 and 3 (every 2nd),
# layer 2 a dense MLP; every width distinct so that a swapped dimension cannot load.
CONFIG = dict(
    architectures=["Qwen3NextForCausalLM"],
    vocab_size=256,  # byte-level: every byte is a token
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    full_attention_interval=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=24,
    shared_expert_intermediate_size=40,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[2],
    hidden_act="silu",
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
    bos_token_id=1,
    eos_token_id=2,
    router_aux_loss_coef=0.0,
    output_router_logits=False,
)

PROMPTS = [
    [7],
    [72, 101, 108, 108, 111, 44, 32],  # "Hello, "
    list(range(3, 36)),  # 33 tokens: crosses two 16-token KV blocks
    [(i * 37 + 11) % 256 for i in range(70)],  # crosses the delta rule's 64-token chunk
]
GREEDY_TOKENS = 16

FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def to_per_expert(sd, num_experts, inter):
    """transformers >= 5 keeps experts fused; the released checkpoints name them one by one."""
    out = {}
    for k, v in sd.items():
        m = FUSED.match(k)
        if not m:
            out[k] = v
            continue
        prefix, name = m.groups()
        for e in range(num_experts):
            if name == "gate_up_proj":
                out[f"{prefix}.{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                out[f"{prefix}.{e}.up_proj.weight"] = v[e, inter:].contiguous()
            else:
                out[f"{prefix}.{e}.down_proj.weight"] = v[e].contiguous()
    return out


def use_torch_reference_path(model):
    """HF's pure-torch Gated DeltaNet (what the C++ reference follows), even where the fla or
    causal-conv1d kernels are installed (they need CUDA and are not the reference).

    Transformers releases name the torch fallbacks differently (torch_causal_conv1d_update exists
    in some, not in others): a fallback the module exports is installed; otherwise the layer's own
    choice is kept if it is torch code from transformers itself (or None, meaning its inline torch
    path), and anything from an external kernel package is an error."""
    swaps = (("causal_conv1d_update", "torch_causal_conv1d_update"),
             ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
             ("recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"))
    for module in model.modules():
        if isinstance(module, hf.Qwen3NextGatedDeltaNet):
            module.causal_conv1d_fn = None
            for attr, fallback in swaps:
                if hasattr(hf, fallback):
                    setattr(module, attr, getattr(hf, fallback))
                    continue
                current = getattr(module, attr, None)
                origin = getattr(current, "__module__", "") or ""
                if current is not None and not origin.startswith("transformers."):
                    sys.exit(f"make_tiny_qwen3_next: {attr} comes from {origin!r} and this "
                             f"transformers has no {fallback} to replace it with")
            if not isinstance(module.norm, hf.Qwen3NextRMSNormGated):
                norm = hf.Qwen3NextRMSNormGated(module.head_v_dim, eps=module.layer_norm_epsilon)
                with torch.no_grad():
                    norm.weight.copy_(module.norm.weight.float().cpu())
                module.norm = norm
    return model


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def greedy(model, ids, n):
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(torch.argmax(logits_of(model, ids)[-1]))
        out.append(nxt)
        ids.append(nxt)
    return out


def max_scaled_diff(a, b):
    """max |a - b| / max(1, |b|), the measure of the C++ golden tolerance."""
    a, b = a.double(), b.double()
    return float(((a - b).abs() / b.abs().clamp(min=1.0)).max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--seed", type=int, default=20261202)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    cfg = transformers.Qwen3NextConfig(**CONFIG)
    model = transformers.Qwen3NextForCausalLM._from_config(cfg, attn_implementation="eager")
    model = use_torch_reference_path(model.float().eval())
    # transformers initialises with std 0.02, which makes every logit nearly equal; widen the
    # weights so that routing and argmax decisions are well separated in the goldens. Norms:
    # Qwen3NextRMSNorm multiplies by (1 + w), so w near 0; the gated norm multiplies by w, so near
    # 1. Decays g = -exp(A_log) * softplus(a + dt_bias) from fast to slow, so that the recurrent
    # state carries information over many tokens.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "norm" in name:
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.05, 1.5).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    per_expert = to_per_expert(sd, cfg.num_experts, cfg.moe_intermediate_size)

    d = os.path.join(args.out, "tiny-qwen3-next")
    os.makedirs(d, exist_ok=True)
    cfg.save_pretrained(d)
    save_file(per_expert, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    goldens, continuations = {}, []
    for i, p in enumerate(PROMPTS):
        goldens[f"logits_{i}"] = logits_of(model, p).float().contiguous()
        continuations.append(greedy(model, p, GREEDY_TOKENS))
    save_file(goldens, os.path.join(args.out, "tiny-qwen3-next-goldens.safetensors"))

    # Cross-check 1: transformers itself loads the files we wrote to the same logits.
    try:
        reloaded = transformers.Qwen3NextForCausalLM.from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager")
    except TypeError:  # transformers 4.x
        reloaded = transformers.Qwen3NextForCausalLM.from_pretrained(
            d, torch_dtype=torch.float32, attn_implementation="eager")
    reloaded = use_torch_reference_path(reloaded.eval())
    reload_diff = max(float((logits_of(reloaded, p) - goldens[f"logits_{i}"]).abs().max())
                      for i, p in enumerate(PROMPTS))
    assert reload_diff == 0.0, f"reloaded checkpoint differs by {reload_diff}"
    # Cross-check 2: how far float32 HF itself is from float64 HF, for reading the C++ test's
    # tolerance (1e-4 of max(1, |logit|)).
    # Some transformers releases run the experts through torch's grouped GEMM, which has no
    # float64 kernel; the goldens do not depend on this check, so it is recorded as skipped.
    float64_diff, float64_skipped = None, None
    try:
        model64 = copy.deepcopy(model).double()
        float64_diff = max(max_scaled_diff(goldens[f"logits_{i}"], logits_of(model64, p))
                           for i, p in enumerate(PROMPTS))
    except RuntimeError as e:
        float64_skipped = f"float64 forward failed in this transformers: {e}"

    meta = dict(
        description="Goldens for tests/data/tiny-qwen3-next: HF transformers Qwen3NextForCausalLM, "
                    "float32, CPU, eager attention, pure-torch Gated DeltaNet (chunked delta rule, "
                    "no cache). logits_<i> in the .safetensors file holds the logits of every "
                    "position of prompt i; greedy continuations recompute the whole sequence per "
                    "token.",
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        seed=args.seed,
        prompts=PROMPTS,
        greedy_continuations=continuations,
        greedy_tokens=GREEDY_TOKENS,
        reload_max_abs_diff=reload_diff,
        float32_vs_float64_max_scaled_diff=float64_diff,
        float32_vs_float64_skipped=float64_skipped,
    )
    with open(os.path.join(args.out, "tiny-qwen3-next-goldens.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(json.dumps({k: meta[k] for k in ("transformers_version", "torch_version",
                                             "float32_vs_float64_max_scaled_diff",
                                             "greedy_continuations")}))


if __name__ == "__main__":
    main()

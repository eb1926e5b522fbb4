#!/usr/bin/env python3
"""Makes the tiny qwen3_moe checkpoint and the golden outputs the CPU engine is tested against.

HF transformers is the reference implementation: this script builds a Qwen3MoeForCausalLM with
random weights (fixed seed), saves it twice, in the two expert layouts found in the wild, and
records logits and greedy continuations computed by transformers in float32 on the CPU.

  tiny-qwen3-moe/        config.json + model.safetensors, per-expert tensors
                         (mlp.experts.{e}.gate_proj.weight, up_proj, down_proj)
  tiny-qwen3-moe-fused/  config.json + model.safetensors, fused tensors
                         (mlp.experts.gate_up_proj [E, 2I, H] gate rows first, mlp.experts.down_proj
                         [E, H, I])
  tiny-qwen3-moe-goldens.json         prompts, greedy continuations, versions
  tiny-qwen3-moe-goldens.safetensors  logits_<i> [len(prompt_i), vocab] float32, all positions

Run where torch and transformers exist (the GPU host has both):
  python3 tests/data/make_tiny_qwen3_moe.py --out tests/data
"""
import argparse
import json
import os
import re

import torch
import transformers
from safetensors.torch import load_file, save_file

CONFIG = dict(
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    vocab_size=256,  # byte-level: every byte is a token
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=24,  # 2I != H so a transposed expert tensor cannot pass
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=16,
    num_experts_per_tok=4,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    hidden_act="silu",
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    attention_bias=False,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="float32",
    router_aux_loss_coef=0.0,
    output_router_logits=False,
)

PROMPTS = [
    [7],
    [72, 101, 108, 108, 111, 44, 32],  # "Hello, "
    list(range(3, 36)),  # 33 tokens: crosses two 16-token blocks
    [(i * 37 + 11) % 256 for i in range(70)],
]
GREEDY_TOKENS = 16

PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def to_per_expert(sd, num_experts, inter):
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


def to_fused(sd, num_experts):
    out, groups = {}, {}
    for k, v in sd.items():
        m = PER_EXPERT.match(k)
        if not m:
            out[k] = v
            continue
        prefix, e, name = m.groups()
        groups.setdefault(prefix, {}).setdefault(name, {})[int(e)] = v
    for prefix, g in groups.items():
        gate = torch.stack([g["gate_proj"][e] for e in range(num_experts)])
        up = torch.stack([g["up_proj"][e] for e in range(num_experts)])
        out[f"{prefix}.gate_up_proj"] = torch.cat([gate, up], dim=1).contiguous()
        out[f"{prefix}.down_proj"] = torch.stack(
            [g["down_proj"][e] for e in range(num_experts)]).contiguous()
    return out


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def greedy(model, ids, n):
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(torch.argmax(logits_of(model, ids)[-1]))
        out.append(nxt)
        ids.append(nxt)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--seed", type=int, default=20261129)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    cfg = transformers.Qwen3MoeConfig(**CONFIG)
    model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    # transformers initialises with std 0.02, which makes every logit nearly equal; widen the
    # weights so that routing and argmax decisions are well separated in the goldens.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    E, inter = cfg.num_experts, cfg.moe_intermediate_size
    per_expert = to_per_expert(sd, E, inter)
    fused = to_fused(per_expert, E)

    cfg_json = dict(CONFIG)
    cfg_json["transformers_version"] = transformers.__version__
    for sub, tensors in (("tiny-qwen3-moe", per_expert), ("tiny-qwen3-moe-fused", fused)):
        d = os.path.join(args.out, sub)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg_json, f, indent=2, sort_keys=True)
            f.write("\n")
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    goldens = {}
    continuations = []
    for i, p in enumerate(PROMPTS):
        goldens[f"logits_{i}"] = logits_of(model, p).contiguous()
        continuations.append(greedy(model, p, GREEDY_TOKENS))
    save_file(goldens, os.path.join(args.out, "tiny-qwen3-moe-goldens.safetensors"))

    # Cross-check: transformers itself loads the per-expert file we wrote to the same logits.
    reloaded = transformers.Qwen3MoeForCausalLM.from_pretrained(
        os.path.join(args.out, "tiny-qwen3-moe"), torch_dtype=torch.float32).eval()
    max_diff = max(float((logits_of(reloaded, p) - goldens[f"logits_{i}"]).abs().max())
                   for i, p in enumerate(PROMPTS))
    assert max_diff == 0.0, f"reloaded per-expert checkpoint differs by {max_diff}"

    meta = dict(
        description="Goldens for tests/data/tiny-qwen3-moe*: HF transformers, float32, CPU, "
                    "eager attention. logits_<i> in the .safetensors file holds the logits of "
                    "every position of prompt i.",
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        seed=args.seed,
        prompts=PROMPTS,
        greedy_continuations=continuations,
        greedy_tokens=GREEDY_TOKENS,
        reload_max_abs_diff=max_diff,
    )
    with open(os.path.join(args.out, "tiny-qwen3-moe-goldens.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(json.dumps({k: meta[k] for k in ("transformers_version", "torch_version",
                                             "greedy_continuations")}))
    print("per-expert keys sample:", sorted(per_expert)[:3], "fused keys:", 
          sorted(k for k in fused if "experts" in k)[:2])


if __name__ == "__main__":
    main()

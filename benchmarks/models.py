"""The HF decoders the benchmarks run, with random weights: a Mistral-7B-shaped
and a Qwen2-MoE-shaped one (transformers' own classes, so the ops they call
are those of real serving). On the GPU at their real widths in bf16; small
(the CPU) at narrow widths in fp32, so that a step is bound by the host as a
GPU decode step is, not by the CPU's arithmetic."""
import torch

KINDS = ("mistral", "qwen-moe")


def mistral(layers, device="cuda", dtype=torch.bfloat16, **config):
    """config overrides MistralConfig fields."""
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(**{"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": layers,
                           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                           "max_position_embeddings": 4096, **config})
    torch.manual_seed(0)
    with torch.device(device):
        return MistralForCausalLM(cfg).to(dtype).eval()


def qwen_moe(layers, device="cuda", dtype=torch.bfloat16, small=False):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    h, heads = (256, 8) if small else (2048, 16)  # the expert widths follow the hidden one
    cfg = Qwen2MoeConfig(hidden_size=h, intermediate_size=h * 11 // 4, moe_intermediate_size=h * 11 // 16,
                         shared_expert_intermediate_size=h * 11 // 4, num_experts=60, num_experts_per_tok=4,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         vocab_size=32000)
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2MoeForCausalLM(cfg).to(dtype).eval()


def build(kind, layers, device="cuda", small=False):
    """The decoder kind names (KINDS)."""
    dtype = torch.float32 if small else torch.bfloat16
    if kind == "mistral":
        narrow = dict(hidden_size=256, intermediate_size=896, num_attention_heads=8, num_key_value_heads=2)
        return mistral(layers, device, dtype, **(narrow if small else {}))
    if kind == "qwen-moe":
        return qwen_moe(layers, device, dtype, small)
    raise ValueError(f"no decoder {kind!r} (one of {', '.join(KINDS)})")

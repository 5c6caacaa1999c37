"""The demo: a small decoder generating tokens with understudy observing.

Uses a Hugging Face Llama-shaped model with random weights when transformers
is importable, else a plain torch decoder of the same structure (RMSNorm,
grouped-query attention through SDPA, SiLU-gated MLP, top-k sampling). Runs
on CUDA when it is available, else on the CPU.
"""
from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F
from torch import nn


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.norm1 = nn.Parameter(torch.ones(d))
        self.norm2 = nn.Parameter(torch.ones(d))
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, ffn, bias=False)
        self.up = nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cache, pos):
        b, t, d = x.shape
        h = F.rms_norm(x, (d,), self.norm1, 1e-6)
        q = self.q(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rope(q, pos), rope(k, pos)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        new_cache = (k, v)
        rep = self.heads // self.kv_heads
        kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, kk, vv, is_causal=cache is None and t > 1)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = F.rms_norm(x, (d,), self.norm2, 1e-6)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x, new_cache


def rope(x, pos: int):
    hd = x.shape[-1]
    t = x.shape[2]
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = torch.arange(pos, pos + t, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class TinyDecoder(nn.Module):
    """A Llama-structured decoder in plain torch."""

    def __init__(self, vocab=512, d=128, layers=2, heads=4, kv_heads=2, ffn=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(DecoderLayer(d, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(d))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids, caches=None, pos=0):
        x = self.embed(ids)
        new = []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, None if caches is None else caches[i], pos)
            new.append(c)
        x = F.rms_norm(x, (x.shape[-1],), self.norm, 1e-6)
        return self.lm_head(x[:, -1]), new

    @torch.no_grad()
    def generate(self, ids, new_tokens: int, top_k: int = 20, seed: int = 0):
        gen = torch.Generator(device=ids.device).manual_seed(seed)
        logits, caches = self(ids)
        out = [ids]
        pos = ids.shape[1]
        for _ in range(new_tokens):
            vals, idx = torch.topk(logits.float(), top_k, dim=-1)
            probs = torch.softmax(vals, dim=-1)
            pick = torch.multinomial(probs, 1, generator=gen)
            tok = idx.gather(-1, pick)
            out.append(tok)
            logits, caches = self(tok, caches, pos)
            pos += 1
        return torch.cat(out, dim=1)


def build_model(device: str, prefer_hf: bool = True):
    """Returns (name, generate(ids, new_tokens) -> token tensor, vocab)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    if prefer_hf:
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except Exception:
            LlamaForCausalLM = None
        if LlamaForCausalLM is not None:
            cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
            model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()

            def gen_hf(ids, n):
                torch.manual_seed(0)
                return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=True, top_k=50,
                                      pad_token_id=0)
            return "transformers LlamaForCausalLM (random weights, 4 layers, hidden 256)", gen_hf, cfg.vocab_size
    model = TinyDecoder().to(device=device, dtype=dtype).eval()
    return ("plain torch decoder (random weights, 2 layers, hidden 128)",
            lambda ids, n: model.generate(ids, n), model.embed.num_embeddings)


def run_demo(device=None, tokens: int = 24, report_path: str = "understudy-demo-report.json") -> int:
    import understudy
    from understudy.cli import format_report

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    name, generate, vocab = build_model(device)
    ids = torch.randint(0, vocab, (2, 16), device=device, generator=torch.Generator(device=device).manual_seed(1))
    print(f"understudy demo: {name} on {device}, torch {torch.__version__}")
    generate(ids, tokens)  # warm-up outside understudy: per-shape set-up (cuDNN plans, ...) stays out of the figures
    understudy.enable({"defaults": {"mode": "observe"}, "report": {"path": report_path, "interval_s": 5}})
    try:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = generate(ids, tokens)
        if device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    finally:
        understudy.disable()
    print(f"generated {out.shape[0]} x {out.shape[1] - ids.shape[1]} tokens in {dt:.2f} s; "
          f"report written to {report_path}\n")
    with open(report_path) as f:
        print(format_report(json.load(f)))
    return 0

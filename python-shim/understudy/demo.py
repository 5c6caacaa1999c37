"""The demo: a small decoder generating tokens with understudy observing.

Uses a Hugging Face Llama-shaped model with random weights when transformers
is importable, else a plain torch decoder of the same structure (RMSNorm,
grouped-query attention through SDPA, SiLU-gated MLP, top-k sampling). Runs
on CUDA when it is available, else on the CPU.

Two phases: observe (every bound op counted and timed), then shadow, where
the model's RMSNorm goes through a vLLM-style out-variant op (_C::rms_norm)
and example candidates run beside production: the native rms_norm kernel
(CPU or CUDA build), a deliberately wrong silu (rolled back at its first
verified mismatch), and on CUDA with Triton the Triton GEMM for aten::mm.
"""
from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F
from torch import nn


def _rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def vllm_rms_norm(x, weight, eps):
    """RMSNorm through _C::rms_norm(Tensor! result, input, weight, epsilon), as vLLM calls it."""
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x.contiguous(), weight, eps)
    return out


_vllm_lib = None


def define_vllm_rms_norm() -> bool:
    """Define _C::rms_norm as vLLM does (when vLLM is not loaded), with a torch
    implementation as production. Returns False when it already exists."""
    global _vllm_lib
    try:
        torch._C._get_schema("_C::rms_norm", "")
        return False
    except RuntimeError:
        pass
    _vllm_lib = torch.library.Library("_C", "FRAGMENT")
    _vllm_lib.define("rms_norm(Tensor(a!) result, Tensor input, Tensor weight, float epsilon) -> ()")
    # what torch.compile traces (as vLLM registers its own): writes result, returns nothing
    torch.library.register_fake("_C::rms_norm", lib=_vllm_lib)(lambda result, input, weight, epsilon: None)

    def impl(result, input, weight, epsilon):
        xf = input.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
        result.copy_((y.to(input.dtype) * weight))

    for key in ("CPU", "CUDA"):
        _vllm_lib.impl("rms_norm", impl, key)
    return True


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
        h = _norm(x, self.norm1, 1e-6)
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
        h = _norm(x, self.norm2, 1e-6)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x, new_cache


_norm = _rms_norm


def use_vllm_rms_norm(model: nn.Module, on: bool) -> None:
    """Route the model's RMSNorm through _C::rms_norm (or back to F.rms_norm)."""
    global _norm
    _norm = vllm_rms_norm if on else _rms_norm
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon"):
            if on:
                m.forward = (lambda mod: lambda h: vllm_rms_norm(h, mod.weight, mod.variance_epsilon))(m)
            elif "forward" in m.__dict__:
                del m.forward


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
        x = _norm(x, self.norm, 1e-6)
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


# Realistic dimensions with few layers and random weights: the shapes serving
# traffic has, at a size one GPU holds in seconds.
SHAPED = {
    "llama-8b-shaped": ("LlamaConfig", "LlamaForCausalLM",
                        dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096),
                        "Llama-3-8B dimensions, 2 layers"),
    "qwen3-moe-shaped": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                         dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                              num_experts=128, num_experts_per_tok=8, num_hidden_layers=2, num_attention_heads=32,
                              num_key_value_heads=4, head_dim=128, max_position_embeddings=4096),
                         "Qwen3-30B-A3B dimensions, 2 layers"),
}


def build_model(device: str, prefer_hf: bool = True, model: str = "small"):
    """Returns (name, generate(ids, new_tokens) -> token tensor, vocab, model)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    if model in SHAPED:
        import transformers

        cfg_name, cls_name, kw, what = SHAPED[model]
        cfg = getattr(transformers, cfg_name)(**kw)
        m = getattr(transformers, cls_name)(cfg).to(device=device, dtype=dtype).eval()

        def gen_shaped(ids, n):
            torch.manual_seed(0)
            return m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=True, top_k=50, pad_token_id=0)
        return f"transformers {cls_name} (random weights, {what})", gen_shaped, cfg.vocab_size, m
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
            return ("transformers LlamaForCausalLM (random weights, 4 layers, hidden 256)", gen_hf, cfg.vocab_size,
                    model)
    model = TinyDecoder().to(device=device, dtype=dtype).eval()
    return ("plain torch decoder (random weights, 2 layers, hidden 128)",
            lambda ids, n: model.generate(ids, n), model.embed.num_embeddings, model)


def _example(name: str):
    """An example torch-op candidate's module: the copy installed with the
    package (examples/), else the clone's examples/candidates/."""
    import importlib.util
    import pathlib

    here = pathlib.Path(__file__).resolve().parent
    path = here / "examples" / f"{name}.py"
    if not path.exists():
        path = here.parents[1] / "examples" / "candidates" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"understudy_example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _native_example(device: str):
    """The demo's native rms_norm candidate for device: in the candidates/
    folder beside the library, as pip installs it and as a build tree holds
    it (the file may be missing: then rms_norm is observed only)."""
    import understudy

    return understudy.library_path().parent / "candidates" / (
        "librms_norm_cuda.so" if device == "cuda" else "librms_norm_cpu.so")


def shadow_config(device: str, report_path: str) -> tuple[dict, list[str]]:
    """The demo's shadow config and a line per candidate."""
    import understudy

    notes = []
    ops: dict = {"sdpa": "observe", "topk": "observe", "gemm": "observe", "grouped_mm": "observe"}
    lib = _native_example(device)
    if lib.exists():
        ops["rms_norm"] = {"mode": "shadow", "sample": 1.0, "candidate": understudy.native(lib, target="_C::rms_norm")}
        notes.append(f"rms_norm: native {lib.name} (pinned sha256 {ops['rms_norm']['candidate']['sha256'][:12]}...)")
    else:
        ops["rms_norm"] = "observe"
        notes.append(f"rms_norm: {lib} not built, observed only")
    wrong = _example("wrong_silu")
    name = understudy.register_candidate(wrong.WRONG_TAIL_NAME, wrong.silu_wrong_tail, like=wrong.TARGET)
    ops["silu"] = {"mode": "shadow", "sample": 1.0, "candidate": {"torch_op": name, "target": "aten::silu"}}
    notes.append(f"silu: torch op {name} (wrong in the last element, on purpose)")
    if device == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            notes.append("gemm: Triton is not installed, observed only")
        else:
            tmm = _example("triton_mm")
            name = understudy.register_candidate(tmm.OP_NAME, tmm.mm_triton, like=tmm.TARGET)
            ops["gemm"] = {"mode": "shadow", "sample": 0.5, "candidate": {"torch_op": name, "target": "aten::mm"}}
            notes.append(f"gemm: torch op {name} (Triton GEMM) for aten::mm, half the calls shadowed")
    return {"operators": ops, "report": {"path": report_path, "interval_s": 5}}, notes


def demo_hardware(device: str) -> tuple[dict | None, str | None]:
    """On a CPU no datasheet profile applies, so nothing would be scored: the
    demo measures this host first (calibrate --quick, about 2.5 s) into
    a hardware directory beside the shipped profiles. Returns the config's
    "hardware" section (None on a GPU: its datasheet profile is shipped) and a
    line saying what was done."""
    if device != "cpu":
        return None, None
    import pathlib
    import shutil
    import tempfile

    import understudy
    from understudy.calibrate import calibrate

    t0 = time.perf_counter()
    prof = calibrate("cpu", quick=True)
    hw = pathlib.Path(tempfile.mkdtemp(prefix="understudy-demo-hardware-"))
    for f in (understudy.problems_dir() / "hardware").glob("*.json"):
        shutil.copy(f, hw / f.name)
    (hw / "host-cpu.json").write_text(json.dumps(prof, indent=2) + "\n")
    peaks = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in prof["p_peak"].items())
    return {"dir": str(hw)}, (f"CPU roofline: this host measured in {time.perf_counter() - t0:.1f} s "
                              f"(copy {prof['b_peak'] / 1e9:.1f} GB/s; {peaks}); for a lasting profile: "
                              f"python -m understudy calibrate --out DIR/cpu.json, then \"hardware\": {{\"dir\": DIR}}")


def run_demo(device=None, tokens: int = 24, report_path: str = "understudy-demo-report.json",
             model: str = "small") -> int:
    import understudy
    from understudy.tables import format_report

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    name, generate, vocab, model = build_model(device, model=model)
    ids = torch.randint(0, vocab, (2, 16), device=device, generator=torch.Generator(device=device).manual_seed(1))
    print(f"understudy demo: {name} on {device}, torch {torch.__version__}")
    hardware, line = demo_hardware(device)
    extra = {"hardware": hardware} if hardware else {}
    if line:
        print(line)
    generate(ids, tokens)  # warm-up outside understudy: per-shape set-up (cuDNN plans, ...) stays out of the figures
    understudy.enable({"defaults": {"mode": "observe"}, "report": {"path": report_path, "interval_s": 5}, **extra})
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
    return run_shadow_phase(device, generate, model, ids, tokens, report_path, extra)


def _phase(model, title, config, notes, serve, before=None):
    """One phase with candidates: the model's RMSNorm goes through _C::rms_norm,
    the candidates are listed, before() runs without understudy and serve()
    with it enabled by config. Returns what both returned."""
    import understudy

    define_vllm_rms_norm()
    use_vllm_rms_norm(model, True)
    print(f"\n{title}")
    for n in notes:
        print(f"  {n}")
    try:
        with torch.inference_mode():
            plain = before() if before is not None else None
            understudy.enable(config)
            try:
                served = serve()
            finally:
                understudy.disable()
    finally:
        use_vllm_rms_norm(model, False)
    return plain, served


def run_shadow_phase(device, generate, model, ids, tokens, report_path, extra=None) -> int:
    from understudy.tables import format_verdicts

    shadow_path = report_path.replace(".json", "") + "-shadow.json"
    config, notes = shadow_config(device, shadow_path)
    config.update(extra or {})
    plain, served = _phase(model, "shadow phase: RMSNorm through _C::rms_norm (vLLM's out-variant op); candidates:",
                           config, notes, lambda: generate(ids, tokens), before=lambda: generate(ids, tokens))
    same = torch.equal(plain, served)
    print(f"tokens served under shadow mode equal the tokens without understudy: {same}; "
          f"report written to {shadow_path}\n")
    with open(shadow_path) as f:
        print(format_verdicts(json.load(f)))
    if not same:
        return 1
    return run_rollout_phase(device, generate, model, ids, tokens, report_path, extra)


def rollout_config(device: str, report_path: str) -> tuple[dict, list[str]]:
    """Candidates take the stage: the native rms_norm under a promotion
    policy, and a silu candidate served live that breaks after a while."""
    import understudy

    notes = []
    ops: dict = {}
    lib = _native_example(device)
    if lib.exists():
        ops["rms_norm"] = {"mode": "shadow", "sample": 0.5, "candidate": understudy.native(lib, target="_C::rms_norm"),
                           "promotion": {"min_verified": 8, "min_speedup": 1.0, "canary": 0.5}}
        notes.append(f"rms_norm: native {lib.name}, promoted shadow -> canary(0.5) -> live after 8 passing "
                     f"verifications in each stage with its median at least as fast as production's")
    wrong = _example("wrong_silu")
    name = understudy.register_candidate(wrong.GOES_WRONG_NAME, wrong.silu_goes_wrong, like=wrong.TARGET)
    ops["silu"] = {"mode": "live", "sample": 0.25, "candidate": {"torch_op": name, "target": "aten::silu"}}
    notes.append(f"silu: torch op {name} serving live, 1 call in 4 verified: right for "
                 f"{wrong.GOES_WRONG_AFTER} calls, then wrong in the last element")
    return {"operators": ops, "report": {"path": report_path, "interval_s": 5}}, notes


def run_rollout_phase(device, generate, model, ids, tokens, report_path, extra=None) -> int:
    from understudy.tables import format_verdicts

    path = report_path.replace(".json", "") + "-rollout.json"
    config, notes = rollout_config(device, path)
    config.update(extra or {})
    _phase(model, "rollout phase: candidates serve; promotions and rollbacks follow the evidence:", config, notes,
           lambda: [generate(ids, tokens) for _ in range(2)])
    with open(path) as f:
        rep = json.load(f)
    print(f"report written to {path}\n")
    print(format_verdicts(rep))
    modes = {(o["name"], s.get("rollout", {}).get("mode")) for o in rep["operators"] for s in o["shapes"]}
    promoted = ("rms_norm", "live") in modes or ("rms_norm", "canary") in modes or "rms_norm" not in config["operators"]
    rolled_back = ("silu", "rolled_back") in modes
    print(f"\nrms_norm promoted: {promoted}; silu rolled back: {rolled_back}")
    return 0 if promoted and rolled_back else 1

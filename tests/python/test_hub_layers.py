"""Hub layers (understudy.guard_kernelized): an HF Llama-shaped model (random
weights, 2 layers) kernelized by the `kernels` package from local kernel
repositories written here (the layout kernels reads: build/<variant>/ with
metadata.json), one RMSNorm right and one wrong on purpose. Ground truth:
the model's logits without kernelize and without understudy, a float64
RMSNorm, and each norm module's calls counted by forward hooks."""
import gc
import hashlib
import json
import pathlib
import textwrap

import pytest
import torch

import understudy

kernels = pytest.importorskip("kernels", reason="kernels (./run.sh test installs it)")
transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

RIGHT = """
import torch
from torch import nn


class RMSNorm(nn.Module):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(hidden_states.dtype)
"""
# kernels-community#105: an RMSNorm off by 0.125 everywhere
WRONG = RIGHT.replace("return self.weight * x.to(hidden_states.dtype)",
                      "return self.weight * x.to(hidden_states.dtype) + 0.125")


def kernel_repo(root: pathlib.Path, name: str, kid: str, layers: str) -> pathlib.Path:
    # a kernel id is unique per build: kernels reuses a module already imported under it
    kid = f"{kid}_{hashlib.sha256(str(root).encode()).hexdigest()[:8]}"
    # torch-universal (pure Python, any backend): kernels resolves a layer's variant by the system's
    # backend, so a torch-cpu variant is not found where torch sees a GPU
    variant = root / name / "build" / "torch-universal"
    variant.mkdir(parents=True)
    (variant / "metadata.json").write_text(json.dumps({
        "id": kid, "name": name, "version": 1, "license": "Apache-2.0", "backend": {"type": "universal"},
        "python-depends": []}))
    (variant / "__init__.py").write_text("from . import layers\n")
    (variant / "layers.py").write_text(textwrap.dedent(layers))
    return root / name


def variant_digest(variant: pathlib.Path) -> str:
    h = hashlib.sha256()
    for p in sorted(variant.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(variant)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def hub_norm():
    """LlamaRMSNorm extensible as kernels' "RMSNorm" layer for the test (this
    transformers pins an older kernels, so its decorator is a no-op)."""
    gc.collect()  # the models of earlier tests, guarded, are gone: their operators leave the config
    cls = modeling_llama.LlamaRMSNorm
    had = "kernel_layer_name" in cls.__dict__
    kernels.replace_kernel_forward_from_hub(cls, "RMSNorm")
    yield cls
    if not had:
        for attr in ("kernel_layer_name", "kernel_condition"):
            cls.__dict__.get(attr) is not None and delattr(cls, attr)


@pytest.fixture
def repos(tmp_path):
    return {"right": kernel_repo(tmp_path, "rmsnorm-right", "_rmsnorm_right_cpu_0a1b2c", RIGHT),
            "wrong": kernel_repo(tmp_path, "rmsnorm-wrong", "_rmsnorm_wrong_cpu_3d4e5f", WRONG)}


def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6)
    return LlamaForCausalLM(cfg).eval()


def kernelize(m, repo):
    mapping = {"RMSNorm": {"cpu": kernels.LocalLayerRepository(repo, layer_name="RMSNorm")}}
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        kernels.kernelize(m, mode=kernels.Mode.INFERENCE, device="cpu")
    return m


def norms(m):
    return [x for x in m.modules() if isinstance(x, modeling_llama.LlamaRMSNorm)]


def count_calls(m):
    counts = {"n": 0}
    for x in norms(m):
        x.register_forward_hook(lambda mod, inp, out: counts.__setitem__("n", counts["n"] + 1))
    return counts


def hub_routes(rep):
    ops = [o for o in rep["operators"] if o["name"].startswith("hub_")]
    return ops, [s for o in ops for s in o["shapes"]]


CONFIG = {"operators": {"hub": {"mode": "shadow", "sample": 1.0, "candidate": {"hub": {"layer": "RMSNorm"}}}},
          "report": {"interval_s": 0}}
IDS = [torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1)),
       torch.randint(0, 128, (1, 3), generator=torch.Generator().manual_seed(2))]


def logits(m):
    with torch.no_grad():
        return [m(ids).logits for ids in IDS]


def test_the_hub_rmsnorm_is_shadowed_per_shape_and_verified_on_every_call(us, hub_norm, repos):
    plain = logits(model())  # without kernelize, without understudy
    m = kernelize(model(), repos["right"])
    lifted = understudy.guard_kernelized(m)
    assert len(lifted) == 5 and all(x["lifted"] for x in lifted)
    (op,) = {x["op"] for x in lifted}
    assert op.startswith("understudy_hub::llamarmsnorm_variance_epsilon_1em06_")  # the epsilon joins the key
    logits(m)  # a lifted op's first call tells that its forward returns one tensor: served without the op
    counts = count_calls(m)
    us.enable(CONFIG)
    got = logits(m)
    assert all(torch.equal(g, p) for g, p in zip(got, plain))  # production: the original forward, bit for bit
    ops, routes = hub_routes(us.report())
    assert {s["key"] for s in routes} == {f"{op}|cpu|f32,f32|M=16,N=64", f"{op}|cpu|f32,f32|M=4,N=64"}
    assert sum(s["calls"] for s in routes) == counts["n"] == 10
    for s in routes:
        assert s["shadow"]["verified"] == s["calls"] == s["shadow"]["passed"]
        assert s["mode"] == "shadow" and s["shadow"]["rollback"] is None
    (o,) = ops
    src = o["candidate"]["source"]
    assert src["kind"] == "hub" and src["repo"] == str(repos["right"])
    assert src["kernel_id"].startswith("_rmsnorm_right_cpu_0a1b2c_") and src["kernel"] == "rmsnorm-right"
    assert src["revision"] == "sha256:" + variant_digest(repos["right"] / "build" / "torch-universal")
    assert src["variant"] == "torch-universal" and src["layer"] == "RMSNorm"
    assert all(s["served_by"]["candidate"] == src["label"] and s["served_by"]["now"] == "production" for s in routes)
    # the guard's verdict agrees with a float64 RMSNorm: the hub layer is right
    x = torch.randn(3, 64, dtype=torch.float64)
    layer = norms(m)[0]
    want = layer.weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    ns, name = o["candidate"]["name"].split("::")  # the hub layer's op, called here directly
    got = getattr(getattr(torch.ops, ns), name)(x.float(), layer.weight)
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_a_hub_kernels_own_ops_are_attributed_to_its_repo_and_revision(hub_norm, tmp_path):
    """A kernel whose layer calls a dispatcher op it registers in its own
    namespace (as kernel-builder's do, `_<name>_<backend>_<hash>::op`)."""
    kid = f"_rmsnorm_ops_cpu_{hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]}"
    repo = kernel_repo(tmp_path, "rmsnorm-ops", "_unused", RIGHT)
    variant = repo / "build" / "torch-universal"
    meta = json.loads((variant / "metadata.json").read_text())
    meta["id"] = kid
    (variant / "metadata.json").write_text(json.dumps(meta))
    (variant / "__init__.py").write_text(textwrap.dedent(f'''
        import torch
        _lib = torch.library.Library("{kid}", "DEF")
        _lib.define("scale(Tensor x, Tensor w) -> Tensor")
        _lib.impl("scale", lambda x, w: x * w, "CompositeExplicitAutograd")
        from . import layers
        '''))
    m = kernelize(model(), repo)
    assert len({x["candidate"] for x in understudy.guard_kernelized(m)}) == 1
    from understudy import hub
    (lifted,) = [r for r in hub.lifted() if r.alive() and r.source["kernel_id"] == kid]
    assert lifted.source["ops"] == [f"{kid}::scale"]
    got = hub.attribute_op(f"{kid}::scale")
    assert got["kernel_id"] == kid and got["repo"] == str(repo)
    assert got["revision"] == "sha256:" + variant_digest(variant)
    assert hub.attribute_op("aten::mm") is None


def test_the_wrong_hub_variant_rolls_back_naming_repo_and_revision(us, hub_norm, repos):
    plain = logits(model())
    m = kernelize(model(), repos["wrong"])
    understudy.guard_kernelized(m)
    logits(m)
    us.enable(CONFIG)
    got = logits(m)
    assert all(torch.equal(g, p) for g, p in zip(got, plain))  # the wrong kernel never reached the caller
    _, routes = hub_routes(us.report())
    assert routes and all(s["mode"] == "rolled_back" for s in routes)
    ev = routes[0]["shadow"]["rollback"]
    digest = variant_digest(repos["wrong"] / "build" / "torch-universal")
    assert ev["reason"] == "mismatch" and abs(ev["max_abs_err"] - 0.125) < 1e-3
    assert ev["candidate"] == f"hub {repos['wrong']}@sha256:{digest[:12]} RMSNorm"


def test_reversed_the_hub_kernel_serves_and_the_original_is_the_check(us, hub_norm, repos):
    m = kernelize(model(), repos["wrong"])
    served_alone = logits(m)  # what the kernelized model serves without understudy
    understudy.guard_kernelized(m, reverse=True)
    logits(m)
    us.enable({**CONFIG, "operators": {"hub": {"mode": "shadow", "sample": 1.0,
                                               "candidate": {"hub": {"layer": "RMSNorm", "reverse": True}}}}})
    got = logits(m)
    assert all(torch.equal(g, p) for g, p in zip(got, served_alone))
    ops, routes = hub_routes(us.report())
    assert all(s["mode"] == "rolled_back" for s in routes)  # the reference disagrees with the served kernel
    src = ops[0]["candidate"]["source"]
    assert src["kind"] == "reference" and src["checks"]["repo"] == str(repos["wrong"])


def test_the_config_form_guards_a_model_kernelized_after_enable(us, hub_norm, repos):
    plain = logits(model())
    us.enable(CONFIG)
    m = kernelize(model(), repos["right"])  # lifted as kernelize swaps each forward
    assert all(getattr(x.__dict__["forward"].__func__, "_understudy_lifted", False) for x in norms(m))
    logits(m)  # the first call: served directly, and understudy enabled again with the lifted operators
    got = logits(m)
    assert all(torch.equal(g, p) for g, p in zip(got, plain))
    _, routes = hub_routes(us.report())
    assert routes and all(s["shadow"]["passed"] == s["calls"] > 0 for s in routes)


def test_a_module_that_needs_gradients_is_served_without_the_ops(us, hub_norm, repos):
    m = kernelize(model(), repos["right"])
    understudy.guard_kernelized(m)
    us.enable(CONFIG)
    ids = IDS[0]
    m.train()
    out = m(ids).logits.sum()
    out.backward()  # no op without a derivative stands in the way
    assert norms(m)[0].weight.grad is not None
    _, routes = hub_routes(us.report())
    assert sum(s["calls"] for s in routes) == 0


@pytest.mark.gpu
def test_liger_rmsnorm_on_the_gpu_shadowed_then_canary(us, hub_norm, tmp_path):
    """Liger-Kernel's Triton RMSNorm as the hub layer of a CUDA model."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("liger_kernel", reason="liger_kernel")
    repo = kernel_repo(tmp_path, "liger-local", "_liger_local_cuda_000001", """
        from liger_kernel.transformers.rms_norm import LigerRMSNorm as _L
        import torch
        from torch import nn


        class RMSNorm(nn.Module):
            def forward(self, hidden_states):
                return _L.forward(self, hidden_states)
        """)
    meta = json.loads((repo / "build" / "torch-universal" / "metadata.json").read_text())
    meta["backend"] = {"type": "cuda"}
    (repo / "build" / "torch-universal").rename(repo / "build" / "torch-cuda")
    (repo / "build" / "torch-cuda" / "metadata.json").write_text(json.dumps(meta))
    m = model().cuda().to(torch.bfloat16)
    for x in norms(m):
        x.offset, x.casting_mode, x.in_place, x.row_mode = 0.0, "llama", False, None
    with kernels.use_kernel_mapping({"RMSNorm": {"cuda": kernels.LocalLayerRepository(repo, layer_name="RMSNorm",
                                                                                      check_arch=False)}},
                                    inherit_mapping=False):
        kernels.kernelize(m, mode=kernels.Mode.INFERENCE, device="cuda")
    understudy.guard_kernelized(m)
    ids = IDS[0].cuda()
    with torch.no_grad():
        plain = m(ids).logits  # the first call: served directly
    counts = count_calls(m)
    # the promotion policy in dry run: it decides on the shadow's paired times and records what it would
    # do, changing no mode (the canary below is set by hand)
    us.enable({**CONFIG, "operators": {"hub": {"mode": "shadow", "sample": 1.0, "promotion": {
        "min_verified": 50, "dry_run": True}, "candidate": {"hub": {"layer": "RMSNorm"}}}}})
    with torch.no_grad():
        for _ in range(20):
            assert torch.equal(m(ids).logits, plain)  # shadow: production's values, bit for bit
    ops, routes = hub_routes(us.report())
    assert routes and sum(s["calls"] for s in routes) == counts["n"] == 100
    for s in routes:  # Liger's Triton kernel agrees with the original forward on every call, in bf16
        assert s["device"] == "cuda" and s["shadow"]["verified"] == s["shadow"]["passed"] == s["calls"]
    assert ops[0]["candidate"]["source"]["kind"] == "hub"
    for s in routes:  # the figures of both arms on the GPU's roofline, and the promotion's standing
        r, p = s["roofline"], s["rollout"].get("promotion") or {}
        print(f"\nliger hub RMSNorm {s['key']}: S production {r['S']}, S candidate {r['S_candidate']}, "
              f"promotion {p.get('state')}: {p.get('note')}")
    # canary: half the calls served by the hub kernel, the rest verified against the original
    for s in routes:
        understudy.set_mode(key=s["key"], mode="canary", canary=0.5)
    with torch.no_grad():
        got = [m(ids).logits for _ in range(40)]
    _, routes = hub_routes(us.report())
    served = {k: sum(s["rollout"]["served"][k] for s in routes) for k in ("production", "candidate")}
    assert all(s["rollout"]["mode"] == "canary" for s in routes), [s["rollout"] for s in routes]
    # every call counted once by what served it: shadow's 100 by production, canary's 200 by either
    assert served["candidate"] > 0 and served["production"] > 100 and sum(served.values()) == 300, served
    assert all(s["shadow"]["failed"] == 0 for s in routes)
    # what the caller got is the model's logits within bf16's rounding of the norm (a float64 RMSNorm
    # between both kernels: each rounds to bf16)
    assert all(torch.allclose(g.float(), plain.float(), atol=0.1, rtol=0.05) for g in got)
    print(f"\nliger hub RMSNorm on {torch.cuda.get_device_name()}: routes {len(routes)}, "
          f"shadow verified {sum(s['shadow']['verified'] for s in routes)} passed "
          f"{sum(s['shadow']['passed'] for s in routes)} failed 0; canary served {served}")

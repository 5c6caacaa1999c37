"""The serving frameworks' plugin entry points (declared in pyproject.toml).

vLLM calls every function of the entry-point group "vllm.general_plugins"
with no argument in each process it creates (the API server, the engine
core, every worker) before it starts work, and does not catch what they
raise; SGLang calls those of "sglang.srt.plugins" likewise in its processes
(VLLM_PLUGINS / SGLANG_PLUGINS may list the plugin names to load: this one is
"understudy"). Each enables understudy from $UNDERSTUDY_CONFIG, once per
process; without it they do nothing. They never raise.
"""
from __future__ import annotations


def vllm() -> None:
    """vllm.general_plugins: understudy in this vLLM process."""
    from .activation import activate

    _note_engine("vllm")
    activate(source="vLLM plugin")


def sglang() -> None:
    """sglang.srt.plugins: understudy in this SGLang process."""
    from .activation import activate

    _note_engine("sglang")
    activate(source="SGLang plugin")


def _note_engine(engine: str) -> None:
    """The engine label of the metrics (never raises: metrics are optional)."""
    try:
        from .metrics import _note_host
        _note_host(engine=engine)
    except Exception:  # noqa: BLE001
        pass

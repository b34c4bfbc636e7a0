"""Regional compilation of the train engine's passes: each decoder layer runs torch.compile'd, the rest
(embeddings, rotary tables, final norm, lm_head) eagerly.

The decoder layers of a model share their code and differ only in their parameters, which torch.compile
treats as inputs, so one compiled graph (per grad mode) serves every layer: compiling costs one layer's
trace instead of the whole model's. This is PyTorch's regional-compilation recipe and torchtitan's per-block
compile. On the CPU (an 8-layer Qwen2, forward and backward, benchmarks/compile_regions.py) the first call
took 30.4 s against 54.8 s for the compiled whole model, and a second shape 0.1 s against 88.1 s.

The layers are compiled only while the engine's passes run (`active()`), by setting the `_compiled_call_impl`
that `nn.Module.compile()` sets: a rollout engine sharing the module (the hybrid engine) sees it uncompiled,
and compiles its own decode step. Rows and widths are dynamic from the first compile and not duck-sized
(equal sizes at the first call, rows and width say, would otherwise be guarded equal and recompiled for).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class CompiledLayers:
    """The compiled decoder layers of `model` (none where it has no `get_decoder().layers`)."""

    def __init__(self, model: torch.nn.Module):
        self.layers = decoder_layers(model)
        self.compiled = [torch.compile(layer._call_impl, dynamic=True) for layer in self.layers]
        self.depth = 0

    def __bool__(self) -> bool:
        return bool(self.layers)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The layers run compiled inside the block (re-entrant: the outermost block sets and clears them)."""
        if self.depth == 0:
            for layer, compiled in zip(self.layers, self.compiled):
                layer._compiled_call_impl = compiled
        self.depth += 1
        try:
            with layer_compile_settings():
                yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                for layer in self.layers:
                    layer._compiled_call_impl = None


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of `model` (or of the model under a peft wrapper); none where it has no
    `get_decoder().layers`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    return list(getattr(decoder, "layers", None) or [])


@contextlib.contextmanager
def layer_compile_settings() -> Iterator[None]:
    """How decoder layers compile (here and in hf_static's decode step, flowrl.engines.hf.decode_regions): Python
    floats as constants (`specialized_floats`), and no duck sizing: equal sizes at the first call (rows and
    width, or rows and the head size: 64 for Qwen2.5-0.5B) would otherwise share a symbol and be specialized
    together. Inductor's mix-order reductions (a norm's backward, fused) skip their size heuristic, whose
    guard (`rows * width * hidden >= 5 * 2**20`) compiled the layers again when micro-batches of variable
    response lengths crossed it: a recompile inside a timed GRPO step on the H200 (2026-12-04)."""
    with torch.fx.experimental._config.patch(use_duck_shape=False), specialized_floats(), \
            torch._inductor.config.patch(_inductor_settings()):
        yield


def _inductor_settings() -> dict:
    """Where this torch has the option (2.11 and later do)."""
    triton = torch._inductor.config.triton
    return {"triton.mix_order_reduction_non_strict_mode": True} \
        if hasattr(triton, "mix_order_reduction_non_strict_mode") else {}


def specialized_floats() -> contextlib.AbstractContextManager:
    """Compiles inside the block take Python floats (attention scaling, norm eps) as constants. Under
    dynamic=True torch.compile first makes them symbols, then its tensorify pass gives up on them and restarts
    the whole trace: on a cold H200 that wasted 13 s of the decode step's compile (21 s with warm caches), and
    a restart of every layer compile (benchmarks/results/issue21_h200_20261204b, 2026-12-04)."""
    return torch._dynamo.config.patch(specialize_float=True)

"""The static-cache engine's compiled decode step, one decoder layer at a time (flowrl.engines.hf.static).

Compiling the whole step (model forward and sampling) as one graph cost 44-53 s of inductor on a cold H200 for
the 24 layers of Qwen2.5-0.5B, most of a cold start (benchmarks/results/issue21_h200_20261204b). Here each
decoder layer runs one compiled function, traced and compiled once for all layers (they share their code and
differ in parameters, which torch.compile takes as inputs), and sampling a second one; embeddings, rotary
tables, final norm and lm_head run eagerly. On CUDA the whole step, eager parts included, is still one captured
CUDA graph (flowrl.engines.hf.decode_loop), so the eager parts cost no launches at replay, only the fusion across a
layer's boundary, which single-token decoding hardly has.

Two things keep one graph for every layer, and the eager parts capturable:
- A layer's attention writes its keys and values through `past_key_values.update(..., self.layer_idx)`. Each
  layer gets a `_LayerCache` of its own StaticCache layer instead, which never reads the index: the compiled
  graph neither guards on it nor on which of the cache's layers it writes.
- The attention mask is the 4-D one the step builds (padding and causal over the cache): transformers returns
  a 4-D mask as it is, where building its own would read the padding mask on the host (`mask.all()`), which
  no CUDA graph can capture. Models with sliding-window layers need another mask per layer type: they, and
  models without `get_decoder().layers`, compile the whole step instead (`supports_regions`, `WholeDecodeStep`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from flowrl.engines.train.regional_compile import decoder_layers, layer_compile_settings, specialized_floats


class _LayerCache:
    """What one decoder layer's attention sees of a StaticCache: its own layer, whatever index it names."""

    def __init__(self, layer: Any):
        self.layer = layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer.update(key_states, value_states, *args, **kwargs)


def _layer_call(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return layer._call_impl(*args, **kwargs)


def supports_regions(model: torch.nn.Module) -> bool:
    """Whether every layer attends to the whole cache (one mask for all) and the decoder's layers are found."""
    types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    return bool(decoder_layers(model)) and types == {"full_attention"}


class RegionalDecodeStep:
    """`step(model, cache_kwargs, token_B, position_B, cache_position, mask_BL, done_B, *sample_args)` ->
    `sample(last logits_BV, done_B, *sample_args)`, with the layers and `sample` compiled (or all eager)."""

    def __init__(self, model: torch.nn.Module, sample: Callable[..., tuple[torch.Tensor, ...]], *, compile: bool):
        self.layers = decoder_layers(model)
        self.compile = compile
        self.layer = torch.compile(_layer_call, dynamic=True) if compile else None
        self.sample = torch.compile(sample, dynamic=True) if compile else sample

    def __call__(self, model: torch.nn.Module, cache_kwargs: dict[str, Any], token_B: torch.Tensor,
                 position_B: torch.Tensor, cache_position: torch.Tensor, mask_BL: torch.Tensor,
                 done_B: torch.Tensor, *sample_args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        (cache,) = cache_kwargs.values()
        slots_L = torch.arange(mask_BL.shape[1], device=mask_BL.device)
        mask_B11L = (mask_BL.bool() & (slots_L <= cache_position))[:, None, None, :]  # padding, then causal
        with self._compiled_layers(cache), layer_compile_settings():
            logits_BV = _last_logits(model, cache_kwargs, token_B, position_B, cache_position, mask_B11L)
            return self.sample(logits_BV, done_B, *sample_args)

    @contextlib.contextmanager
    def _compiled_layers(self, cache: Any) -> Iterator[None]:
        """Each layer runs the compiled function with its own cache layer while the block runs; what a layer
        ran before (the train engine's compiled layers, or nothing) is put back after it."""
        if not self.compile:
            yield
            return
        before = [layer._compiled_call_impl for layer in self.layers]
        for layer, cache_layer in zip(self.layers, cache.layers):
            layer._compiled_call_impl = _bound(self.layer, layer, _LayerCache(cache_layer))
        try:
            yield
        finally:
            for layer, previous in zip(self.layers, before):
                layer._compiled_call_impl = previous


class WholeDecodeStep:
    """The same step as one function: the whole model and sampling compiled as one graph (or all eager), with
    transformers' own mask; for the models `supports_regions` turns down."""

    def __init__(self, model: torch.nn.Module, sample: Callable[..., tuple[torch.Tensor, ...]], *, compile: bool):
        self.sample = sample
        self.run = torch.compile(self._run, dynamic=True) if compile else self._run

    def __call__(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with specialized_floats():
            return self.run(*args)

    def _run(self, model: torch.nn.Module, cache_kwargs: dict[str, Any], token_B: torch.Tensor,
             position_B: torch.Tensor, cache_position: torch.Tensor, mask_BL: torch.Tensor, done_B: torch.Tensor,
             *sample_args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.sample(_last_logits(model, cache_kwargs, token_B, position_B, cache_position, mask_BL), done_B,
                           *sample_args)


def _last_logits(model: torch.nn.Module, cache_kwargs: dict[str, Any], token_B: torch.Tensor, position_B: torch.Tensor,
                 cache_position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The logits of each row's newest token, fed at `position_B` into the cache's `cache_position` slot."""
    return model(input_ids=token_B[:, None], attention_mask=mask, position_ids=position_B[:, None],
                 cache_position=cache_position, use_cache=True, **cache_kwargs).logits[:, -1]


def _bound(compiled: Callable[..., Any], layer: torch.nn.Module, cache: _LayerCache) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        # the layer's cache argument, under the name this transformers passes (`cache` from 5.2x)
        name = "cache" if "cache" in kwargs else "past_key_values"
        return compiled(layer, *args, **{**kwargs, name: cache})
    return call

"""An entry at its whole shape holding only the block a rollout rank keeps: what the reshard hands vLLM's loaders.

vLLM's weight loaders take each Hugging Face entry at its whole shape and `narrow` it to the block their tensor
rank keeps (column- and row-parallel linears, packed qkv and gate_up, the padded vocabulary: tests/
vllm_tp_reference.py transcribes them); `narrow` is the only thing they do with it beyond reading its shape.
`KeptBlock` is a tensor subclass with the entry's shape, dtype and device and no storage of its own: `narrow` of
exactly the kept block returns the block (the rows or columns that arrived), and any other operation that reads
data is refused with one line naming the entry. So no rank allocates a tensor it does not keep, on the GPU as
on the CPU (the entry held whole before, `torch.empty` of its full shape: CPU pages stay unresident until
written, but CUDA's caching allocator reserves them all), and a loader that narrows another block than the plan
(flowrl.engines.weights.reshard_plan.kept_box) says so instead of loading stale rows.
"""

from __future__ import annotations

from typing import Any

import torch

from flowrl.engines.weights.reshard_plan import Box

NARROW = {torch.Tensor.narrow, torch.narrow}


class KeptBlockError(RuntimeError):
    """A loader read an entry otherwise than by narrowing it to the block this rank keeps."""


class KeptBlock(torch.Tensor):
    """`block` (entry `entry`'s rows or columns [box.start, box.stop) along box.dim) standing for a tensor of
    `shape`."""

    entry: str
    block: torch.Tensor
    box: Box

    @staticmethod
    def __new__(cls, entry: str, block: torch.Tensor, shape: tuple[int, ...], box: Box):
        view = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=block.dtype, device=block.device)
        view.entry, view.block, view.box = entry, block, box
        return view

    def __repr__(self) -> str:  # noqa: D105 (no data to print: the default repr would read it)
        return f"KeptBlock({self.entry}, shape={tuple(self.shape)}, kept {self.box})"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in NARROW:
            return narrow(*args, **kwargs)
        # shape, dtype and device are the wrapper's own; anything reading data goes on to __torch_dispatch__
        return super().__torch_function__(func, types, args, kwargs)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        flat = [*args, *(kwargs or {}).values()]
        names = [a.entry for a in [*flat, *(b for a in flat if isinstance(a, (list, tuple)) for b in a)]
                 if isinstance(a, KeptBlock)]
        raise KeptBlockError(f"weight sync: {func} read {', '.join(names)}, of which this rank holds only the block "
                             f"it keeps (vLLM's loaders narrow to it; flowrl.engines.weights.kept_block)")


def narrow(tensor: KeptBlock, dim: int, start: int | torch.Tensor, length: int) -> torch.Tensor:
    """The kept block, where (dim, start, length) is exactly it; else one line naming the entry and both blocks."""
    start, dim, box = int(start), dim % tensor.dim(), tensor.box
    if (dim, start, start + length) == (box.dim, box.start, box.stop):
        return tensor.block
    raise KeptBlockError(f"weight sync: vLLM's loader narrowed {tensor.entry} to [{start}, {start + length}) along "
                         f"dim {dim}; this rank keeps [{box.start}, {box.stop}) along dim {box.dim} "
                         f"(flowrl.engines.weights.reshard_plan.kept_box disagrees with vLLM's loader here)")

"""The resharding plan: which rows (and columns) of each parameter every train rank sends to every rollout rank.

Pure functions over shapes, no torch.distributed (the executor: flowrl.engines.weights.reshard).

- Source: FSDP2's placement of every parameter, `Shard(0)` over the train mesh of `num_train` ranks: rank r
  holds rows [r c, (r + 1) c) of a tensor of d rows, c = ceil(d / num_train) (torch.chunk's split, the last
  ranks possibly short or empty: `fsdp_rows`).
- Destination: the rollout layout, `tp` ranks per vLLM engine times `dp` replicas (rollout rank q is tensor
  rank q % tp of replica q // tp). What a tensor rank keeps of each Hugging Face entry is a `Box` (rows or
  columns) transcribed from vLLM's loaders (`kept_box`): column-parallel (q/k/v_proj and gate/up_proj,
  packed by vLLM into qkv_proj and gate_up_proj) keep a block of output rows, k/v of a GQA model with fewer
  key-value heads than `tp` keep the one head their rank shares; row-parallel (o_proj, down_proj) keep a
  block of input columns; the vocabulary (embed_tokens, lm_head) is padded to a multiple of `vocab_pad`
  (vLLM's 64) and split evenly, so a rank keeps its padded block's real rows (the last ranks fewer, or none);
  everything else (norms, a row-parallel bias) is kept whole.
- `plan_param` crosses the two: one `Piece` per (src, dst) pair whose boxes meet, the rectangle to move.
  A rank that is both (a colocated pool) copies its own piece in place.

`sync_bytes` counts what every rank sends and receives; `gather_bytes` what today's path (FSDP2 all-gather,
then train rank 0's broadcast to a split pool) moves, for the same parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

VOCAB_PAD = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py)
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # vLLM: QKVParallelLinear, MergedColumnParallel
ROW = ("o_proj", "down_proj")  # vLLM: RowParallelLinear (input dim split)
VOCAB = ("embed_tokens", "lm_head")  # vLLM: VocabParallelEmbedding, ParallelLMHead
KV = ("k_proj", "v_proj")


@dataclass(frozen=True)
class Layout:
    """The rollout's layout and the model's head counts (the key-value heads decide GQA's replication)."""

    tp: int
    dp: int
    num_heads: int
    num_kv_heads: int
    vocab_pad: int = VOCAB_PAD

    def __post_init__(self) -> None:
        check_layout(self.tp * self.dp, self.tp)
        if self.num_heads % self.tp:
            raise ValueError(f"roles.rollout.tensor_parallel_size={self.tp} must divide the model's "
                             f"{self.num_heads} attention heads")
        if self.num_kv_heads % self.tp and self.tp % self.num_kv_heads:
            raise ValueError(f"roles.rollout.tensor_parallel_size={self.tp} and the model's {self.num_kv_heads} "
                             f"key-value heads: one must divide the other")

    @property
    def ranks(self) -> int:
        return self.tp * self.dp


def check_layout(world: int, tp: int) -> int:
    """The number of data-parallel replicas of a `tp`-rank engine on a pool of `world` ranks; one line if
    `tp` does not divide it."""
    if tp < 1 or world % tp:
        raise ValueError(f"roles.rollout.tensor_parallel_size={tp} must divide the rollout pool's {world} ranks "
                         f"(tensor_parallel_size x data-parallel replicas = ranks)")
    return world // tp


@dataclass(frozen=True)
class Box:
    """Entries [start, stop) along `dim` (0: rows, 1: columns) of a tensor, the other dim whole."""

    dim: int
    start: int
    stop: int


@dataclass(frozen=True)
class Piece:
    """Rows [row0, row1) x columns [col0, col1) of one parameter, from train rank `src` (whose shard starts at
    row `shard0`) to rollout rank `dst` (sync-group ranks); columns (0, 0): every column."""

    src: int
    dst: int
    shard0: int
    row0: int
    row1: int
    col0: int = 0
    col1: int = 0


@dataclass(frozen=True)
class ParamPlan:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kept: tuple[Box, ...]  # by tensor rank
    pieces: tuple[Piece, ...]
    keepers: tuple[int, ...]  # the rollout ranks (sync-group ranks), rollout rank q of tensor rank q % tp

    def box(self, rank: int) -> Box:
        """What sync-group rank `rank` (a rollout rank) keeps."""
        return self.kept[self.keepers.index(rank) % len(self.kept)]

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def numel(self, piece: Piece) -> int:
        inner = math.prod(self.shape[1:])
        if piece.col1 > piece.col0:
            inner = (piece.col1 - piece.col0) * math.prod(self.shape[2:])
        return (piece.row1 - piece.row0) * inner


def fsdp_rows(rows: int, num_train: int) -> list[tuple[int, int]]:
    """FSDP2 Shard(0): rank r's rows [start, stop); ceil-sized chunks, so 10 rows on 4 ranks: 3, 3, 3, 1."""
    chunk = -(-rows // num_train)
    return [(min(r * chunk, rows), min((r + 1) * chunk, rows)) for r in range(num_train)]


def _even(size: int, parts: int, rank: int, what: str) -> tuple[int, int]:
    if size % parts:
        raise ValueError(f"{what}: {size} does not split over tensor_parallel_size={parts}")
    block = size // parts
    return rank * block, (rank + 1) * block


def kept_box(name: str, shape: tuple[int, ...], layout: Layout, tp_rank: int) -> Box:
    """What tensor rank `tp_rank` keeps of entry `name` (a Hugging Face name), as vLLM's loader narrows it."""
    parts = name.split(".")
    module = parts[-2] if len(parts) > 1 else ""
    if layout.tp == 1 or not shape:
        return Box(0, 0, shape[0] if shape else 1)
    if module in VOCAB:
        block = -(-shape[0] // layout.vocab_pad) * layout.vocab_pad // layout.tp  # padded vocab / tp
        return Box(0, min(tp_rank * block, shape[0]), min((tp_rank + 1) * block, shape[0]))
    if module in KV and layout.num_kv_heads < layout.tp:  # GQA: tp / kv ranks share one head
        head = shape[0] // layout.num_kv_heads
        share = layout.tp // layout.num_kv_heads
        return Box(0, tp_rank // share * head, (tp_rank // share + 1) * head)
    if module in COLUMN:
        return Box(0, *_even(shape[0], layout.tp, tp_rank, name))
    if module in ROW and len(shape) == 2:
        return Box(1, *_even(shape[1], layout.tp, tp_rank, name))
    return Box(0, 0, shape[0])


def plan_param(name: str, shape: tuple[int, ...], dtype: torch.dtype, layout: Layout, src_ranks: list[int],
               dst_ranks: list[int]) -> ParamPlan:
    """Every (train rank, rollout rank) piece of one entry; `src_ranks[i]` holds FSDP2 shard i, `dst_ranks[q]`
    is rollout rank q (its tensor rank q % tp)."""
    rows = shape[0] if shape else 1
    kept = tuple(kept_box(name, shape, layout, t) for t in range(layout.tp))
    pieces = []
    for dst_index, dst in enumerate(dst_ranks):
        box = kept[dst_index % layout.tp]
        want = (box.start, box.stop) if box.dim == 0 else (0, rows)
        cols = (box.start, box.stop) if box.dim == 1 else (0, 0)
        for src, (start, stop) in zip(src_ranks, fsdp_rows(rows, len(src_ranks))):
            row0, row1 = max(start, want[0]), min(stop, want[1])
            if row0 < row1 and (cols[0] < cols[1] or box.dim == 0):
                pieces.append(Piece(src, dst, start, row0, row1, *cols))
    return ParamPlan(name, tuple(shape), dtype, kept, tuple(pieces), tuple(dst_ranks))


def plan(entries: Iterable[tuple[str, tuple[int, ...], torch.dtype]], layout: Layout, src_ranks: list[int],
         dst_ranks: list[int]) -> list[ParamPlan]:
    """`plan_param` for each (name, shape, dtype), in order."""
    if len(dst_ranks) != layout.ranks:
        raise ValueError(f"the rollout layout has {layout.ranks} ranks, the rollout pool {len(dst_ranks)}")
    return [plan_param(name, shape, dtype, layout, src_ranks, dst_ranks) for name, shape, dtype in entries]


def bucketed(plans: list[ParamPlan], bucket_bytes: int) -> Iterator[list[ParamPlan]]:
    """Consecutive plans grouped so that no rank's send and receive buffers together pass `bucket_bytes` in
    one (a larger parameter goes alone)."""
    bucket: list[ParamPlan] = []
    load: dict[int, int] = {}
    for one in plans:
        mine: dict[int, int] = {}
        for p in one.pieces:  # a piece to itself is copied in place, no buffer
            for rank in {p.src, p.dst} if p.src != p.dst else ():
                mine[rank] = mine.get(rank, 0) + one.numel(p) * one.itemsize
        if bucket and any(load.get(r, 0) + b > bucket_bytes for r, b in mine.items()):
            yield bucket
            bucket, load = [], {}
        bucket.append(one)
        for rank, size in mine.items():
            load[rank] = load.get(rank, 0) + size
    if bucket:
        yield bucket


def sync_bytes(plans: list[ParamPlan], rank: int) -> tuple[int, int]:
    """(bytes sent, bytes received) by sync-group rank `rank`; a piece to itself moves nothing."""
    sent = received = 0
    for one in plans:
        for p in one.pieces:
            if p.src != p.dst:
                size = one.numel(p) * one.itemsize
                sent += size if p.src == rank else 0
                received += size if p.dst == rank else 0
    return sent, received


def gather_bytes(plans: list[ParamPlan], num_train: int, num_split_rollout: int = 0) -> tuple[int, int]:
    """Today's path per train rank: (sent, received) of a ring all-gather of every entry ((n - 1) / n of it each
    way), and, for a split pool of `num_split_rollout` ranks, train rank 0's broadcast of each whole entry
    to every one of them (each receives the whole model)."""
    total = sum(math.prod(p.shape) * p.itemsize for p in plans)
    ring = total * (num_train - 1) // num_train
    return ring + total * num_split_rollout, ring

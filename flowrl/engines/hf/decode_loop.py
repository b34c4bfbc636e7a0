"""The decode steps of one rollout shape: static buffers each step updates in place, and on CUDA one captured
CUDA graph of the step, replayed once per token.

A step reads the newest token, its position and the cache slot from buffers, runs the (compiled) model
forward and sampling, and writes the sampled token, its logprob and the rows' done flags back, the token and
logprob also into column `t` of the output buffers. Because every input and output of a step lives at a fixed
address, the whole step, bookkeeping included, is one `torch.cuda.CUDAGraph`: a replay costs a few
microseconds of CPU, where torch.compile's own CUDA graphs (mode="reduce-overhead") check guards and input
addresses on every call; for a 0.5B model decoding 512 rows on an H200 a token step went from 5.3 to 4.7 ms
(docs/benchmarks.md). The graph reads the model's parameters where they are, so optimizer steps and in-place
weight syncs reach it; a loop whose parameters moved (a new state dict assigned, an FSDP reshard) warms up
and captures again. Sampling randomness comes from torch's generator through CUDA graphs' per-replay
offsets, so seeded calls repeat.

Each row may carry a last column (`eos_at_B`, relative to the loop's column 0): a row still running there gets
eos as that token, with logprob 0 (benchmarks draw response lengths so).

On the CPU, or with compile off, the same step runs eagerly with the same buffers.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

WARMUP_STEPS = 3  # eager (compiled) steps before capture: compilation, cuBLAS workspaces, autotuning

Step = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class DecodeLoop:
    """Buffers (and on CUDA the graph) for `rows` rows, a `length`-token cache and `new_tokens` outputs."""

    def __init__(self, model: torch.nn.Module, cache_kwargs: dict[str, Any], step: Step, *, rows: int,
                 length: int, new_tokens: int, sample_args: tuple, eos_id: int, graph: bool,
                 pool: tuple[int, int] | None = None):
        device = next(model.parameters()).device
        self.model, self.cache_kwargs, self._step_fn, self.sample_args = model, cache_kwargs, step, sample_args
        self.rows, self.eos_id = rows, eos_id
        self.eos_at_B = torch.full((rows,), new_tokens + 1, dtype=torch.long, device=device)
        self.mask_BL = torch.ones(rows, length, dtype=torch.long, device=device)
        self.token_B = torch.zeros(rows, dtype=torch.long, device=device)
        self.position_B = torch.zeros(rows, dtype=torch.long, device=device)
        self.done_B = torch.zeros(rows, dtype=torch.bool, device=device)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.tokens_BR = torch.zeros(rows, new_tokens, dtype=torch.long, device=device)
        self.logprobs_BR = torch.zeros(rows, new_tokens, dtype=torch.float32, device=device)
        self.use_graph = graph and device.type == "cuda"
        self.pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self._warm = 0
        self._addresses: list[int] = []

    def start(self, mask_BL: torch.Tensor, token_B: torch.Tensor, logprob_B: torch.Tensor, done_B: torch.Tensor,
              position_B: torch.Tensor, prompt_len: int, eos_at_B: torch.Tensor | None = None) -> None:
        """Loads the prefill's results: the first sampled token sits in column 0; `eos_at_B`: each row's last
        column + 1 (None: none)."""
        self.mask_BL.copy_(mask_BL)
        if eos_at_B is None:
            self.eos_at_B.fill_(self.tokens_BR.shape[1] + 1)
        else:
            self.eos_at_B.copy_(eos_at_B)
        self.token_B.copy_(token_B)
        self.done_B.copy_(done_B)
        self.position_B.copy_(position_B)
        self.cache_position.fill_(prompt_len - 1)
        self.tokens_BR[:, 0] = token_B
        self.logprobs_BR[:, 0] = logprob_B
        self.column.fill_(1)
        if self.graph is not None and self._addresses != _addresses(self.model):
            # parameters were replaced rather than updated in place: warm up (the compiled step may recompile
            # for them, which must not happen inside a capture) and capture again
            self.graph, self._warm = None, 0

    def step(self) -> None:
        """One token for every row (finished rows get pad)."""
        if self.graph is not None:
            self.graph.replay()
        elif not self.use_graph:
            self._run()
        elif self._warm < WARMUP_STEPS:
            self._warm_up()
        else:
            self._capture()
            self.graph.replay()

    def outputs(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, logprobs) of the first `steps` columns, as new tensors."""
        return self.tokens_BR[:, :steps].clone(), self.logprobs_BR[:, :steps].clone()

    def _run(self) -> None:
        self.position_B.add_(1)
        self.cache_position.add_(1)
        token_B, logprob_B, done_B = self._step_fn(self.model, self.cache_kwargs, self.token_B, self.position_B,
                                                   self.cache_position, self.mask_BL, self.done_B,
                                                   *self.sample_args)
        token_B, logprob_B, done_B = force_eos(self.column, self.eos_at_B, token_B, logprob_B, self.done_B, done_B,
                                               self.eos_id)
        self.token_B.copy_(token_B)
        self.done_B.copy_(done_B)
        self.tokens_BR.index_copy_(1, self.column, token_B[:, None])
        self.logprobs_BR.index_copy_(1, self.column, logprob_B[:, None].float())
        self.column.add_(1)

    def _warm_up(self) -> None:
        """A real step, run on a side stream as CUDA graph capture wants its warm-up runs."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run()
        torch.cuda.current_stream().wait_stream(side)
        self._warm += 1

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._run()
        self.graph, self._addresses = graph, _addresses(self.model)


def force_eos(column: torch.Tensor | int, eos_at_B: torch.Tensor, token_B: torch.Tensor, logprob_B: torch.Tensor,
              was_done_B: torch.Tensor, done_B: torch.Tensor,
              eos_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows still running at column eos_at_B - 1 get eos there (logprob 0: a forced token) and are done."""
    last_B = eos_at_B - 1 <= column
    forced_B = last_B & ~was_done_B
    return (torch.where(forced_B, eos_id, token_B), logprob_B.masked_fill(forced_B, 0.0), done_B | last_B)


def _addresses(model: torch.nn.Module) -> list[int]:
    return [t.data_ptr() for t in (*model.parameters(), *model.buffers())]

"""The cost model: seconds of each kind of node on a candidate layout, from constants measured per device kind.

DEVICES is the table the project ships: one row per GPU kind, each figure from a run on that card
(docs/benchmarks.md, shared PERF_NOTES; `python benchmarks/cost_constants.py` tables every recorded run's
`timing_s/<node>` against what this table predicts for it, docs/cluster.md "Cost constants, measured"):
- memory: usable bytes of one card as torch reports them (H100 80GB: 79.2 GiB; H200: 140.4 GiB);
- train_mfu: model-FLOPs utilisation of a compiled update at large micro-batches (41.1% and 38.8% measured on
  an H200 for the 0.5B shape); `half_mfu_tokens`: tokens per rank per micro-batch at which it is halved. Checked
  on 2026-12-06 against every recorded update (benchmarks/results/issue21_h200_20261204{b..f}/*runs*.jsonl,
  verl_h{100,200}_20261206/runs_A.jsonl): measured over predicted 1.00 at the median, so both stay;
- prefill_mfu: a no-grad forward over whole rows (a prefill, and the forward nodes: old and reference
  logprobs) at 55%, from the recorded runs' `timing_s/ref.logprobs` (0.37-0.41 s for 512 rows of 128 + 256
  tokens, 0.31-0.32 s for 128 rows of 128 + 1024, 1.27 s for 512 rows of 128 + 1024; the same files): the median
  over all of them is 0.54, over the fixed-length ones, whose tokens the planner counts exactly, 0.53;
- decode step overheads: hf_static's captured loop attends over its whole static cache every step (prompt +
  max_new_tokens slots a row, read at HBM bandwidth with the weights) and costs `hf_static_step_s` (1.8 ms) a
  step plus `hf_static_row_s` (4 us) a row beyond those reads. Its recorded generates (the 0.5B shape, 128 prompt
  tokens; issue21_h200_20261204{b..f}, verl_h{100,200}_20261206) took 2.5-3.1 ms a decode step at 128 rows
  (256 or 1024 new tokens), 4.8-5.3 ms at 512 rows of 256 and 6.7 ms at 512 rows of 1024. A constant a step
  alone cannot fit both: the 4 ms shipped before over-predicted the 128-row runs by 40-80%, and one fitted to
  them (2.6 ms) under-predicts the 512-row ones by 20-43%; these two figures put all 25 (those
  benchmarks/cost_constants.py does not mark as disturbed) within 15%, and the planner runs' steps (16 x 8 rows
  of 4 + 1024 tokens: 4.24 s on an H200, verl_h200_20261206/planner_0.5B.log; 4.46 s on an H100,
  docs/benchmarks.md "H100 try, 2026-12-06") within 1%;
  vLLM with CUDA graphs took 10.6 s a step where hf_static took 9.2 s (1.5B, 1024 long-tailed tokens) and 24.9 s
  eager (the issue 43 audit, one H100, a27447d): 14.3 s more over about 1024 decode steps is 14 ms a decode step
  more without graphs, `vllm_eager_step_s` - `vllm_step_s`. The recorded vLLM runs do not pin them: at 128
  concurrent rows (issue21_h200_20261204f/call8_runs.jsonl) the graphs' generate is within 13% of `vllm_step_s`;
  at 512 (max_num_seqs=512, never a planner candidate) vLLM's per-request Python costs 2-3x more than the model
  says, and varied 1.6x between calls of one layout; one eager run (verl_h100_20261206/runs_G_inproc.jsonl,
  0.5B, 256 concurrent) took 7.8 s where 10.6 s is predicted. Both stay;
- vLLM's CUDA graph pool: 0.39 GiB for its default 51 capture sizes (max_num_seqs 256) on the 0.5B shape's 24
  layers, 0.18 GiB for 19 sizes (max_num_seqs 64) (vLLM 0.26 on an H200, FULL_AND_PIECEWISE graphs: "Graph
  capturing finished ... took 0.39 GiB" in benchmarks/results/issue21_h200_20261204e/call2_vllm_fixed_profiled.log
  and call2_sync_direct.log): about 0.33 MiB per capture size and layer, `vllm_graph_mib`;
- weight sync into an in-process vLLM: vLLM's `reload_weights` call took 0.06-0.21 s (median 0.10 s) for the
  0.5B shape's 0.99 GB, `sync_gbs` 10 GB/s, and the prefix-cache reset 0.008-0.013 s, `sync_fixed_s` 0.015 s
  (`timing_s/sync_reload`, `sync_reset_cache`: issue21_h200_20261204e/call6_runs.jsonl,
  issue21_h200_20261204f/call4_runs.jsonl and call8_runs.jsonl, verl_h100_20261206/runs_G_inproc.jsonl); the
  wake of sleep level 1, 0.03-0.04 s, is the 2 GB over PCIe the model adds; sleep level 1 frees 42 GiB in 0.9 s
  and wakes in 0.09 s; PCIe, NVLink and InfiniBand bandwidths as usually reached;
- a step's own overhead beyond its nodes, `step_fixed_s`: 0.004-0.021 s in every recorded run (median 0.013 s);
  the driver's nodes (the reward's scoring, which detokenizes the responses, and the advantages), `driver_row_s`:
  0.04-0.26 s for 512 rows and 0.011-0.12 s for 128 (it grows with the responses' tokens, about 0.7 us a token
  there), 0.1 ms a row in the table.
An H100 row shares the H200's compute figures (same SM count and clocks) with its own memory and bandwidth: the
H100's recorded runs (verl_h100_20261206/runs_A.jsonl: generate 1.35 s, reference 0.39 s, update 1.50 s against
the H200's 1.30-1.33, 0.37-0.41 and 1.44-1.64 s on the same work; and the planner run's 4.46 s) agree with them
within 5%, the generate's difference being the H100's slower HBM, which the model reads. The A100 and L40S rows
are not measured: they keep their own decode overheads and take the measured rest.
The CPU row is nominal, not measured (the CPU runs of the tests and of benchmarks/planner_one_gpu.py --tiny):
it has no CUDA graphs and no vLLM sleep mode, so a plan for it never picks them; its overhead is a Python
process with torch loaded (the tiny shapes of benchmarks/planner_one_gpu.py --device cpu peaked at 0.47 GiB
resident); refine its costs with a run's own steps (`flowrl plan --costs RUN/plan.json`).

`CostModel.refine` scales each kind of node by what a run's own first steps measured (`timing_s/<node>`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

GIB = 2**30


@dataclass(frozen=True)
class DeviceKind:
    memory_gib: float  # usable memory of one card
    peak_tflops: float  # dense bf16 tensor-core peak
    hbm_gbs: float  # memory bandwidth, GB/s
    train_mfu: float = 0.40
    half_mfu_tokens: int = 1024  # tokens per rank and micro-batch at which the MFU is halved
    prefill_mfu: float = 0.55  # a no-grad forward over whole rows: a prefill, old and reference logprobs
    hf_static_step_s: float = 0.0018  # per decode step, beyond the reads (the captured loop's launches etc.)
    hf_static_row_s: float = 4e-6  # and per row of that step (sampling over the vocabulary, the row's kernels)
    vllm_step_s: float = 0.0060  # the same for vLLM with CUDA graphs
    vllm_eager_step_s: float = 0.0200  # and for eager vLLM (enforce_eager: no CUDA graphs)
    vllm_graph_mib: float = 0.33  # vLLM's CUDA graph pool, MiB per capture size and decoder layer
    cuda: bool = True  # CUDA graphs and vLLM's sleep mode exist (not on the CPU)
    overhead_gib: float = 2.0  # per device beside the engines: CUDA context, NCCL, the allocator's fragmentation
    sync_gbs: float = 10.0  # an in-process weight sync into vLLM (bucketed), GB/s
    sync_fixed_s: float = 0.015
    pcie_gbs: float = 25.0  # host <-> device copies (offload, sleep level 1)
    nvlink_gbs: float = 300.0  # a collective's bandwidth inside a node
    network_gbs: float = 25.0  # across nodes (InfiniBand, one NIC a GPU)
    cpu_adam_gparams_s: float = 1.0  # AdamW on the CPU (FSDP2 offload), billions of parameters a second
    driver_row_s: float = 1e-4  # the driver's nodes (score, advantages) per row
    step_fixed_s: float = 0.015  # a step's own overhead (batching, metrics)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def overhead_bytes(self) -> int:
        return int(self.overhead_gib * GIB)


DEVICES: dict[str, DeviceKind] = {
    "H100-80G": DeviceKind(memory_gib=79.2, peak_tflops=989.0, hbm_gbs=3350.0),
    "H200-141G": DeviceKind(memory_gib=140.4, peak_tflops=989.0, hbm_gbs=4800.0, pcie_gbs=50.0),
    "A100-80G": DeviceKind(memory_gib=79.2, peak_tflops=312.0, hbm_gbs=2039.0, nvlink_gbs=200.0,
                           hf_static_step_s=0.006, vllm_step_s=0.008, vllm_eager_step_s=0.025),
    "A100-40G": DeviceKind(memory_gib=39.4, peak_tflops=312.0, hbm_gbs=1555.0, nvlink_gbs=200.0,
                           hf_static_step_s=0.006, vllm_step_s=0.008, vllm_eager_step_s=0.025),
    "L40S-48G": DeviceKind(memory_gib=44.4, peak_tflops=362.0, hbm_gbs=864.0, nvlink_gbs=25.0,
                           hf_static_step_s=0.006, vllm_step_s=0.008, vllm_eager_step_s=0.025),
    "CPU": DeviceKind(memory_gib=32.0, peak_tflops=0.5, hbm_gbs=20.0, train_mfu=0.3, prefill_mfu=0.3,
                      hf_static_step_s=0.002, vllm_step_s=0.002, vllm_eager_step_s=0.002, sync_gbs=5.0,
                      pcie_gbs=20.0, nvlink_gbs=5.0, network_gbs=1.0, cuda=False, overhead_gib=0.45),
}

CATEGORIES = ("generate", "forward", "update", "sync", "driver")


@dataclass(frozen=True)
class CostModel:
    """Node costs on one device kind; `scale` multiplies a category's prediction (refined from a run)."""

    device: DeviceKind
    scale: tuple[tuple[str, float], ...] = ()
    fixed_s: float | None = None  # a step's own overhead where a run measured it (else the device row's)

    @property
    def step_fixed_s(self) -> float:
        return self.device.step_fixed_s if self.fixed_s is None else self.fixed_s

    def scaled(self, category: str, seconds: float) -> float:
        return seconds * dict(self.scale).get(category, 1.0)

    def refine(self, predicted: dict[str, float], measured: list[dict[str, float]],
               categories: dict[str, str]) -> "CostModel":
        """Each category scaled by the median over a run's steps (its first left out, it compiles) of measured
        over predicted seconds of its nodes (`timing_s/<node>`); `categories` maps node names to categories."""
        steps = measured[1:] or measured
        ratios: dict[str, list[float]] = {}
        for name, category in categories.items():
            seen = [row[f"timing_s/{name}"] for row in steps if f"timing_s/{name}" in row]
            if seen and predicted.get(name, 0) > 0:
                ratios.setdefault(category, []).append(statistics.median(seen) / predicted[name])
        scale = dict(self.scale)
        for category, values in ratios.items():
            scale[category] = scale.get(category, 1.0) * statistics.median(values)
        return replace(self, scale=tuple(sorted(scale.items())))

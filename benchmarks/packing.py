"""Padded vs packed sequences, row vs token-budget micro-batches: logprob and update time and peak memory, side by
side in one process on the same batches (issue 26).

    python benchmarks/packing.py                        # CUDA: Qwen2.5-0.5B shape, bf16, 1024 and 4096 new tokens
    python benchmarks/packing.py --device cpu --tiny    # a smoke run, well under a minute

Workloads, per cap on new tokens (--new-tokens, with --rows rows each): "fixed", every response at the cap, and
"long_tail", response lengths drawn from a log-normal with median a quarter of the cap (--sigma), capped at it
(forced_lengths.draw_lengths: the same draws for every variant). Prompts are --prompt-len tokens.

Variants, one train engine (flowrl.engines.train.hf_engine) switched between them:
- padded: rows left/right padded, --micro-batch-size rows per update micro-batch and --forward-micro-batch-size
  per no-grad one, rows grouped by length and each micro-batch trimmed to its longest row (the engine's default);
- padded+budget: the same, micro-batches by token budget (rows x longest row) instead of by row count;
- packed: each row micro-batch's rows as one sequence (flowrl.engines.train.packing; FlexAttention on CUDA);
- packed+budget: packed micro-batches of at most the budget in real tokens, Karmarkar-Karp balanced.
The budgets are what a row micro-batch holds at full length: micro-batch size x (prompt + cap), so no variant may
hold more tokens in one pass than padded does. On "fixed" the budget variants group rows exactly as their row
variants do, so they are left out there.

Per workload and variant one JSON line as it goes: logprob_s (engine.forward), update_s (engine.update: forward,
backward and the AdamW step, one mini-batch of all rows), each after a warm-up call, their peaks
(torch.cuda.max_memory_allocated since the call's start; null on CPU), the micro-batch counts, and the memory
estimate of the engine config (HFTrainConfig.estimate_memory: activations and logits follow the token budget
when set). At the end, each variant's ratios to padded on the same workload.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import QWEN05B, SMALL, make_batch  # noqa: E402
from forced_lengths import draw_lengths  # noqa: E402

from flowrl.engines.hf.configs import HFTrainConfig, HFTrainConfig  # noqa: E402
from flowrl.engines.train.hf_engine import HFTrainEngine  # noqa: E402
from flowrl.engines.memory import GIB, ModelShape, RankLoad  # noqa: E402
from flowrl.rl.ops.aggregate import agg_loss, agg_weight  # noqa: E402

VARIANTS = {"padded": (False, False), "padded+budget": (False, True), "packed": (True, False),
            "packed+budget": (True, True)}  # (packing, token budget)


class TokenMeanPG:
    """-A * logp, token-mean over the loss mask: the policy-gradient term every PPO-style loss has (LossFn)."""

    reads = ("advantages", "loss_mask")
    needs = ("logprobs",)
    combine = "mean"

    def __call__(self, out, mb):
        loss = agg_loss(-mb["advantages"] * out["logprobs"], mb["loss_mask"], "token-mean")
        return loss, {"pg_loss": loss.detach()}

    def weight(self, mb):
        return agg_weight(mb["loss_mask"], "token-mean")


def build_engine(args) -> tuple[HFTrainEngine, ModelShape]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = SMALL if args.tiny else QWEN05B
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    config = Qwen2Config(**shape, max_position_embeddings=args.prompt_len + max(args.new_tokens),
                         tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(config).to(dtype)
    options = HFTrainConfig(lr=1e-6, compile=args.compile, logprob_chunk_tokens=args.logprob_chunk_tokens)
    engine = HFTrainEngine(model, options, kind="actor", device=args.device)
    return engine, ModelShape.from_config(config.to_dict(), 2 if dtype == torch.bfloat16 else 4)


def workload_batch(rows: int, prompt_len: int, lengths: list[int], vocab: int):
    """Random prompts and responses, response i `lengths[i]` tokens long (right padded), one advantage a row."""
    cap = max(lengths)
    batch = make_batch(rows, prompt_len, cap, vocab)
    mask = (torch.arange(cap)[None] < torch.tensor(lengths)[:, None]).long()
    batch["response_mask"] = mask
    batch["response_ids"] = batch["response_ids"] * mask
    batch["advantages"] = batch["advantages"] * mask
    batch["loss_mask"] = mask.clone()
    return batch


def timed(fn, device: str, repeats: int) -> tuple[float, float | None]:
    """(mean seconds of fn() after one warm-up call, peak GiB allocated over the timed calls; None off CUDA)."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / repeats
    return seconds, (torch.cuda.max_memory_allocated() / GIB if device == "cuda" else None)


def run_variant(engine, shape, batch, args, cap: int, packing: bool, budget: bool) -> dict:
    seq_len = args.prompt_len + cap
    update_tokens = args.micro_batch_size * seq_len if budget else 0
    forward_tokens = args.forward_micro_batch_size * seq_len if budget else 0
    engine.packing, engine.max_tokens, engine.forward_max_tokens = packing, update_tokens, forward_tokens
    rows = batch.batch_size[0]
    loss = TokenMeanPG()
    logprob_s, logprob_peak = timed(lambda: engine.forward(batch, micro_batch_size=args.forward_micro_batch_size),
                                    args.device, args.repeats)
    update_s, update_peak = timed(lambda: engine.update(batch, loss, mini_batch_size=rows,
                                                        micro_batch_size=args.micro_batch_size),
                                  args.device, args.repeats)
    config = HFTrainConfig(max_tokens_per_micro_batch=update_tokens, logprob_chunk_tokens=args.logprob_chunk_tokens)
    load = RankLoad(ranks=1, rows=rows, seq_len=seq_len, tokens=args.micro_batch_size * seq_len)
    estimate = config.estimate_memory(shape, load)
    return dict(logprob_s=round(logprob_s, 4), update_s=round(update_s, 4),
                logprob_peak_gib=None if logprob_peak is None else round(logprob_peak, 3),
                update_peak_gib=None if update_peak is None else round(update_peak, 3),
                update_micro_batches=len(engine._micro_batches(batch, args.micro_batch_size, engine.max_tokens)),
                forward_micro_batches=len(engine._micro_batches(batch, args.forward_micro_batch_size,
                                                                engine.forward_max_tokens)),
                estimate_gib=round(sum(estimate.values()) / GIB, 3),
                estimate_activations_gib=round(estimate["activations"] / GIB, 3))


def ratios(results: list[dict]) -> list[dict]:
    """Each variant's figures over padded's on the same workload (below 1: less time or memory)."""
    base = {(r["workload"], r["new_tokens"]): r for r in results if r["variant"] == "padded"}
    out = []
    for r in results:
        ref = base[(r["workload"], r["new_tokens"])]
        if r is ref:
            continue
        entry = dict(workload=r["workload"], new_tokens=r["new_tokens"], variant=r["variant"])
        for key in ("logprob_s", "update_s", "logprob_peak_gib", "update_peak_gib"):
            entry[key] = None if r[key] is None else round(r[key] / ref[key], 3)
        out.append(entry)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="a tiny model of the same architecture and small workloads")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--new-tokens", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="caps on new tokens, comma separated (default 1024,4096; --tiny 64,128)")
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="rows per workload, one per cap (default 64,64; --tiny 16,8)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 256; --tiny 16)")
    p.add_argument("--micro-batch-size", type=int, default=None, help="rows per update micro-batch (default 4)")
    p.add_argument("--forward-micro-batch-size", type=int, default=None, help="rows per no-grad pass (default 16)")
    p.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of the long-tailed lengths")
    p.add_argument("--repeats", type=int, default=2, help="timed calls after the warm-up one")
    p.add_argument("--logprob-chunk-tokens", type=int, default=4096)
    p.add_argument("--compile", action="store_true", help="the engine's torch.compile'd passes (actor.compile)")
    args = p.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.new_tokens = args.new_tokens or ([64, 128] if args.tiny else [1024, 4096])
    args.rows = args.rows or ([16, 8] if args.tiny else [64, 64])
    args.prompt_len = args.prompt_len or (16 if args.tiny else 256)
    args.micro_batch_size = args.micro_batch_size or 4
    args.forward_micro_batch_size = args.forward_micro_batch_size or 16
    if len(args.rows) != len(args.new_tokens):
        p.error(f"--rows: one count per cap of --new-tokens {args.new_tokens}, got {args.rows}")
    engine, shape = build_engine(args)
    print(json.dumps(dict(setup=dict(vars(args)), params_m=round(sum(t.numel() for t in engine.model.parameters())
                                                                 / 1e6, 1),
                          device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu")), flush=True)
    results = []
    for cap, rows in zip(args.new_tokens, args.rows):
        for workload in ("fixed", "long_tail"):
            lengths = [cap] * rows if workload == "fixed" else draw_lengths(rows, cap, args.sigma, seed=cap)
            batch = workload_batch(rows, args.prompt_len, lengths, shape.vocab_size)
            for variant, (packing, budget) in VARIANTS.items():
                if workload == "fixed" and budget:
                    continue  # rows of one length: the budget groups them as the row count does
                record = dict(workload=workload, new_tokens=cap, variant=variant, rows=rows,
                              response_tokens=sum(lengths), padded_response_tokens=rows * cap,
                              **run_variant(engine, shape, batch, args, cap, packing, budget))
                results.append(record)
                print(json.dumps(record), flush=True)
    print(json.dumps(dict(ratios_to_padded=ratios(results))), flush=True)


if __name__ == "__main__":
    main()

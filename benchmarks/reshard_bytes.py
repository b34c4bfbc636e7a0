"""Bytes each rank moves per weight sync: today's path (FSDP2 all-gather of every entry, then for a split pool
train rank 0's broadcast of each whole entry) against the resharding plan (flowrl.engines.weights.reshard_plan), for
the Qwen2.5-0.5B and -1.5B shapes (built on the meta device: no download, no memory).

The plan's counts are what the executor moves: tests/test_reshard.py asserts, on gloo ranks, that each rank's
measured bytes (reshard_exec.Moved) equal `sync_bytes` of its plan.

    python benchmarks/reshard_bytes.py
"""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from flowrl.engines.weights.reshard_plan import Layout, gather_bytes, plan, sync_bytes

SHAPES = {  # Qwen2.5's published configs
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}
GB = 1e9


def entries(shape: dict) -> list:
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**shape, torch_dtype=torch.bfloat16)).to(torch.bfloat16)
    return [(n, tuple(t.shape), t.dtype) for n, t in model.state_dict().items()]  # lm_head too, as streamed


def row(name: str, shape: dict, train: int, tp: int, dp: int, split: bool) -> str:
    layout = Layout(tp, dp, shape["num_attention_heads"], shape["num_key_value_heads"])
    src = list(range(train))
    dst = list(range(train, train + tp * dp)) if split else src
    plans = plan(entries(shape), layout, src, dst)
    new = [sync_bytes(plans, r) for r in sorted({*src, *dst})]
    old_train = gather_bytes(plans, train, len(dst) if split else 0)
    whole = sum(torch.Size(p.shape).numel() * p.itemsize for p in plans)
    old_max_in = whole if split else old_train[1]  # a split rollout rank receives the whole model
    new_max_in = max(r for _, r in new)
    new_max_out = max(s for s, _ in new)
    where = f"{train} train -> {tp * dp} rollout" if split else f"{train} colocated"
    return (f"| {name} | {where} | TP{tp} x DP{dp} | {old_max_in / GB:.3f} | {new_max_in / GB:.3f} | "
            f"{old_max_in / max(new_max_in, 1):.2f}x | {old_train[0] / GB:.3f} | {new_max_out / GB:.3f} |")


def main() -> None:
    print("| shape | pools | rollout | today: max GB received per rank | reshard: max GB received | ratio | "
          "today: max GB sent | reshard: max GB sent |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        for train, tp, dp, split in [(4, 1, 4, False), (4, 2, 2, False), (4, 4, 1, False), (4, 2, 2, True),
                                     (4, 4, 1, True)]:
            if shape["num_attention_heads"] % tp:
                continue  # 14 heads do not split over 4 (vLLM refuses it too)
            print(row(name, shape, train, tp, dp, split))


if __name__ == "__main__":
    main()

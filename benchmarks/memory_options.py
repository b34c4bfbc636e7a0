"""Peak memory of one train step (forward, backward, optimizer step) and of a sharded checkpoint save, per option:
full fine-tuning, actor.offload_params, actor.offload_optimizer, LoRA.

    python benchmarks/memory_options.py [--device cuda] [--ranks 2] [--hidden-size 1024] [--layers 12]

Each option runs in fresh processes (`--ranks` of them, gloo on CPU, NCCL on CUDA with one GPU per rank),
so peaks do not carry over. Reported per rank 0: on CUDA torch.cuda.max_memory_allocated, on CPU the
peak resident set (ru_maxrss, which includes the Python process and its libraries: compare differences).
On CPU, offload moves nothing (the device is the CPU): its rows show what it costs, not what it saves.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from common import make_batch  # noqa: E402

from flowrl.engines.configs import ModelSource  # noqa: E402
from flowrl.engines.hf.configs import HFTrainConfig  # noqa: E402
from flowrl.engines.models.tiny_model import build_tiny_model  # noqa: E402
from flowrl.rl.losses import ppo_loss  # noqa: E402

OPTIONS = {"full": {}, "offload_params": {"offload_params": True}, "offload_optimizer": {"offload_optimizer": True},
           "lora r=16": {"lora_rank": 16, "lora_alpha": 32.0}}
GIB = 2**30


def peak_gib(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # KiB on Linux


def worker(rank: int, args: argparse.Namespace, options: dict, model: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    if args.ranks > 1:
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=args.ranks)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // args.ranks))
    import warnings
    warnings.simplefilter("ignore")
    engine = HFTrainConfig(lr=1e-5, **options).build(ModelSource(Path(model), args.dtype), head="actor",
                                                    device=args.device)
    batch = make_batch(args.rows // args.ranks, args.prompt_len, args.response_len, 12)  # the char vocabulary
    batch["old_logprobs"] = torch.zeros(batch["response_mask"].shape)
    batch["loss_mask"] = batch["response_mask"].clone()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.update(batch, ppo_loss(), mini_batch_size=args.rows, micro_batch_size=args.micro_batch_size)
    step_s = (time.perf_counter() - start) / args.steps
    train_peak = peak_gib(args.device)
    start = time.perf_counter()
    engine.save(os.path.join(out, "ckpt"))
    save_s = time.perf_counter() - start
    size = sum(f.stat().st_size for f in Path(out, "ckpt").iterdir()) / GIB
    if rank == 0:
        print(f"{args.label}\t{train_peak:.3f}\t{peak_gib(args.device):.3f}\t{step_s:.2f}\t{save_s:.2f}\t{size:.4f}",
              flush=True)
    if args.ranks > 1:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--ranks", type=int, default=2, help="processes (FSDP2 shards over them; offload_params "
                                                             "needs 2 or more off the CPU)")
    parser.add_argument("--hidden-size", type=int, default=512, help="width of the built model")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the built model")
    parser.add_argument("--model", help="a Hugging Face model folder instead of the built one")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--port", type=int, default=29533)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = args.model or str(build_tiny_model(Path(folder) / "m", hidden_size=args.hidden_size,
                                                   num_layers=args.layers, num_heads=max(1, args.hidden_size // 64),
                                                   max_position_embeddings=args.prompt_len + args.response_len))
        params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(model)
                     .parameters()) / 1e6
        print(f"# {params:.1f}M parameters, {args.ranks} rank(s) on {args.device}, {args.dtype}; peaks of rank 0")
        print("option\tpeak_GiB_step\tpeak_GiB_save\ts/step\ts_save\tcheckpoint_GiB")
        for label, options in OPTIONS.items():
            args.label = label
            out = tempfile.mkdtemp(dir=folder)
            mp.start_processes(worker, args=(args, options, model, out), nprocs=args.ranks, start_method="spawn")
            args.port += 1


if __name__ == "__main__":
    main()

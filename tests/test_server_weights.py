"""vLLM's NCCL weight transfer into vllm_server replicas (flowrl.engines.vllm.server_weights), everything of it that
runs without a GPU: the path chosen by device and its one-line error, the server's argument, the group's rank
arithmetic against vLLM's own formula, the request payloads against vLLM's schemas (the installed vLLM's classes
and vLLM 0.26's, the GPU's, transcribed), the routes the engine posts, and the protocol's two sides over a real
store with a recording trainer and server."""

import dataclasses
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
import torch.distributed as dist

from flowrl.engines.vllm.server import VLLMServerConfig, VLLMServerEngine
from flowrl.engines.vllm.server_weights import (NcclLayout, ServerNcclTransport, init_info, server_args,
                                                transfer_for, update_info)


@dataclasses.dataclass
class InitInfo026:
    """vLLM 0.26's NCCLWeightTransferInitInfo (vllm/distributed/weight_transfer/nccl_common.py), transcribed."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int


@dataclasses.dataclass
class UpdateInfo026:
    """vLLM 0.26's NCCLWeightTransferUpdateInfo (vllm/distributed/weight_transfer/nccl_engine.py), transcribed."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    packed: bool = False
    packed_buffer_size_bytes: int = 1024 * 1024 * 1024
    packed_num_buffers: int = 2


def vllm_worker_rank(dp_rank: int, world_size_per_dp: int, rank_within_dp: int, rank_offset: int) -> int:
    """vLLM 0.26's worker_init_process_group: dp_rank * (TP x PP) + the worker's rank + rank_offset."""
    return dp_rank * world_size_per_dp + rank_within_dp + rank_offset


def test_the_path_by_device_and_nccl_off_cuda_is_one_line():
    assert transfer_for("auto", "cuda") == "nccl" and transfer_for("auto", "cpu") == "file"
    assert transfer_for("file", "cuda") == "file" and transfer_for("nccl", "cuda:0") == "nccl"
    with pytest.raises(ValueError) as err:
        transfer_for("nccl", "cpu")
    assert str(err.value) == ("roles.rollout.weight_transfer=nccl needs CUDA (the rollout runs on cpu); use file or "
                              "auto")
    assert VLLMServerConfig().weight_transfer == "auto"


def test_the_server_argument_parses_as_vllms_weight_transfer_config():
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert server_args("file") == []
    parsed = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(["--model", "m", *server_args("nccl")])
    assert parsed.weight_transfer_config.backend == "nccl"


def test_two_replicas_of_two_workers_fill_ranks_1_to_4_after_the_trainer():
    layout = NcclLayout(replicas=2, workers=2)
    assert layout.world_size == 5
    ranks = [vllm_worker_rank(0, 2, worker, init_info("h", 1, layout, replica)["rank_offset"])
             for replica in range(2) for worker in range(2)]
    assert ranks == [1, 2, 3, 4]  # each server's own vLLM has one data-parallel rank (0)
    assert NcclLayout(1, 1).world_size == 2 and NcclLayout(3, 4).rank_offset(2) == 9
    with pytest.raises(AssertionError):
        layout.rank_offset(2)


def test_payloads_parse_as_vllms_own_request_classes():
    layout = NcclLayout(2, 2)
    info = init_info("10.0.0.1", 29555, layout, 1)
    assert info == {"master_address": "10.0.0.1", "master_port": 29555, "rank_offset": 3, "world_size": 5}
    bucket = update_info([("model.embed_tokens.weight", "bfloat16", [8, 4]), ("lm_head.weight", "float32", [8, 4])])
    assert InitInfo026(**info).rank_offset == 3
    parsed = UpdateInfo026(**bucket)
    assert parsed.packed is False  # vLLM's one-by-one receive: an empty tensor per entry, then a broadcast
    assert [getattr(torch, name) for name in parsed.dtype_names] == [torch.bfloat16, torch.float32]  # as vLLM reads
    vllm_common = pytest.importorskip("vllm.distributed.weight_transfer.nccl_common")
    vllm_engine = pytest.importorskip("vllm.distributed.weight_transfer.nccl_engine")
    assert vllm_common.NCCLWeightTransferInitInfo(**info).world_size == 5  # the installed vLLM (0.32 here)
    assert vllm_engine.NCCLWeightTransferUpdateInfo(**bucket).shapes == [[8, 4], [8, 4]]


class Recorder(BaseHTTPRequestHandler):
    posts: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.posts.append((self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"message": "ok"}')

    def log_message(self, *args):
        pass


def test_the_engine_posts_vllms_routes_with_their_bodies():
    """The routes of vLLM 0.26's dev RLHF router (serve/dev/rlhf/api_router.py): init_info and update_info are
    the body keys it reads; start and finish take none."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine = object.__new__(VLLMServerEngine)  # its HTTP side only: no vLLM process
    engine.config, engine.url = VLLMServerConfig(tensor_parallel_size=2), f"http://127.0.0.1:{server.server_port}"
    engine.transfer = "nccl"
    try:
        engine.init_weight_transfer(init_info("h", 7, NcclLayout(1, 2), 0))
        engine.start_weight_update()
        engine.update_weights(update_info([("w", "float32", [2])]))
        engine.finish_weight_update()
    finally:
        server.shutdown()
    assert Recorder.posts == [
        ("/init_weight_transfer_engine", {"init_info": {"master_address": "h", "master_port": 7, "rank_offset": 1,
                                                        "world_size": 3}}),
        ("/start_weight_update", {}),
        ("/update_weights", {"update_info": {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}}),
        ("/finish_weight_update", {}), ("/reset_prefix_cache", {})]
    assert engine.nccl_workers == 2
    engine.transfer = "file"
    assert engine.nccl_workers == 0


class FakeTrainer:
    def __init__(self, host, port, world_size, timeout_s):
        self.joined, self.sent = (host, port, world_size), []

    def send(self, bucket):
        self.sent.append([(name, tensor.clone()) for name, tensor in bucket])


class FakeServer:
    def __init__(self):
        self.calls = []

    def init_weight_transfer(self, info):
        self.calls.append(("init", info))

    def start_weight_update(self):
        self.calls.append(("start",))

    def update_weights(self, info):
        self.calls.append(("update", info))

    def finish_weight_update(self):
        self.calls.append(("finish",))


def test_both_sides_meet_over_the_store_bucket_by_bucket():
    """Train rank 0 and two server replicas (tensor parallel 2): the trainer joins a group of 5, each server its
    offset; two syncs of three tensors in buckets of 64 bytes, every server told each bucket's entries in the
    order the trainer sends them, between one start and one finish."""
    timeout = timedelta(seconds=20)
    master = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, timeout=timeout, wait_for_workers=False)
    stores = [master] + [dist.TCPStore("127.0.0.1", master.port, 3, is_master=False, timeout=timeout)
                         for _ in range(2)]  # one client each, as in each rank's process
    layout, servers = NcclLayout(2, 2), [FakeServer(), FakeServer()]
    sides = [ServerNcclTransport(stores[rank], rank, layout, 64, 20.0, trainer=FakeTrainer) for rank in range(3)]
    tensors = [("a", torch.ones(8)), ("b", torch.zeros(4, 2, dtype=torch.bfloat16)), ("c", torch.arange(20.0))]

    def each(rank_call):
        threads = [threading.Thread(target=rank_call, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

    each(lambda r: sides[r].open("127.0.0.1", None if r == 0 else servers[r - 1]))
    stats = []
    for _ in range(2):
        each(lambda r: stats.append(sides[0].send(iter(tensors))) if r == 0 else sides[r].receive_into(servers[r - 1]))
    trainer = sides[0].trainer
    assert trainer.joined[2] == 5 and stats[0] == {"buckets": 2.0, "bytes": 32.0 + 16.0 + 80.0}
    assert [[n for n, _ in b] for b in trainer.sent] == [["a", "b"], ["c"]] * 2  # 32 + 16 bytes, then 80
    for replica, server in enumerate(servers):
        assert server.calls[0] == ("init", init_info("127.0.0.1", trainer.joined[1], layout, replica))
        one_sync = [("start",), ("update", update_info([("a", "float32", [8]), ("b", "bfloat16", [4, 2])])),
                    ("update", update_info([("c", "float32", [20])])), ("finish",)]
        assert server.calls[1:] == one_sync * 2


def test_nccl_asked_where_the_trainer_shares_the_process_warns_and_takes_the_file():
    engine = object.__new__(VLLMServerEngine)
    engine.config, engine.transfer = VLLMServerConfig(weight_transfer="nccl"), "nccl"
    with pytest.warns(UserWarning, match="roles.rollout.weight_transfer=nccl has no effect here"):
        sync = engine.weight_sync(None)
    assert type(sync).__name__ == "StreamedSync"  # VLLMServerEngine.load_weight_stream: the file path

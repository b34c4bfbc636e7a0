"""The reshard's NCCL branch beside its gloo one, on the CPU (issue 44 point 6; the review: docs/cluster.md, "The
reshard on NCCL"): the backend and device each path picks, buffers on the collective's device, and one bucket
protocol (same sends, receives and tags) that NCCL brackets in one coalesced group."""

from datetime import timedelta

import pytest
import torch

from flowrl.engines.weights.buckets import WeightSyncTimeout, backend_for
from flowrl.engines.weights.reshard import Exchange, exchange_bucket, pack_sends, receive_buffers
from flowrl.engines.weights.reshard_plan import Layout, plan_param


def test_each_device_picks_its_backend():
    assert backend_for(torch.device("cpu")) == "gloo" and backend_for(torch.device("cuda", 1)) == "nccl"
    assert Exchange.on("cpu") == Exchange("gloo", False, torch.device("cpu"))
    assert Exchange.on("cuda:0") == Exchange("nccl", True, torch.device("cuda", 0))


def test_buffers_live_on_the_collectives_device():
    """o_proj 4 x 4 on train ranks 0, 1 (rows 0-1, 2-3), TP 2 on the same ranks: rank 0 sends columns 2-3 of its
    2 rows to rank 1 (2 x 2 floats, 16 bytes) and receives columns 0-1 of rows 2-3 from it (16 bytes). Its
    shard is a CPU tensor (an offloaded one); the buffers are on the collective's device ('meta' stands in
    for 'cuda' here: the copy is the same `.to(device)`)."""
    one = plan_param("l.self_attn.o_proj.weight", (4, 4), torch.float32, Layout(2, 1, 2, 2), [0, 1], [0, 1])
    outgoing = {p.dst: [(one, p)] for p in one.pieces if p.src == 0}
    incoming = {p.src: [(one, p)] for p in one.pieces if p.dst == 0 and p.src != 0}
    shard = torch.arange(8.0).view(2, 4)
    meta = torch.device("meta")
    sends, receives = pack_sends(0, outgoing, {one.name: shard}, meta), receive_buffers(incoming, meta)
    assert list(sends) == [1] and sends[1].device == meta and sends[1].numel() == 16  # not the piece to itself
    assert list(receives) == [1] and receives[1].device == meta and receives[1].numel() == 16
    on_cpu = pack_sends(0, outgoing, {one.name: shard}, torch.device("cpu"))[1]
    assert on_cpu.view(torch.float32).tolist() == [2.0, 3.0, 6.0, 7.0]  # rows 0-1, columns 2-3


class Work:
    def __init__(self, log, what, fails=False):
        self.log, self.what, self.fails = log, what, fails

    def wait(self, timeout):
        self.log.append(("wait", self.what, timeout))
        if self.fails:
            raise RuntimeError("Timed out waiting 3000ms for recv operation to complete")


class RecordingGroup:
    """A process group that records what a bucket posts (the calls ProcessGroupGloo and ProcessGroupNCCL take)."""

    def __init__(self, fails=False):
        self.log, self.fails = [], fails

    def send(self, tensors, dst, tag):
        self.log.append(("send", dst, tag, tensors[0].numel()))
        return Work(self.log, f"send {dst}", self.fails)

    def recv(self, tensors, src, tag):
        self.log.append(("recv", src, tag, tensors[0].numel()))
        return Work(self.log, f"recv {src}", self.fails)

    def _start_coalescing(self, device):
        self.log.append(("start", device.type))

    def _end_coalescing(self, device):
        self.log.append(("end", device.type))
        return Work(self.log, "group", self.fails)


def _run(how, fails=False):
    group = RecordingGroup(fails)
    send = {2: torch.zeros(8, dtype=torch.uint8), 1: torch.zeros(4, dtype=torch.uint8)}
    receive = {3: torch.zeros(16, dtype=torch.uint8)}
    exchange_bucket(group, 7, send, receive, how, timeout_s=3.0)
    return group.log


def test_nccl_and_gloo_post_the_same_bucket_protocol():
    """Both post every send (by peer) then every receive, tagged with the bucket's index; gloo awaits each work
    under the deadline, NCCL brackets them in one group and awaits it once, also under the deadline."""
    gloo, nccl = _run(Exchange.on("cpu")), _run(Exchange("nccl", True, torch.device("cpu")))
    posted = [("send", 1, 7, 4), ("send", 2, 7, 8), ("recv", 3, 7, 16)]
    assert [e for e in gloo if e[0] != "wait"] == posted
    assert [e[0] for e in gloo if e[0] == "wait"] == ["wait"] * 3
    assert all(timedelta(0) < e[2] <= timedelta(seconds=3) for e in gloo if e[0] == "wait")
    assert nccl[0] == ("start", "cpu") and nccl[1:4] == posted and nccl[4] == ("end", "cpu")
    assert len(nccl) == 6 and nccl[5][:2] == ("wait", "group") and nccl[5][2] <= timedelta(seconds=3)


def test_a_stopped_transfer_is_named_on_either_backend():
    with pytest.raises(WeightSyncTimeout, match=r"bucket 7: the send to rank 1 got no answer within 3 s"):
        _run(Exchange.on("cpu"), fails=True)
    with pytest.raises(WeightSyncTimeout, match=r"bucket 7: the exchange with ranks \[1, 2, 3\] got no answer "
                                                r"within 3 s \(sync.timeout_s\)"):
        _run(Exchange("nccl", True, torch.device("cpu")), fails=True)

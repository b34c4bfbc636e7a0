"""SpreadRunner (flowrl.runtime.offpolicy.spread_runner): groups spread over replicas by load, gathered in draw order,
pauses and resumes reaching every replica."""

import threading

import pytest
from tensordict import TensorDict
import torch

from flowrl.runtime.offpolicy.spread_runner import SpreadRunner
from flowrl.runtime.offpolicy.stream_runner import Group


class Replica:
    """A runner whose groups finish when `release()`d, in submission order."""

    def __init__(self):
        self.submitted, self.ready, self.calls = [], [], []
        self.lock = threading.Lock()

    def settings(self):
        return False, 5.0, 0

    def submit(self, batch, draw, n, sampling, rows=None):
        self.submitted += [(draw, r) for r in rows]

    def release(self, count):
        with self.lock:
            for draw, row in self.submitted[:count]:
                self.ready.append(Group(draw, row, TensorDict({}, batch_size=[1])))
            self.submitted = self.submitted[count:]

    def finished(self, wanted, timeout_s):
        with self.lock:
            out, self.ready = self.ready, []
        return out, len(self.submitted)

    def pause(self, abort):
        self.calls.append(("pause", abort))
        return 1

    def resume(self, version):
        self.calls.append(("resume", version))

    def close(self):
        self.calls.append(("close",))


def batch(rows):
    return TensorDict({"x": torch.zeros(rows)}, batch_size=[rows])


def test_groups_go_to_the_least_loaded_replica_and_come_back_in_draw_order():
    replicas = [Replica(), Replica()]
    spread = SpreadRunner(replicas, poll_s=0.01)
    spread.submit(batch(3), draw=0, n=2, sampling={})
    assert [r.submitted for r in replicas] == [[(0, 0), (0, 2)], [(0, 1)]]  # 0 -> A, 1 -> B, 2 -> A (tie)
    replicas[1].release(1)
    spread.submit(batch(2), draw=1, n=2, sampling={}, rows=[0, 1])  # A holds 2, B 1 (not yet taken back)
    assert [r.submitted for r in replicas] == [[(0, 0), (0, 2), (1, 1)], [(1, 0)]]
    groups, _ = spread.finished(wanted=1, timeout_s=1.0)
    assert [(g.draw, g.index) for g in groups] == [(0, 1)]
    replicas[0].release(2)
    groups, in_flight = spread.finished(wanted=2, timeout_s=1.0)
    assert [(g.draw, g.index) for g in groups] == [(0, 0), (0, 2)]
    assert spread.outstanding == [1, 1] and in_flight == 2


def test_a_short_take_returns_at_its_deadline_and_pause_resume_close_reach_every_replica():
    replicas = [Replica(), Replica(), Replica()]
    spread = SpreadRunner(replicas, poll_s=0.01)
    spread.submit(batch(3), draw=0, n=1, sampling={})
    groups, in_flight = spread.finished(wanted=3, timeout_s=0.05)
    assert groups == [] and in_flight == 3
    assert spread.pause(True) == 3
    spread.resume(4)
    spread.close()
    assert all(r.calls == [("pause", True), ("resume", 4), ("close",)] for r in replicas)
    with pytest.raises(ValueError, match="at least one replica"):
        SpreadRunner([])

"""flowrl.engines.device_peak: the device peak less what a sleeping vLLM unmapped, on counters played by hand
(the H100's 7B run of 2026-12-07 in GiB), and the in-process vLLM engine's wake: torch's cache is emptied
before vLLM maps its pages again, and what it maps leaves the unmapped count."""

from types import SimpleNamespace

import pytest

from flowrl.engines import device_peak
from flowrl.engines.device_peak import Counters, DevicePeak
from flowrl.engines.memory import GIB


class Allocator:
    """torch's allocated bytes and peak since the last reset, moved by hand."""

    def __init__(self):
        self.now = self.top = 0

    def set(self, gib: float) -> None:
        self.now = int(gib * GIB)
        self.top = max(self.top, self.now)

    def reset(self) -> None:
        self.top = self.now

    def counters(self) -> Counters:
        return Counters(allocated=lambda: self.now, peak=lambda: self.top, reset=self.reset)


def gib(n: int) -> float:
    return round(n / GIB, 6)


def test_an_update_beside_a_sleeping_vllm_counts_only_what_is_on_the_device():
    torch_count = Allocator()
    tracker = DevicePeak(torch_count.counters())
    torch_count.set(30.0)  # the actor's and the reference's weights
    torch_count.set(66.3)  # vLLM awake: its 36.3 GiB pool, counted by torch
    tracker.unmapped(int(37.7 * GIB))  # it sleeps: the pool's pages are gone, its tensors (and torch's count) stay
    torch_count.set(108.9)  # the update's gradients and activations, as torch counts
    torch_count.set(68.0)
    assert gib(tracker.run_peak_bytes()) == pytest.approx(71.2)  # 108.9 - 37.7, not torch's 108.9
    tracker.unmapped(-int(37.7 * GIB))  # it wakes
    torch_count.set(70.0)
    assert gib(tracker.run_peak_bytes()) == pytest.approx(71.2)
    torch_count.set(75.0)  # a generation's own peak, everything mapped
    assert gib(tracker.run_peak_bytes()) == pytest.approx(75.0)


def test_a_phase_that_wakes_the_engine_inside_has_the_peak_of_each_of_its_intervals():
    torch_count = Allocator()
    tracker = DevicePeak(torch_count.counters())
    torch_count.set(60.0)
    tracker.unmapped(int(30 * GIB))  # asleep: 30 GiB on the device
    with tracker.phase() as box:
        torch_count.set(61.0)  # a sync's buffers: 31 GiB on the device
        tracker.unmapped(-int(10 * GIB))  # the weights woken: 40 GiB on the device, torch's count unchanged
        torch_count.set(62.5)
    peak, start = box
    assert (gib(peak), gib(start)) == (pytest.approx(42.5), pytest.approx(30.0))
    torch_count.set(59.0)
    with tracker.phase() as later:  # the fold at its start cut the first phase's intervals off
        torch_count.set(60.0)
    assert gib(later[0]) == pytest.approx(40.0)
    assert gib(tracker.run_peak_bytes()) == pytest.approx(60.0)  # before the engine first slept, all mapped


def test_a_restart_forgets_an_earlier_systems_peak():
    torch_count = Allocator()
    tracker = DevicePeak(torch_count.counters())
    torch_count.set(50.0)
    torch_count.set(2.0)
    tracker.restart()
    torch_count.set(3.0)
    assert gib(tracker.run_peak_bytes()) == pytest.approx(3.0)


def test_vllms_wake_empties_torchs_cache_first_and_counts_what_it_maps(monkeypatch):
    from flowrl.engines.vllm import rollout

    events, used = [], [40.0]
    torch_count = Allocator()
    monkeypatch.setattr(device_peak, "TRACKER", DevicePeak(torch_count.counters(), unmapped_bytes=int(37.7 * GIB)))
    monkeypatch.setattr(rollout.torch.cuda, "empty_cache", lambda: events.append("empty_cache") or used.__setitem__(
        0, used[0] - 20.0))  # 20 GiB of an update's cached blocks go back to the device
    monkeypatch.setattr(rollout, "device_used_gib", lambda cuda: used[0])

    def wake_up(tags):
        events.append(("wake_up", tuple(tags)))
        used[0] += 14.2  # the weights' pages mapped again

    engine = rollout.VLLMRolloutEngine.__new__(rollout.VLLMRolloutEngine)
    engine.cuda, engine.sleeping, engine.llm = True, {"weights", "kv_cache"}, SimpleNamespace(wake_up=wake_up)
    engine._wake_up("weights")
    assert events == ["empty_cache", ("wake_up", ("weights",))] and engine.sleeping == {"kv_cache"}
    assert gib(device_peak.TRACKER.unmapped_bytes) == pytest.approx(37.7 - 14.2)
    engine._wake_up("weights")  # awake already: nothing emptied, nothing mapped
    assert len(events) == 2

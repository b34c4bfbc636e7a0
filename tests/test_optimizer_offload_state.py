"""flowrl.engines.train.fsdp.move_optimizer_state (roles.*.offload_optimizer): the moments go where they are
sent, `step` stays where AdamW's kernel reads it: a fused AdamW's on its parameter's device, a plain one's on the
CPU. The H100 run of 2026-12-06 failed its second step when a fused AdamW's `step` had gone to the CPU with the
moments. On the CPU the "device" is `meta`: the moments go there and `step` stays on the CPU; the case that
failed (a CUDA parameter) runs where a GPU is."""

import pytest
import torch

from flowrl.engines.train.fsdp import move_optimizer_state


def stepped(fused: bool) -> tuple[torch.nn.Parameter, torch.optim.AdamW]:
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(8))
    optimizer = torch.optim.AdamW([param], lr=0.1, fused=fused)
    param.grad = torch.randn(8)
    optimizer.step()
    return param, optimizer


@pytest.mark.parametrize("fused", [True, False])
def test_the_moments_move_and_step_stays_where_the_kernel_reads_it(fused):
    param, optimizer = stepped(fused)
    state = optimizer.state[param]
    move_optimizer_state(optimizer, "meta")
    assert state["exp_avg"].device.type == state["exp_avg_sq"].device.type == "meta"
    assert state["step"].device == (param.device if fused else torch.device("cpu"))


def test_a_fused_step_after_the_round_trip_equals_one_that_never_moved():
    moved, kept = stepped(True), stepped(True)
    for param, optimizer in (moved, kept):
        param.grad = torch.ones(8)
    move_optimizer_state(moved[1], "cpu")
    move_optimizer_state(moved[1], "cpu")
    moved[1].step()
    kept[1].step()
    assert torch.equal(moved[0].detach(), kept[0].detach())
    assert moved[1].state[moved[0]]["step"].item() == 2.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the failing case: a fused AdamW over a CUDA parameter")
def test_a_fused_cuda_step_after_an_offload_round_trip_runs_and_equals_one_that_never_moved():
    results = []
    for offload in (True, False):
        torch.manual_seed(0)
        param = torch.nn.Parameter(torch.randn(8, device="cuda"))
        optimizer = torch.optim.AdamW([param], lr=0.1, fused=True)
        for _ in range(3):
            param.grad = torch.ones(8, device="cuda")
            if offload:
                move_optimizer_state(optimizer, "cuda")
            optimizer.step()
            if offload:
                move_optimizer_state(optimizer, "cpu")
                assert optimizer.state[param]["exp_avg"].device.type == "cpu"
        results.append(param.detach().cpu())
    assert torch.equal(results[0], results[1])

"""The widths a train engine's layers see, and the compile settings that keep variable response lengths from
compiling the layers again (the H200's recompiles inside timed GRPO steps, 2026-12-04: inductor guarded the
compiled layer on `width % 8 == 0` and on a size threshold of its mix-order reductions)."""

import torch

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.models.folders import load_causal_lm
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.train.model_inputs import COLUMN_MULTIPLE, column_multiple, trim_padding
from flowrl.engines.train.regional_compile import layer_compile_settings
from fakes import TokenMeanNLL
from test_engine_hf_train import ROWS, make_batch


def widths_seen(engine: HFTrainEngine) -> list[int]:
    widths = []
    layer = engine.model.get_decoder().layers[0]
    layer.register_forward_pre_hook(lambda _, args, kwargs: widths.append(
        (args[0] if args else kwargs["hidden_states"]).shape[1]), with_kwargs=True)
    return widths


def test_widths_are_aligned_on_cuda_and_exact_on_the_cpu():
    assert column_multiple(torch.device("cuda", 0)) == COLUMN_MULTIPLE == 8
    assert column_multiple(torch.device("cpu")) == 1  # the CPU runs' figures stay those recorded


def test_every_micro_batch_width_is_a_multiple_of_eight(tiny_model_path):
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(lr=1e-2), kind="actor")
    engine.column_multiple = COLUMN_MULTIPLE  # as on CUDA
    widths = widths_seen(engine)
    for rows in (ROWS, ROWS[:3], ROWS[4:]):
        for micro in (1, 2, 4):
            engine.forward(make_batch(rows), micro_batch_size=micro)
        engine.update(make_batch(rows), TokenMeanNLL(), mini_batch_size=len(rows), micro_batch_size=2)
    assert COLUMN_MULTIPLE == 8 and len(set(widths)) >= 2  # widths differ between micro-batches ...
    assert all(w % 8 == 0 for w in widths), widths  # ... and all are aligned (before: 2 to 9 columns)


def test_aligned_widths_change_no_output_and_no_step(tiny_model_path):
    """The same forward and update with the trimmed widths aligned (as on CUDA) and exact (as on the CPU)."""
    batch = make_batch(ROWS)
    results = []
    for multiple in (COLUMN_MULTIPLE, 1):
        torch.manual_seed(0)
        engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(lr=1e-2), kind="actor", eps=1.0)
        engine.column_multiple = multiple
        widths = widths_seen(engine)
        out = engine.forward(batch, micro_batch_size=2, outputs=("logprobs", "entropy"))
        metrics = engine.update(batch, TokenMeanNLL(), mini_batch_size=len(ROWS), micro_batch_size=2)
        results.append((out, metrics, engine.model.state_dict(), widths))
    (out, metrics, state, widths), (out_1, metrics_1, state_1, widths_1) = results
    assert any(w % 8 for w in widths_1) and not any(w % 8 for w in widths)  # the two runs did differ
    for key in ("logprobs", "entropy"):
        assert out[key].shape == out_1[key].shape == batch["response_ids"].shape
        torch.testing.assert_close(out[key], out_1[key], atol=1e-5, rtol=0)
    torch.testing.assert_close(metrics["loss"], metrics_1["loss"], atol=1e-6, rtol=1e-5)
    for key, value in state_1.items():
        torch.testing.assert_close(state[key], value, atol=1e-6, rtol=0)


def test_trim_padding_pads_responses_with_masked_columns():
    batch = make_batch(ROWS)  # prompts 6 wide, responses 4
    trimmed = trim_padding(batch, (1, 3), 8)  # 5 prompt columns + 3 response columns: 8, none added
    assert trimmed["prompt_ids"].shape[1] == 5 and trimmed["response_ids"].shape[1] == 3
    assert trim_padding(batch, (2, 3))["response_ids"].shape[1] == 3  # multiple 1: exact
    trimmed = trim_padding(batch, (2, 3), 8)  # 4 + 3 = 7: one masked column of id 0 after the responses
    assert trimmed["response_ids"].shape[1] == 4
    assert torch.equal(trimmed["response_ids"][:, :3], batch["response_ids"][:, :3])
    assert not trimmed["response_mask"][:, 3].any() and not trimmed["response_ids"][:, 3].any()


def test_layer_compiles_skip_the_mix_order_size_guard():
    triton = torch._inductor.config.triton
    before = triton.mix_order_reduction_non_strict_mode
    with layer_compile_settings():
        assert triton.mix_order_reduction_non_strict_mode is True
    assert triton.mix_order_reduction_non_strict_mode == before

import copy

import pytest
import torch
from tensordict import TensorDict

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer, load_value_model
from fakes import TokenMeanNLL

PAD = 0



def stepped_grads(engine) -> dict[str, torch.Tensor]:
    """The gradients the engine's optimizer steps with (the last step's), filled in at each step: the engine
    frees them right after it."""
    grads: dict[str, torch.Tensor] = {}
    engine.optimizer.register_step_pre_hook(lambda *_: grads.update(
        {name: p.grad.clone() for name, p in engine.model.named_parameters() if p.grad is not None}))
    return grads


def make_batch(rows, prompt_width=None, response_width=None):
    """rows: (prompt tokens, response tokens); prompts left-padded, responses right-padded."""
    prompt_width = prompt_width or max(len(p) for p, _ in rows)
    response_width = response_width or max(len(r) for _, r in rows)
    prompt_ids = torch.full((len(rows), prompt_width), PAD)
    prompt_mask = torch.zeros(len(rows), prompt_width, dtype=torch.long)
    response_ids = torch.full((len(rows), response_width), PAD)
    response_mask = torch.zeros(len(rows), response_width, dtype=torch.long)
    for i, (prompt, response) in enumerate(rows):
        prompt_ids[i, prompt_width - len(prompt):] = torch.tensor(prompt)
        prompt_mask[i, prompt_width - len(prompt):] = 1
        response_ids[i, :len(response)] = torch.tensor(response)
        response_mask[i, :len(response)] = 1
    return TensorDict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=response_mask, batch_size=[len(rows)])


ROWS = [([3, 12, 4, 15], [5, 1]), ([7, 8], [9, 10, 11, 1]), ([2, 13, 2, 15, 4, 4], [6]),
        ([4, 14, 5], [3, 3, 7, 1]), ([9], [2, 1]), ([5, 12, 5, 15], [11, 2, 1])]


class ValueMSE:
    reads = ("response_mask",)
    needs = ("values",)
    combine = "mean"

    def __call__(self, out, mb):
        mask = mb["response_mask"].float()
        loss = ((out["values"] - 1.0) ** 2 * mask).sum() / mask.sum()
        return loss, {"value_loss": loss.item()}

    def weight(self, mb):
        return float(mb["response_mask"].sum())


def reference_logprobs(model, prompt, response, temperature=1.0):
    """Unpadded forward of one row: logprobs and entropies of its response tokens."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    logp = torch.log_softmax(logits[len(prompt) - 1:-1], -1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0], entropy


def test_forward_matches_unpadded_reference(tiny_model_path):
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(), kind="actor")
    for widths in [(None, None), (9, 7)]:  # the same rows, padded two ways
        batch = make_batch(ROWS, *widths)
        out = engine.forward(batch, temperature=0.7, micro_batch_size=4, outputs=("logprobs", "entropy"))
        assert out["logprobs"].shape == out["entropy"].shape == batch["response_ids"].shape
        for i, (prompt, response) in enumerate(ROWS):
            logprobs, entropy = reference_logprobs(engine.model, prompt, response, temperature=0.7)
            torch.testing.assert_close(out["logprobs"][i, :len(response)], logprobs, atol=1e-5, rtol=0)
            torch.testing.assert_close(out["entropy"][i, :len(response)], entropy, atol=1e-5, rtol=0)
    assert "entropy" not in engine.forward(batch)


def fresh_engine(path, **kwargs):
    # eps=1 makes Adam's first step ~ lr * g / (|g| + 1): sensitive to the gradient's scale, not only its sign
    config = HFTrainConfig(**{"lr": 1.0, "grad_clip": 1e9, **kwargs})
    return HFTrainEngine(load_causal_lm(path), config, kind="actor", eps=1.0)


def test_update_is_exact_over_micro_batches(tiny_model_path):
    batch = make_batch(ROWS[:4])  # 2, 4, 1 and 4 valid tokens: unequal micro-batch weights
    engines = [fresh_engine(tiny_model_path) for _ in range(3)]
    metrics = [engine.update(batch, TokenMeanNLL(), mini_batch_size=4, micro_batch_size=size)
               for engine, size in zip(engines, [4, 1, 3])]
    assert metrics[0]["skipped_steps"] == 0 and metrics[0]["lr"] == 1.0
    for other, other_metrics in zip(engines[1:], metrics[1:]):
        assert other_metrics["grad_norm"] == pytest.approx(metrics[0]["grad_norm"], rel=1e-5)
        for (name, p), q in zip(engines[0].model.named_parameters(), other.model.parameters()):
            torch.testing.assert_close(q, p, atol=1e-6, rtol=0, msg=name)


def test_update_lowers_supervised_loss(tiny_model_path):
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(lr=1e-2), kind="actor")
    batch = make_batch(ROWS)
    before = engine.forward(batch)["logprobs"]
    metrics = engine.update(batch, TokenMeanNLL(), mini_batch_size=6, micro_batch_size=6)
    after = engine.forward(batch)["logprobs"]
    mask = batch["response_mask"].bool()
    assert metrics["loss"] == pytest.approx(-before[mask].mean().item(), rel=1e-5)
    assert -after[mask].mean() < -before[mask].mean()
    assert metrics["grad_norm"] > 0


def test_update_shuffles_and_warms_up(tiny_model_path):
    engine = fresh_engine(tiny_model_path, lr=1e-3, warmup_steps=4)
    metrics = engine.update(make_batch(ROWS), TokenMeanNLL(), mini_batch_size=2, micro_batch_size=1, epochs=2,
                            shuffle_seed=0)
    assert metrics["lr"] == pytest.approx(1e-3)  # the 6th step: past warmup
    assert engine.scheduler.last_epoch == 6
    with pytest.raises(ValueError, match="mini_batch_size"):
        engine.update(make_batch(ROWS), TokenMeanNLL(), mini_batch_size=0)
    with pytest.raises(ValueError, match="kind"):
        HFTrainEngine(engine.model, HFTrainConfig(), kind="ref")


def test_non_finite_gradient_skips_the_step(tiny_model_path):
    engine = fresh_engine(tiny_model_path)
    before = copy.deepcopy(engine.model.state_dict())

    class Infinite(TokenMeanNLL):
        def __call__(self, out, mb):
            return out["logprobs"].sum() * float("inf"), {}

    metrics = engine.update(make_batch(ROWS), Infinite(), mini_batch_size=6)
    assert metrics["skipped_steps"] == 1
    for name, value in engine.model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_save_load_roundtrip(tiny_model_path, tmp_path):
    batch = make_batch(ROWS)
    trained = fresh_engine(tiny_model_path, lr=1e-2, warmup_steps=3)
    trained.update(batch, TokenMeanNLL(), mini_batch_size=3)
    trained.save(str(tmp_path / "ckpt"))
    trained.save(str(tmp_path / "ckpt"))  # overwriting an existing checkpoint is atomic too
    restored = fresh_engine(tiny_model_path, lr=1e-2, warmup_steps=3)
    restored.load(str(tmp_path / "ckpt"))
    for name, value in trained.full_state_dict().items():
        assert torch.equal(restored.full_state_dict()[name], value), name
    assert restored.scheduler.get_last_lr() == trained.scheduler.get_last_lr()
    for engine in (trained, restored):  # the same optimizer moments: the next steps agree too
        engine.update(batch, TokenMeanNLL(), mini_batch_size=3)
    for name, value in trained.full_state_dict().items():
        torch.testing.assert_close(restored.full_state_dict()[name], value, atol=0, rtol=0)
    with pytest.raises(ValueError, match="path"):
        restored.load(str(tmp_path / "nothing"))


def test_save_pretrained_exports_loadable_weights(tiny_model_path, tmp_path):
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(lr=1e-2), kind="actor")
    engine.update(make_batch(ROWS), TokenMeanNLL(), mini_batch_size=6)
    engine.save_pretrained(str(tmp_path / "hf"), load_tokenizer(tiny_model_path))
    exported = load_causal_lm(tmp_path / "hf")
    for name, value in engine.model.state_dict().items():
        assert torch.equal(exported.state_dict()[name], value), name
    assert load_tokenizer(tmp_path / "hf").decode([3, 4]) == "12"


def test_critic_values(tiny_model_path):
    engine = HFTrainEngine(load_value_model(tiny_model_path), HFTrainConfig(lr=1e-2), kind="critic")
    batch, shifted = make_batch(ROWS), make_batch(ROWS, 9, 7)
    values = engine.forward(batch, micro_batch_size=4)["values"]
    assert values.shape == batch["response_ids"].shape and values.dtype == torch.float32
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(engine.forward(shifted)["values"][:, :4][mask], values[mask], atol=1e-5, rtol=0)
    metrics = engine.update(batch, ValueMSE(), mini_batch_size=6, micro_batch_size=3)
    assert engine.update(batch, ValueMSE(), mini_batch_size=6)["value_loss"] < metrics["value_loss"]


def test_a_masked_interior_token_is_left_out_as_if_absent(tiny_model_path):
    """Rows are packed to their front for the flash kernel: a mask gap inside a prompt still hides that token
    and shifts no position, as the padding mask did."""
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(), kind="actor")
    gapped = make_batch([([3, 12, 13, 4, 15], [5, 9, 1])])
    gapped["prompt_mask"][0, 2] = 0
    out = engine.forward(gapped)["logprobs"][0]
    torch.testing.assert_close(out, reference_logprobs(engine.model, [3, 12, 4, 15], [5, 9, 1])[0], atol=1e-5, rtol=0)


def test_padding_columns_cost_nothing_and_change_nothing(tiny_model_path):
    """Extra all-padding columns on both sides are trimmed per micro-batch; outputs keep the batch's width."""
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(), kind="actor")
    batch = make_batch(ROWS)
    wide = batch.clone()
    wide["prompt_ids"] = torch.nn.functional.pad(batch["prompt_ids"], (5, 0))
    wide["prompt_mask"] = torch.nn.functional.pad(batch["prompt_mask"], (5, 0))
    wide["response_ids"] = torch.nn.functional.pad(batch["response_ids"], (0, 7))
    wide["response_mask"] = torch.nn.functional.pad(batch["response_mask"], (0, 7))
    narrow_out = engine.forward(batch, micro_batch_size=2)["logprobs"]
    wide_out = engine.forward(wide, micro_batch_size=2)["logprobs"]
    assert wide_out.shape == (len(ROWS), batch["response_ids"].shape[1] + 7)
    torch.testing.assert_close(wide_out[:, :narrow_out.shape[1]], narrow_out, atol=1e-5, rtol=0)
    assert (wide_out[:, narrow_out.shape[1]:] == 0).all()


def test_length_grouped_micro_batches_change_no_output_and_no_step(tiny_model_path):
    batch = make_batch(ROWS)
    results = []
    for by_length in (False, True):
        torch.manual_seed(0)
        engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(lr=1e-2), kind="actor", eps=1.0,
                               by_length=by_length)
        logprobs = engine.forward(batch, micro_batch_size=2)["logprobs"]  # rows come back in the batch's order
        engine.update(batch, TokenMeanNLL(), mini_batch_size=len(ROWS), micro_batch_size=2)
        results.append((logprobs, engine.model.state_dict()))
    (lp_plain, state_plain), (lp_grouped, state_grouped) = results
    torch.testing.assert_close(lp_grouped, lp_plain, atol=1e-5, rtol=0)
    for key, value in state_plain.items():
        torch.testing.assert_close(state_grouped[key], value, atol=1e-6, rtol=0)


def test_chunked_logprobs_equal_full_logits_with_gradients(tiny_model_path):
    """logprob_chunk_tokens: outputs and the gradient of a loss on them equal the full-logits computation."""
    torch.manual_seed(0)
    rows, prompt_len, response_len = 5, 4, 7
    batch = TensorDict(prompt_ids=torch.randint(2, 14, (rows, prompt_len)),
                       prompt_mask=torch.ones(rows, prompt_len, dtype=torch.long),
                       response_ids=torch.randint(2, 14, (rows, response_len)),
                       response_mask=torch.ones(rows, response_len, dtype=torch.long), batch_size=[rows])
    batch["response_mask"][0, 4:] = 0
    outs, grads = [], []
    for chunk in (0, 3):
        engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(logprob_chunk_tokens=chunk), kind="actor")
        out = engine._outputs(batch, temperature=1.3, outputs=("logprobs", "entropy"))
        (out["logprobs"].sum() + out["entropy"].sum()).backward()
        outs.append(out)
        grads.append({n: p.grad.clone() for n, p in engine.model.named_parameters()})
    for key in ("logprobs", "entropy"):
        assert torch.allclose(outs[0][key], outs[1][key], atol=1e-5), key
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-5), name


def _compiled_and_eager_passes(path, out):
    """In a fresh process: logprobs and gradients of the eager passes and of the compiled ones (chunk 0 and 3)."""
    from flowrl.engines.configs import ModelSource, TrainEngineConfig

    batch = make_batch(ROWS[:3])
    results = []
    for compile, chunk in ((False, 0), (True, 0), (True, 3)):
        config = TrainEngineConfig.model_validate({"compile": compile, "logprob_chunk_tokens": chunk})
        engine = config.build(ModelSource(path), head="actor", device="cpu")
        logprobs = engine._outputs(batch, temperature=1.3, outputs=("logprobs",))["logprobs"]
        logprobs.sum().backward()
        results.append({"logprobs": logprobs.detach(), "grads": {n: p.grad for n, p in engine.model.named_parameters()},
                        "compiled_modules": sum(bool(m._compiled_call_impl) for m in engine.model.modules())})
    torch.save(results, out)


def test_compiled_passes_compute_what_eager_ones_do(tiny_model_path, tmp_path, monkeypatch):
    """actor.compile: the engine's passes run torch.compile'd (chunked logprobs and full logits); outputs and
    gradients equal the eager model's, and the module itself is left uncompiled for a rollout sharing it.

    inductor runs in a fresh process with its own cache folder and the quick start's CPU kernels
    (flowrl.runtime.threads.CPU_KERNELS), as a run of the tiny model compiles: in the test session it compiled after
    whatever earlier tests had left in the process (an in-process vLLM engine sets inductor's thread and cache
    variables) and in the shared /tmp cache, and CI's machine once aborted inside the compiled layer there."""
    import multiprocessing

    from flowrl.runtime.threads import CPU_KERNELS

    for key, value in CPU_KERNELS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    for key in ("TORCHINDUCTOR_CPP_DYNAMIC_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "passes.pt"
    child = multiprocessing.get_context("spawn").Process(target=_compiled_and_eager_passes,
                                                         args=(str(tiny_model_path), str(out)))
    child.start()
    child.join(timeout=600)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, f"the compiling process ended with {child.exitcode} (its stderr is above)"
    eager, whole, chunked = torch.load(out)
    assert whole["compiled_modules"] == chunked["compiled_modules"] == 0
    assert torch.allclose(eager["logprobs"], whole["logprobs"], atol=1e-5)
    assert torch.allclose(eager["logprobs"], chunked["logprobs"], atol=1e-5)
    assert eager["grads"].keys() == whole["grads"].keys()  # the same parameter names: checkpoints and exports unchanged
    for name in eager["grads"]:
        assert torch.allclose(eager["grads"][name], whole["grads"][name], atol=1e-5), name
        assert torch.allclose(eager["grads"][name], chunked["grads"][name], atol=1e-5), name


def test_sum_pi_squared_chunked_equals_full_and_a_direct_computation(tiny_model_path):
    """outputs "sum_pi_squared": sum_v pi(v)^2 of each response token's distribution (temperature applied), the same
    from chunks of 3 tokens as from full logits, and equal to softmax(logits).square().sum() row by row."""
    batch = make_batch(ROWS)
    outs = []
    for chunk in (0, 3):
        engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(logprob_chunk_tokens=chunk), kind="actor")
        wanted = ("logprobs", "sum_pi_squared")
        outs.append(engine.forward(batch, temperature=0.7, micro_batch_size=4, outputs=wanted))
        assert "entropy" not in outs[-1] and "sum_pi_squared" not in engine.forward(batch)
    torch.testing.assert_close(outs[1]["sum_pi_squared"], outs[0]["sum_pi_squared"], atol=1e-6, rtol=0)
    torch.testing.assert_close(outs[1]["logprobs"], outs[0]["logprobs"], atol=1e-6, rtol=0)
    for i, (prompt, response) in enumerate(ROWS):
        with torch.no_grad():
            logits = engine.model(input_ids=torch.tensor([prompt + response])).logits[0].float() / 0.7
        expected = torch.softmax(logits[len(prompt) - 1:-1], -1).square().sum(-1)
        for out in outs:
            torch.testing.assert_close(out["sum_pi_squared"][i, :len(response)], expected, atol=1e-6, rtol=0)
            assert (out["sum_pi_squared"][i, len(response):] == 0).all()


def test_token_sum_update_is_exact_over_micro_batches(tiny_model_path):
    """A token-sum loss (LossFn.combine == "sum"): the step's gradient is that of the mini-batch's sum, whether
    it runs as 1, 2 or 4 micro-batches, and equals -sum(A * logp) over the batch's valid tokens by hand."""
    from flowrl.rl.losses import reinforce_loss

    batch = make_batch(ROWS[:4])  # 2, 4, 1 and 4 valid tokens
    batch["loss_mask"] = batch["response_mask"].clone()
    batch["loss_mask"][1, 0] = 0  # a token the loss does not count
    batch["advantages"] = torch.linspace(-1.0, 1.5, 4)[:, None] * batch["response_mask"]
    batch["old_logprobs"] = torch.zeros(batch["response_mask"].shape)
    loss = reinforce_loss(loss_agg_mode="token-sum")
    assert loss.combine == "sum" and reinforce_loss().combine == "mean"
    grads = []
    for size in (4, 2, 1):
        engine = fresh_engine(tiny_model_path)
        grads.append(stepped_grads(engine))
        engine.update(batch, loss, mini_batch_size=4, micro_batch_size=size)
    by_hand = fresh_engine(tiny_model_path)
    logprobs = by_hand._outputs(batch, 1.0, ("logprobs",))["logprobs"]
    (-(batch["advantages"] * logprobs * batch["loss_mask"]).sum()).backward()
    for name, p in by_hand.model.named_parameters():
        for other in grads:
            torch.testing.assert_close(other[name], p.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_compiled_passes_compile_once_per_grad_mode_over_micro_batch_shapes(tiny_model_path, monkeypatch):
    """Rows and width are dynamic from the first compile: micro-batches of other shapes reuse the graphs of
    the first (torch.compile's default traced again at the second shape, a full inductor compile each on a
    GPU). Dynamo's guards decide this, not the backend: torch.compile gets backend="eager" here."""
    import functools

    from flowrl.engines.configs import ModelSource, TrainEngineConfig

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    graphs = torch._dynamo.utils.counters["stats"]
    for chunk in (3, 0):  # chunked logprobs over the decoder, and full logits
        torch._dynamo.reset()
        config = TrainEngineConfig.model_validate({"compile": True, "logprob_chunk_tokens": chunk})
        engine = config.build(ModelSource(tiny_model_path), head="actor", device="cpu")
        counts = []
        for grad in (False, True):
            for batch in (make_batch(ROWS[:3]), make_batch(ROWS, prompt_width=9, response_width=6)):
                with torch.set_grad_enabled(grad):
                    engine._outputs(batch, temperature=1.0, outputs=("logprobs",))
                counts.append(graphs["unique_graphs"])
        assert counts[1] == counts[0] and counts[3] == counts[2] > counts[1], (chunk, counts)


def test_an_update_leaves_no_gradient_on_the_device(tiny_model_path):
    """A colocated vLLM wakes between two updates: the gradients are freed after each optimizer step (they were
    kept to the next update's start, 15 GiB beside vLLM for a 7B shape, which ran an H100 out of memory), and the
    step they were freed after still moved every weight."""
    engine = fresh_engine(tiny_model_path)
    before = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    stepped = stepped_grads(engine)
    engine.update(make_batch(ROWS[:4]), TokenMeanNLL(), mini_batch_size=2, micro_batch_size=2)
    assert all(p.grad is None for p in engine.model.parameters())
    assert stepped and all(g.abs().sum() > 0 for name, g in stepped.items() if "embed" not in name)
    assert all(not torch.equal(before[name], p) for name, p in engine.model.named_parameters() if name in stepped)

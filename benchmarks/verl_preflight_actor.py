"""benchmarks/verl_preflight.py's `logprobs` stage, in verl's packages: the forward verl's FSDP engine gives the
actor and the reference model (verl/workers/engine/fsdp/transformer_impl.py builds the model, then
`apply_monkey_patch` with the model config's use_remove_padding, use_fused_kernels and
fused_kernel_options.impl_backend), run on the CPU over the benchmark's model copy: with the fused kernels on,
the patched forward's log_probs (verl's FusedLinearForPPO, chunked, without flash-attn) against log_softmax of the
plain forward's logits, and their backward, the update's path. On the H100 (2026-12-07) verl ran without them,
and without flash-attn its logprobs went through a per-token Python loop (82.9 s a step); the fused path is what
the benchmark's verl set-up runs since, and this stage checks it before the GPU's 5 minutes of start-up."""

from __future__ import annotations

from verl_preflight_fakes import check

ROWS, LENGTH = 2, 24


def stage_logprobs(ctx):
    import torch
    from transformers import AutoModelForCausalLM

    from verl.models.transformers.monkey_patch import apply_monkey_patch

    model_cfg = ctx["config"].actor_rollout_ref.model
    fused = bool(model_cfg.get("use_fused_kernels", False))
    backend = (model_cfg.get("fused_kernel_options") or {}).get("impl_backend")
    path = ctx["model_config"].local_path
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (ROWS, LENGTH), generator=generator)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "position_ids": torch.arange(LENGTH).expand(ROWS, LENGTH)}
    with torch.no_grad():  # before the patch: verl patches the model's class
        logits = model(**inputs).logits[:, :-1]
    want = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    forward = type(model).forward
    try:
        apply_monkey_patch(model=model, use_remove_padding=bool(model_cfg.use_remove_padding), ulysses_sp_size=1,
                           use_fused_kernels=fused, fused_kernels_backend=backend)
        if not fused:
            return None, "use_fused_kernels=False: verl's plain forward (logprobs_from_logits on its logits)"
        check(type(model).forward is not forward, "apply_monkey_patch left the forward as it was")
        out = model(**inputs, temperature=1.0, return_dict=True)
        got = out.log_probs[:, :-1]  # the last position's label is the roll's wrap-around
        error = (got.detach() - want).abs().max().item()
        check(error < 1e-4, f"fused log_probs differ from log_softmax by {error:.3g}")
        got.sum().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        check(all(g is not None and torch.isfinite(g).all() for g in grads), "a parameter got no finite gradient")
    finally:
        type(model).forward = forward  # the class as it was, for whatever runs after
    return None, (f"use_fused_kernels=True, backend {backend}: {ROWS}x{LENGTH} tokens, log_probs within {error:.1g} "
                  f"of log_softmax, entropy {tuple(out.entropy.shape)}, backward to {len(grads)} parameters")

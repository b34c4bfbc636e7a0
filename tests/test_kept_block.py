"""What a rollout rank hands vLLM's loaders under the reshard (flowrl.engines.weights.kept_block): an entry's whole
shape backed by the kept block alone. Narrowed as vLLM's loaders narrow it (tests/vllm_tp_reference.py) it gives
each tensor rank's parameters bit for bit as the full tensor does; nothing else reads it."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from flowrl.engines.weights.kept_block import KeptBlock, KeptBlockError
from flowrl.engines.weights.reshard import Kept, loader_view
from flowrl.engines.weights.reshard_plan import Box, Layout, kept_box
from vllm_tp_reference import vllm_params

HEADS, KV_HEADS = 4, 2


def kept_views(full: dict[str, torch.Tensor], layout: Layout, tp_rank: int) -> dict[str, torch.Tensor]:
    """Each entry as loader_view gives it to tensor rank `tp_rank`: the kept block cut out (a copy, as the
    reshard assembles it from what arrived), never the full tensor."""
    views = {}
    for name, tensor in full.items():
        box = kept_box(name, tuple(tensor.shape), layout, tp_rank)
        block = tensor.narrow(box.dim, box.start, box.stop - box.start).clone() if tensor.dim() else tensor.clone()
        views[name] = loader_view(Kept(name, block, box, tuple(tensor.shape)))
    return views


@pytest.mark.parametrize("tp", [2, 4])
def test_vllm_s_loaders_read_the_same_parameters_from_kept_blocks(tp):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=70, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=False)
    full = Qwen2ForCausalLM(config).state_dict()
    layout = Layout(tp, 1, HEADS, KV_HEADS)
    for tp_rank in range(tp):
        views = kept_views(full, layout, tp_rank)
        partial = [v for v in views.values() if isinstance(v, KeptBlock)]
        assert len(partial) >= 8 * config.num_hidden_layers  # q, k, v, o, gate, up, down of each layer, the vocab
        assert all(v.block.numel() < v.numel() for v in partial)  # only the block is held
        old = vllm_params(full, tp, tp_rank, HEADS, KV_HEADS)
        new = vllm_params(views, tp, tp_rank, HEADS, KV_HEADS)
        assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old), tp_rank


def test_a_kept_block_is_the_whole_entry_to_look_at_and_only_its_block_to_read():
    block = torch.arange(6.0).reshape(2, 3)
    view = KeptBlock("model.layers.0.mlp.gate_proj.weight", block, (6, 3), Box(0, 2, 4))
    assert (view.shape, view.dtype, view.device, view.dim(), view.numel()) == ((6, 3), torch.float32,
                                                                               torch.device("cpu"), 2, 18)
    assert view.narrow(0, 2, 2) is block and torch.narrow(view, -2, 2, 2) is block
    with pytest.raises(KeptBlockError, match=r"narrowed model.layers.0.mlp.gate_proj.weight to \[0, 2\) along dim "
                                             r"0; this rank keeps \[2, 4\) along dim 0"):
        view.narrow(0, 0, 2)
    for read in (lambda: view.clone(), lambda: view + 1, lambda: view.to(torch.float16), lambda: torch.cat([view])):
        with pytest.raises(KeptBlockError, match="read model.layers.0.mlp.gate_proj.weight, of which this rank "
                                                 "holds only the block it keeps"):
            read()
    assert "kept Box(dim=0, start=2, stop=4)" in repr(view)


def test_an_entry_kept_whole_is_handed_over_as_it_is():
    norm = torch.ones(8)
    assert loader_view(Kept("model.norm.weight", norm, Box(0, 0, 8), (8,))) is norm
    columns = torch.zeros(4, 2)
    view = loader_view(Kept("model.layers.0.self_attn.o_proj.weight", columns, Box(1, 2, 4), (4, 4)))
    assert isinstance(view, KeptBlock) and view.narrow(1, 2, 2) is columns

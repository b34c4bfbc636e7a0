"""`flowrl model import`: a GGUF file (written here with the gguf package) or an HF folder as a model folder."""

import json
import re

import numpy as np
import pytest
import torch

from flowrl.cli import main
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.models.model_import import import_model

gguf = pytest.importorskip("gguf", reason="writing a GGUF file needs the gguf package: pip install -e '.[real-model]'")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QUANTIZED = ("ffn_gate", "ffn_up", "ffn_down")  # written as Q8_0, the rest as F32


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py permutation of q and k rows (transformers' GGUF loader undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama():
    tokens = SPECIALS + list(bytes_to_unicode().values()) + ["Ġt"]
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval(), tokens


def gguf_tensors(model):
    """(GGUF name, numpy array as written) for every weight of a Llama model."""
    cfg, sd = model.config, {k: v.float().numpy() for k, v in model.state_dict().items()}
    out = [("token_embd.weight", sd["model.embed_tokens.weight"]), ("output_norm.weight", sd["model.norm.weight"])]
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i in range(cfg.num_hidden_layers):
        for short, hf in names.items():
            w = sd[f"model.layers.{i}.{hf}.weight"]
            if short in ("attn_q", "attn_k"):
                w = permute(w, cfg.num_attention_heads if short == "attn_q" else cfg.num_key_value_heads)
            out.append((f"blk.{i}.{short}.weight", w))
    return out


def write_gguf(path, model, tokens, architecture="llama"):
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(["Ġ t"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(TEMPLATE)
    expected = {}
    for name, w in gguf_tensors(model):
        if name.split(".")[-2] in QUANTIZED:
            q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            w = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)  # what a reader gets back
        else:
            writer.add_tensor(name, w)
        expected[name] = w
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    model, tokens = tiny_llama()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, model, write_gguf(path, model, tokens)


def test_a_gguf_file_imports_as_a_folder_flowrl_loads(tiny_gguf, tmp_path, capsys):
    path, model, written = tiny_gguf
    out = tmp_path / "imported"
    assert main(["model", "import", str(path), "--output", str(out), "--dtype", "float32"]) == 0
    assert capsys.readouterr().out.strip() == f"imported {path} -> {out}"
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True and config["num_key_value_heads"] == 2
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    loaded = load_causal_lm(out).state_dict()
    source = model.state_dict()
    for name, value in source.items():  # F32 weights exact; Q8_0 ones equal gguf's own de-quantisation
        quantized = any(f"{m}_proj" in name for m in ("gate", "up", "down"))
        want = torch.from_numpy(np.asarray(_written_for(name, written))) if quantized else value
        assert torch.equal(loaded[name], want.reshape(value.shape)), name
    tok = load_tokenizer(out)
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")
    ids = tok.apply_chat_template([{"role": "user", "content": "hi t"}], add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    assert tok.decode(ids) == "<|im_start|>user\nhi t<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == 1 and tok.convert_tokens_to_ids("Ġt") in ids  # a special token whole; the merge applied


def test_the_files_own_special_token_ids_win_over_the_tokenizer_conversion(tiny_gguf, tmp_path, monkeypatch):
    """transformers 5.17's GGUF conversion made SmolLM2's eos <|im_start|> (id 1; the file says 2), so every
    rollout failed for a missing eos: the import now sets bos, eos and pad from the file's ids."""
    import transformers

    path, _, _ = tiny_gguf
    convert = transformers.AutoTokenizer.from_pretrained

    def as_5_17(*args, **kwargs):
        tok = convert(*args, **kwargs)
        tok.eos_token, tok.pad_token = "<|im_start|>", None
        return tok

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", as_5_17)
    out = tmp_path / "imported"
    assert main(["model", "import", str(path), "--output", str(out), "--dtype", "float32"]) == 0
    monkeypatch.undo()
    tok = load_tokenizer(out)
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (2, 2, 1)


def _written_for(hf_name, written):
    layer, module = hf_name.split(".")[2], hf_name.split(".")[-2].replace("_proj", "")
    return written[f"blk.{layer}.ffn_{module}.weight"]


def test_an_hf_folder_of_another_dtype_imports_in_the_chosen_dtype(tiny_model_path, tmp_path):
    src = load_causal_lm(tiny_model_path)
    out = import_model(tiny_model_path, tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    back = load_causal_lm(out, dtype=torch.bfloat16).state_dict()
    assert all(torch.equal(back[k], v.to(torch.bfloat16)) for k, v in src.state_dict().items())
    assert load_tokenizer(out).get_vocab() == load_tokenizer(tiny_model_path).get_vocab()


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b"PK\x03\x04 a zip"), r"{p}: not a GGUF file \(it does not start with b'GGUF'\)"),
    (lambda p: None, r"{p}: no such file or folder; give a .gguf file or a Hugging Face model folder"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, capsys, make, message):
    path = tmp_path / "model.gguf"
    make(path)
    assert main(["model", "import", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.fullmatch(f"flowrl: error: {message.format(p=path)}.*", err), err
    assert not (tmp_path / "out").exists()


def test_an_unsupported_architecture_names_the_file_and_the_fix(tiny_gguf, tmp_path, capsys):
    path, model, _ = tiny_gguf
    odd = tmp_path / "odd.gguf"
    odd.write_bytes(path.read_bytes().replace(b"llama", b"xlstm", 1))  # general.architecture comes first
    assert main(["model", "import", str(odd), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"flowrl: error: {odd}: transformers cannot load GGUF architecture 'xlstm' (it loads ")
    assert "llama" in err and err.endswith("convert the original model to a Hugging Face folder and import that")


def test_a_missing_gguf_package_is_one_line_with_the_fix(tiny_gguf, tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    path = tiny_gguf[0]
    assert main(["model", "import", str(path), "--output", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (f"flowrl: error: {path}: reading a GGUF file needs the gguf package: "
                                               f"pip install -e '.[real-model]' in the flowrl checkout (or pip "
                                               f"install gguf)")

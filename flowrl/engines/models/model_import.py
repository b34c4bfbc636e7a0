"""`flowrl model import SRC --output DIR`: a GGUF file or a Hugging Face folder as the folder flowrl trains from.

The output is an ordinary Hugging Face folder (`model.path`): config.json without any quantization
config, the weights in `dtype`, generation_config.json, and the tokenizer with its chat template.
A GGUF file is read by transformers' own GGUF loader (it needs the `gguf` package), which
de-quantises the weights to float. transformers refuses to save a model it loaded from GGUF, so the
weights move into the plain model class built from the same config, which saves as usual. An HF
folder (any dtype) is read and written again in `dtype`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any, Literal

import torch

from flowrl.engines.models.folders import atomic_dir, check_model_path, load_tokenizer

log = logging.getLogger(__name__)
Dtype = Literal["float32", "bfloat16", "float16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GGUF_MAGIC = b"GGUF"
GGUF_FIX = "pip install -e '.[real-model]' in the flowrl checkout (or pip install gguf)"


def import_model(source: str | Path, output: str | Path, dtype: Dtype = "bfloat16") -> Path:
    """Writes folder `output` from a .gguf file or an HF folder `source`; returns `output`."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {sorted(DTYPES)}")
    src = Path(source)
    if src.is_dir():
        model, tokenizer = _from_folder(src)
    elif src.is_file():
        model, tokenizer = _from_gguf(src)
    else:
        raise ValueError(f"{src}: no such file or folder; give a .gguf file or a Hugging Face model folder")
    model = plain_model(model, DTYPES[dtype])
    with atomic_dir(output) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    log.info("wrote %s (%s parameters, %s)", output, f"{model.num_parameters():,}", dtype)
    return Path(output)


def gguf_architecture(path: Path) -> str:
    """The file's `general.architecture`; one line naming the file when it is no GGUF or gguf is missing."""
    with path.open("rb") as file:
        if file.read(4) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file (it does not start with b'GGUF'); give a .gguf file or a "
                             f"Hugging Face model folder")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"{path}: reading a GGUF file needs the gguf package: {GGUF_FIX}")
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
    except KeyError:
        raise ValueError(f"{path}: the GGUF file has no general.architecture; re-convert it with llama.cpp's "
                         f"convert_hf_to_gguf.py") from None
    except Exception as err:  # a truncated or corrupt file: the reader's own exception types
        raise ValueError(f"{path}: cannot read the GGUF file ({type(err).__name__}: {err}); re-download or "
                         f"re-convert it") from None
    return bytes(field.parts[field.data[0]]).decode()


def _from_gguf(path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    architecture = gguf_architecture(path)
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{path}: transformers cannot load GGUF architecture {architecture!r} (it loads "
                         f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); convert the original model to a "
                         f"Hugging Face folder and import that")
    folder, name = str(path.parent), path.name
    log.info("reading %s (%s; de-quantising, may take a minute)", path, architecture)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    _set_special_tokens(tokenizer, path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 local_files_only=True)
    return model, tokenizer


SPECIAL_IDS = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
               "pad_token": "tokenizer.ggml.padding_token_id"}


def _set_special_tokens(tokenizer: Any, path: Path) -> None:
    """bos, eos and pad as the file's own ids name them: transformers' GGUF tokenizer conversion sets them
    differently across versions (5.17 made SmolLM2's eos <|im_start|>, id 1, where the file says 2)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    for attr, key in SPECIAL_IDS.items():
        if key in fields:
            field = fields[key]
            setattr(tokenizer, attr, tokenizer.convert_ids_to_tokens(int(field.parts[field.data[0]][0])))


def _from_folder(folder: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    check_model_path(folder)
    quantization = json.loads((folder / "config.json").read_text()).get("quantization_config")
    if quantization:
        raise ValueError(f"{folder}: config.json holds a quantized model ({quantization.get('quant_method')}); "
                         f"import the unquantized checkpoint (or its GGUF file) instead")
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype="auto", local_files_only=True)
    return model, load_tokenizer(folder)


def plain_model(model: Any, dtype: torch.dtype) -> Any:
    """The same weights in the model's own class built from its config without quantization_config, in
    `dtype`, with the model's generation config (a GGUF one holds the file's bos, eos and pad ids)."""
    import copy

    from transformers import AutoModelForCausalLM

    config = model.config
    if getattr(config, "quantization_config", None) is not None:  # set on a GGUF-loaded model's config
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(model.state_dict())  # strict: every weight of the plain class is copied
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain.eval()

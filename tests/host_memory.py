"""Host memory of one phase in a process (the weight-sync tests): a model large enough to show, and the peak
resident set a call adds."""

import ctypes
import re

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from flowrl.engines.models.folders import load_tokenizer

MB = 1 << 20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def build_wide_model(path, tokenizer_path):
    """The tiny model's tokenizer with a model of 134 MB in fp32 (2 layers of width 1024; largest tensor 16 MB)."""
    config = Qwen2Config(vocab_size=len(load_tokenizer(tokenizer_path)), hidden_size=1024, intermediate_size=4096,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
                         max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    load_tokenizer(tokenizer_path).save_pretrained(path)
    return path


def _status_kb(field):
    return int(re.search(rf"{field}:\s+(\d+)", open("/proc/self/status").read()).group(1))


def fix_mmap_threshold():
    """glibc's mmap threshold fixed at 128 KB (not raised as large blocks are freed): freed tensors leave the
    resident set, so each phase's peak is its own."""
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 << 10)


def reset_peak():
    """Start a measurement: VmHWM back to the current resident set; returns that (kB)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kb("VmRSS")


def peak_since(start_kb):
    """MB the resident set peaked above `start_kb` since reset_peak."""
    return (_status_kb("VmHWM") - start_kb) / 1024


def peak_during(fn):
    """Peak resident memory (MB) above what the process held before fn ran."""
    start = reset_peak()
    fn()
    return peak_since(start)


# What the split-pool weight-sync test runs inside Ray workers (`worker.__ray_call__.remote(fn, ...)`).

def shift_actor(worker, by):
    """Every shard of the actor's weights moved by `by` (so the synced weights differ from the checkpoint)."""
    with torch.no_grad():
        for p in worker.roles["actor"].engine.model.parameters():
            (p.to_local() if hasattr(p, "to_local") else p).add_(by)


def actor_weights(worker):
    """The actor's entries, unsharded (collective: every train rank calls it)."""
    return {name: t.clone() for name, t in worker.roles["actor"].engine.named_full_tensors()}


def rollout_weights(worker):
    return {name: t.detach().clone() for name, t in worker.roles["rollout"].engine.model.state_dict().items()}


def rollout_greedy(worker, ids, mask, params):
    return worker.roles["rollout"].engine.generate(ids, mask, params)["response_ids"]


def start_measuring(worker):
    fix_mmap_threshold()
    return reset_peak()


def measured(worker, start_kb):
    return peak_since(start_kb)


def old_gather(worker):
    """The full-state-dict path the collective transport replaced: every train rank's CPU copy."""
    return len(worker.roles["actor"].engine.full_state_dict())


def old_load(worker, state_dict):
    worker.roles["rollout"].engine.load_weights(state_dict)


def actor_state(worker):
    """The old path's first half: the full state dict on this train rank's CPU (collective), returned through
    Ray's object store."""
    return worker.roles["actor"].engine.full_state_dict()

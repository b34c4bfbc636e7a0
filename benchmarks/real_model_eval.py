"""Greedy test accuracy of a model folder on a data set's first rows, by the strict and flexible gsm8k scorers.

    python benchmarks/real_model_eval.py --model models/smollm2 --data data/wordproblems/test.parquet --num 200

Each prompt is wrapped by the tokenizer's chat template (as task.chat_template=true does in training),
prompts are left-padded into batches and decoded greedily with transformers' generate; a response is
its tokens before the first eos, decoded as flowrl's reward role decodes it. Prints one JSON line:
strict and flexible accuracy, the mean response length and the seconds taken (docs/real_model.md).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from flowrl.data.dataset import load_rows
from flowrl.data.prompts import encode_prompt
from flowrl.data.scoring.scorers import gsm8k, gsm8k_flexible
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer


def greedy_responses(model: Any, tokenizer: Any, prompts: list[Any], max_new_tokens: int,
                     batch_size: int) -> list[list[int]]:
    """Each prompt's greedy response ids, through (not including) the first eos."""
    device, pad, eos = next(model.parameters()).device, tokenizer.pad_token_id, tokenizer.eos_token_id
    out = []
    for start in range(0, len(prompts), batch_size):
        ids = [encode_prompt(tokenizer, p, chat_template=True) for p in prompts[start:start + batch_size]]
        width = max(map(len, ids))
        input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in ids], device=device)
        mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids], device=device)
        with torch.no_grad():
            generated = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False,
                                       max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                                       temperature=None, top_p=None, top_k=None)
        for row in generated[:, width:].tolist():
            out.append(row[:row.index(eos)] if eos in row else row)
    return out


def greedy_accuracy(model_dir: str, data: str, num: int, max_new_tokens: int = 256, batch_size: int = 32,
                    device: str = "cpu", dtype: str = "float32", responses_file: str | None = None) -> dict:
    """Strict and flexible gsm8k accuracy of `model_dir`'s greedy responses to `data`'s first `num` rows."""
    rows = load_rows([data], "--data")[:num]
    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, getattr(torch, dtype)).to(device).eval()
    start = time.perf_counter()
    ids = greedy_responses(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens, batch_size)
    seconds = time.perf_counter() - start
    texts = [tokenizer.decode(row) for row in ids]
    strict = [gsm8k(r["data_source"], t, r["ground_truth"]) for r, t in zip(rows, texts)]
    flexible = [gsm8k_flexible(r["data_source"], t, r["ground_truth"]) for r, t in zip(rows, texts)]
    if responses_file:
        with open(responses_file, "w") as f:
            for r, t, s, x in zip(rows, texts, strict, flexible):
                f.write(json.dumps({"truth": r["ground_truth"], "response": t, "strict": s, "flexible": x}) + "\n")
    return {"model": model_dir, "data": data, "num": len(rows), "strict": sum(strict) / len(rows),
            "flexible": sum(flexible) / len(rows), "mean_response_tokens": sum(map(len, ids)) / len(ids),
            "cut_off": sum(len(row) == max_new_tokens for row in ids), "max_new_tokens": max_new_tokens,
            "seconds": round(seconds, 1), "device": device}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder (flowrl model import's output)")
    parser.add_argument("--data", required=True, help="rows in verl's schema (flowrl data wordproblems' test.parquet)")
    parser.add_argument("--num", type=int, default=200, help="the first this many rows")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--responses", help="also write every response and its scores to this .jsonl")
    args = parser.parse_args()
    print(json.dumps(greedy_accuracy(args.model, args.data, args.num, args.max_new_tokens, args.batch_size,
                                     args.device, args.dtype, args.responses)))


if __name__ == "__main__":
    main()

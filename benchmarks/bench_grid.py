"""`grpo_vs_trl.py --grid`: one process runs its systems over several workload sizes in turn (a process start
costs 20-90 s on the GPU).

`--grid 16x8:256,64x8:256` is a list of PROMPTSxGROUP:NEW_TOKENS items, run in the order given. With variable
lengths the process's draws file holds the concatenation, in item order, of each item's `Workload.draws()`;
before item k the process's draw counter moves to that item's start and its end to that item's end, so the
item samples exactly the lengths it would sample alone in a fresh process (and runs out where it would).
"""

from __future__ import annotations

import re

import forced_lengths

ITEM = re.compile(r"(\d+)x(\d+):(\d+)")


def parse_grid(text: str) -> list[dict]:
    """'16x8:256,64x8:1024' -> [{prompts: 16, group: 8, new_tokens: 256}, ...]; one line of error otherwise."""
    items = []
    for part in (p.strip() for p in text.split(",")):
        match = ITEM.fullmatch(part)
        if not match or 0 in (sizes := tuple(int(g) for g in match.groups())):
            raise SystemExit(f"--grid: bad item {part!r}; want PROMPTSxGROUP:NEW_TOKENS with positive numbers, "
                             f"e.g. 16x8:256")
        items.append(dict(zip(("prompts", "group", "new_tokens"), sizes)))
    return items


def draw_layout(workloads: list) -> tuple[list[int], list[tuple[int, int]]]:
    """The concatenated draws of the items and each item's (start, end) in them."""
    draws, spans = [], []
    for wl in workloads:
        mine = wl.draws()
        spans.append((len(draws), len(draws) + len(mine)))
        draws += mine
    return draws, spans


def start_item(span: tuple[int, int]) -> None:
    """The process's next draw is the item's first; taking past the item's last raises, as in a fresh process."""
    draws = forced_lengths.process_draws()
    draws.next, draws.end = span


def warn_vllm(num_items: int, systems: list[str], flowrl_engine: str) -> None:
    """A vLLM engine started again in the same process for each item: never run on a card yet (flowrl's
    sleep-mode engine is one per process as far as we know); a failing item is reported, the next ones run."""
    if num_items > 1 and ("trl_vllm" in systems or ("flowrl" in systems and flowrl_engine == "vllm")):
        print("WARNING --grid: a vLLM engine per item in one process is untested; if an item fails, run the "
              "vLLM systems one item per process", flush=True)

"""A streamed replica spanning tensor-parallel ranks (flowrl.engines.streaming.lockstep): every follower steps
exactly the leader's adds, aborts and steps, a partial weight update's aborts included."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_cores import ScriptCore
from lockstep_ranks import TOKENS
from flowrl.engines.weights.reshard_plan import check_layout

HERE = Path(__file__).parent
RANKS = int(os.environ.get("FLOWRL_LOCKSTEP_RANKS", "2"))  # 4: 30 s here on the shared 2 cores


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """2 gloo ranks at tensor parallel 2, one replica (tests/lockstep_ranks.py; FLOWRL_LOCKSTEP_RANKS=4: two
    replicas, ranks 0-1 and 2-3): each rank's calls and results."""
    out = tmp_path_factory.mktemp("lockstep")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS),
                           str(HERE / "lockstep_ranks.py"), str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]


def test_each_follower_steps_exactly_its_leaders_requests(ranks):
    assert [r["leader"] for r in ranks] == [True, False, True, False][:RANKS]
    assert [r["src"] for r in ranks] == [0, 0, 2, 2][:RANKS]  # replicas of consecutive ranks, led by their rank 0
    for leader, follower in zip(ranks[::2], ranks[1::2]):
        assert follower["calls"] == leader["calls"]
        assert follower["messages"] > 10 and follower["sample"].startswith("a tensor-parallel follower rank")
    assert RANKS == 2 or ranks[0]["calls"] != ranks[2]["calls"]  # each replica its own requests


def test_the_updates_aborts_and_the_resumed_requests_reach_the_followers(ranks):
    calls = ranks[1]["calls"]
    kinds = [c[0] for c in calls]
    adds = [c for c in calls if c[0] == "add"]
    # 3 requests, the given-up one, the parked one (queued before the update); the refused one never
    assert len({c[1].split(".")[0] for c in adds}) == 5 and all(len(c[2]) < 100 for c in adds)
    aborts = [c for c in calls if c[0] == "abort"]
    assert len(aborts) == 2 and len(aborts[0][1]) == 1  # the caller who gave up, then the update's cut
    cut = set(aborts[1][1])
    resumed = [c for c in adds[kinds[:calls.index(aborts[1])].count("add"):]]
    assert len(resumed) == len(cut) - 1 > 0  # every cut request but the parked one whose caller gave up
    assert {c[1].split(".")[0] for c in resumed} < {c.split(".")[0] for c in cut}


def test_samples_continue_from_their_prefix_under_the_new_version(ranks):
    core = ScriptCore()
    for sample in ranks[0]["samples"]:
        assert len(sample["ids"]) == TOKENS and sample["aborts"] == 1
        start = sample["versions"].index(1)
        assert 0 < start and set(sample["versions"][start:]) == {1}
        head = [core.token(sample["prompt"], sample["seed"], j) for j in range(start)]
        tail = [core.token(sample["prompt"] + sample["ids"][:start], sample["seed"] + start, j)
                for j in range(TOKENS - start)]
        assert sample["ids"] == head + tail  # the resumed request: prompt + prefix, seed + its tokens so far
    assert "past the context" in ranks[0]["refused"]


def test_a_layout_that_does_not_divide_is_one_line():
    assert check_layout(4, 2) == 2
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide the rollout pool's 4 ranks"):
        check_layout(4, 3)

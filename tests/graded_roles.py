"""A user role with options of its own (`roles.grader.*`), in a module a run imports by name
(`algorithm=graded_roles:graded`), so its config is known only once the algorithm is resolved."""

from pydantic import Field

import flowrl as fl
from flowrl import losses, stages


class GraderConfig(fl.RoleConfig):
    threshold: float = Field(0.5, ge=0, le=1, description="A response scores 1 when at least this share of its "
                                                          "tokens are generated (not padding), else 0.")


@fl.role("grader", on_driver=True, config=GraderConfig)
class Grader:
    def __init__(self, config: GraderConfig):
        self.threshold = config.threshold

    @fl.graph_method(reads=("response_mask",), writes=("scores",))
    def score(self, batch):
        filled = batch["response_mask"].float().mean(-1)
        batch["scores"] = (filled >= self.threshold).float()
        fl.metrics.log("grader/threshold", self.threshold)
        return batch


@fl.algorithm
def graded(batch, actor, rollout, grader):
    batch = rollout.generate(batch, n=2)
    batch = grader.score(batch)
    batch = actor.logprobs(batch)
    batch = stages.group_advantage(batch)
    return actor.update(batch, loss=losses.ppo_loss())

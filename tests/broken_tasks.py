"""Tasks with the mistakes a user makes, for the one-line error tests."""

from flowrl.data.builtin.arithmetic import ArithmeticTask


class NoReward:
    meta_keys, chars = ("answer",), "0123456789+="

    def example(self, seed, index):
        return "1+1=", {"answer": "2"}


class RaisingReward(ArithmeticTask):
    def reward(self, responses, meta):
        return [1 / 0 for _ in responses]


class ForeignCharacters(ArithmeticTask):
    def example(self, seed, index):
        return "1+ä=", {"answer": "1"}


class HugeReward(ArithmeticTask):
    def reward(self, responses, meta):
        return [3e38 for _ in responses]


class InfiniteReward(ArithmeticTask):
    def reward(self, responses, meta):
        return [float("inf") for _ in responses]


class SlowReward(ArithmeticTask):
    """Each step's scoring takes FLOWRL_TEST_REWARD_S seconds (default 0.5): a run that lasts while tests act on it."""

    def reward(self, responses, meta):
        import os
        import time

        time.sleep(float(os.environ.get("FLOWRL_TEST_REWARD_S", "0.5")))
        return super().reward(responses, meta)


class HangingReward(ArithmeticTask):
    def reward(self, responses, meta):
        import time

        time.sleep(3600)


class ExitingReward(ArithmeticTask):
    """sys.exit(0) in a reward: the run must not end as if it had finished."""

    def reward(self, responses, meta):
        raise SystemExit(0)


class HangingExample(ArithmeticTask):
    """Prompt 2 never comes back."""

    def example(self, seed, index):
        if index == 2:
            import time

            time.sleep(3600)
        return super().example(seed, index)


class MissingKeyExample(ArithmeticTask):
    def example(self, seed, index):
        return {"answer": 1}["difficulty"]


class EmptyPrompt(ArithmeticTask):
    """example() gives an empty prompt for index 1 (it was `IndexError: index -1` deep in the rollout)."""

    def example(self, seed, index):
        prompt, meta = super().example(seed, index)
        return ("" if index == 1 else prompt), meta


class WordReward(ArithmeticTask):
    """reward() returns words, not numbers (it was `too many dimensions 'str'`)."""

    def reward(self, responses, meta):
        return ["good" for _ in responses]

"""The data layer: batches (TensorDict conventions), tasks and prompt streams."""

from flowrl.data.builtin.arithmetic import ArithmeticTask
from flowrl.data.batch import MODEL_INPUT, concat, prompt_batch, repeat_rows
from flowrl.data.prompts import PromptStream
from flowrl.data.tasks import Task, make_task

__all__ = ["ArithmeticTask", "MODEL_INPUT", "concat", "prompt_batch", "repeat_rows", "PromptStream", "Task",
           "make_task"]

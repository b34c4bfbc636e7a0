import torch
from tensordict import TensorDict

from flowrl.data.batch import column, concat, first_groups, left_pad, prompt_batch, repeat_rows, right_pad


def test_left_pad_and_prompt_batch_keep_metadata_aligned():
    ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    batch = prompt_batch([[5, 6], [7]], 0, uids=[10, 11], meta={"answer": ["a", "b"]})
    repeated = repeat_rows(batch, 2)
    assert repeated["uid"].tolist() == [10, 10, 11, 11]
    assert column(repeated, "answer") == ["a", "a", "b", "b"]


def test_right_pad_pads_with_the_given_value_and_is_one_column_wide_at_least():
    ids, mask = right_pad([[5, 6], [7]], pad_id=9)
    assert ids.tolist() == [[5, 6], [7, 9]] and mask.tolist() == [[1, 1], [1, 0]]
    logprobs, _ = right_pad([[-0.5], []], 0.0, torch.float32)
    assert logprobs.dtype == torch.float32 and logprobs.tolist() == [[-0.5], [0.0]]
    ids, mask = right_pad([[], []], pad_id=9)
    assert ids.tolist() == [[9], [9]] and mask.tolist() == [[0], [0]]


def test_concat_pads_prompts_left_and_responses_right():
    a = TensorDict({"prompt_ids": torch.tensor([[1, 2]]), "response_ids": torch.tensor([[3]]),
                    "group": torch.tensor([0])}, batch_size=[1])
    b = TensorDict({"prompt_ids": torch.tensor([[4]]), "response_ids": torch.tensor([[5, 6]]),
                    "group": torch.tensor([1])}, batch_size=[1])
    both = concat([a, b])
    assert both["prompt_ids"].tolist() == [[1, 2], [0, 4]]
    assert both["response_ids"].tolist() == [[3, 0], [5, 6]]
    a["response_mask"] = torch.tensor([[1]])
    b["response_mask"] = torch.tensor([[1, 1]])
    both = concat([a, b], pad_id=9)  # streamed groups of different widths: ids pad with pad_id, masks with 0
    assert both["prompt_ids"].tolist() == [[1, 2], [9, 4]]
    assert both["response_ids"].tolist() == [[3, 9], [5, 6]] and both["response_mask"].tolist() == [[1, 0], [1, 1]]


def test_first_groups_keeps_order_of_first_appearance():
    batch = TensorDict({"group": torch.tensor([7, 7, 3, 3, 9, 9])}, batch_size=[6])
    assert first_groups(batch, 2)["group"].tolist() == [7, 7, 3, 3]

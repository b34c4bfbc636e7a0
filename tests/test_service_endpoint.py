"""The OpenAI-compatible endpoint (flowrl.engines.service.endpoint) over the tiny model: what it returns equals
the batch engine's own sample, token ids and logprobs included; episodes are recorded; bad requests are one
line; a token guards it; it listens on 127.0.0.1 unless told otherwise."""

import json
import urllib.error
import urllib.request

import pytest
import torch

from flowrl.engines.hf.configs import HFRolloutConfig
from flowrl.data.batch import left_pad
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.service.endpoint import Endpoint
from flowrl.engines.streaming.thread_streamer import ThreadedStreamer

GREEDY = SamplingParams(max_new_tokens=6, greedy=True)
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"


@pytest.fixture(scope="module")
def served(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    engine = HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig())
    streamer = ThreadedStreamer(engine, pad_id=tokenizer.pad_token_id)
    endpoint = Endpoint(streamer, tokenizer, GREEDY, token="secret", chat_template=TEMPLATE)
    endpoint.start()
    yield endpoint, engine, tokenizer
    endpoint.stop()
    streamer.close()


def post(url, body, token="secret"):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def batch_sample(engine, tokenizer, ids, params=GREEDY):
    ids_BP, mask_BP = left_pad([ids], tokenizer.pad_token_id)
    out = engine.generate(ids_BP, mask_BP, params, seed=0)
    n = int(out["response_mask"][0].sum())
    return out["response_ids"][0, :n].tolist(), out["rollout_logprobs"][0, :n]


def test_a_completion_is_the_engines_own_sample_with_its_token_ids_and_logprobs(served):
    endpoint, engine, tokenizer = served
    ids = tokenizer.encode("12+3=")
    status, reply = post(f"{endpoint.base_url}/completions", {"model": "flowrl", "prompt": "12+3=", "max_tokens": 6})
    assert status == 200, reply
    expected_ids, expected_logprobs = batch_sample(engine, tokenizer, ids)
    assert reply["prompt_token_ids"] == ids and reply["token_ids"] == expected_ids
    assert torch.allclose(torch.tensor(reply["token_logprobs"]), expected_logprobs, atol=1e-5)
    assert reply["choices"][0]["text"] == tokenizer.decode(expected_ids, skip_special_tokens=True)
    assert reply["usage"] == {"prompt_tokens": 5, "completion_tokens": len(expected_ids),
                              "total_tokens": 5 + len(expected_ids)}
    assert reply["policy_versions"] == [0] * len(expected_ids)


def test_chat_goes_through_the_chat_template_and_the_openai_client_reads_it(served):
    openai = pytest.importorskip("openai")
    endpoint, engine, tokenizer = served
    client = openai.OpenAI(base_url=endpoint.base_url, api_key="secret", max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="flowrl", messages=[{"role": "user", "content": "7*8"}],
                                           max_tokens=4)
    ids = tokenizer.encode("7*8=")  # the template: contents, then "=" as the generation prompt
    assert reply.model_extra["prompt_token_ids"] == ids
    expected_ids, _ = batch_sample(engine, tokenizer, ids, SamplingParams(max_new_tokens=4, greedy=True))
    assert reply.model_extra["token_ids"] == expected_ids
    assert reply.choices[0].message.content == tokenizer.decode(expected_ids, skip_special_tokens=True)
    assert [m.id for m in client.models.list().data] == ["flowrl"]


def test_an_episodes_calls_are_recorded_and_a_closed_episode_is_refused(served):
    endpoint, _, tokenizer = served
    endpoint.book.open("e1")
    url = endpoint.episode_url("e1")
    _, first = post(f"{url}/completions", {"prompt": "9-4=", "max_tokens": 2})
    _, second = post(f"{url}/completions", {"prompt": first["prompt_token_ids"] + first["token_ids"], "max_tokens": 2})
    calls = endpoint.book.close("e1")
    assert [list(c.response_ids) for c in calls] == [first["token_ids"], second["token_ids"]]
    assert [list(c.logprobs) for c in calls] == [first["token_logprobs"], second["token_logprobs"]]
    status, reply = post(f"{url}/completions", {"prompt": "9-4=", "max_tokens": 2})
    assert status == 410 and "not open" in reply["error"]["message"]


@pytest.mark.parametrize("body, status, words", [
    ({"prompt": "1+1=", "temperature": 0.5}, 400, "temperature=0.5 differs from the run's roles.rollout.temperature"),
    ({"prompt": "1+1=", "stream": True}, 400, "stream=true is not supported"),
    ({"prompt": "1+1=", "n": 2}, 400, "one choice per request"),
    ({"prompt": "1+1=", "max_tokens": 0}, 400, "max_tokens must be a positive int"),
    ({"prompt": {"x": 1}}, 400, "prompt must be a string or a list of token ids"),
    ({"messages": "hi"}, 400, "messages must be a non-empty list"),
])
def test_bad_requests_are_one_line(served, body, status, words):
    endpoint, _, _ = served
    route = "chat/completions" if "messages" in body else "completions"
    got, reply = post(f"{endpoint.base_url}/{route}", body)
    assert got == status and words in reply["error"]["message"], reply


def test_the_token_is_required_and_a_stop_string_cuts_the_response(served):
    endpoint, engine, tokenizer = served
    assert post(f"{endpoint.base_url}/completions", {"prompt": "1+1="}, token=None)[0] == 401
    assert post(f"{endpoint.base_url}/completions", {"prompt": "1+1="}, token="wrong")[0] == 401
    full, _ = batch_sample(engine, tokenizer, tokenizer.encode("22+22="))
    text = tokenizer.decode(full, skip_special_tokens=True)
    stop = text[1] if len(text) > 1 else None
    if stop is None:
        pytest.skip("the tiny model's greedy answer is one character")
    _, reply = post(f"{endpoint.base_url}/completions", {"prompt": "22+22=", "stop": stop})
    assert reply["choices"][0]["text"] == text[:text.index(stop)]
    assert reply["token_ids"] == full[:text.index(stop) + 1]  # through the token that completed the stop


def test_only_loopback_listens_without_a_token(served):
    endpoint, engine, tokenizer = served
    with pytest.raises(ValueError, match="endpoint_host='0.0.0.0' is reachable from other machines"):
        Endpoint(endpoint.engine, tokenizer, GREEDY, host="0.0.0.0")
    assert endpoint.host == "127.0.0.1"


class DiesAfter:
    """A StreamingEngine that answers `good` requests with one token, then fails each one (a dead worker)."""

    version = 0

    def __init__(self, good: int):
        self.good, self.calls = good, 0

    async def sample(self, request):
        from flowrl.engines.protocols import FinishReason
        from flowrl.engines.streaming.protocol import Sample

        self.calls += 1
        if self.calls > self.good:
            raise RuntimeError("worker 3 died")
        return Sample(request, [request.prompt_ids[-1]], [-0.5], [self.version], FinishReason.STOP)

    async def pause(self, abort=False):
        pass

    def resume(self, version):
        self.version = version

    def close(self):
        pass


def test_after_an_engine_failure_the_call_is_500_and_every_later_call_503_sent_to_no_engine(tiny_model_path):
    tokenizer, engine = load_tokenizer(tiny_model_path), DiesAfter(good=1)
    endpoint = Endpoint(engine, tokenizer, GREEDY, chat_template=TEMPLATE)
    endpoint.start()
    try:
        ok, reply = post(f"{endpoint.base_url}/completions", {"prompt": [5, 6]}, token=None)
        assert ok == 200 and reply["token_ids"] == [6] and reply["token_logprobs"] == [-0.5]
        failed, reply = post(f"{endpoint.base_url}/completions", {"prompt": [5, 6]}, token=None)
        assert failed == 500 and reply["error"] == {"message": "the rollout engine failed: RuntimeError: worker 3 died",
                                                     "type": "server_error"}
        endpoint.book.open("e1")  # an episode's own base_url is refused alike, and so is chat
        for url, body in ((f"{endpoint.base_url}/completions", {"prompt": "1+1="}),
                          (f"{endpoint.episode_url('e1')}/completions", {"prompt": [7]}),
                          (f"{endpoint.base_url}/chat/completions", {"messages": [{"role": "user", "content": "1"}]})):
            status, reply = post(url, body, token=None)
            assert status == 503, reply
            assert reply["error"]["message"] == "the rollout engine failed earlier: RuntimeError: worker 3 died"
        assert engine.calls == 2 and str(endpoint.failure) == "worker 3 died"  # the 503s reached no engine
        assert endpoint.book.close("e1") == []
    finally:
        endpoint.stop()

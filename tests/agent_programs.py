"""Agent programs for the black-box agent tests (flowrl.engines.service.black_box_agents): each plays one
episode through the endpoint's base_url with plain HTTP (urllib) or the openai client, as an outside program
would."""

import json
import os
import time
import urllib.request

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import stages
from flowrl.rl.options import KLLossCoef



def post(base_url, route, body, key="flowrl"):
    request = urllib.request.Request(f"{base_url}/{route}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def two_calls(episode):
    """Two completions over token ids: the second prompt is the first prompt, its response and "="; the reward
    is 1 when the second response is shorter than the first."""
    first = post(episode.base_url, "completions", {"prompt": list(episode.prompt_ids), "max_tokens": 3})
    equals = post(episode.base_url.removesuffix("/v1").rsplit("/episodes/", 1)[0], "tokenize", {"prompt": "="})
    second = post(episode.base_url, "completions",
                  {"prompt": first["prompt_token_ids"] + first["token_ids"] + equals["tokens"], "max_tokens": 3})
    return {"reward": float(len(second["token_ids"]) < len(first["token_ids"]))}


def chat_openai(episode):
    """One chat turn through the openai client (text in, text out)."""
    import openai

    client = openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0, timeout=60)
    reply = client.chat.completions.create(model="flowrl", messages=[{"role": "user", "content": episode.prompt}],
                                           max_tokens=3)
    return 1.0 if reply.choices[0].message.content else 0.0


def hangs(episode):
    post(episode.base_url, "completions", {"prompt": list(episode.prompt_ids), "max_tokens": 2})
    time.sleep(30)  # past the deadline: abandoned
    post(episode.base_url, "completions", {"prompt": list(episode.prompt_ids), "max_tokens": 2})


def crashes(episode):
    post(episode.base_url, "completions", {"prompt": list(episode.prompt_ids), "max_tokens": 2})
    raise RuntimeError("the agent's own bug")


def hangs_every_third(episode):
    return hangs(episode) if episode.id.endswith(("-0", "-3")) else two_calls(episode)


def process_main():
    """The program form: FLOWRL_* in the environment, the reward as the last line printed."""
    base_url, prompt = os.environ["FLOWRL_BASE_URL"], os.environ["FLOWRL_PROMPT"]
    reply = post(base_url, "completions", {"prompt": prompt, "max_tokens": 3}, os.environ["FLOWRL_API_KEY"])
    print("log line the trainer ignores")
    print(json.dumps({"reward": float(len(reply["token_ids"]))}))


class AgentGRPOConfig(fl.GRPOConfig):
    model_config = ConfigDict(extra="forbid")
    kl_coef: KLLossCoef = 0.0


@fl.algorithm(config=AgentGRPOConfig)
def grpo_agent(batch, actor, rollout, ref, cfg):
    batch = rollout.agents(batch, n=cfg.group_size)  # the agent's rewards land in `scores`
    batch = actor.logprobs(batch)
    loss = cfg.loss()
    if "ref_logprobs" in loss.reads:
        batch = ref.logprobs(batch)
    batch = stages.group_advantage(batch)
    return actor.update(batch, loss=loss)


if __name__ == "__main__":
    process_main()

"""verl's algorithm keys as flowrl's: which algorithm (algorithm.adv_estimator, the policy loss's mode, DAPO's
keys) and its `algo.*` options (clip, KL, advantages). An option the chosen algorithm's config lacks is dropped
when verl's value has no effect there, and refused in one line when the command set it to one that would."""

from __future__ import annotations

from typing import Any

from flowrl.config.verl_keys import AR, BY_KEY, Given, Mapped
from flowrl.rl.options import KLLoss, KLReward

ESTIMATORS = {"gae": "ppo", "grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_pp",
              "reinforce_plus_plus_baseline": "reinforce_pp_baseline", "remax": "remax"}
"""verl's advantage estimators and flowrl's algorithm for each (GRPO's relatives are chosen by choose_algorithm)."""

ACTOR = f"{AR}.actor"
OVERLONG = ("reward_model.overlong_buffer", "reward_model.reward_kwargs.overlong_buffer_cfg")


def clip_range(v: Given) -> tuple[float, float]:
    """verl's (clip_ratio_low, clip_ratio_high), each clip_ratio where unset."""
    clip = float(v(f"{ACTOR}.clip_ratio"))
    low, high = (v(f"{ACTOR}.clip_ratio_{side}") for side in ("low", "high"))
    return float(clip if low is None else low), float(clip if high is None else high)


def overlong(v: Given) -> tuple[int, float] | None:
    """DAPO's overlong buffer (length, penalty factor) when either of verl's two spellings enables it."""
    for prefix in OVERLONG:
        if v(f"{prefix}.enable", False):
            return int(v(f"{prefix}.len")), float(v(f"{prefix}.penalty_factor", 1.0))
    return None


def choose_algorithm(v: Given) -> str:
    estimator, mode = v("algorithm.adv_estimator"), v(f"{ACTOR}.policy_loss.loss_mode")
    if estimator not in ESTIMATORS:
        raise ValueError(f"algorithm.adv_estimator={estimator}: --verl maps {', '.join(ESTIMATORS)}; flowrl's own "
                         f"algorithms are listed by `flowrl algorithms`")
    if v("algorithm.use_pf_ppo"):
        raise ValueError("algorithm.use_pf_ppo=true: flowrl's PF-PPO is an algorithm of its own: `flowrl train pf_ppo`")
    if mode not in ("vanilla", "gspo") or (mode == "gspo" and estimator != "grpo"):
        raise ValueError(f"{ACTOR}.policy_loss.loss_mode={mode}: --verl maps vanilla, and gspo with "
                         f"adv_estimator=grpo; flowrl's other losses are algorithms of their own (`flowrl algorithms`)")
    if mode == "gspo":
        return "gspo"
    low, high = clip_range(v)
    if estimator == "grpo" and (v("algorithm.filter_groups.enable") or overlong(v) or low != high):
        return "dapo"
    return ESTIMATORS[estimator]


def kl_options(v: Given, config: type) -> dict[str, Any]:
    """algo.kl_coef from verl's KL as a loss (actor.use_kl_loss) or in the reward (algorithm.use_kl_in_reward),
    whichever the algorithm has; the other one, if on, is refused."""
    loss, in_reward = bool(v(f"{ACTOR}.use_kl_loss")), bool(v("algorithm.use_kl_in_reward"))
    loss_coef = float(v(f"{ACTOR}.kl_loss_coef")) if loss else 0.0
    reward_coef = float(v("algorithm.kl_ctrl.kl_coef")) if in_reward else 0.0
    if loss and loss_coef and v(f"{ACTOR}.kl_loss_type") not in ("low_var_kl", "k3"):
        raise ValueError(f"{ACTOR}.kl_loss_type={v(f'{ACTOR}.kl_loss_type')}: flowrl's KL loss is low_var_kl (k3)")
    if in_reward and reward_coef and v("algorithm.kl_penalty") not in ("kl", "k1"):
        raise ValueError(f"algorithm.kl_penalty={v('algorithm.kl_penalty')}: flowrl's KL in the reward is kl (k1)")
    has_loss, has_reward = issubclass(config, KLLoss), issubclass(config, KLReward)
    for on, coef, has, key, other in ((loss, loss_coef, has_loss, f"{ACTOR}.use_kl_loss", "in the reward"),
                                      (in_reward, reward_coef, has_reward, "algorithm.use_kl_in_reward", "as a loss")):
        if on and coef and not has:
            where = f"only {other}" if has_loss or has_reward else "no KL term"
            raise ValueError(f"{key}=true: this algorithm has {where} in flowrl; set {key}=false")
    if has_reward:
        options = {"kl_coef": reward_coef}
        if "kl_ctrl" in config.model_fields and in_reward:
            options.update(kl_ctrl=v("algorithm.kl_ctrl.type"), target_kl=float(v("algorithm.kl_ctrl.target_kl")),
                           horizon=int(v("algorithm.kl_ctrl.horizon")))
        return options
    return {"kl_coef": loss_coef} if has_loss else {}


def loss_options(v: Given, fields: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """Each algo option with the verl key it comes from."""
    low, high = clip_range(v)
    options: dict[str, tuple[Any, str]] = {
        "group_size": (int(v(f"{AR}.rollout.n")), f"{AR}.rollout.n"),
        "dual_clip": (float(v(f"{ACTOR}.clip_ratio_c")), f"{ACTOR}.clip_ratio_c"),
        "loss_agg_mode": (v(f"{ACTOR}.loss_agg_mode"), f"{ACTOR}.loss_agg_mode"),
        "entropy_coef": (float(v(f"{ACTOR}.entropy_coeff")), f"{ACTOR}.entropy_coeff"),
        "norm_by_std": (bool(v("algorithm.norm_adv_by_std_in_grpo")), "algorithm.norm_adv_by_std_in_grpo"),
        "gamma": (float(v("algorithm.gamma")), "algorithm.gamma"),
        "lam": (float(v("algorithm.lam")), "algorithm.lam"),
        "value_clip": (float(v("critic.cliprange_value")), "critic.cliprange_value"),
    }
    if "clip" in fields:
        options["clip"] = (low, f"{ACTOR}.clip_ratio_low")
        if low != high:
            raise ValueError(f"{ACTOR}.clip_ratio_high={high}: this algorithm clips alike on both sides in flowrl "
                             f"(clip_ratio_low={low})")
    else:
        options.update(clip_low=(low, f"{ACTOR}.clip_ratio_low"), clip_high=(high, f"{ACTOR}.clip_ratio_high"))
    return options


def dapo_options(v: Given) -> dict[str, tuple[Any, str]]:
    enable = "algorithm.filter_groups.enable"
    options: dict[str, tuple[Any, str]] = {"dynamic_sampling": (bool(v(enable)), enable)}
    if v(enable) and v("algorithm.filter_groups.metric", "seq_reward") not in ("seq_reward", "acc"):
        raise ValueError(f"algorithm.filter_groups.metric={v('algorithm.filter_groups.metric')}: flowrl drops the "
                         f"groups whose scores are all equal (seq_reward, or acc for 0/1 rewards)")
    rounds = int(v("algorithm.filter_groups.max_num_gen_batches", 0) or 0)
    if v(enable) and rounds:
        options["max_sampling_rounds"] = (rounds, "algorithm.filter_groups.max_num_gen_batches")
    buffer = overlong(v)
    options["overlong_buffer_len"] = (buffer[0] if buffer else 0, f"{OVERLONG[0]}.len")
    if buffer:
        options["overlong_penalty"] = (buffer[1], f"{OVERLONG[0]}.penalty_factor")
    return options


CORRECTION = {"rollout_is": "is_level", "rollout_is_threshold": "is_threshold", "rollout_rs": "rs_level",
              "rollout_rs_threshold": "rs_threshold"}


def correction_options(v: Given) -> dict[str, Any]:
    options = {}
    for key, target in CORRECTION.items():
        value = v(f"algorithm.rollout_correction.{key}")
        if value is not None:
            options[target] = value
    return {"rollout_correction": options} if options else {}


def algo_options(v: Given, out: Mapped) -> dict[str, Any]:
    """The chosen algorithm's algo.* values: those its config has; the others dropped, or refused when the
    command set them to a value that would matter."""
    import flowrl.algorithms  # noqa: F401 (registers the prebuilt ones)
    from flowrl.graph.algorithm import ALGORITHMS

    config = ALGORITHMS.get(out.algorithm).config_cls
    fields = config.model_fields
    candidates = {**loss_options(v, fields), **(dapo_options(v) if "dynamic_sampling" in fields else {})}
    options = {**kl_options(v, config), **correction_options(v)}
    for name, (value, key) in candidates.items():
        if name in fields:
            options[name] = value
        elif key not in v.values or value == BY_KEY[key].default:
            continue  # verl's default, or unset: no effect here
        elif name == "group_size" or (name == "norm_by_std" and v("algorithm.adv_estimator") == "grpo"):
            raise ValueError(f"{key}={v.values[key]}: flowrl's {out.algorithm} has no such option (algo.{name})")
        else:
            out.notes.append(f"{key}={v.values[key]}: not honoured: flowrl's {out.algorithm} has no algo.{name}")
    defaults = config().model_dump()
    return {name: value for name, value in options.items() if value != defaults.get(name)}  # the command: short

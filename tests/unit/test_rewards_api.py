"""agrpo.rewards: TRL's reward names and signatures, scoring here and configured as built-ins."""

import inspect

import pytest

import agrpo.rewards as rewards
from agrpo import AsyncGRPOConfig, AsyncGRPOTrainer
from agrpo.services.reward.builtins import builtin_key

TRL_NAMES = ["accuracy_reward", "get_cosine_scaled_reward", "get_repetition_penalty_reward",
             "get_soft_overlong_punishment", "reasoning_accuracy_reward", "think_format_reward"]
# The parameters of trl.rewards 1.16.0's functions, in order.
TRL_PARAMETERS = {
    "accuracy_reward": ["completions", "solution", "log_extra", "kwargs"],
    "reasoning_accuracy_reward": ["completions", "solution", "reasoning_delimiters", "log_extra", "kwargs"],
    "think_format_reward": ["completions", "kwargs"],
    "get_cosine_scaled_reward": ["max_len", "min_value_wrong", "max_value_wrong", "min_value_correct",
                                 "max_value_correct"],
    "get_repetition_penalty_reward": ["ngram_size", "max_penalty"],
    "get_soft_overlong_punishment": ["max_completion_len", "soft_punish_cache"],
}


def test_every_trl_name_is_here_with_trls_parameters():
    assert sorted(rewards.__all__) == TRL_NAMES
    for name, params in TRL_PARAMETERS.items():
        assert list(inspect.signature(getattr(rewards, name)).parameters) == params, name


def test_they_score_in_this_process():
    msgs = [[{"role": "assistant", "content": "<think>x</think> so \\boxed{4}"}], [{"content": "five"}]]
    assert rewards.accuracy_reward(msgs, ["4", "4"]) == [1.0, 0.0]
    assert rewards.think_format_reward(msgs) == [1.0, 0.0]
    assert rewards.reasoning_accuracy_reward(msgs, ["4", "4"]) == [1.0, 0.0]
    overlong = rewards.get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)
    assert overlong.__name__ == "soft_overlong_punishment_reward"
    assert overlong(completion_ids=[[1] * 5, [1] * 8, [1] * 12]) == [0.0, -0.5, -1.0]
    with pytest.raises(ValueError):
        rewards.get_repetition_penalty_reward(max_penalty=1.0)  # checked when made, as TRL does


def test_the_api_configures_them_as_built_ins_not_pickles(tmp_path):
    funcs = [rewards.accuracy_reward, rewards.get_cosine_scaled_reward(max_len=100)]
    trainer = AsyncGRPOTrainer(model=str(tmp_path), reward_funcs=funcs, train_dataset="x.jsonl",
                               args=AsyncGRPOConfig(output_dir=str(tmp_path / "out")))
    import yaml

    entries = yaml.safe_load(trainer.config().read_text())["reward_funcs"]
    assert entries[0] == {"name": "accuracy"} and builtin_key(entries[0]["name"]) == "accuracy"
    assert entries[1]["name"] == "cosine_scaled" and entries[1]["kwargs"]["max_len"] == 100
    assert not list((tmp_path / "out" / "api").glob("*.pkl"))

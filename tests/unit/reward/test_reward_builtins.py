"""Built-in reward functions on TRL's documented examples and edge cases."""

from __future__ import annotations

import threading

import pytest

from agrpo.services.reward import builtins as b


def conv(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_accuracy_trl_example_and_formats():
    sol = [r"\frac{1}{3}"] * 2
    assert b.Accuracy()([conv(r"My answer is \boxed{\frac{1}{3}}"),
                         conv(r"My answer is \boxed{\frac{1}{2}}")], sol) == [1.0, 0.0]
    # Standard completions, GSM8K-style numbers, LaTeX equivalents, unparseable gold.
    out = b.Accuracy()([r"so \boxed{72}", r"$0.5$ is \boxed{\dfrac{1}{2}}", "x", "y"],
                       ["72", r"\frac{1}{2}", "42", "no math here"])
    assert out == [1.0, 1.0, 0.0, None]


def test_accuracy_in_a_thread_turns_timeouts_off_like_trl():
    result = {}
    thread = threading.Thread(target=lambda: result.update(
        v=b.Accuracy()([r"\boxed{2}"], ["2"])))
    thread.start()
    thread.join(60)
    assert result["v"] == [1.0]


def test_reasoning_accuracy_trl_example():
    sol = [r"\frac{1}{3}"] * 3
    completions = [conv(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}"),
                   conv(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}"),
                   conv(r"<think> Reasoning with partial answers \boxed{\frac{1}{3}} but no final answer")]
    assert b.ReasoningAccuracy()(completions, sol) == [1.0, 0.0, 0.0]
    custom = b.ReasoningAccuracy(reasoning_delimiters=["### Answer"])
    assert custom([r"junk \boxed{5} ### Answer \boxed{3}"], ["3"]) == [1.0]


def test_think_format_trl_example():
    completions = [conv("<think>\nThis is my reasoning.\n</think>\nThis is my answer."),
                   conv("<think>\nThis is my reasoning.\nThis is my answer."),
                   conv("<think>a</think><think>b</think>"), "<think>ok</think> plain string"]
    assert b.ThinkFormat()(completions) == [1.0, 0.0, 0.0, 1.0]


def test_cosine_scaled_trl_example_and_clamp():
    fn = b.CosineScaled(max_len=100)
    completions = [conv(r"\boxed{\frac{1}{3}}"), conv(r"\boxed{\frac{1}{2}}")]
    sol = [r"\frac{1}{3}"] * 2
    assert fn(completions, sol, [[1] * 50, [1] * 50]) == pytest.approx([0.75, -0.75])
    assert fn(completions, sol, [[1] * 0, [1] * 0]) == pytest.approx([1.0, -1.0])
    assert fn(completions, sol, [[1] * 300, [1] * 300]) == pytest.approx([0.5, -0.5])  # clamped
    assert fn([conv("x")], ["not math"], [[1]]) == [None]
    with pytest.raises(ValueError):
        b.CosineScaled(max_len=0)


def test_repetition_penalty_trl_example():
    fn = b.RepetitionPenalty(ngram_size=2, max_penalty=-1.0)
    assert fn([[1, 2, 3, 4], [5, 5, 5, 5, 5], [1]]) == [0.0, -0.75, 0.0]
    assert b.RepetitionPenalty()([[1, 2, 3, 1, 2, 3]]) == pytest.approx([-0.25])
    for bad in ({"ngram_size": 0}, {"max_penalty": 0.5}):
        with pytest.raises(ValueError):
            b.RepetitionPenalty(**bad)


def test_soft_overlong_punishment_dapo():
    fn = b.SoftOverlongPunishment(max_completion_len=100, soft_punish_cache=20)
    assert fn([[1] * n for n in (10, 80, 90, 100, 101)]) == pytest.approx([0, 0, -0.5, -1.0, -1.0])


def test_builtin_names_a_trl_user_would_write():
    assert b.builtin_key("accuracy") == "accuracy"
    assert b.builtin_key("accuracy_reward") == "accuracy"
    assert b.builtin_key("trl.rewards:get_cosine_scaled_reward") == "cosine_scaled"
    assert b.builtin_key("builtin:think_format") == "think_format"
    assert b.builtin_key("mypkg.rewards:accuracy") is None
    instances = (b.Accuracy(), b.ThinkFormat(), b.SoftOverlongPunishment(10, 2))
    assert {fn.__name__ for fn in instances} == {
        "accuracy_reward", "think_format_reward", "soft_overlong_punishment_reward"}

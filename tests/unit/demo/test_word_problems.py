"""The word-problem task (agrpo demo --task word-problems): the generated problems' answers against
a solver that reads only their text, the reward on chains of thought, the demo's settings."""

import json
import random
import re
from pathlib import Path

import pytest

from agrpo.demo import runner
from agrpo.demo.cli import parse
from agrpo.demo.task import final_answer, word_problem, write_word_problems_dataset

# --- an independent solver: the problem's sentences, read one by one ------------------------

_START_BOXES = re.compile(r"^(\w+) has (\d+) boxes of (\d+) (\w+)\.$")
_START = re.compile(r"^(\w+) has (\d+) (\w+)\.$")
_RULES = [  # (pattern, what it does to the count, operations it takes)
    (re.compile(r"^(?:She|He) (?:buys|finds) (\d+) more\.$"), lambda v, x, box: v + x, 1),
    (re.compile(r"^A friend gives (?:her|him) (\d+) more\.$"), lambda v, x, box: v + x, 1),
    (re.compile(r"^(?:She|He) (?:gives|loses|gives away) (\d+)(?: to a friend)?\.$"), lambda v, x, box: v - x, 1),
    (re.compile(r"^(?:She|He) buys (\d+) more boxes\.$"), lambda v, x, box: v + x * box, 2),
    (re.compile(r"^Then the number of \w+ (?:she|he) has (doubles|triples)\.$"),
     lambda v, x, box: v * {"doubles": 2, "triples": 3}[x], 1),
    (re.compile(r"^(?:She|He) shares them equally among (\d+) friends\.$"), lambda v, x, box: v / x, 1),
]


def solve(text: str) -> tuple[float, int]:
    """(answer, operations) of a problem, from its text alone."""
    body = text.split(" Put the final answer")[0]
    sentences = re.findall(r"[^.?]+[.?]", body)
    *changes, question = (s.strip() for s in sentences)
    assert question.startswith("How many"), question
    first, *changes = changes
    if m := _START_BOXES.match(first):
        value, box, ops = int(m[2]) * int(m[3]), int(m[3]), 1
    else:
        m = _START.match(first)
        assert m, first
        value, box, ops = int(m[2]), None, 0
    for sentence in changes:
        for pattern, apply, cost in _RULES:
            if m := pattern.match(sentence):
                x = m[1] if m[1] in ("doubles", "triples") else int(m[1])
                value, ops = apply(value, x, box), ops + cost
                break
        else:
            raise AssertionError(f"no rule reads {sentence!r}")
    return value, ops


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_every_answer_is_what_the_text_says(tmp_path, seed):
    rows = _rows(write_word_problems_dataset(tmp_path / "w.jsonl", 64, seed=seed))
    assert len(rows) == 64
    for row in rows:
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].endswith(" Put the final answer in \\boxed{}.")
        answer, ops = solve(message["content"])
        assert answer == int(row["solution"]) and 1 <= ops <= 4, (message["content"], row["solution"])
        assert re.fullmatch(r"[1-9]\d{0,2}|0", row["solution"])  # one plain number: no sign, point or comma


def test_seed_0_begins_with_these_problems(tmp_path):
    """Pinned (checked by hand): a change in the generator changes every race's prompts."""
    rows = _rows(write_word_problems_dataset(tmp_path / "w.jsonl", 3, seed=0))
    assert [r["prompt"][0]["content"].split(" Put")[0] for r in rows] == [
        ("Leo has 6 boxes of 9 apples. Then the number of apples he has triples. He gives away 12. He buys 18 more. "
         "How many apples does Leo have now?"),
        ("Ravi has 13 pencils. Then the number of pencils he has doubles. He gives away 4. He finds 12 more. "
         "How many pencils does Ravi have now?"),
        "Sara has 3 boxes of 9 stamps. How many stamps does Sara have?"]
    assert [r["solution"] for r in rows] == ["168", "34", "27"]  # 54*3-12+18, 13*2-4+12, 3*9


def test_chains_of_thought_vary_from_one_line_to_four(tmp_path):
    rng = random.Random(7)
    problems = [word_problem(rng) for _ in range(400)]
    counts = {n: sum(len(p.steps) == n for p in problems) for n in (1, 2, 3, 4)}
    assert sum(counts.values()) == 400 and min(counts.values()) >= 70, counts  # uniform: 100 each
    for p in problems:  # every reference line is true arithmetic and the chain ends on the answer
        for line in p.steps:
            a, op, b, _, c = line.split()
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b),
                    "/": int(a) / int(b)}[op] == int(c), line
        assert int(p.steps[-1].split()[-1]) == p.answer and 0 < p.answer < 1000
        assert solve(p.question) == (p.answer, len(p.steps))
    with pytest.raises(ValueError):
        word_problem(rng, num_ops=5)
    assert len(word_problem(random.Random(1), num_ops=3).steps) == 3


def test_the_dataset_is_seeded(tmp_path):
    a = write_word_problems_dataset(tmp_path / "a.jsonl", 20, seed=5).read_text()
    assert a == write_word_problems_dataset(tmp_path / "b.jsonl", 20, seed=5).read_text()
    assert a != write_word_problems_dataset(tmp_path / "c.jsonl", 20, seed=6).read_text()


def test_final_answer_scores_chains_of_thought():
    p = word_problem(random.Random(0))  # 168: 54 * 3 - 12 + 18
    chains = [
        "6 boxes of 9 is 54. Tripled: 162. He gives away 12, so 150. Then 18 more: 150 + 18 = 168 apples.",
        "54 * 3 = 162\n162 - 12 = 150\n150 + 18 = \\boxed{168}",
        "The answer is \\boxed{168}. (I first thought 150.)",  # the box beats a later number
        "54 * 3 = 162, 162 - 12 = 150, 150 + 18 = 168. So Leo has 168 apples left after 2 trades.",
        "54 * 3 = 162, 162 - 12 = 150. Leo has 150 apples.",  # stopped one step short
        "\\boxed{150} ... 168",
        "Leo has a lot of apples.",
    ]
    assert final_answer(chains, solution=[str(p.answer)] * len(chains)) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


# --- the demo ------------------------------------------------------------------------------

def test_the_demo_trains_word_problems_when_asked_and_its_defaults_are_unchanged(tmp_path):
    words = parse(["--model", "smollm2", "--task", "word-problems", "--out", str(tmp_path)])
    assert runner.task_settings(words) == {"reward_funcs": [{"name": "agrpo.demo.task:final_answer"}],
                                           "max_completion_length": 256, "learning_rate": 2e-5, "temperature": 1.0}
    rows = _rows(runner.write_prompts(words))
    assert len(rows) == 64 and all(solve(r["prompt"][0]["content"])[0] == int(r["solution"]) for r in rows)
    # the defaults, as before --task existed
    assert runner.task_settings(parse(["--model", "smollm2"])) == {
        "reward_funcs": [{"name": "agrpo.demo.task:final_answer"}], "max_completion_length": 32,
        "learning_rate": 2e-5, "temperature": 1.0}
    assert runner.task_settings(parse([])) == {"reward_funcs": [{"name": "agrpo.demo.task:digit_share"}],
                                               "max_completion_length": 24, "learning_rate": 3e-3, "temperature": 1.0}
    assert runner.task_settings(parse(["--model", "1.5b"]))["learning_rate"] == runner.SHAPED_LR
    sums = _rows(runner.write_prompts(parse(["--model", "smollm2", "--out", str(tmp_path / "s")])))
    assert sums[0]["prompt"][0]["content"].startswith("What is ") and int(sums[0]["solution"]) <= 18
    with pytest.raises(SystemExit):
        parse(["--task", "poetry"])


def test_shaped_models_get_room_for_long_completions(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 1024, "hidden_size": 8}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    runner._long_positions(tmp_path)
    runner._long_positions(tmp_path)  # idempotent
    assert json.loads((tmp_path / "config.json").read_text()) == {"max_position_embeddings": 32768, "hidden_size": 8}
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 32768
    runner._long_positions(tmp_path / "absent")  # nothing to raise: nothing happens

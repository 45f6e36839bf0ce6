import json

import pytest

from agrpo.services.common.config.sections import DatasetConfig
from agrpo.services.rollout.data import build_prompt_set, load_rows, load_tokenizer


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def test_standard_and_conversational_prompts(tok):
    rows = [{"prompt": "What is 1 + 1?", "solution": "2"},
            {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "solution": "4"}]
    ps = build_prompt_set(rows, tok, prompt_column="prompt", max_prompt_len=100,
                          chat_template_kwargs=None, seed=0)
    std, conv = ps[0], ps[1]
    assert std.prompt_ids == tok("What is 1 + 1?", add_special_tokens=False)["input_ids"]
    assert not std.conversational and conv.conversational
    text = tok.apply_chat_template(rows[1]["prompt"], add_generation_prompt=True, tokenize=False)
    assert conv.prompt_text == text and text.endswith("<|im_start|>assistant\n")
    assert conv.prompt_ids == tok(text, add_special_tokens=False)["input_ids"]
    assert std.columns == {"solution": "2"} and conv.columns == {"solution": "4"}


def test_too_long_prompts_are_skipped_and_counted(tok):
    rows = [{"prompt": "short"}, {"prompt": "word " * 200}, {"prompt": "also short"}]
    ps = build_prompt_set(rows, tok, prompt_column="prompt", max_prompt_len=20,
                          chat_template_kwargs=None, seed=0)
    assert len(ps) == 2 and ps.skipped == 1 and sorted(ps.order(0)) == [0, 2]
    with pytest.raises(ValueError, match="fits"):
        build_prompt_set(rows[1:2], tok, prompt_column="prompt", max_prompt_len=20,
                         chat_template_kwargs=None, seed=0)


def test_missing_prompt_column_is_a_clear_error(tok):
    with pytest.raises(ValueError, match="question"):
        build_prompt_set([{"prompt": "x"}], tok, prompt_column="question", max_prompt_len=20,
                         chat_template_kwargs=None, seed=0)


def test_per_epoch_shuffle_is_seeded(tok):
    rows = [{"prompt": f"p{i}"} for i in range(30)]
    a = build_prompt_set(rows, tok, prompt_column="prompt", max_prompt_len=50, chat_template_kwargs=None, seed=1)
    b = build_prompt_set(rows, tok, prompt_column="prompt", max_prompt_len=50, chat_template_kwargs=None, seed=1)
    c = build_prompt_set(rows, tok, prompt_column="prompt", max_prompt_len=50, chat_template_kwargs=None, seed=2)
    assert a.order(0) == b.order(0) and a.order(1) == b.order(1)
    assert a.order(0) != a.order(1) and a.order(0) != c.order(0)
    assert sorted(a.order(3)) == list(range(30))


def test_chat_template_kwargs_reach_the_template(tok, monkeypatch):
    seen = {}
    real = tok.apply_chat_template

    def spy(messages, **kw):
        seen.update(kw)
        return real(messages, **{k: v for k, v in kw.items() if k != "enable_thinking"})
    monkeypatch.setattr(tok, "apply_chat_template", spy)
    build_prompt_set([{"prompt": [{"role": "user", "content": "hi"}]}], tok, prompt_column="prompt",
                     max_prompt_len=50, chat_template_kwargs={"enable_thinking": False}, seed=0)
    assert seen["enable_thinking"] is False and seen["add_generation_prompt"] is True


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_load_rows_from_files(tmp_path, fmt):
    rows = [{"prompt": f"q{i}", "solution": str(i)} for i in range(3)]
    path = tmp_path / f"d.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        cfg = DatasetConfig(path="json", data_files=str(path))
    else:
        import datasets
        ds = datasets.Dataset.from_list(rows)
        ds.to_csv(str(path), index=False) if fmt == "csv" else ds.to_parquet(str(path))
        cfg = DatasetConfig(path=fmt, data_files=str(path))
    got = load_rows(cfg)
    assert [r["prompt"] for r in got] == ["q0", "q1", "q2"]
    assert str(got[2]["solution"]) == "2"

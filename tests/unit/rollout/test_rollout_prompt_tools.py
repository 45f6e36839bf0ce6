"""Multi-turn prompts are length-checked with their tool schemas, as the first turn renders them."""

from agrpo.services.rollout.data import build_prompt_set, render


def test_tool_schemas_count_towards_the_prompt_length(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    schema = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
              "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}
    plain, _ = render(tok, [{"role": "user", "content": "What is 2 + 2?"}], None)
    with_tools, text = render(tok, "What is 2 + 2?", None, tools=[schema])
    assert '"name": "add"' in text and len(with_tools) > len(plain)
    rows = [{"prompt": [{"role": "user", "content": "What is 2 + 2?"}]}]
    limit = (len(plain) + len(with_tools)) // 2  # fits without the schema, not with it
    kept = build_prompt_set(rows * 2, tok, prompt_column="prompt", max_prompt_len=limit,
                            chat_template_kwargs=None, seed=0)
    assert len(kept) == 2
    try:
        build_prompt_set(rows, tok, prompt_column="prompt", max_prompt_len=limit,
                         chat_template_kwargs=None, seed=0, tools_for_row=lambda row: [schema])
    except ValueError as exc:
        assert "fits" in str(exc)
    else:
        raise AssertionError("a prompt too long with its tool schema must be skipped")


def test_empty_environment_prompt_renders_to_nothing(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert render(tok, [], None, tools=[]) == ([], "")

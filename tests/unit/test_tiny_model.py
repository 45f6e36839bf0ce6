"""The tiny test model must be reproducible, vLLM-compatible and tool-aware."""

from __future__ import annotations

import json

import pytest

from agrpo.demo.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {name: make_tiny_model(root / name, seed=seed)
            for name, seed in (("a0", 0), ("b0", 0), ("c1", 1))}


def test_same_seed_same_bytes_different_seed_different_weights(built):
    from safetensors.torch import load_file

    read = lambda name, f: (built[name] / f).read_bytes()  # noqa: E731
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        assert read("a0", f) == read("b0", f), f
    assert read("a0", "tokenizer.json") == read("c1", "tokenizer.json")  # shared vocab across seeds
    a, c = load_file(str(built["a0"] / "model.safetensors")), load_file(str(built["c1"] / "model.safetensors"))
    assert a.keys() == c.keys()
    assert not (a["model.embed_tokens.weight"] == c["model.embed_tokens.weight"]).all()


def test_rebuild_is_skipped_when_marker_matches(built):
    st = built["a0"] / "model.safetensors"
    mtime = st.stat().st_mtime_ns
    make_tiny_model(built["a0"], seed=0)
    assert st.stat().st_mtime_ns == mtime


def test_config_is_vllm_cpu_friendly(built):
    cfg = json.loads((built["a0"] / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] >= 32  # vLLM CPU attention: no head_dim 16
    assert cfg["tie_word_embeddings"] is False and cfg["dtype"] == "float32"
    gen = json.loads((built["a0"] / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (2, 0)


def test_tokenizer_and_chat_template_with_tools(built):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built["a0"])
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for t in ("<|im_start|>", "<tool_call>", "</tool_call>", "<think>", "</think>"):
        assert len(tok.encode(t)) == 1, t
    # <tool_call> survives skip_special_tokens, so tool parsers can see it.
    ids = tok.encode('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>')
    assert tok.decode(ids, skip_special_tokens=True).startswith("<tool_call>")

    tools = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
    messages = [
        {"role": "user", "content": "What is 3 + 4?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "3 + 4"}}}]},
        {"role": "tool", "content": "7"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n")
    assert "<tools>\n" + json.dumps(tools[0]) + "\n</tools>" in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 4"}}'
            "\n</tool_call><|im_end|>\n") in text
    assert "<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_refuses_to_overwrite_a_foreign_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError):
        make_tiny_model(tmp_path, seed=0)
    assert (tmp_path / "notes.txt").exists()

"""Build a tiny, random, offline Qwen2 chat model for tests (no hub access needed).

Why these choices:
- The tokenizer depends only on a fixed corpus, never on ``seed``, so models with
  different seeds share one vocabulary and can stand in for "new weights" of the
  same policy (weight-sync tests load seed 1 into a server serving seed 0).
- hidden 128 / 4 heads -> head_dim 32: vLLM's CPU attention rejects head_dim 16.
- N(0, 0.2) init (instead of HF's 0.02) gives peaky logits, so greedy decoding is
  stable across implementations and sampled text is not uniform noise.
- ``<tool_call>``/``<think>`` are atomic but *not* special tokens (as in Qwen):
  decoding with ``skip_special_tokens`` must keep them so tool parsers see them.
Heavy imports (torch, transformers, tokenizers) happen inside functions.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FORMAT_VERSION = 1  # bump when the recipe changes so cached models get rebuilt
MARKER = "agrpo_tiny_model.json"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
ATOMIC = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

# Qwen2.5-style ChatML template with tool support.
CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls %}{%- set f = tc.function if tc.function is defined else tc %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}"
    "{{- f.arguments if f.arguments is string else f.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

WORDS = (
    "the a an of to and in is it you that he she was for on are with as they be at one have this from "
    "or had by word but what some we can out other were all there when up use your how said each which "
    "do their time if will way about many then them write would like so these her long make thing see "
    "him two has look more day could go come did number sound no most people my over know water than "
    "call first who may down side been now find any new work part take get place made live where after "
    "back little only round man year came show every good me give our under name very through just form "
    "sentence great think say help low line differ turn cause much mean before move right boy old too "
    "same tell does set three want air well also play small end put home read hand port large spell add "
    "even land here must big high such follow act why ask men change went light kind off need house "
    "picture try us again animal point mother world near build self earth father answer question solve "
    "math sum total weather city search result function tool call arguments value"
).split()


def _corpus() -> list[str]:
    """Deterministic text mix: words, arithmetic, chat and tool-call snippets."""
    rng = random.Random(1234)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))) for _ in range(4000)]
    for a in range(60):
        for b in range(25):
            op, r = rng.choice([("+", a + b), ("-", a - b), ("*", a * b)])
            lines.append(f"What is {a} {op} {b}? The answer is {r}.")
    for i in range(600):
        city, n = rng.choice(["Paris", "Tokyo", "Lima", "Oslo", "Cairo"]), rng.randint(0, 999)
        lines.append(f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>')
        lines.append(f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{n} + {i}"}}}}\n</tool_call>')
        lines.append(f"<tool_response>\n{{\"result\": {n + i}}}\n</tool_response>")
        lines.append(f"<|im_start|>user\nWhat is {n} + {i}?<|im_end|>\n<|im_start|>assistant\n"
                     f"<think>\nadd them\n</think>\nThe answer is {n + i}.<|im_end|>")
    return lines


def _make_tokenizer(vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(ATOMIC), special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ATOMIC])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 extra_special_tokens=["<|im_start|>"], model_max_length=1024)
    hf.chat_template = CHAT_TEMPLATE
    assert len(hf) <= vocab_size, (len(hf), vocab_size)
    return hf


def _built_with(out: Path, params: dict) -> bool:
    marker = out / MARKER
    return marker.is_file() and (out / "model.safetensors").is_file() and json.loads(marker.read_text()) == params


def _save_atomically(out: Path, params: dict, save) -> None:
    """Save into a temp sibling, then rename it into place, so concurrent test
    sessions sharing a cache dir never see (or serve) a half-written model."""
    import shutil
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700
    try:
        save(tmp)
        (tmp / MARKER).write_text(json.dumps(params, indent=1) + "\n")
        if out.exists() and not _built_with(out, params):
            if (out / MARKER).is_file():  # ours, built with other parameters
                shutil.rmtree(out)
            elif any(out.iterdir()):
                raise FileExistsError(f"{out} is not empty and holds no tiny model; refusing to overwrite it")
            else:
                out.rmdir()
        try:
            tmp.rename(out)
        except OSError:  # another process won the race
            if not _built_with(out, params):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_tiny_model(out_dir, seed: int = 0, hidden_size: int = 128, intermediate_size: int = 256,
                    num_layers: int = 2, vocab_size: int = 1024, num_heads: int = 4, num_kv_heads: int = 2,
                    init_std: float = 0.2) -> Path:
    """Write a random Qwen2ForCausalLM + tokenizer to ``out_dir``; return the path.

    Deterministic for given arguments (same seed -> byte-identical safetensors).
    A no-op if ``out_dir`` already holds a model built with the same arguments.
    ``init_std`` 0.2 suits two layers (see above); a deep stack needs HF's 0.02, or its
    residual stream saturates and every sample is the same.
    """
    out = Path(out_dir)
    params: dict[str, int | float] = dict(format=FORMAT_VERSION, seed=seed, hidden_size=hidden_size,
                  intermediate_size=intermediate_size, num_layers=num_layers, vocab_size=vocab_size)
    if (num_heads, num_kv_heads, init_std) != (4, 2, 0.2):  # keeps the markers of models built before
        params.update(num_heads=num_heads, num_kv_heads=num_kv_heads, init_std=init_std)
    if _built_with(out, params):
        return out
    head_dim = hidden_size // num_heads
    if hidden_size % num_heads or head_dim not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512):
        raise ValueError(f"head_dim={head_dim} (hidden_size/num_heads) is not supported by vLLM's CPU attention")

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = _make_tokenizer(vocab_size)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                      max_position_embeddings=1024, tie_word_embeddings=False, rope_theta=10000.0,
                      bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      dtype="float32")
    with torch.random.fork_rng(devices=[]):  # don't disturb the caller's global RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg).to(torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, init_std)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    _save_atomically(out, params, lambda d: (model.save_pretrained(d), tok.save_pretrained(d)))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(make_tiny_model(args.out_dir, seed=args.seed))


if __name__ == "__main__":
    main()

"""Config: TRL parity of names and defaults, precedence file < env < flag, clear rejections."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agrpo.services.common.config import AgrpoConfig, ConfigError, load_config
from agrpo.services.common.config.compat import UNSUPPORTED_DEFAULTS

SIGNATURE = Path(__file__).resolve().parents[2] / "data" / "trl_async_grpo_config_signature.txt"


def _seed_params() -> dict[str, str]:
    """Parameter name -> default text, parsed from TRL's AsyncGRPOConfig signature."""
    text = SIGNATURE.read_text()
    sig = re.search(r"AsyncGRPOConfig\((output_dir.*?)\)\n", text, re.S).group(1)
    parts, depth, cur = [], 0, ""
    for ch in sig:
        depth += ch in "[(<{"
        depth -= ch in "])>}"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return {m.group(1): m.group(2) for m in (re.match(r"(\w+): .* = (.*)$", p) for p in parts)}


def test_every_seed_parameter_exists_with_its_default():
    params = _seed_params()
    assert len(params) > 130
    cfg = AgrpoConfig()
    for name, default_text in params.items():
        if name in UNSUPPORTED_DEFAULTS:
            value = UNSUPPORTED_DEFAULTS[name]
        else:
            assert name in AgrpoConfig.model_fields, f"{name} missing from the config"
            value = getattr(cfg, name)
        expected = [] if default_text == "<factory>" else eval(default_text)  # TRL's defaults: literals
        assert value == expected, f"{name}: default {value!r} != TRL's {expected!r}"


def test_precedence_file_then_env_then_flag(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("max_staleness: 1\nnum_generations: 4\ntrainer:\n  port: 6000\n  grace_s: 3\n")
    env = {"AGRPO_CONFIG": str(f), "AGRPO_MAX_STALENESS": "2", "AGRPO_TRAINER__PORT": "7000",
           "AGRPO_VLLM_PYTHON": "python3"}  # the launchers' variable is not a config key
    cfg = load_config([], env)
    assert (cfg.max_staleness, cfg.num_generations, cfg.trainer.port, cfg.trainer.grace_s) == (2, 4, 7000, 3)
    cfg = load_config(["--max-staleness", "3", "--trainer.port=8000"], env)
    assert (cfg.max_staleness, cfg.trainer.port, cfg.trainer.grace_s) == (3, 8000, 3)


def test_flag_values_parse_as_yaml_scalars():
    cfg = load_config(["--vllm_server_base_urls", "[http://a:1, http://b:2/]", "--min_p", "null"], {})
    assert cfg.vllm_urls == ["http://a:1", "http://b:2"]
    assert cfg.min_p is None


@pytest.mark.parametrize("argv, key", [
    (["--bogus_key", "1"], "bogus_key"),
    (["--num_generations", "eight"], "num_generations"),
    (["--max_staleness", "-1"], "max_staleness"),
    (["--trainer.nope", "1"], "trainer.nope"),
    (["--deepspeed", "ds.json"], "deepspeed"),
    (["--temperature", "-0.5"], "temperature"),
])
def test_rejections_name_the_key(argv, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(argv, {})


def test_cross_field_rules():
    with pytest.raises(ConfigError, match="max_steps"):
        load_config(["--lr_scheduler_type", "cosine"], {})
    assert load_config(["--lr_scheduler_type", "cosine", "--max_steps", "10"], {}).max_steps == 10
    with pytest.raises(ConfigError, match="reward_weights"):
        load_config(["--reward_weights", "[1.0]"], {})
    with pytest.raises(ConfigError, match="one_request_per_group is for single-turn groups"):
        load_config(["--rollout.one_request_per_group", "true", "--tools", "[m:f]"], {})
    assert load_config(["--rollout.one_request_per_group", "true"], {}).rollout.one_request_per_group


def test_unsupported_compat_key_at_default_is_accepted():
    assert load_config(["--push_to_hub", "false"], {}).max_staleness == 4


def test_bad_file_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        load_config(["--config", str(tmp_path / "missing.yaml")], {})
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(["--config", str(bad)], {})


def test_auto_inflight_formula():
    cfg = load_config([], {})
    assert cfg.resolved_max_inflight_tasks == 4 * 8 * 1
    assert load_config(["--max_inflight_tasks", "5"], {}).resolved_max_inflight_tasks == 5
    two_ranks = load_config(["--gradient_accumulation_steps", "2", "--trainer.num_processes", "2"], {})
    assert two_ranks.resolved_max_inflight_tasks == 4 * 8 * 2 * 2  # TRL's x num_processes
    assert load_config(["--trainer.num_processes", "0"], {}).resolved_max_inflight_tasks == 4 * 8  # unknown: one


@pytest.mark.parametrize("argv, key", [
    (["--max_staleness", "-1"], "max_staleness"),
    (["--unknown", "1"], "unknown"),
    (["--num_generations", "x"], "num_generations"),
])
def test_cli_bad_config_exits_nonzero_with_one_line(argv, key):
    proc = subprocess.run([sys.executable, "-m", "agrpo.cli", "trainer", *argv],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], proc.stderr


def test_cli_help_does_not_import_heavy_modules():
    code = ("import sys, agrpo.cli as c; c.main(['--help']); "
            "print(sorted(m for m in ('torch','transformers','datasets','grpc') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.stdout.strip().endswith("[]"), out.stdout + out.stderr


def test_config_reference_is_up_to_date():
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, str(root / "scripts" / "gen_config_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=60, cwd=root, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_readme_states_the_resume_rule_as_the_config_reference_does():
    from gen_config_docs import RESUMING

    root = Path(__file__).resolve().parents[3]
    table = "\n".join(line for line in RESUMING.splitlines() if line.startswith("|"))
    assert table.count("\n") > 5 and table in (root / "README.md").read_text()


def test_environment_without_dataset_needs_max_steps():
    with pytest.raises(ConfigError, match="max_steps"):
        load_config(["--environment_factory", "m:Env"], {})
    cfg = load_config(["--environment_factory", "m:Env", "--max_steps", "5"], {})
    assert cfg.dataset.path is None and cfg.max_steps == 5

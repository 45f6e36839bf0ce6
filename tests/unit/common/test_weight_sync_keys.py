"""Weight-sync keys by transport: a key the named transport does not read is a one-line config
error; docs/config.md's knob table is the registrations (services/common/weight_transports.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agrpo.services.common import weight_transports
from agrpo.services.common.config import ConfigError, load_config
from agrpo.services.common.config.sections import TrainerSection

# A valid value other than the default for every weight-sync key.
OTHER = {"weight_load": "direct", "weight_swap": "false", "cpu_reload": "layerwise", "sync_dtype": "bfloat16",
         "overlap_weight_sync": "false", "recompute_in_flight": "false", "http_chunk_mb": "8",
         "shared_weights_dir": "/tmp/w", "nccl_buffer_mb": "256", "nccl_rendezvous": "store",
         "nccl_master_address": "10.0.0.1", "nccl_timeout_s": "30.5"}


def test_every_sync_key_is_a_trainer_key_with_another_value_to_test():
    assert set(OTHER) == set(weight_transports.SYNC_KEYS) <= set(TrainerSection.model_fields)
    for name in weight_transports.NAMES:
        assert set(weight_transports.TRANSPORTS[name].keys) <= set(weight_transports.SYNC_KEYS)


def _flags(transport: str, key: str) -> list[str]:
    return ["--trainer.weight_transport", transport, f"--trainer.{key}", OTHER[key]]


@pytest.mark.parametrize("transport", weight_transports.NAMES)
def test_a_transport_accepts_every_key_it_reads(transport):
    for key in weight_transports.reads(transport):
        if transport == "ipc" and key == "weight_load":
            continue
        cfg = load_config(_flags(transport, key), {})
        assert str(getattr(cfg.trainer, key)).lower() == OTHER[key]


@pytest.mark.parametrize("transport", weight_transports.NAMES)
def test_a_key_the_transport_does_not_read_is_a_one_line_error(transport):
    ignored = [k for k in weight_transports.SYNC_KEYS if k not in weight_transports.reads(transport)]
    for key in ignored:
        with pytest.raises(ConfigError) as err:
            load_config(_flags(transport, key), {})
        message = str(err.value)
        assert "\n" not in message and message.startswith(
            f"trainer.{key}={OTHER[key]} does nothing with trainer.weight_transport={transport} (it reads")


def test_the_message_names_what_the_transport_reads_and_env_counts_as_set():
    with pytest.raises(ConfigError) as err:
        load_config([], {"AGRPO_TRAINER__WEIGHT_TRANSPORT": "nccl", "AGRPO_TRAINER__HTTP_CHUNK_MB": "8"})
    assert str(err.value) == ("trainer.http_chunk_mb=8 does nothing with trainer.weight_transport=nccl (it reads: "
                              "weight_load, sync_dtype, recompute_in_flight, nccl_buffer_mb, nccl_rendezvous, "
                              "nccl_master_address, nccl_timeout_s)")
    with pytest.raises(ConfigError, match=r"^trainer.weight_swap=false does nothing .*=ipc"):
        load_config(["--trainer.weight_transport", "ipc", "--trainer.weight_swap", "false"], {})
    with pytest.raises(ConfigError, match="it reads none of the weight-sync keys"):
        load_config(["--trainer.weight_transport", "local", "--trainer.recompute_in_flight", "false"], {})


def test_a_config_file_key_counts_as_set(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  weight_transport: http\n  nccl_buffer_mb: 64\n")
    with pytest.raises(ConfigError, match=r"^trainer.nccl_buffer_mb=64 does nothing with .*=http"):
        load_config(["--config", str(path)], {})


@pytest.mark.parametrize("transport", weight_transports.NAMES)
def test_defaults_and_keys_set_to_their_default_are_accepted(transport):
    assert load_config(["--trainer.weight_transport", transport], {}).trainer.weight_transport == transport
    defaults = {k: TrainerSection.model_fields[k].get_default() for k in weight_transports.SYNC_KEYS}
    flags = [f for k, v in defaults.items() if v is not None for f in (f"--trainer.{k}", str(v))]
    load_config(["--trainer.weight_transport", transport, *flags], {})


def test_auto_refuses_nothing():
    flags = [f for k in weight_transports.SYNC_KEYS for f in (f"--trainer.{k}", OTHER[k])]
    assert load_config(flags, {}).trainer.weight_transport == "auto"


def test_ipc_keeps_its_own_message_for_a_vllm_load():
    with pytest.raises(ConfigError, match="loads through our worker extension"):
        load_config(["--trainer.weight_transport", "ipc", "--trainer.weight_load", "vllm"], {})


def test_the_knob_table_in_the_docs_is_the_registrations():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    from gen_config_docs import knob_table

    rows = knob_table()
    text = (Path(__file__).resolve().parents[3] / "docs" / "config.md").read_text()
    assert "\n".join(rows) in text
    header = [c.strip(" `") for c in rows[0].strip("|").split("|")][1:]
    assert header == list(weight_transports.NAMES)
    for row in rows[2:]:
        cells = [c.strip(" `") for c in row.strip("|").split("|")]
        key = cells[0].removeprefix("trainer.")
        assert {n for n, c in zip(header, cells[1:]) if c == "reads"} == \
            {n for n in weight_transports.NAMES if key in weight_transports.TRANSPORTS[n].keys}
    assert [r.split("|")[1].strip(" `").removeprefix("trainer.") for r in rows[2:]] == list(weight_transports.SYNC_KEYS)

"""NCCL transport metadata and packing (CPU only; the GPU issue runs the real broadcast)."""

from __future__ import annotations

import base64

import pytest
import torch

from agrpo.services.trainer.weight_sync.nccl import (
    NcclProtocol,
    init_info,
    manifest,
    pack_chunk,
    packed_chunks,
    parse_version,
    update_info,
)


def test_protocol_by_version():
    assert parse_version("0.28.1.dev3+gabc") == (0, 28, 1)
    old, mid, new = (NcclProtocol.for_version(v) for v in ("0.27.0", "0.28.0", "0.33.0"))
    assert not old.packed_in_init and not old.unique_id_b64
    assert mid.packed_in_init and not mid.unique_id_b64
    assert new.packed_in_init and new.unique_id_b64


def test_packed_flag_moves_from_update_to_init_at_028():
    named = [("a.weight", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b.bias", torch.zeros(4))]
    meta = manifest(named)
    assert meta == {"names": ["a.weight", "b.bias"], "dtype_names": ["bfloat16", "float32"],
                    "shapes": [[2, 3], [4]]}
    old, new = NcclProtocol.for_version("0.27.0"), NcclProtocol.for_version("0.30.0")
    assert update_info(old, meta)["packed"] is True
    assert set(update_info(new, meta)) == {"names", "dtype_names", "shapes"}  # extra keys are rejected
    assert "packed" not in init_info(old, 2, master_address="10.0.0.1", master_port=29500)
    uid = bytes(range(128))
    info = init_info(new, 3, unique_id=uid)
    assert info["packed"] is True and info["rank_offset"] == 1 and info["world_size"] == 3
    assert base64.b64decode(info["nccl_unique_id_b64"]) == uid


def test_chunks_flush_after_exceeding_buffer():
    # The tensor that crosses the threshold stays in the chunk that it overflows.
    assert packed_chunks([4, 4, 4, 4], buffer_bytes=6) == [[0, 1], [2, 3]]
    assert packed_chunks([10, 1, 1], buffer_bytes=6) == [[0], [1, 2]]
    assert packed_chunks([3, 3], buffer_bytes=6) == [[0, 1]]  # exactly full does not flush


def test_pack_chunk_bytes_roundtrip():
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    buf = pack_chunk([a, b])
    assert buf.dtype == torch.uint8
    assert buf.numel() == 6 * 4 + 2 * 2  # float32 (2, 3) + bfloat16 (2,)
    assert torch.equal(buf[:24].view(torch.float32).reshape(2, 3), a)
    assert torch.equal(buf[24:].view(torch.bfloat16), b)


def test_auto_rendezvous_is_torch_only_on_every_protocol():
    from agrpo.services.trainer.weight_sync.nccl import NcclTransport

    old, new = NcclProtocol.for_version("0.26.0"), NcclProtocol.for_version("0.30.0")
    auto = NcclTransport()
    assert (auto._choose(old), auto._choose(new)) == ("store", "b64")  # never imports vLLM
    assert NcclTransport(rendezvous="vllm")._choose(old) == "vllm"  # still there when asked for
    with pytest.raises(ValueError, match=r"< 0\.30"):
        NcclTransport(rendezvous="b64")._choose(old)


def test_from_config_reads_every_nccl_key():
    from agrpo.services.common.config import load_config
    from agrpo.services.trainer.weight_sync.nccl import NcclTransport

    cfg = load_config(["--trainer.nccl_buffer_mb", "3", "--trainer.nccl_rendezvous", "store",
                       "--trainer.nccl_timeout_s", "7.5", "--trainer.nccl_master_address", "10.1.2.3"], {})
    t = NcclTransport.from_config(cfg, torch.device("cpu"))
    assert t.buffer_bytes == 3 * 1024 * 1024
    assert t.rendezvous == "store" and t._choose(NcclProtocol.for_version("0.33.0")) == "store"
    assert t.timeout == 7.5
    assert t.master_address == "10.1.2.3"


def test_nccl_config_defaults_are_the_transports_own():
    from agrpo.services.common.config import load_config
    from agrpo.services.trainer.weight_sync.nccl import DEFAULT_BUFFER_BYTES, DEFAULT_TIMEOUT_S, NcclTransport

    t, plain = NcclTransport.from_config(load_config([], {}), torch.device("cpu")), NcclTransport()
    assert (t.buffer_bytes, t.rendezvous, t.timeout, t.master_address) == \
        (plain.buffer_bytes, plain.rendezvous, plain.timeout, plain.master_address) == \
        (DEFAULT_BUFFER_BYTES, "auto", DEFAULT_TIMEOUT_S, None)


@pytest.mark.parametrize(("flag", "value"), [("nccl_buffer_mb", "0"), ("nccl_timeout_s", "0"),
                                             ("nccl_rendezvous", "tcp")])
def test_bad_nccl_settings_are_refused(flag, value):
    from agrpo.services.common.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=flag):
        load_config([f"--trainer.{flag}", value], {})


async def test_a_step_past_nccl_timeout_s_fails_naming_the_phase():
    """The configured timeout is the one `_together` waits: a server call that never ends fails
    after it, as a WeightSyncError naming the phase, while the local side already finished."""
    import asyncio

    from agrpo.services.common.config import load_config
    from agrpo.services.trainer.weight_sync.client import WeightSyncError
    from agrpo.services.trainer.weight_sync.nccl import NcclTransport

    t = NcclTransport.from_config(load_config(["--trainer.nccl_timeout_s", "0.05"], {}), torch.device("cpu"))

    class Admin:
        url = "http://server"

    with pytest.raises(WeightSyncError, match=r"did not finish in 0 s \(server side still waiting\)"):
        await asyncio.wait_for(t._together(Admin(), "update", asyncio.sleep(30), lambda: None), 5)

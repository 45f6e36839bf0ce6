"""CUDA IPC weight sharing between two processes on one GPU, as trainer and vLLM worker do it.

The parent packs weights with the trainer's IpcTransport; a spawned child opens the buffer
with the worker side (agrpo_vllm_plugin.ipc), as our worker extension does, and reads every
tensor back. Then the parent packs new values into the same buffer: the child, still holding
it open, must see them. (Into a real vLLM: benchmarks/gpu_weight_sync.py --variants ipc.)
"""
from __future__ import annotations

import json

import pytest

ipc = pytest.importorskip("agrpo.services.trainer.weight_sync.ipc")


def _named(seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    shapes = [((64, 32), torch.bfloat16), ((7,), torch.float32), ((3, 5, 11), torch.bfloat16)]
    return [(f"w{i}", torch.randn(s, generator=g).to(dtype).cuda()) for i, (s, dtype) in enumerate(shapes)]


def _child(requests, answers) -> None:
    import torch

    from agrpo_vllm_plugin.ipc import OpenBuffer, views

    held = OpenBuffer()
    while True:
        msg = requests.get()
        if msg is None:
            return
        info, seed = json.loads(msg[0]), msg[1]
        got = views(held.get(info["buffer"], torch.cuda.current_device()), info)
        want = _named(seed)
        answers.put([bool(torch.equal(g.cpu(), w.cpu())) for (_, g), (_, w) in zip(got, want)] +
                    [held.key == info["buffer"]["handle"]])


def test_a_second_process_reads_every_version_from_one_shared_buffer():
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    requests, answers = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child, args=(requests, answers), daemon=True)
    child.start()
    transport = ipc.IpcTransport()
    try:
        first = transport.prepare(_named(0), 1)
        requests.put((json.dumps(first.update_infos[0]), 0))
        assert all(answers.get(timeout=120))
        second = transport.prepare(_named(1), 2)  # same buffer, new values
        assert second.update_infos[0]["buffer"]["handle"] == first.update_infos[0]["buffer"]["handle"]
        requests.put((json.dumps(second.update_infos[0]), 1))
        assert all(answers.get(timeout=60))
    finally:
        requests.put(None)
        child.join(30)
        transport.close()
    assert child.exitcode == 0

"""The engine-side one-call weight swap (vllm_plugin/agrpo_vllm_plugin/swap.py) on a stand-in
engine core: what runs when, in which order, and what a failure leaves. Against real vLLM it
runs in tests/integration/trainer/test_trainer_weight_swap.py."""

from __future__ import annotations

import json
import queue
import sys
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from agrpo_vllm_plugin.swap import swap


class Engine:
    """Records every engine and worker call in `log`; `busy` makes the pause wait for a step."""

    def __init__(self, busy: bool = False, fail_on: str | None = None, dp: int = 1) -> None:
        self.log: list[tuple] = []
        self.busy, self.fail_on = busy, fail_on
        self.pending: Future | None = None
        self.vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=dp))
        self.model_executor = SimpleNamespace(collective_rpc=self._worker)

    def _worker(self, method, timeout, args, kwargs):
        self.log.append(("worker", method, args, kwargs))
        if method == self.fail_on:
            raise RuntimeError(f"{method} failed")
        return [None]

    def pause_scheduler(self, mode, clear_cache):
        self.log.append(("pause", mode, clear_cache))
        if self.busy:
            self.pending = Future()
            return self.pending
        return None

    def reset_prefix_cache(self, reset_running_requests=False):
        self.log.append(("reset", reset_running_requests))

    def set_weight_version(self, label):
        self.log.append(("label", label))

    def resume_scheduler(self):
        self.log.append(("resume",))


class LoopEngine(Engine):
    """An engine core with a busy loop: it blocks on `input_queue` when it has nothing to do."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.input_queue: queue.Queue = queue.Queue()


@pytest.fixture
def wakeup_type(monkeypatch):
    """vLLM's input sentinel that only wakes the engine's loop (vLLM is not in this venv)."""
    request_types = SimpleNamespace(WAKEUP=b"\x05")
    module = SimpleNamespace(EngineCoreRequestType=request_types)
    for name in ("vllm", "vllm.v1", "vllm.v1.engine"):
        monkeypatch.setitem(sys.modules, name, module)
    return request_types.WAKEUP


def spec(**over) -> str:
    base = {"calls": [{"method": "start_weight_update"},
                      {"method": "update_weights", "kwargs": {"update_info": {"path": "/w"}}},
                      {"method": "finish_weight_update"}],
            "on_failure": [{"method": "finish_weight_update"}], "label": "7", "failed_label": "partial",
            "reset_prefix_cache": True, "reset_running": True, "timeout": 5.0}
    return json.dumps({**base, **over})


def test_idle_engine_loads_resets_labels_and_resumes_in_that_order():
    engine = Engine()
    done = swap(engine, spec())
    [answer] = done.result(timeout=0)
    assert answer["ok"] and answer["load_s"] >= 0 and answer["drain_s"] >= 0
    assert engine.log == [("pause", "keep", False),
                          ("worker", "start_weight_update", (), None),
                          ("worker", "update_weights", (), {"update_info": {"path": "/w"}}),
                          ("worker", "finish_weight_update", (), None),
                          ("reset", True), ("label", "7"), ("resume",)]


def test_nothing_loads_until_the_step_in_flight_has_drained():
    engine = Engine(busy=True)
    done = swap(engine, spec())
    assert not done.done() and engine.log == [("pause", "keep", False)]
    engine.pending.set_result(None)  # the engine went idle: vLLM's idle callback
    assert done.result(timeout=0)[0]["ok"] and engine.log[-1] == ("resume",)


def test_kept_requests_keep_the_cache():
    engine = Engine()
    swap(engine, spec(reset_prefix_cache=False, reset_running=False)).result(timeout=0)
    assert not any(entry[0] == "reset" for entry in engine.log) and engine.log[-1] == ("resume",)


def test_a_failed_load_closes_the_update_and_stays_paused_under_the_failed_label():
    engine = Engine(fail_on="update_weights")
    done = swap(engine, spec())
    with pytest.raises(RuntimeError, match="update_weights failed"):
        done.result(timeout=0)
    assert engine.log[-2:] == [("worker", "finish_weight_update", (), None), ("label", "partial")]
    assert ("resume",) not in engine.log and ("label", "7") not in engine.log


def test_probe_and_data_parallel_refusal():
    assert swap(Engine(), json.dumps({"probe": True})) == [{"ok": True, "why": ""}]
    engine = Engine(dp=2)
    [answer] = swap(engine, spec())
    assert not answer["ok"] and "data_parallel_size=2" in answer["why"] and engine.log == []


def test_a_resume_from_the_idle_callback_wakes_the_engine_loop(wakeup_type):
    """vLLM runs the idle callback right before its loop blocks on the input queue: without a
    wake-up, the resumed requests wait for the next request to arrive (seconds, when nothing
    new comes until they finish)."""
    engine = LoopEngine(busy=True)
    done = swap(engine, spec())
    assert engine.input_queue.empty()  # paused: nothing to wake yet
    engine.pending.set_result(None)
    assert done.result(timeout=0)[0]["ok"]
    assert engine.input_queue.get_nowait() == (wakeup_type, None) and engine.input_queue.empty()


def test_a_failed_load_does_not_wake_the_paused_engine(wakeup_type):
    engine = LoopEngine(busy=True, fail_on="update_weights")
    done = swap(engine, spec())
    engine.pending.set_result(None)
    with pytest.raises(RuntimeError):
        done.result(timeout=0)
    assert engine.input_queue.empty()

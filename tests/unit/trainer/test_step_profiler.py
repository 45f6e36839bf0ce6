"""trainer.profile_steps: the window's files, and the arithmetic of the GPU's busy time."""

import gzip
import json
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.trainer.profiling import StepProfiler, idle_gaps


def _event(name: str, device: str, start_us: float, end_us: float):
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device),
                           time_range=SimpleNamespace(start=start_us, end=end_us))


def test_overlapping_kernels_count_once_and_the_gaps_name_what_the_host_ran():
    events = [_event("k1", "CUDA", 0, 2000), _event("k2", "CUDA", 1000, 3000), _event("k3", "CUDA", 2500, 2800),
              _event("k4", "CUDA", 5000, 6000), _event("aten::item", "CPU", 3500, 3600),
              _event("aten::item", "CPU", 4000, 4100), _event("aten::mm", "CPU", 0, 10)]
    busy, gaps = idle_gaps(events)
    assert busy == pytest.approx(0.004)
    assert gaps == [(2.0, 3.0, "aten::item x2")]
    assert idle_gaps([_event("aten::mm", "CPU", 0, 10)]) == (0.0, [])


def _train_like_work() -> None:
    a = torch.randn(32, 32, requires_grad=True)
    (a @ a).sum().backward()


def test_the_window_writes_its_tables_and_timeline_after_its_last_step(tmp_path):
    profiler = StepProfiler((2, 3), tmp_path, cuda=False)
    for step in (1, 2, 3, 4):
        profiler.before_step(step)
        _train_like_work()
        write = profiler.after_step(step)
        assert (write is not None) == (step == 3)
        if write is not None:
            write()
        written = sorted(p.name for p in (tmp_path / "profile").glob("*")) if (tmp_path / "profile").exists() else []
        assert written == ([] if step < 3 else ["steps_2-3.txt", "trace_2-3.json.gz"])
    table = (tmp_path / "profile" / "steps_2-3.txt").read_text()
    assert table.startswith("steps 2-3: ") and "aten::mm" in table
    trace = json.loads(gzip.decompress((tmp_path / "profile" / "trace_2-3.json.gz").read_bytes()))
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])


def test_a_run_that_stops_inside_the_window_writes_what_it_profiled(tmp_path):
    profiler = StepProfiler((1, 50), tmp_path, cuda=False)
    profiler.before_step(1)
    _train_like_work()
    assert profiler.after_step(1) is None
    profiler.close()()
    assert (tmp_path / "profile" / "steps_1-1.txt").exists()


def test_a_run_resumed_inside_the_window_profiles_from_its_first_step(tmp_path):
    profiler = StepProfiler((2, 3), tmp_path, cuda=False)
    profiler.before_step(3)
    _train_like_work()
    profiler.after_step(3)()
    assert (tmp_path / "profile" / "steps_3-3.txt").read_text().startswith("steps 3-3: ")


def test_no_window_profiles_nothing(tmp_path):
    profiler = StepProfiler(None, tmp_path, cuda=False)
    profiler.before_step(1)
    assert profiler.after_step(1) is None and profiler.close() is None
    assert not (tmp_path / "profile").exists()


def test_the_window_is_validated():
    assert AgrpoConfig(trainer={"profile_steps": [3, 5]}).trainer.profile_steps == (3, 5)
    with pytest.raises(ValidationError, match="1 <= first <= last"):
        AgrpoConfig(trainer={"profile_steps": [5, 3]})

"""CPU placement helpers: the core-list reading and moving a running process's threads."""

import os
import subprocess
import sys
import time

import pytest

from agrpo.launcher.affinity import cores, pin_threads


def test_cores_reads_taskset_lists():
    assert cores("0") == {0}
    assert cores("1,3") == {1, 3}
    assert cores("0-2,5") == {0, 1, 2, 5}
    with pytest.raises(ValueError):
        cores("one")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_pin_threads_moves_every_thread_of_a_running_process():
    first, second = sorted(os.sched_getaffinity(0))[:2]
    # A child with a second thread, started on both cores.
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) >= 2
        assert all(os.sched_getaffinity(t) >= {first, second} for t in tids)
        pin_threads(child.pid, str(second))
        assert all(os.sched_getaffinity(t) == {second} for t in tids)
    finally:
        child.kill()
        child.wait()

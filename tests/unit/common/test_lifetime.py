"""A process `agrpo run` starts dies with it, even when it is SIGKILLed (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

_PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from agrpo.services.common.lifetime import dying_with_this_process
    argv = ["sleep", "60"]
    child = subprocess.Popen(dying_with_this_process(argv) if sys.argv[1] == "guarded" else argv,
                             start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(60)
""")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may be slow to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _child_after_parent_sigkill(mode: str) -> bool:
    """Start a parent that starts `sleep 60` in a session of its own, SIGKILL the parent; is the
    child still alive 5 s later?"""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, mode], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(parent.stdout.readline())
    try:
        time.sleep(0.5)  # the shim has exec'd sleep
        assert Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if not _running(child):
                return False
            time.sleep(0.1)
        return True
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_guarded_child_dies_with_its_sigkilled_parent_an_unguarded_one_does_not():
    assert not _child_after_parent_sigkill("guarded")
    assert _child_after_parent_sigkill("plain")  # what start_new_session alone leaves behind

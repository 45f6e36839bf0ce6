import socket

from agrpo.services.common import ports
from agrpo.services.common.ports import free_port


def test_a_free_port_lies_below_the_ephemeral_range_and_binds():
    low = ports.ephemeral_low()
    picked = {free_port() for _ in range(20)}
    assert all(ports.LOWEST <= p < low for p in picked)
    assert len(picked) > 1  # random, not the same sequence in every process
    for port in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_picked(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", taken)
        monkeypatch.setattr(ports, "ephemeral_low", lambda: taken + ports.TRIES)
        for _ in range(5):
            assert free_port() != taken


def test_without_room_below_the_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_low", lambda: ports.LOWEST + 1)
    port = free_port()
    assert port > 0 and ports.bindable("127.0.0.1", port)

"""The intake's seams: IntakeHooks given at construction, ModelLimits bound once the model is loaded."""

from __future__ import annotations

from agrpo.services.trainer.app import TrainerApp
from agrpo.services.trainer.buffer import SampleBuffer
from agrpo.services.trainer.intake import AdmitAll, Intake, IntakeHooks, ModelLimits
from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.loop import TrainerLoop
from agrpo.services.trainer.sample import Outcome
from trainer_helpers import Limits


class Recorder:
    """A fake IntakeHooks: versions above 5 are a problem; every event is kept."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []

    def version_problem(self, sample) -> str | None:
        return "newer than the trainer" if sample.policy_version > 5 else None

    def on_intake(self, kind: str, sample) -> None:
        self.events.append((kind, sample.sample_id if sample else None))


def test_the_production_classes_implement_the_seams():
    assert issubclass(TrainerApp, IntakeHooks) and issubclass(AdmitAll, IntakeHooks)
    assert issubclass(TrainerLoop, ModelLimits) and isinstance(Limits(), ModelLimits)


def test_a_fake_hooks_is_asked_and_told(make_sample):
    hooks = Recorder()
    assert isinstance(hooks, IntakeHooks)
    intake = Intake(SampleBuffer(4), Ledger(), hooks=hooks)
    stream = intake.open("p", 0)
    assert intake.receive(stream, make_sample("a", "g", [1], [2], size=1)) is Outcome.ACCEPTED
    assert intake.receive(stream, make_sample("b", "h", [1], [2], version=6, size=1)) is Outcome.DROPPED_STALE
    assert hooks.events == [("received", "a"), ("received", "b"), ("off_lineage", "b")]


def test_model_limits_apply_once_bound(make_sample):
    intake = Intake(SampleBuffer(4), Ledger())
    stream = intake.open("p", 0)
    assert intake.receive(stream, make_sample("a", "g", [1] * 8, [2] * 8, size=1)) is Outcome.ACCEPTED
    intake.bind_limits(Limits(tokens=10, vocab=1000))
    assert intake.receive(stream, make_sample("b", "h", [1] * 8, [2] * 8, size=1)) is Outcome.REJECTED
    assert intake.receive(stream, make_sample("c", "i", [1], [1000], size=1)) is Outcome.REJECTED  # past the vocab

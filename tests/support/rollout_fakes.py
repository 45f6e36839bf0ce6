"""Stand-ins shared by the rollout Engine's unit tests (single- and multi-turn)."""


class FakeSender:
    """Records the groups the Engine hands to the trainer stream; nothing goes stale."""

    def __init__(self, credits: int = 1 << 30):
        self.groups = []
        self.held = 0
        self.credits = credits  # the trainer's grant; unlimited unless a test paces
        self.unsent_count = 0

    def add_group(self, key, version, samples):
        self.groups.append((key, version, samples))

    def sweep_stale(self):
        return 0

    def drop_off_lineage(self, lineage):
        return 0

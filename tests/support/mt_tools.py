"""Tools and environments of the multi-turn tests (unit and integration), as `mt_tools:...`."""

import asyncio
import time

TABLE = {"x": "unset"}
"""What `lookup` answers; tests set the values they expect to see."""


def lookup(key: str) -> str:
    """Look a key up in a table the test controls.

    Args:
        key: The key.
    """
    return f"{key}={TABLE.get(key, 'missing')}"


async def async_double(x: int) -> int:
    """Double a number (async).

    Args:
        x: The number.
    """
    await asyncio.sleep(0.01)
    return 2 * x


def explode(x: int) -> int:
    """Raise an error.

    Args:
        x: Ignored.
    """
    raise ValueError("exploded on purpose")


def stall(x: int) -> int:
    """Never return in time (sleeps longer than the tests' tool timeouts).

    Args:
        x: Ignored.
    """
    time.sleep(3)
    return x


class CounterEnv:
    """Counts increments; rewarded by the count."""

    def __init__(self):
        self.count = 0
        self.resets = 0

    def reset(self, **row):
        self.count = 0
        self.resets += 1
        return f" (start at {row.get('start', 0)})"

    def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: Amount to add.
        """
        self.count += by
        return str(self.count)

    async def get_reward(self) -> float:
        return float(self.count)


class EchoEnv:
    """No reward; one tool."""

    def reset(self, **row):
        return None

    def echo(self, text: str) -> str:
        """Echo text back.

        Args:
            text: What to echo.
        """
        return text


class ScoreEnv:
    """Reward = 10 * increments + 1 (so a rollout without tool calls still scores 1)."""

    def __init__(self):
        self.n = 0

    def reset(self, **row):
        self.n = 0
        return f" [goal {row.get('goal', '?')}]"

    def bump(self, times: int) -> str:
        """Bump the score.

        Args:
            times: How many bumps.
        """
        self.n += times
        return f"bumped to {self.n}"

    def get_reward(self) -> float:
        return 10.0 * self.n + 1.0


class ShoutEnv:
    """Async reward: 2.0 always."""

    def reset(self, **row):
        return None

    def shout(self, text: str) -> str:
        """Upper-case text.

        Args:
            text: The text.
        """
        return text.upper()

    async def get_reward(self) -> float:
        return 2.0


class PromptEnv:
    """Owns the data: reset() writes the prompt (no dataset); get_reward is sync."""

    def __init__(self):
        self.n = 0

    def reset(self, **row):
        self.n += 1
        return f"Task number {self.n}: count to three."

    def count(self, upto: int) -> str:
        """Count from one.

        Args:
            upto: The last number.
        """
        return " ".join(str(i) for i in range(1, upto + 1))

    def get_reward(self) -> float:
        return 1.0

"""Tools and environments used by the multi-turn tests (importable as `mt_tools:...`)."""

import asyncio
import time

CONTROLLED = {"value": "42"}


def lookup(key: str) -> str:
    """Look a key up in the test's table.

    Args:
        key: The key to look up.
    """
    return f"{key}={CONTROLLED['value']}"


async def async_double(x: int) -> int:
    """Double a number asynchronously.

    Args:
        x: The number.
    """
    await asyncio.sleep(0)
    return 2 * x


def boom(x: int) -> int:
    """Always fails.

    Args:
        x: Ignored.
    """
    raise RuntimeError("boom")


def hang(x: int) -> int:
    """Sleeps longer than any test timeout.

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

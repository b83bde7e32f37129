"""The table, logged after training, of where the time went: the step and each hook stage."""

from __future__ import annotations

import logging
from typing import Dict, List, Tuple

from tabulate import tabulate

__all__ = ["log_time_table"]

# The loop's logger: the table is part of what training logs, filtered with it.
logger = logging.getLogger("treadle.engine.train_loop")


def log_time_table(seconds: Dict[str, float], iterations: int) -> None:
    """Logs the rows of ``seconds`` (``"step"`` and ``"Hook.stage"`` keys) that
    took at least 1% of the time (INFO), and every row (DEBUG)."""
    iterations = max(iterations, 1)
    rows = sorted(seconds.items(), key=lambda kv: -kv[1])
    if not rows:
        return
    total = sum(t for _, t in rows) or 1.0

    def table(selected: List[Tuple[str, float]]) -> str:
        return tabulate(
            [(name, f"{t:.4f}", f"{1000 * t / iterations:.4f}", f"{100 * t / total:.1f}%") for name, t in selected],
            headers=["where", "total (s)", "per iteration (ms)", "share"],
            tablefmt="pipe",
        )

    shown = [(name, t) for name, t in rows if name == "step" or t >= 0.01 * total]
    hidden = [(name, t) for name, t in rows if (name, t) not in shown]
    rest = ""
    if hidden:
        rest = (
            f"\n({len(hidden)} other hook stages took {sum(t for _, t in hidden):.4f} s in all, under 1% each; "
            "the full table is logged at DEBUG level)"
        )
    logger.info("Time spent in the step and in the hooks over %d iterations:\n%s%s", iterations, table(shown), rest)
    if hidden and logger.isEnabledFor(logging.DEBUG):
        logger.debug("Time spent in the step and in every hook stage:\n%s", table(rows))

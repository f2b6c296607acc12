"""A job's progress for the person running it: a tqdm bar on a terminal, plain periodic lines otherwise.

Both show lines done of the total, lines/s and input tokens/s of this run
(lines an earlier run finished are counted done, not in the rates), the
failed lines and an ETA.
"""

from __future__ import annotations

import sys
import time
from typing import IO

from poolgate.gateway.jobs.job import Counts


def rate_line(counts: Counts, elapsed: float) -> str:
    """``12,000/100,000 lines (12.0%), 1,523 lines/s, 30,412 tokens/s, 3 failed, ETA 58 s``."""
    done = counts.completed + counts.failed
    lines_s = done / elapsed if elapsed > 0 else 0.0
    left = counts.total - counts.finished
    eta = f"{left / lines_s:,.0f} s" if lines_s > 0 else "?"
    share = 100.0 * counts.finished / counts.total if counts.total else 100.0
    return (
        f"{counts.finished:,}/{counts.total:,} lines ({share:.1f}%), {lines_s:,.0f} lines/s, "
        f"{counts.tokens / elapsed if elapsed > 0 else 0:,.0f} tokens/s, {counts.failed:,} failed, ETA {eta}"
    )


class Progress:
    """Attach to a job's ``Counts`` (``counts.listeners``); ``close`` prints the last line."""

    def __init__(
        self, counts: Counts, *, stream: IO[str] | None = None, every_s: float = 10.0, bar: bool | None = None
    ):
        self.stream = stream or sys.stderr
        self.every_s, self.started, self.last = every_s, time.monotonic(), time.monotonic()
        self.bar = None
        if bar if bar is not None else self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=counts.total,
                initial=counts.finished,
                unit="line",
                file=self.stream,
                desc="run-batch",
                dynamic_ncols=True,
            )
        self._shown = counts.finished
        counts.listeners.append(self.update)

    def update(self, counts: Counts) -> None:
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(counts.finished - self._shown)
            self._shown = counts.finished
            if now - self.last >= 0.5:
                elapsed = now - self.started
                self.bar.set_postfix_str(
                    f"{counts.tokens / elapsed if elapsed else 0:,.0f} tok/s, {counts.failed} failed", refresh=False
                )
                self.last = now
        elif now - self.last >= self.every_s:
            print(rate_line(counts, now - self.started), file=self.stream, flush=True)
            self.last = now

    def close(self, counts: Counts) -> None:
        if self.bar is not None:
            self.bar.update(counts.finished - self._shown)
            self.bar.close()
        print(rate_line(counts, time.monotonic() - self.started), file=self.stream, flush=True)

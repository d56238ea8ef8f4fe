"""SIGINT and SIGTERM during training: noted, then acted on between optimizer steps."""

from __future__ import annotations

import signal
import threading

import torch


class StopSignals:
    """While active, SIGINT and SIGTERM only set ``signum``; the training loop checks it between
    iterations, so a checkpoint is never taken in the middle of an optimizer step.
    A second signal gets the default behaviour at once (for a run that must die now)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        self.signum = signum
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = {s: signal.getsignal(s) for s in self.SIGNALS}
            for s in self.SIGNALS:
                signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def agreed(self, dist, compare_now: bool, device: torch.device) -> int | None:
        """The signal to stop on, if any. One process answers at every iteration; under torchrun
        the ranks compare only when ``compare_now`` (at each metrics row: one small all-reduce),
        because a signal reaches each rank at a slightly different moment and they must stop together."""
        if not dist.enabled:
            return self.signum
        if not compare_now:
            return None
        flag = dist.max(torch.tensor([float(self.signum or 0)], device=device))
        return int(flag.item()) or None


def signal_name(signum: int | None) -> str | None:
    """``SIGINT`` for 2; None for None."""
    return signal.Signals(signum).name if signum else None

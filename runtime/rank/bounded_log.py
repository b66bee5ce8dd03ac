"""Log lines a peer can cause, at a bounded rate.

Rank 0 refuses what a client or a rank sends that it cannot take (runtime/control/
coordinator.py counts each by reason). Writing a line, or a traceback, per refusal would
let a client that holds the key grow rank 0's log at will: a handler error wrote ~700
bytes a message. Here each kind of line goes out at most once per ``period_s``; the next
one says how many were held back meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class BoundedLog:
    logger: logging.Logger
    period_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, float] = field(default_factory=dict)  # kind -> when it last went out
    _held: dict[str, int] = field(default_factory=dict)  # kind -> lines held back since

    def __call__(self, level: int, kind: str, text: str, *, exc_info: bool = False) -> bool:
        """Log ``text`` unless a line of ``kind`` went out less than ``period_s`` ago;
        True if it was written."""
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.period_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False
        held = self._held.pop(kind, 0)
        suffix = f" ({held} more like it in the last {now - last:.0f} s)" if held else ""
        self.logger.log(level, "%s%s", text, suffix, exc_info=exc_info)
        self._last[kind] = now
        return True

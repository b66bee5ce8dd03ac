"""What rank 0 made of the messages it received: how many it took, the ones it refused by
category (and the last refusal, which the control server logs at a bounded rate), and the
replies no pipe would take. Pure bookkeeping, read by ``reflow status``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class MessageBook:
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    last_rejected: str = ""  # its category and what was wrong, for rank 0's log
    undeliverable: Counter[str] = field(default_factory=Counter)  # replies, by type

    def accept(self) -> None:
        """A message taken."""
        self.accepted += 1

    def reject(self, category: str, detail: str = "") -> None:
        """A message refused, counted by ``category``; ``detail`` says what was wrong."""
        self.rejected[category] += 1
        self.last_rejected = f"{category}: {detail}" if detail else category

    def undelivered(self, message_type: str) -> None:
        """A reply no pipe would take (its rank gone, or its queue full)."""
        self.undeliverable[message_type] += 1

    def status(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "rejected": sum(self.rejected.values()),
            "rejected_by_reason": dict(self.rejected),
            "undeliverable": dict(self.undeliverable),
        }

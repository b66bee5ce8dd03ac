"""ReFlow's two controllers, pure logic with an injected clock (no I/O):

- generation scheduling, per request: :class:`ConcurrencyController` (AIMD cap per
  rollout worker, slow loop) and :class:`TokenRouter` (token-budget admission, cost-based
  routing with prompt affinity, fast path);
- resource allocation, per training step: :class:`ProducerConsumerAllocator` (rates ->
  placement search over whole replica groups -> cooldown gate).

The coordinator drives them in the real runtime; unit tests and the simulator drive the
same classes with scripted signals.
"""

from runtime.control.scheduling.allocator import Placement, ProducerConsumerAllocator, WindowStats
from runtime.control.scheduling.concurrency import ConcurrencyController, WorkerSignals
from runtime.control.scheduling.router import TokenRouter

__all__ = [
    "ConcurrencyController",
    "Placement",
    "ProducerConsumerAllocator",
    "TokenRouter",
    "WindowStats",
    "WorkerSignals",
]

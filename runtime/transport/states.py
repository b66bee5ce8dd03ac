"""The run's and the workers' states: the vocabulary rank 0, the ranks and the CLI share.

Both are ``str`` enums, so they compare equal to their values, encode as plain strings in
msgpack and JSON, and print as their values (``f"run is {state}"`` reads ``run is RUNNING``).
"""

from __future__ import annotations

from enum import Enum


class _StrEnum(str, Enum):
    # The value, not ``RunState.RUNNING``, wherever the state is formatted or printed.
    __str__ = str.__str__
    __format__ = str.__format__


class RunState(_StrEnum):
    """Run states::

    STARTING -> RUNNING -> COMPLETED        (train.steps reached)
        |          |-----> STOPPING -> STOPPED   (reflow stop, SIGTERM, SIGUSR2)
        '----------'-----> FAILED            (lost rank, registration timeout)
    """

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    COMPLETED = "COMPLETED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({RunState.COMPLETED, RunState.STOPPED, RunState.FAILED})


class WorkerState(_StrEnum):
    """What a rank is doing, as it reports it (heartbeats) or rank 0 concludes it."""

    STARTING = "starting"  # registered, engines still starting
    IDLE = "idle"
    SWITCHING = "switching"  # changing role at a layout change
    BUSY = "busy"  # generating or training
    STOPPING = "stopping"
    DEAD = "dead"  # no heartbeat within the timeout (rank 0's verdict)
    EXITED = "exited"  # said Bye

    @property
    def gone(self) -> bool:
        return self in GONE


GONE = frozenset({WorkerState.DEAD, WorkerState.EXITED})

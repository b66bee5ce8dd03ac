"""The trainer leader's batch requests across role switches (pure logic, fake clock)."""

from __future__ import annotations

from runtime.rank.sides import REASK_S, BatchConsumer
from runtime.transport import protocol as p


class Leader(BatchConsumer):
    def __init__(self) -> None:
        super().__init__(cfg=None, rank=0)

    def observe(self, step: int, policy_version: int) -> None:
        """Nothing to follow here."""

    def train_batch(self, msg: p.Batch) -> None:
        """Trained at once."""


def test_a_request_unanswered_when_the_rank_left_the_trainer_role_does_not_hold_the_next(
    monkeypatch,
):
    # Colocated sync: the leader asks for its next batch right after its step report;
    # rank 0's "sync point in progress" comes after the switch to rollout, so it reaches
    # the rollout side. Back in the trainer role, the leader must ask again at once, not
    # REASK_S later (before, every colocated step waited those 10 s).
    import runtime.rank.sides as sides

    now = [1000.0]
    monkeypatch.setattr(sides.time, "monotonic", lambda: now[0])
    side = Leader()
    sent: list[p.Message] = []
    side.attach(lambda m: sent.append(m) or True, 0)
    side.activate()
    side.step()
    assert [type(m) for m in sent] == [p.BatchRequest]
    side.deactivate()  # the phase switch; the answer goes to the other side
    now[0] += 0.5
    side.activate()
    side.step()
    assert [type(m) for m in sent] == [p.BatchRequest, p.BatchRequest]
    # while the role is kept, an unanswered request is asked again only when overdue
    now[0] += REASK_S / 2
    side.step()
    assert len(sent) == 2
    now[0] += REASK_S
    side.step()
    assert len(sent) == 3

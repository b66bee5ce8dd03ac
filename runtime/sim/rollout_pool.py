"""The simulated rollout side: one modelled replica per rollout group, each led by a rank
running the real rollout pull loop (:class:`runtime.rank.rollout_loop.RolloutLoop`).

A leader asks for work up to its sequence limit, telling rank 0 how many of its requests
are between turns (in a tool call, holding no generation slot, as a real agent rank
does); its replica generates each request turn by turn (a tool call between turns), and
finished samples go back to rank 0 as the real ranks send them. Requests refused for lack
of room (B_max, staleness, a barrier, the token budget) are retried when something that
lifts those limits happens, not polled.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace

from runtime.control.coordinator import Coordinator
from runtime.data.sample import ParkedRollout, Request, Sample, Turn
from runtime.rank.rollout_loop import RolloutLoop
from runtime.sim.eval_episodes import EvalEpisodes
from runtime.sim.events import EventQueue
from runtime.sim.parameters import ModelProfile, WorkloadProfile
from runtime.sim.replica import RolloutReplica
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.transport.sample_shape import turns_mask


@dataclass
class _Generation:
    """A request in flight on a simulated replica (its pull loop's handle for it)."""

    prompt_blocks: int
    turns: list[int]  # blocks to generate per turn
    version: int  # policy version when dispatched
    group_id: int
    prompt_id: int
    dispatched_at: float
    turn: int = 0
    context: int = 0  # blocks of earlier turns and of their tool outputs
    # Handed over by a rank that left the rollout pool (runtime/control/hand_over.py):
    # the version spans of what it had generated, and the blocks of the current turn.
    prefix: list[tuple[int, int, int]] | None = None
    done: int = 0
    # an eval round's episode: (round id, task id); the reward goes back as ``EvalDone``
    eval_task: tuple[int, int] | None = None


class RolloutPool:
    """The rollout replicas of the current layout, keyed by their leader rank."""

    def __init__(
        self,
        events: EventQueue,
        coord: Coordinator,
        send: Callable[[int, p.Message], bool],
        model: ModelProfile,
        workload: WorkloadProfile,
        *,
        rng: random.Random,
        eval_rng: random.Random | None = None,
        block: int,
        max_seqs: int,
        world: int,
        gpus_per_replica: int,
        prompt_ids: list[int],
        progress: Callable[[], float],
        on_delivered: Callable[[], None],
    ) -> None:
        self.events, self.coord, self._send = events, coord, send
        self.model, self.workload, self.lengths = model, workload, workload.lengths
        self.rng, self.block, self.max_seqs = rng, block, max_seqs
        self.gpus_per_replica = gpus_per_replica
        self._progress, self._on_delivered = progress, on_delivered
        self.stopped = False
        self.version = 0  # the newest policy version the ranks have received
        self.replicas: dict[int, RolloutReplica] = {}  # leader rank -> replica
        self.loops: dict[int, RolloutLoop[_Generation]] = {}  # leader rank -> its pull loop
        self._replica_event: dict[int, int] = {}  # leader -> token of its scheduled event
        # Leaders whose last work request got nothing (B_max, staleness, a barrier, the
        # token budget), oldest first. They ask again when something that lifts those
        # limits happens: a step (all), a delivery (the oldest one), the periodic tick.
        self._blocked: dict[int, None] = {}
        self._stale_at: int | None = None  # see _stale_limited
        self.rollout_active: list[float] = [0.0] * world  # seconds per rank, for heartbeats
        self.rollout_busy: list[float] = [0.0] * world
        self.rollout_paused: list[float] = [0.0] * world  # of busy, paused for syncs
        self.rollout_prefill: list[float] = [0.0] * world  # of busy, prefilling
        self._last_account = 0.0
        # leader -> its replica's (busy, paused, prefill) seconds at the last account
        self._accounted: dict[int, tuple[float, float, float]] = {}
        self._arrays: dict[int, tuple[array, array]] = {}
        self._prompt_ids = prompt_ids  # the one prompt rank 0 hands out
        # sample id -> its generation as a rank that left the pool handed it over
        self._handed: dict[int, _Generation] = {}
        # vLLM caches prefixes by default; only a later turn of an episode can hit (first
        # turns' shared prompts are not modelled), so single-turn replicas skip the cache
        self._multi_turn = workload.turns > 1
        self._tool_out = workload.tool_output_tokens // block  # blocks per tool call
        # What the workload model drew, for checking it against its profile: tool calls
        # started and their seconds; episodes delivered and the tool calls they made.
        self.tool_calls, self.tool_s_total = 0, 0.0
        self.episodes_done, self.episode_tool_calls = 0, 0
        self.evals = EvalEpisodes(eval_rng or random.Random("evals"))

    # --- layout ------------------------------------------------------------------------

    def add(self, leader: int, *, frozen_for: float = 0.0) -> None:
        """A rollout replica led by ``leader``, with the leader's pull loop; it starts
        generating after ``frozen_for`` seconds (a role switch)."""
        replica = RolloutReplica(
            self.model, block=self.block, max_seqs=self.max_seqs, prefix_cache=self._multi_turn
        )
        loop: RolloutLoop[_Generation] = RolloutLoop(leader, retry_s=0.0)
        loop.attach(lambda msg: self._send(leader, msg), leader)
        self.replicas[leader], self.loops[leader] = replica, loop
        if frozen_for:
            replica.t = replica.frozen_until = self.events.now + frozen_for

    def relayout(self, leaders: set[int], frozen_for: float) -> None:
        """Keep the replicas whose leaders lead again, drop the others (each hands over
        what it was generating, as a rank leaving the rollout pool does), add the new."""
        self.account()
        for gone in set(self.replicas) - leaders:
            self._hand_over(gone)
            del self.replicas[gone]
            self.loops.pop(gone).drop()
            self._replica_event.pop(gone, None)
            self._accounted.pop(gone, None)
            self._blocked.pop(gone, None)
            self.evals.drop(gone)
        for new in leaders - set(self.replicas):
            self.add(new, frozen_for=frozen_for)

    # --- coordinator -> leaders --------------------------------------------------------

    def on_work(self, leader: int, msg: p.Work) -> None:
        replica, loop = self.replicas.get(leader), self.loops.get(leader)
        if replica is None or loop is None:
            return
        now = self.events.now
        requests = loop.take(msg, now)
        if not msg.requests:
            # Nothing now (B_max, staleness, a barrier): real ranks ask again a moment
            # later; here the blocked ones ask when something that lifts those limits
            # happens (a step, a delivery, the periodic tick).
            self._blocked[leader] = None
            return
        self._blocked.pop(leader, None)
        for req in requests:
            handed = self._handed.pop(req.sample_id, None)
            if handed is not None and req.resume is not None:
                self._resume(leader, replica, req, handed, msg.policy_version)
                continue
            g = self._episode(msg.policy_version, req.group_id, req.prompt_id, self.rng)
            loop.running[req.sample_id] = g
            replica.submit(req.sample_id, g.prompt_blocks, g.turns[0])
        self._catch_up(leader, replica)

    def _episode(
        self, version: int, group_id: int, prompt_id: int, rng: random.Random
    ) -> _Generation:
        """A new episode drawn (from ``rng``) from the workload model at the run's
        progress: its response length, split into turns by its tool calls."""
        total = self.lengths.draw(rng, self._progress())
        n_turns = self.workload.episode_turns(rng)  # tool calls + 1
        per = max(1, total // n_turns // self.block)
        # a tool output is part of the response drawn, but prefilled, not decoded
        later = max(1, per - self._tool_out)
        return _Generation(
            prompt_blocks=len(self._prompt_ids),
            turns=[per] + [later] * (n_turns - 1),
            version=version,
            group_id=group_id,
            prompt_id=prompt_id,
            dispatched_at=self.events.now,
        )

    def on_eval_work(self, leader: int, msg: p.EvalWork) -> None:
        """Rank 0 pinned this replica to an eval round: its episodes run here, each drawn
        like a training one (runtime/sim/eval_episodes.py)."""
        replica, loop = self.replicas.get(leader), self.loops.get(leader)
        if replica is None or loop is None:
            return
        loop.take_eval(msg, self.events.now)
        if not msg.tasks:  # all handed out: asks again when one of its episodes ends
            self._blocked[leader] = None
            return
        self._blocked.pop(leader, None)
        for t in msg.tasks:
            g = self._episode(msg.policy_version, -1, -1, self.evals.rng)
            g.eval_task = (msg.round_id, t["task_id"])
            replica.submit(self.evals.add(leader, g), g.prompt_blocks, g.turns[0])
        self._catch_up(leader, replica)

    def _resume(
        self, leader: int, replica: RolloutReplica, req: Request, was: _Generation, version: int
    ) -> None:
        """A request handed over by a rank that left: its episode goes on where it was cut
        off (what it had is prefilled, not decoded again; one cut off in a tool call
        starts its next turn)."""
        s = replace(was, version=version, dispatched_at=self.events.now)
        self.loops[leader].running[req.sample_id] = s
        replica.submit(
            req.sample_id, s.prompt_blocks + s.context + s.done, s.turns[s.turn] - s.done
        )

    def _hand_over(self, leader: int) -> None:
        """``leader`` leaves the rollout pool: what its replica had generated of each
        request goes to rank 0 as a rank reports it (``Parked``), and is kept here to go on
        with on the replica that gets the request next."""
        loop, replica = self.loops[leader], self.replicas[leader]
        if not self.coord.data.handing_over(leader):
            return  # (colocated_sync: no hand-overs)
        # (a rank reports also when it has nothing: rank 0 awaits the report)
        replica.advance(self.events.now)
        rollouts: dict[int, ParkedRollout] = {}
        for sid, s in loop.running.items():
            seq = replica.running.get(sid)
            if seq is not None:  # decoding (a waiting or preempted one has nothing)
                # (a turn ending at this very instant is cut one block short)
                s.done += min(seq.need - 1, int(replica.S - seq.start + 1e-9))
            n = s.context + s.done
            if n == 0:
                continue
            turns, pos = [], 0
            for t in range(s.turn):
                turns.append(Turn(pos, pos + s.turns[t], "stop", None))
                pos += s.turns[t] + self._tool_out
            if s.done:
                turns.append(Turn(pos, pos + s.done, "abort", None))
            s.prefix = self._spans(s, n)
            tokens, logprobs = self._arrays_of(n)
            mask = turns_mask([(t.start, t.end) for t in turns], n)
            rollouts[sid] = ParkedRollout(
                token_ids=tokens, logprobs=logprobs, loss_mask=mask, versions=s.prefix, turns=turns
            )
            self._handed[sid] = s
        self._send(leader, wire.parked_message(leader, rollouts))

    def _spans(self, s: _Generation, n: int) -> list[tuple[int, int, int]]:
        """The version spans of ``s``'s first ``n`` blocks: what a rank that left had
        generated, then this stretch. Held across a weight sync (runtime/rank/rollout_loop.py,
        Spans): modelled as half way through, which is all rank 0 looks at (the versions)."""
        prefix = s.prefix or []
        start = prefix[-1][2] if prefix else 0
        v = s.version
        if n <= start:
            return prefix
        if self.version <= v:
            return [*prefix, (v, start, n)]
        mid = start + (n - start) // 2
        return [*prefix, (v, start, mid), (self.version, mid, n)]

    def on_weight_sync(self, rank: int, version: int) -> None:
        """A sync holds a replica's requests for the sync time; they resume after."""
        self.version = max(self.version, version)
        replica = self.replicas.get(rank)
        if replica is not None:
            replica.stall(self.events.now, self.model.weight_sync_s)
            self._schedule(rank)

    # --- replica events ----------------------------------------------------------------

    def _schedule(self, leader: int) -> None:
        replica = self.replicas.get(leader)
        if replica is None:
            return
        t = replica.next_event()
        token = self.events.token()
        self._replica_event[leader] = token
        if t < math.inf:
            self.events.at(max(t, self.events.now), self._tick, leader, token)

    def _tick(self, leader: int, token: int) -> None:
        replica = self.replicas.get(leader)
        if replica is None or self._replica_event.get(leader) != token:
            return  # superseded by a later schedule, or the replica is gone
        self._turns_finished(leader, replica.on_event(self.events.now))
        if self._stale_limited():
            self._blocked.setdefault(leader, None)
        elif leader not in self._blocked:  # blocked ones wait for a step or a delivery
            self.ask_work(leader)
        self._schedule(leader)

    def _catch_up(self, leader: int, replica: RolloutReplica) -> None:
        """Bring a replica to now after new work: what finishes at this very instant (its
        tick was due now but had not run yet) must be reported, not dropped."""
        self._turns_finished(leader, replica.on_event(self.events.now))
        self._schedule(leader)

    def _turns_finished(self, leader: int, sids: list[int]) -> None:
        """Turns that ended at this instant: those that go on to a tool call first, so
        that a delivery among them (which may ask for work at once) reports every
        request now between turns as such."""
        running = self.loops[leader].running

        def last(sid: int) -> bool:
            s = running.get(sid) or self.evals.get(leader, sid)
            return s is None or s.turn + 1 >= len(s.turns)

        for sid in sorted(sids, key=last):  # stable: the replica's order otherwise
            self._turn_finished(leader, sid)

    def _turn_finished(self, leader: int, sid: int) -> None:
        loop = self.loops.get(leader)
        # (a delivery of the same instant may have ended a lend: the replica left, and rank
        # 0 put its requests back in the queue)
        s = loop.running.get(sid) if loop is not None else None
        s = s or self.evals.get(leader, sid)
        if s is None or loop is None:
            return
        now = self.events.now
        s.context += s.turns[s.turn]
        s.turn, s.done = s.turn + 1, 0
        if s.turn < len(s.turns):  # a tool call, then the next turn on the same replica
            s.context += self._tool_out  # its output, in the next turn's prompt
            tool_s = self.workload.tool_s(self.rng if s.eval_task is None else self.evals.rng)
            if s.eval_task is not None:
                self.evals.tool_call(leader, started=True)
            self.tool_calls += 1
            self.tool_s_total += tool_s
            self.events.at(now + tool_s, self._next_turn, leader, sid)
            return
        if s.eval_task is not None:  # its result to rank 0; the leader asks for more
            loop.queue(
                self.evals.finished(leader, sid, lambda: self.workload.reward_p(self._progress()))
            )
            loop.flush()
            self._blocked.pop(leader, None)
            self.ask_work(leader)
            return
        del loop.running[sid]
        self.episodes_done += 1
        self.episode_tool_calls += len(s.turns) - 1
        n = s.context
        spans = self._spans(s, n)
        reward = float(self.rng.random() < self.workload.reward_p(self._progress()))
        tokens, logprobs = self._arrays_of(n)
        loop.finished(
            Sample(
                sample_id=sid,
                group_id=s.group_id,
                prompt_id=s.prompt_id,
                versions=spans,
                prompt_token_ids=self._prompt_ids,  # rank 0 checks it was its prompt
                token_ids=tokens,
                logprobs=logprobs,
                n_valid=n,
                reward=reward,
                worker=leader,
                started_at=s.dispatched_at,
                finished_at=now,
            )
        )
        loop.flush()
        if self._blocked and not self._stale_limited():
            # a slot under B_max is free now: the longest-waiting asks
            oldest = next(iter(self._blocked))
            del self._blocked[oldest]
            self.ask_work(oldest)
        self._on_delivered()

    def _next_turn(self, leader: int, sid: int) -> None:
        replica, loop = self.replicas.get(leader), self.loops.get(leader)
        s = loop.running.get(sid) if loop is not None else None
        s = s or self.evals.get(leader, sid)
        if replica is None or s is None:
            return
        if s.eval_task is not None:
            self.evals.tool_call(leader, started=False)
        replica.advance(self.events.now)
        replica.submit(sid, s.prompt_blocks + s.context, s.turns[s.turn])
        self._catch_up(leader, replica)

    # --- asking for work ---------------------------------------------------------------

    def ask_work(self, leader: int) -> None:
        replica = self.replicas.get(leader)
        if replica is None or self.stopped:
            return
        data = self.coord.data
        refused = data.n_blocked("staleness")
        loop = self.loops[leader]
        # A generation in flight is either in the replica (generating or queued there) or
        # between two turns, in a tool call: those hold no slot, and rank 0 is told so. An
        # eval episode in a tool call keeps its slot (as the vLLM rank's free_slots counts).
        evals_here, eval_tools = self.evals.slots(leader)
        in_tools = len(loop.running) - (replica.outstanding - evals_here)
        free = self.max_seqs - replica.outstanding - eval_tools
        asked = loop.pull(free, self.events.now, in_tools)
        if asked and data.n_blocked("staleness") != refused:
            self._stale_at = self._settled_groups()

    def ask_all(self) -> None:
        for leader in list(self.replicas):
            self.ask_work(leader)

    def retry_blocked(self) -> None:
        """Something that lifts the limits happened (a step, the periodic tick): the
        blocked leaders ask again, oldest first, until staleness refuses one."""
        self._stale_at = None
        for leader in list(self._blocked):
            if self._stale_limited():  # the rest would be refused the same way
                break
            self._blocked.pop(leader, None)
            self.ask_work(leader)

    def _settled_groups(self) -> int:
        return sum(self.coord.data.groups_settled())

    def _stale_limited(self) -> bool:
        """Whether the last work request was refused by staleness admission and nothing
        that lifts it has happened since. Its bound counts buffered + outstanding samples,
        which a delivery does not change: only a step (a batch consumed, a new version) or
        a group leaving the buffer does. Asking again after every delivery while it holds
        was nine in ten of all work requests at 128 GPUs."""
        if self._stale_at is not None and self._stale_at != self._settled_groups():
            self._stale_at = None
        return self._stale_at is not None

    def _arrays_of(self, n: int) -> tuple[array, array]:
        """Token ids and log-probs of a response of ``n`` blocks (their values never matter;
        typed arrays go onto the wire as they are)."""
        b = self._arrays.get(n)
        if b is None:
            b = self._arrays[n] = (array("i", [0] * n), array("f", [-1.0] * n))
        return b

    # --- accounting --------------------------------------------------------------------

    def account(self) -> None:
        """Rollout active/busy seconds per rank since the last call (for the heartbeats)."""
        now = self.events.now
        dt = now - self._last_account
        self._last_account = now
        for leader, replica in self.replicas.items():
            replica.advance(now)
            before = self._accounted.get(leader, (0.0, 0.0, 0.0))
            after = (replica.busy_s, replica.paused_s, replica.prefill_s)
            self._accounted[leader] = after
            busy, paused, prefill = (x - y for x, y in zip(after, before, strict=True))
            for r in range(leader, leader + self.gpus_per_replica):
                self.rollout_active[r] += dt
                self.rollout_busy[r] += busy
                self.rollout_paused[r] += paused
                self.rollout_prefill[r] += prefill

"""What rank 0 reports: the step's metrics line, ``reflow status``, ``summary.json``.

Read-only views of the coordinator's state (the counters they need are kept in
:class:`runtime.control.run.StepCounters`); the server writes them out
(runtime/rank/control_server.py).
"""

from __future__ import annotations

import logging
from typing import Any

from runtime.config.layout import Role
from runtime.control.checkpoints import PARK_TIMEOUT_S
from runtime.control.replay_buffer import Batch
from runtime.control.run import Run
from runtime.data.sample import Sample
from runtime.transport import protocol as p

log = logging.getLogger(__name__)

LEDGER_KEYS = ("dispatched", "delivered", "consumed", "replayed", "evicted", "lost", "duplicated")


def reward_info_means(samples: list[Sample]) -> dict[str, float]:
    """``reward_info/<key>``: the mean over the batch's samples of each numeric diagnostic
    a recipe's own reward function returned beside its score (``workload.reward_fn``)."""
    sums: dict[str, list[float]] = {}
    for t in samples:
        info = t.info.get("reward_info")
        if not isinstance(info, dict):
            continue
        for key, value in info.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                sums.setdefault(key, []).append(float(value))
    return {f"reward_info/{k}": round(sum(v) / len(v), 6) for k, v in sorted(sums.items())}


def step_line(c: Run, msg: p.StepDone, batch: Batch | None, now: float) -> dict[str, Any]:
    """The metrics line of a finished step, before the coordinator adds its decisions."""
    n = c.counters
    line: dict[str, Any] = {
        "step": msg.step,
        "policy_version": msg.policy_version,
        "attempt": c.life.attempt,
    }
    if batch is not None:
        line.update(
            batch_unused=batch.n_unused,
            batch_replay=batch.n_replay,
            max_sample_age=batch.max_age,
            reward_mean=sum(t.reward for t in batch.samples) / len(batch.samples),
            # rewards that crashed or timed out (scored 0, recorded by the agent)
            reward_failures=sum(1 for t in batch.samples if t.info.get("reward_error")),
            tokens=sum(t.n_valid for t in batch.samples),
            # of those, the samples trained for the first time (replay trains no new data)
            fresh_tokens=sum(t.n_valid for t in batch.samples[: batch.n_unused]),
        )
        line.update(reward_info_means(batch.samples))
        warning = n.zero_reward.observe(batch.samples)
        if warning:
            log.warning("%s", warning)
            line["reward_warning"] = warning
    if n.delivered:  # every group, before a sampler drops any: the policy's own reward
        line["rollout_reward_mean"] = n.reward_sum / n.delivered
        line["rollout_samples"] = n.delivered
        # their mean response length: the trend the allocator reacts to
        line["rollout_response_tokens"] = round(
            (n.generated_tokens - n.tokens_at_last_step) / n.delivered, 2
        )
    n.tokens_at_last_step = n.generated_tokens
    n.reward_sum, n.delivered = 0.0, 0
    line.update(
        wall_s=round(now - c.life.started_at, 4),
        trainer_idle_s=round(c.data.trainer_idle_s, 4),
        # cumulative idle seconds by cause (runtime/control/idle.py)
        trainer_idle_by_cause_s={
            k: round(v, 3) for k, v in sorted(c.idle.trainer_idle(now).items()) if v > 0
        },
        rollout_idle_by_cause_s={
            k: round(v, 3) for k, v in sorted(c.idle.rollout.items()) if v > 0
        },
        **lend_fields(c, now),
        layout=c.layout.ratio,
        **{k: v for k, v in msg.metrics.items() if k not in line},
    )
    if not c.reports.lines:
        n.tokens_at_first_step = n.generated_tokens
    return line


def lend_fields(c: Run, now: float) -> dict[str, Any]:
    """A lending run's metrics-line fields: the trainer's cumulative busy seconds by cause
    (``lent``) and the lends so far (runtime/control/lends.py)."""
    if c.lends is None:
        return {}
    busy = c.idle.trainer_busy_s(now)
    return {
        "trainer_busy_by_cause_s": {k: round(v, 3) for k, v in sorted(busy.items()) if v > 0},
        "lends": c.lends.status(),
    }


def resumed_brief(c: Run) -> dict[str, Any] | None:
    if c.life.resumed is None:
        return None
    buf = c.life.resumed["buffer"]
    return {
        **{k: v for k, v in c.life.resumed.items() if k != "buffer"},
        "samples": len(buf["samples"]),
        "pending": len(buf["pending"]),
    }


def summary(c: Run) -> dict[str, Any]:
    """End-of-run figures (``summary.json``)."""
    n = c.counters
    end = c.life.ended_at if c.life.ended_at is not None else c.clock()
    wall = max(end - c.life.started_at, 1e-9)
    ledger = c.data.ledger()
    tokens = sum(line.get("tokens", 0) for line in c.reports.lines)
    first = c.reports.lines[0]["wall_s"] if c.reports.lines else 0.0
    syncs = sorted(x["weight_sync_s"] for x in c.reports.lines if "weight_sync_s" in x)
    return {
        "run": c.run,
        "state": c.state,
        "reason": c.reason,
        "mode": c.cfg.reflow.mode,
        "steps": c.step,
        "wall_s": round(wall, 3),
        "trainer_tokens_per_s": round(tokens / wall, 2),
        # Idle is counted from the first step on: before it the pools are warming up.
        # Every idle second has one cause (runtime/control/idle.py).
        "trainer_idle_ratio": round(c.trainer_idle_ratio(end), 4),
        "rollout_idle_ratio": round(c.rollout_idle_ratio(), 4),
        **c.idle.report(end, c.trainer_window),
        # generated, then evicted before any use (by reason), and their length bias
        **c.data.waste(),
        "rollout_tokens": n.generated_tokens,
        # over the training window (first step to the end), as trainer idle is
        "rollout_tokens_per_s": round(
            (n.generated_tokens - n.tokens_at_first_step) / max(wall - first, 1e-9), 2
        ),
        "eval_reward_start": c.reports.evals.get("eval_reward_start"),
        "eval_reward_end": c.reports.evals.get("eval_reward_end"),
        "evals": eval_sets(c.reports.evals),
        # a run whose rollout engines play its eval sets: every eval that ended
        **({"eval_rounds": [r.as_dict() for r in c.evals.records]} if c.evals is not None else {}),
        "weight_sync_s_median": syncs[len(syncs) // 2] if syncs else None,
        # tokens and seconds of the rollout engines by running requests (heartbeats)
        "rollout_decode_by_concurrency": c.engine_profile.summary(),
        "switches": [s.as_dict() for s in c.rebalance.switches],
        **({"lends": c.lends.status()} if c.lends is not None else {}),  # a lending run's
        "lost_ranks": list(c.members.lost_ranks),
        "rejoined_ranks": list(c.members.rejoined_ranks),
        "attempt": c.life.attempt,
        "resumed": resumed_brief(c),
        "checkpoints": list(c.checkpoints),
        "failed_while_training": c.life.failed_while_training,
        "ledger_violations": len(c.reports.ledger_violations),
        "samples": {k: ledger[k] for k in LEDGER_KEYS},
        # paused across a weight sync and resumed; parked at a stop, continued after it
        **c.data.partial_rollouts(),
        "delivered_by_rank": c.data.stats()["delivered_by_rank"],
    }


def status(c: Run) -> dict[str, Any]:
    """``reflow status --json`` (docs/run-folder.md has the schema)."""
    now = c.clock()
    allocator = c.rebalance.allocator
    return {
        "run": c.run,
        "state": c.state,
        "reason": c.reason,
        "mode": c.cfg.reflow.mode,
        "step": c.step,
        "total_steps": c.cfg.train.steps,
        "policy_version": c.policy_version,
        "uptime_s": round(now - c.life.started_at, 3),
        "layout": c.rebalance.status(),
        "workers": c.members.status(now),
        # one engine each: with rollout_gpus_per_replica > 1 a replica spans several ranks
        "rollout_replicas": c.members.rollout_replicas(c.layout.groups(Role.ROLLOUT)),
        "buffer": {**c.data.stats(), "ledger": c.data.ledger()},
        "metrics": dict(c.reports.last_metrics),
        "switches": [s.as_dict() for s in c.rebalance.switches[-10:]],
        "generation": c.generation.status(),
        "lost_ranks": list(c.members.lost_ranks),
        "rejoined_ranks": list(c.members.rejoined_ranks),
        "attempt": c.life.attempt,
        "resumed": resumed_brief(c),
        "checkpoint": c.ckpt.status(),
        "waits": rank0_waits(c, now),
        "idle": {
            "trainer_idle_ratio": round(c.trainer_idle_ratio(now), 4),
            "rollout_idle_ratio": round(c.rollout_idle_ratio(), 4),
            **c.idle.report(now, c.trainer_window),
            "throttled_busy_s": round(c.idle.throttled_busy_s, 3),
            **c.data.waste(),
        },
        "evals": eval_sets(c.reports.evals),
        # the rollout engines' eval rounds: the last finished, the one in flight
        "eval_rounds": c.evals.status() if c.evals is not None else None,
        "lends": c.lends.status() if c.lends is not None else None,
        "allocator": {
            "auto": c.auto_rebalance,
            "decisions": [d.as_dict() for d in allocator.decisions[-5:]],
        },
        "control": {**c.messages.status(), "batches_resent": c.trainer_link.resent},
        "ledger_violations": c.reports.ledger_violations[-5:],
        "updated_at": c.wall(),
    }


def eval_sets(evals: dict[str, float]) -> dict[str, dict[str, dict[str, float]]]:
    """The ``data.eval`` sets' figures by set: ``start`` (before the first step) and
    ``last`` (the latest eval: the end's once the run completed)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key, value in evals.items():
        head, _, rest = key.partition("/")
        name, _, figure = rest.partition("/")
        if head in ("eval", "eval_start") and name and figure:
            when = "start" if head == "eval_start" else "last"
            out.setdefault(name, {}).setdefault(when, {})[figure] = value
    return out


def rank0_waits(c: Run, now: float) -> list[dict[str, Any]]:
    """What rank 0 is waiting on now, for whom, since when, and what bounds the wait (the
    ranks' own waits are each worker's ``waiting_on``)."""
    ctl = c.cfg.control
    out: list[dict[str, Any]] = []
    if c.batch_in_flight is not None:
        trainers = c.trainer_ranks()
        out.append(
            {
                "what": f"the step report of batch {c.batch_in_flight}",
                "from": [0],  # the trainer leader reports for its group
                "trained_by": trainers,
                "for_s": round(now - c.trainer_link.sent_at, 3),
                "bound": f"control.step_timeout_s={ctl.step_timeout_s:g} (the run fails)",
            }
        )
    switch = c.rebalance.applied if c.rebalance.switching() else None
    if switch is not None and switch.applied_at is not None:
        out.append(
            {
                "what": f"the ranks taking up layout epoch {switch.epoch} ({switch.ratio})",
                "from": sorted(switch.waiting_for),
                "for_s": round(now - switch.applied_at, 3),
                "bound": (
                    f"control.heartbeat_timeout_s={ctl.heartbeat_timeout_s:g} of silence "
                    "(a rank in a switch still beats when it is done)"
                ),
            }
        )
    pending = c.ckpt.pending
    if pending is not None:
        out.append(
            {
                "what": f"the trainer's half of the checkpoint of step {pending.step}",
                "from": [0],
                "for_s": round(now - pending.requested_at, 3),
                "bound": f"control.checkpoint_timeout_s={ctl.checkpoint_timeout_s:g}",
            }
        )
        if pending.awaiting:
            out.append(
                {
                    "what": "the parked rollouts of the requests in flight, for the checkpoint",
                    "from": sorted(pending.awaiting),
                    "for_s": round(now - pending.parked_at, 3),
                    "bound": (
                        f"{PARK_TIMEOUT_S:g} s (then their requests are saved from the prompt)"
                    ),
                }
            )
    return out


def sample_record(t: Sample, rank: int) -> dict[str, Any]:
    """One line of ``samples.jsonl`` (``logging.samples``)."""
    return {
        "sample_id": t.sample_id,
        "group_id": t.group_id,
        "rank": rank,
        "reward": t.reward,
        "n_valid": t.n_valid,
        "versions": [list(v) for v in t.versions],
        "prompt_ids": list(t.prompt_token_ids),
        "token_ids": list(t.token_ids),
        "loss_mask": None if t.loss_mask is None else list(t.loss_mask),
        "info": t.info,
    }

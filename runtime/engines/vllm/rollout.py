"""The rollout engine: vLLM's ``AsyncLLM`` behind ReFlow's rollout side.

:class:`VLLMEngine` (runtime/engines/vllm/engine.py) is the async adapter;
:class:`VLLMRolloutSide` runs it on a background thread for the synchronous
hybrid worker, behind the rollout pull loop (runtime/rank/rollout_loop.py): work from rank 0
goes in, finished samples (scored by the workload's reward) come out through the loop's
outbox, emptied on the worker's thread, which owns the socket.

Weights: the side's :class:`runtime.weights.receive.PolicyReceiver` takes part in each
transfer the leader's header announces (over gloo on CPU: written to /dev/shm and reloaded;
over NCCL on CUDA: straight into the engine's workers) and hands the engine's part to this
side, which runs it on the engine's loop, one update in flight at a time. Each sync leaves
a record in ``sync_records`` (bytes, seconds, GB/s).

Sleep levels on a role switch: ``deactivate`` sleeps at level 2 (KV cache and weights
dropped) when the rank has a process group, because a rank joining the rollout pool always
receives the leader's current weights in :meth:`VLLMRolloutSide.on_layout` before it asks
for work: keeping a copy in host memory (level 1) would cost that memory and a copy back
for weights that are replaced anyway. Without a process group nothing would send them, so
it sleeps at level 1 (weights kept in host memory). ``activate`` wakes the engine (KV cache
and weight memory allocated again). On CPU there is no sleep mode (``enable_sleep_mode``
fails at engine creation): the state and its seconds are recorded, the device work is
skipped, and the inactive engine stays warm with a small KV cache
(``engine.kv_cache_memory_bytes``), the documented CPU equivalent. ``last_switch`` holds
the seconds of the last sleep or wake and of the weights received on joining.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import shutil
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from runtime.config.layout import LayoutChange
from runtime.config.schema import Config
from runtime.data.sample import ParkedRollout, Request, Sample
from runtime.engines.vllm.engine import VLLMEngine
from runtime.engines.vllm.eval_player import EvalPlayer
from runtime.engines.vllm.route_probe import RouteProbe
from runtime.engines.vllm.settings import VLLMEngineConfig
from runtime.rank.collective import Collective
from runtime.rank.rollout_loop import RolloutSide
from runtime.store.run_dir import RunPaths, fresh_private_dir
from runtime.transport import protocol as p
from runtime.weights.receive import PolicyReceiver
from runtime.weights.settings import WeightPathConfig
from runtime.workloads.agents import registry
from runtime.workloads.agents.base import AgentEnv
from runtime.workloads.agents.pool import RewardPool
from runtime.workloads.agents.settings import AgentEnvConfig

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
T = TypeVar("T")
ENGINE_CALL_TIMEOUT_S = 600.0  # sleep, wake-up, a reload: minutes at most on a big model
# At a stop, how long an episode waiting on a tool call or a reward may finish it before it
# is cancelled (it keeps the turns it had; the call runs again after the resume).
PARK_GRACE_S = 5.0


def eval_records(cfg: Config, name: str) -> Any:
    """The record lookup of the eval set ``name`` (its file loaded as rank 0 rendered its
    prompts), or None if the run has no such set."""
    from runtime.workloads.eval_sets import eval_prompts

    path = cfg.data.eval.get(name)
    return None if path is None else eval_prompts(cfg, path)[1]


class VLLMRolloutSide(RolloutSide[Future]):
    name = "rollout"

    def __init__(
        self, cfg: Config, rank: int, paths: RunPaths, collective: Collective | None = None
    ) -> None:
        from runtime.embedded.resolve import resolve_model_path

        super().__init__(cfg, rank)
        self.cfg: Config = cfg
        self.paths = paths
        # the weight path's sync group (None: an engine pair without a process group)
        self.sync = collective.sync if collective is not None else None
        # Received weights are handed to the engine as a file in memory (/dev/shm), the
        # fastest path measured on the CPU build; one folder per version.
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() else paths.root
        # The name is predictable (one per run and rank): made fresh, 0700, by us, or the
        # rank fails; another user's folder or link there is never written into.
        self.weights_root = fresh_private_dir(base / f"reflow-{paths.name}-rank{rank}")
        self.agent = registry.agent(cfg.workload.kind)
        self.slots = cfg.scheduler.max_concurrency
        self._updating: Future | None = None  # the engine's part of a weight update
        # a weight transfer waits as long as the leader's collectives may
        self._transfer_timeout_s = (
            self.sync.timeout.total_seconds() if self.sync is not None else 600.0
        )
        # the last role switch of this side: sleep or wake seconds, weights on joining
        self.last_switch: dict[str, float] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="vllm-loop"
        )
        self._thread.start()
        model_path = resolve_model_path(cfg.model.path)
        self.engine = VLLMEngine(
            model_path, VLLMEngineConfig.from_config(cfg), seed=cfg.train.seed + rank, rank=rank
        )
        # bounded like registration: a rank whose engine never comes up is not ready
        start_s = cfg.control.register_timeout_s
        self._await(self.engine.start(0), start_s, "engine start (control.register_timeout_s)")
        self.receiver = PolicyReceiver(
            WeightPathConfig.from_config(cfg),
            rank,
            self.engine,
            self.sync,
            self.weights_root,
            self._transfer_timeout_s,
        )
        # routing replay: the routes of each finished sample, from a probe of the served
        # policy (CPU; route_probe.py), which loads every version the engine loads
        self.probe: RouteProbe | None = None
        if cfg.algorithm.routing_replay == "rollout":
            self.probe = RouteProbe(model_path, keep=max(4, cfg.reflow.delta + 3))
            self.receiver.on_loaded = self.probe.load
        from runtime.data.codec import codec_for

        record = None
        if not cfg.data.embedded:
            from runtime.data.prompts import prompt_set
            from runtime.data.settings import PromptsConfig

            record = prompt_set(PromptsConfig.from_config(cfg)).record
        # Rewards and tool calls run in processes of their own, so a slow or crashing one
        # never stalls the engine's loop (the pool starts on first use: arith needs none).
        self.pool = RewardPool(
            cfg.sandbox.reward_workers,
            cfg.workload.reward_timeout_s + 30,
            cfg.sandbox.concurrency,
        )
        codec = codec_for(model_path, cfg.model.path)
        self.env = AgentEnv(AgentEnvConfig.from_config(cfg), codec, self.engine, record, self.pool)
        # an eval round's episodes when rank 0 pins this driver to one (runtime/control/evals.py)
        self.evals = EvalPlayer(
            AgentEnvConfig.from_config(cfg),
            lambda name: eval_records(cfg, name),
            cfg.eval.temperature,
            self.engine,
            codec,
            self.pool,
            self.agent,
            self._call,
        )

    def _call(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _await(self, coro: Coroutine[Any, Any, T], seconds: float, what: str) -> T:
        """Run ``coro`` on the engine's loop and wait at most ``seconds`` for it; a timeout
        says which engine call did not finish (a bare TimeoutError says nothing)."""
        fut = self._call(coro)
        try:
            return fut.result(seconds)
        except FutureTimeout:
            if fut.done():  # the call's own TimeoutError (the same class on Python 3.11)
                raise
            fut.cancel()
            raise TimeoutError(f"vLLM {what} did not finish within {seconds:g} s") from None

    # --- the engine behind the pull loop (runtime/rank/rollout_loop.py) ------------------

    def start(self, req: Request, now: float) -> Future:
        return self._call(self._run(req))

    def reap(self, now: float) -> None:
        if self._updating is not None and self._updating.done():
            done, self._updating = self._updating, None
            done.result()  # a failed weight update fails the rank, with its reason
        self.evals.reap(self.loop.queue)
        running = self.loop.running
        for sid in [s for s, f in running.items() if f.done()]:
            fut = running.pop(sid)
            exc = None if fut.cancelled() else fut.exception()
            if exc is not None:
                log.error("generation of sample %d failed: %r", sid, exc)
                self.loop.failed(sid, repr(exc))

    def free_slots(self) -> int:
        # Only episodes generating now hold a slot: one waiting on the sandbox does not.
        # An eval round's episodes hold theirs (a pinned driver runs little else).
        return self.slots - (len(self.loop.running) - self.env.in_tools) - len(self.evals.running)

    def play_evals(self, msg: p.EvalWork) -> None:
        """An eval round's episodes: the weight update in flight (if any) lands first, so
        the engine serves the round's version; from here its syncs are held."""
        self._settle()
        self.evals.start(self.rank, msg.round_id, msg.policy_version, msg.tasks)

    def episodes_in_tools(self) -> int:
        """Episodes waiting on a tool call or a reward: rank 0 counts no slot for them."""
        return self.env.in_tools

    def abort(self, running: dict[int, Future]) -> None:
        """Leaving the rollout pool: stop what is in flight (rank 0 requeues it)."""
        turns = range(self.cfg.workload.max_turns)
        ids = [f"s{sid}" for sid in running]
        ids += [f"s{sid}-t{t}" for sid in running for t in turns]
        for fut in running.values():
            fut.cancel()  # an agent between turns must not start the next one
        if ids:
            what = f"abort of {len(ids)} requests"
            self._await(self.engine.abort(ids), ENGINE_CALL_TIMEOUT_S, what)

    def park(self) -> dict[int, ParkedRollout]:
        """A stop: what runs is cut off where it is (generations aborted, tool calls
        cancelled after a grace period) and handed back as parked rollouts."""
        running = self.loop.drop()
        what = f"parking {len(running)} requests in flight"
        return self._await(self._park(running), ENGINE_CALL_TIMEOUT_S, what)

    async def _park(self, running: dict[int, Future]) -> dict[int, ParkedRollout]:
        env = self.env
        env.parking = True  # no generation starts from here on
        turns = range(self.cfg.workload.max_turns)
        ids = [f"s{sid}" for sid in running] + [f"s{sid}-t{t}" for sid in running for t in turns]
        if ids:
            await self.engine.abort(ids)  # each generation returns what it had, cut off
        waiting = [asyncio.wrap_future(f) for f in running.values()]
        if waiting:  # an episode in a tool call gets a moment, then is cancelled
            await asyncio.wait(waiting, timeout=PARK_GRACE_S)
        for f in running.values():
            f.cancel()
        # the cancellations reach the tasks; they unwind later, and what they had
        # generated is in env.episodes already
        await asyncio.sleep(0)
        out: dict[int, ParkedRollout] = {}
        for sid, f in running.items():
            rid = f"s{sid}"
            finished = f.done() and not f.cancelled() and f.exception() is None and f.result()
            ep = env.episodes.get(rid)
            rollout = ep.parked_rollout() if ep is not None and not finished else None
            if rollout is not None:
                out[sid] = rollout
            env.forget(rid)
        return out

    def observe(self, msg: p.Message, now: float) -> None:
        if isinstance(msg, p.WeightSync):
            self._receive_weights(wait=False, hold=msg.hold)

    # --- RoleSide ----------------------------------------------------------------------

    def activate(self) -> None:
        # a hand-over on leaving (RolloutSide.hand_over) parked everything: generate again
        self.env.parking = False
        start = time.perf_counter()
        self._await(self.engine.wake_up(), ENGINE_CALL_TIMEOUT_S, "wake_up")
        self.last_switch = {"wake_s": time.perf_counter() - start}
        self.active = True

    def deactivate(self) -> None:
        super().deactivate()
        evals = self.evals.cancel()  # rank 0 ends the round incomplete: this rank left
        if evals:
            self._await(self.engine.abort(evals), ENGINE_CALL_TIMEOUT_S, "abort of evals")
        try:
            self._settle()  # no weight update in flight while the engine goes to sleep
        except Exception:  # its weights are replaced on joining again; the sleep goes on
            log.exception("the weight update in flight failed")
        start = time.perf_counter()
        level = self.sleep_level()
        # leaving the rollout pool is leaving the sync group: its NCCL group is stale
        self._await(
            self.engine.leave_transfer_group(self._transfer_timeout_s),
            self._transfer_timeout_s + 5,
            "leaving the NCCL weight group",
        )
        self._await(self.engine.sleep(level), ENGINE_CALL_TIMEOUT_S, f"sleep (level {level})")
        self.last_switch = {
            "sleep_s": time.perf_counter() - start,
            "sleep_level": float(level),
            "slept_on_device": float(self.engine.can_sleep),
        }

    def sleep_level(self) -> int:
        """2 when the weights will be replaced before this engine generates again (a rank
        joining the rollout pool receives the current ones in :meth:`on_layout`, which
        needs the process group), else 1 (kept in host memory). A LoRA engine receives
        the adapter only, never the base again: 1."""
        return 2 if self.sync is not None and not self.engine.serves_adapter else 1

    def engine_stats(self) -> dict[str, float]:
        return self.engine.stats.snapshot()

    def on_layout(self, change: LayoutChange) -> None:
        """New rollout ranks get the leader's current weights (the whole rollout pool
        takes part in that broadcast) and load them before asking for work."""
        if self.rank in change.ranks("rollout") and change.joined("rollout"):
            self._receive_weights(wait=True)
            if self.rank in change.joined("rollout") and self.sync_records:
                r = self.sync_records[-1]
                self.last_switch.update(
                    weights_receive_s=r["receive_s"],
                    weights_load_s=r["load_s"],
                    weights_bytes=r["bytes"],
                )

    def close(self) -> None:
        """Shut the engine down (its processes must not outlive the rank)."""
        try:
            self.pool.close()
            self.engine.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            shutil.rmtree(self.weights_root, ignore_errors=True)

    # --- internals ---------------------------------------------------------------------

    @property
    def sync_records(self) -> collections.deque[dict[str, float]]:
        """One record per weight sync received (bytes, seconds, GB/s)."""
        return self.receiver.records

    def _receive_weights(self, *, wait: bool, hold: bool = False) -> None:
        """Take part in the leader's weight transfer and load it into the engine (requests
        in flight are held and resumed). ``wait``: until the engine has the weights.
        ``hold``: keep the version served (an eval round's): received and dropped."""
        update = self.receiver.receive(self._settle, hold)
        if update is not None:
            self._updating = self._call(self._paused(update))
        if wait:
            self._settle()

    async def _paused(self, update: Coroutine[Any, Any, float]) -> None:
        self.paused_s += await update  # the seconds the engine held requests

    def load_in_place(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Mode colocated_sync: this rank's trainer's weights (host memory) into its own
        engine, as a file in memory then a reload; no process group, nothing in flight."""
        self._settle()
        self.receiver.load_in_place(
            version, weights, lambda coro, what: self._await(coro, ENGINE_CALL_TIMEOUT_S, what)
        )

    def _settle(self) -> None:
        """Until the weight update in flight (if any) is done; its error raised here."""
        if self._updating is not None:
            pending, self._updating = self._updating, None
            bound = ENGINE_CALL_TIMEOUT_S + self._transfer_timeout_s
            try:
                pending.result(bound)
            except FutureTimeout:
                if pending.done():
                    raise
                raise TimeoutError(
                    f"vLLM weight update in flight did not finish within {bound:g} s"
                ) from None

    async def _run(self, req: Request) -> bool:
        """One episode; True once its sample is in the outbox."""
        prompt = req.prompt
        started = time.monotonic()
        rid = f"s{req.sample_id}"
        self.env.resume(rid, req.resume)
        try:
            ep = await self.agent.run(self.env, rid, prompt)
        finally:
            if not self.env.parking:  # a stop reads what it had generated first
                self.env.forget(rid)
        if ep is None:  # aborted: leaving the rollout pool (requeued), or a stop (parked)
            return False
        sample = Sample(
            sample_id=req.sample_id,
            group_id=req.group_id,
            prompt_id=req.prompt_id,
            versions=ep.spans or [(self.engine.version, 0, len(ep.token_ids))],
            prompt_token_ids=list(prompt["prompt_ids"]),
            token_ids=ep.token_ids,
            logprobs=ep.logprobs,
            loss_mask=ep.loss_mask if 0 in ep.loss_mask else None,
            n_valid=ep.n_model_tokens,
            reward=ep.reward,
            info=ep.info or {},
            worker=self.rank,
            started_at=started,
            finished_at=time.monotonic(),
        )
        if self.probe is not None:  # a forward per version: off the engine's loop
            loop = asyncio.get_running_loop()
            sample.routes = await loop.run_in_executor(None, self.probe.routes, sample)
        self.loop.finished(sample)
        return True

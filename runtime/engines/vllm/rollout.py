"""The rollout engine: vLLM's ``AsyncLLM`` behind ReFlow's rollout side.

:class:`VLLMEngine` is the async adapter (one event loop): generation with the sampled
tokens' log-probs, weight updates for partial rollout (pause with ``mode="keep"`` and a
cleared KV cache -> reload in place -> version bump -> resume, so held requests finish
under the new weights and vLLM records the per-span versions), abort, shutdown.

:class:`VLLMRolloutSide` runs that adapter on a background thread for the synchronous
hybrid worker, behind the rollout pull loop (runtime/rank/rollout_loop.py): work from rank 0
goes in, finished samples (scored by the workload's reward) come out through the loop's
outbox, emptied on the worker's thread, which owns the socket.

Log-probs: vLLM's default ``raw_logprobs`` are of the distribution before temperature. The
trainer computes log pi(y) at temperature 1 too, so the importance ratio compares like
with like when ``algorithm.temperature`` is 1 (the demo's setting). With another
temperature we request ``processed_logprobs`` (logits / T), and the trainer divides its
logits by the same T.

On CPU there is no sleep mode (``enable_sleep_mode`` fails at engine creation): an
inactive rollout side keeps its engine warm with a small KV cache
(``engine.kv_cache_memory_bytes``), which is the documented CPU equivalent. On CUDA,
``deactivate`` calls ``sleep(1)`` and ``activate`` ``wake_up()``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from runtime.config.layout import LayoutChange
from runtime.config.schema import Config
from runtime.data.sample import Request, Sample
from runtime.engines.vllm.stat_logger import EngineStats, vllm_stat_logger
from runtime.rank.collective import Collective
from runtime.rank.rollout_loop import RolloutSide
from runtime.store.run_dir import RunPaths, fresh_private_dir
from runtime.transport import protocol as p
from runtime.workloads.agents import registry
from runtime.workloads.agents.base import AgentEnv, Generation
from runtime.workloads.agents.pool import RewardPool

log = logging.getLogger(__name__)


def _prepare_env() -> None:
    # vLLM compiles a helper on the first log-probs batch (2-20 s stall on CPU); the eager
    # path gives the same values. No hub access here.
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


class VLLMEngine:
    def __init__(self, model_path: str, cfg: Config, *, seed: int = 0) -> None:
        _prepare_env()
        from vllm.engine.arg_utils import AsyncEngineArgs

        from runtime.workloads.agents.registry import NEEDS_STOP_STRINGS

        e = cfg.engine
        self.temperature = cfg.algorithm.temperature
        # Token ids in, token ids out; only stop strings (tool calls) need the tokenizer.
        self.detokenize = cfg.workload.kind in NEEDS_STOP_STRINGS
        kwargs: dict[str, Any] = {
            "model": model_path,
            "dtype": cfg.model.dtype,
            "enforce_eager": e.enforce_eager,
            "skip_tokenizer_init": not self.detokenize,
            "max_model_len": cfg.model.max_seq_len,
            "max_num_seqs": e.max_num_seqs,
            "seed": seed,
            "worker_extension_cls": "runtime.engines.vllm.worker_ext.ReflowWorkerExtension",
            "tensor_parallel_size": cfg.resources.rollout_gpus_per_replica,
        }
        if e.kv_cache_memory_bytes:
            kwargs["kv_cache_memory_bytes"] = e.kv_cache_memory_bytes
        if self.temperature != 1.0:
            kwargs["logprobs_mode"] = "processed_logprobs"
        # Sleep mode exists on CUDA only (engine creation fails with it on the CPU build).
        self.can_sleep = cfg.resources.device == "cuda"
        if self.can_sleep:
            kwargs["enable_sleep_mode"] = True
        self._args = AsyncEngineArgs(**kwargs)
        self.stats = EngineStats()  # filled by vLLM's stat logging, once per engine step
        self.engine: Any = None
        self.version = 0

    async def start(self, version: int = 0) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine = AsyncLLM.from_engine_args(
            self._args, stat_loggers=[vllm_stat_logger(self.stats)]
        )
        await self.engine.update_weight_version(str(version))
        self.version = version

    async def generate(
        self, request_id: str, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False
    ) -> tuple[list[int], list[float], list[tuple[int, int, int]], str]:
        """Token ids, their log-probs, version spans ``(version, first, end)``, finish reason."""
        g = await self.generate_turn(request_id, prompt_ids, max_tokens, None, ignore_eos)
        return g.tokens, g.logprobs, g.spans, g.finish

    async def generate_turn(
        self,
        request_id: str,
        prompt_ids: list[int],
        max_tokens: int,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
    ) -> Generation:
        """One generation (the agents' engine interface); ``stop`` strings end it, kept in
        the output."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=bool(stop) and self.detokenize,
            stop=stop if self.detokenize else None,
            include_stop_str_in_output=True,
            ignore_eos=ignore_eos,
        )
        final = None
        async for out in self.engine.generate(
            TokensPrompt(prompt_token_ids=prompt_ids), params, request_id=request_id
        ):
            final = out
        assert final is not None
        c = final.outputs[0]
        tokens = list(c.token_ids)
        logprobs = [d[t].logprob for d, t in zip(c.logprobs or [], tokens, strict=True)]
        spans = [(int(w.version), w.start, w.end) for w in (c.weight_versions or [])]
        if not spans or spans[-1][2] != len(tokens):
            spans = [(self.version, 0, len(tokens))]
        return Generation(tokens, logprobs, spans, c.finish_reason or "stop", c.stop_reason)

    async def update_weights(self, weights_dir: str, version: int) -> float:
        """Partial rollout: requests in flight are held, then resumed under new weights."""
        start = time.perf_counter()
        await self.engine.pause_generation(mode="keep", clear_cache=True)
        try:
            await self.engine.collective_rpc("reflow_reload_weights", args=(weights_dir,))
            await self.engine.update_weight_version(str(version))
            self.version = version
        finally:
            await self.engine.resume_generation()
        return time.perf_counter() - start

    async def abort(self, request_ids: list[str]) -> None:
        await self.engine.abort(request_ids)

    async def sleep(self) -> None:
        """Free the KV cache and offload the weights (level 1); CUDA only."""
        if self.can_sleep:
            await self.engine.sleep(level=1)

    async def wake_up(self) -> None:
        if self.can_sleep:
            await self.engine.wake_up()

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            # Collect it now: AsyncLLM.__del__ at interpreter exit prints a spurious
            # TypeError once the modules it needs are torn down.
            self.engine = None
            gc.collect()


class VLLMRolloutSide(RolloutSide[Future]):
    name = "rollout"

    def __init__(
        self, cfg: Config, rank: int, paths: RunPaths, collective: Collective | None = None
    ) -> None:
        from runtime.embedded.resolve import resolve_model_path

        super().__init__(cfg, rank)
        self.cfg: Config = cfg
        self.paths = paths
        self.collective = collective
        # Received weights are handed to the engine as a file in memory (/dev/shm), the
        # fastest path measured on the CPU build; one folder per version.
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() else paths.root
        # The name is predictable (one per run and rank): made fresh, 0700, by us, or the
        # rank fails; another user's folder or link there is never written into.
        self.weights_root = fresh_private_dir(base / f"reflow-{paths.name}-rank{rank}")
        self.agent = registry.agent(cfg.workload.kind)
        self.slots = cfg.scheduler.max_concurrency
        self._updating: Future | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="vllm-loop"
        )
        self._thread.start()
        model_path = resolve_model_path(cfg)
        self.engine = VLLMEngine(model_path, cfg, seed=cfg.train.seed + rank)
        self._call(self.engine.start(0)).result()
        from runtime.data.codec import codec_for

        record = None
        if not cfg.data.train.startswith("embedded:"):
            from runtime.data.prompts import prompt_set

            record = prompt_set(cfg).record
        # Rewards and tool calls run in processes of their own, so a slow or crashing one
        # never stalls the engine's loop (the pool starts on first use: arith needs none).
        self.pool = RewardPool(cfg.sandbox.reward_workers, cfg.workload.reward_timeout_s + 30)
        self.env = AgentEnv(
            cfg, codec_for(model_path, cfg.model.path), self.engine, record, self.pool
        )

    def _call(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    # --- the engine behind the pull loop (runtime/rank/rollout_loop.py) ------------------

    def start(self, req: Request, now: float) -> Future:
        return self._call(self._run(req))

    def reap(self, now: float) -> None:
        running = self.loop.running
        for sid in [s for s, f in running.items() if f.done()]:
            fut = running.pop(sid)
            exc = None if fut.cancelled() else fut.exception()
            if exc is not None:
                log.error("generation of sample %d failed: %r", sid, exc)
                self.loop.failed(sid, repr(exc))

    def free_slots(self) -> int:
        # Only episodes generating now hold a slot: one waiting on the sandbox does not.
        return self.slots - (len(self.loop.running) - self.env.in_tools)

    def abort(self, running: dict[int, Future]) -> None:
        """Leaving the rollout pool: stop what is in flight (rank 0 requeues it)."""
        turns = range(self.cfg.workload.max_turns)
        ids = [f"s{sid}" for sid in running]
        ids += [f"s{sid}-t{t}" for sid in running for t in turns]
        for fut in running.values():
            fut.cancel()  # an agent between turns must not start the next one
        if ids:
            self._call(self.engine.abort(ids)).result()

    def observe(self, msg: p.Message, now: float) -> None:
        if isinstance(msg, p.WeightSync):
            self._receive_weights(wait=False)

    # --- RoleSide ----------------------------------------------------------------------

    def activate(self) -> None:
        self._call(self.engine.wake_up()).result()
        self.active = True

    def deactivate(self) -> None:
        super().deactivate()
        self._call(self.engine.sleep()).result()

    def engine_stats(self) -> dict[str, float]:
        return self.engine.stats.snapshot()

    def on_layout(self, change: LayoutChange) -> None:
        """New rollout ranks get the leader's current weights (the whole rollout pool
        takes part in that broadcast) and load them before asking for work."""
        if self.rank in change.ranks("rollout") and change.joined("rollout"):
            self._receive_weights(wait=True)

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

    def _receive_weights(self, *, wait: bool) -> None:
        """Take part in the leader's weight broadcast, then load the weights into the engine
        (requests in flight are held and resumed). ``wait``: until the engine has them."""
        if self.collective is None:
            return
        from safetensors.torch import save_file

        start = time.perf_counter()
        version, weights = self.collective.receive_weights()
        received_s = time.perf_counter() - start
        if self._updating is not None:
            self._updating.result()  # one reload at a time, in version order
        if version <= self.engine.version:
            return
        folder = self.weights_root / f"v{version}"
        folder.mkdir(mode=0o700, exist_ok=True)  # inside our private root
        save_file(weights, str(folder / "model.safetensors"))
        log.debug("weights v%d received in %.3f s", version, received_s)
        self._updating = self._call(self._update(str(folder), version))
        if wait:
            self._updating.result()

    async def _update(self, path: str, version: int) -> None:
        took = await self.engine.update_weights(path, version)
        self.paused_s += took  # paused, reloaded, resumed: requests held meanwhile
        log.debug("weights v%d loaded in %.3f s", version, took)
        for old in self.weights_root.glob("v*"):  # the engine holds its own copy now
            if old.name != f"v{version}":
                shutil.rmtree(old, ignore_errors=True)

    async def _run(self, req: Request) -> None:
        prompt = req.prompt
        started = time.monotonic()
        ep = await self.agent.run(self.env, f"s{req.sample_id}", prompt)
        if ep is None:  # aborted on leaving the rollout pool; rank 0 requeued it
            return
        self.loop.finished(
            Sample(
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
        )

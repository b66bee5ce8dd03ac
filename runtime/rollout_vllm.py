"""The rollout engine: vLLM's ``AsyncLLM`` behind ReFlow's rollout side.

:class:`VLLMEngine` is the async adapter (one event loop): generation with the sampled
tokens' log-probs, weight updates for partial rollout (pause with ``mode="keep"`` and a
cleared KV cache -> reload in place -> version bump -> resume, so held requests finish
under the new weights and vLLM records the per-span versions), abort, shutdown.

:class:`VLLMRolloutSide` runs that adapter on a background thread for the synchronous
hybrid worker: work from rank 0 goes in, finished trajectories (scored by the workload's
reward) come out through a queue drained on the worker's thread, which owns the socket.

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
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from runtime import protocol as p
from runtime import wire
from runtime.config import Config
from runtime.roles import Send
from runtime.run_dir import RunPaths, read_json
from runtime.sample import Trajectory
from runtime.tasks import registry

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

        e = cfg.engine
        self.temperature = cfg.algorithm.temperature
        kwargs: dict[str, Any] = {
            "model": model_path,
            "dtype": cfg.model.dtype,
            "enforce_eager": e.enforce_eager,
            "skip_tokenizer_init": True,
            "max_model_len": cfg.model.max_seq_len,
            "max_num_seqs": e.max_num_seqs,
            "seed": seed,
            "worker_extension_cls": "runtime.vllm_ext.ReflowWorkerExtension",
            "tensor_parallel_size": cfg.resources.rollout_gpus_per_replica,
        }
        if e.kv_cache_memory_bytes:
            kwargs["kv_cache_memory_bytes"] = e.kv_cache_memory_bytes
        if self.temperature != 1.0:
            kwargs["logprobs_mode"] = "processed_logprobs"
        self._args = AsyncEngineArgs(**kwargs)
        self.engine: Any = None
        self.version = 0

    async def start(self, version: int = 0) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine = AsyncLLM.from_engine_args(self._args)
        await self.engine.update_weight_version(str(version))
        self.version = version

    async def generate(
        self, request_id: str, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False
    ) -> tuple[list[int], list[float], list[tuple[int, int, int]], str]:
        """Token ids, their log-probs, version spans ``(version, first, end)``, finish reason."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=False,
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
        return tokens, logprobs, spans, c.finish_reason or "stop"

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

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            # Collect it now: AsyncLLM.__del__ at interpreter exit prints a spurious
            # TypeError once the modules it needs are torn down.
            self.engine = None
            gc.collect()


def latest_weights(paths: RunPaths) -> tuple[int, str] | None:
    """The newest published policy weights (written by the trainer), if any."""
    try:
        info = read_json(paths.root / "weights" / "latest.json")
    except (OSError, ValueError):
        return None
    return int(info["version"]), str(paths.root / "weights" / info["dir"])


class VLLMRolloutSide:
    name = "rollout"

    def __init__(self, cfg: Config, rank: int, paths: RunPaths) -> None:
        from runtime.model.resolve import resolve_model_path

        self.cfg = cfg
        self.rank = rank
        self.paths = paths
        self.task = registry.task(cfg.workload.kind)
        self.slots = cfg.scheduler.max_concurrency
        self.active = False
        self._send: Send = lambda m: None
        self._outbox: queue.SimpleQueue[Trajectory] = queue.SimpleQueue()
        self._running: dict[int, Future] = {}
        self._asked = False
        self._retry_at = 0.0
        self._target_version = 0
        self._updating: Future | None = None
        self.sync_times: list[float] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="vllm-loop"
        )
        self._thread.start()
        self.engine = VLLMEngine(resolve_model_path(cfg), cfg, seed=cfg.train.seed + rank)
        self._call(self.engine.start(0)).result()

    def _call(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    # --- RoleSide ----------------------------------------------------------------------

    def attach(self, send: Send, rank: int) -> None:
        self._send, self.rank = send, rank

    def activate(self) -> None:
        self.active = True
        # A rank joining the rollout pool loads the latest published weights before it asks
        # for work (it heard no policy versions while it was a trainer).
        latest = latest_weights(self.paths)
        if latest is not None and latest[0] > self.engine.version:
            self._target_version = max(self._target_version, latest[0])
            self._call(self._update(latest[1], latest[0])).result()

    def deactivate(self) -> None:
        # Leaving the rollout pool: abort what is in flight (rank 0 requeues it).
        self.active = False
        ids = [f"s{sid}" for sid in self._running]
        if ids:
            self._call(self.engine.abort(ids)).result()
        self._running.clear()
        self._asked = False

    @property
    def state(self) -> str:
        return "busy" if self._running else "idle"

    def on_message(self, msg: p.Message) -> None:
        if isinstance(msg, (p.Work, p.HeartbeatAck)):
            self._target_version = max(self._target_version, msg.policy_version)
        if isinstance(msg, p.Work):
            self._asked = False
            if not msg.requests:
                self._retry_at = time.monotonic() + 0.05
            for req in msg.requests:
                self._running[req["sample_id"]] = self._call(self._run(req))

    def step(self) -> None:
        while not self._outbox.empty():
            self._send(wire.sample_done(self._outbox.get(), self.rank))
        for sid in [s for s, f in self._running.items() if f.done()]:
            fut = self._running.pop(sid)
            exc = None if fut.cancelled() else fut.exception()
            if exc is not None:
                # Never lose a sample silently: rank 0 puts it back in the queue.
                log.error("generation of sample %d failed: %r", sid, exc)
                self._send(p.SampleFailed(rank=self.rank, sample_id=sid, reason=repr(exc)))
        if not self.active:
            return
        self._maybe_update_weights()
        free = self.slots - len(self._running)
        if free > 0 and not self._asked and time.monotonic() >= self._retry_at:
            self._asked = bool(self._send(p.WorkRequest(rank=self.rank, slots=free)))

    def close(self) -> None:
        """Shut the engine down (its processes must not outlive the rank)."""
        try:
            self.engine.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    # --- internals ---------------------------------------------------------------------

    def _maybe_update_weights(self) -> None:
        if self._updating is not None and not self._updating.done():
            return
        if self._target_version <= self.engine.version:
            return
        latest = latest_weights(self.paths)
        if latest is None or latest[0] <= self.engine.version:
            return
        version, path = latest
        self._updating = self._call(self._update(path, version))

    async def _update(self, path: str, version: int) -> None:
        took = await self.engine.update_weights(path, version)
        self.sync_times.append(took)
        log.info("weights v%d loaded in %.3f s", version, took)

    async def _run(self, req: dict[str, Any]) -> None:
        prompt = req["prompt"]
        started = time.monotonic()
        tokens, logprobs, spans, finish = await self.engine.generate(
            f"s{req['sample_id']}", prompt["prompt_ids"], self.cfg.workload.max_response_tokens
        )
        if finish == "abort":  # aborted on leaving the rollout pool; rank 0 requeued it
            return
        score = self.task.reward(tokens, prompt)
        self._outbox.put(
            Trajectory(
                sample_id=req["sample_id"],
                group_id=req["group_id"],
                prompt_id=req["prompt_id"],
                versions=spans,
                token_ids=tokens,
                logprobs=logprobs,
                reward=score,
                n_valid=len(tokens),
                worker=self.rank,
                started_at=started,
                finished_at=time.monotonic(),
                extra={"prompt_ids": list(prompt["prompt_ids"])},
            )
        )

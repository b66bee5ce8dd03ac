"""vLLM's ``AsyncLLM`` as ReFlow's rollout engine: one async adapter on one event loop.

:class:`VLLMEngine` is the async adapter (one event loop): generation with the sampled
tokens' log-probs, weight updates for partial rollout (pause with ``mode="keep"`` and a
cleared KV cache -> reload in place -> version bump -> resume, so held requests finish
under the new weights and vLLM records the per-span versions), abort, shutdown.

Log-probs: vLLM's default ``raw_logprobs`` are of the distribution before temperature. The
trainer computes log pi(y) at temperature 1 too, so the importance ratio compares like
with like when ``algorithm.temperature`` is 1 (the demo's setting). With another
temperature we request ``processed_logprobs`` (logits / T), and the trainer divides its
logits by the same T.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime.config.lora_config import VLLM_LORA_RANKS, VLLM_LORA_SLOTS
from runtime.engines.vllm.devices import replica_devices, visible_devices
from runtime.engines.vllm.settings import VLLMEngineConfig
from runtime.engines.vllm.stat_logger import EngineStats, vllm_stat_logger
from runtime.weights import lora_format
from runtime.weights import nccl as weight_transfer
from runtime.weights.wire import WeightsHeader
from runtime.workloads.agents.base import Generation


def _prepare_env() -> None:
    # vLLM compiles a helper on the first log-probs batch (2-20 s stall on CPU); the eager
    # path gives the same values. No hub access here.
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


# The one adapter slot a LoRA run's engine serves, replaced in place at each sync.
ADAPTER_NAME, ADAPTER_ID = "policy", 1


def lora_engine_args(rank: int) -> dict[str, Any]:
    """vLLM's LoRA settings for adapters of ``rank``."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"model.lora.rank {rank}: vLLM serves ranks up to {VLLM_LORA_RANKS[-1]}")
    return {
        "enable_lora": True,
        "max_lora_rank": fits[0],
        # Two slots for one adapter: the CPU build's LoRA ops index the stacked weights by
        # slot and read a request without an adapter (-1) as the last slot; an empty
        # second slot keeps such a request on the base (measured: 4.18 nats off with one).
        "max_loras": VLLM_LORA_SLOTS,
        "max_cpu_loras": VLLM_LORA_SLOTS,
    }


class VLLMEngine:
    def __init__(
        self, model_path: str, config: VLLMEngineConfig, *, seed: int = 0, rank: int = 0
    ) -> None:
        _prepare_env()
        from vllm.engine.arg_utils import AsyncEngineArgs

        e = config.engine
        self.model_path = model_path
        lora = config.model.lora
        # A LoRA run whose syncs send the adapter: the engine serves the frozen base with
        # the newest adapter loaded in place (``model.lora.sync: merged`` sends weights).
        self.serves_adapter = lora.syncs_adapter
        self._lora = lora
        self._zero_adapter_dir: Path | None = None
        self.temperature = config.temperature
        # Token ids in, token ids out; only stop strings (tool calls) need the tokenizer.
        self.detokenize = config.detokenize
        kwargs: dict[str, Any] = {
            "model": model_path,
            "dtype": config.model.dtype,
            "enforce_eager": e.enforce_eager,
            "skip_tokenizer_init": not self.detokenize,
            "max_model_len": config.model.max_seq_len,
            "max_num_seqs": e.max_num_seqs,
            "seed": seed,
            "worker_extension_cls": "runtime.engines.vllm.worker_ext.ReflowWorkerExtension",
            "tensor_parallel_size": config.resources.rollout_gpus_per_replica,
        }
        if e.kv_cache_memory_bytes:
            kwargs["kv_cache_memory_bytes"] = e.kv_cache_memory_bytes
        if e.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = e.gpu_memory_utilization
        if self.temperature != 1.0:
            kwargs["logprobs_mode"] = "processed_logprobs"
        if self.serves_adapter:
            kwargs.update(lora_engine_args(lora.rank))
        # Sleep mode exists on CUDA only (engine creation fails with it on the CPU build),
        # and so does the NCCL weight transfer.
        self.can_sleep = config.resources.device == "cuda"
        if self.can_sleep:
            kwargs["enable_sleep_mode"] = True
            kwargs["weight_transfer_config"] = {"backend": "nccl"}
        self._args = AsyncEngineArgs(**kwargs)
        # on CUDA the engine's workers take the GPUs of this replica's ranks
        self.devices = (
            replica_devices(
                rank,
                config.resources.rollout_gpus_per_replica,
                config.resources.gpus_per_node,
                os.environ,
            )
            if config.resources.device == "cuda"
            else None
        )
        self.stats = EngineStats()  # filled by vLLM's stat logging, once per engine step
        self.engine: Any = None
        self.version = 0
        self.sleep_level = 0  # 0 awake; 1 or 2 as slept (on CPU: the state only)
        self.weights_valid = True  # False after a level-2 sleep dropped them
        self.transfer_epoch: int | None = None  # layout epoch of the NCCL group joined
        # the one adapter every request is served with (a LoRA run, ``serves_adapter``)
        self.lora_request: Any = None

    async def start(self, version: int = 0) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        with visible_devices(self.devices):  # the engine's processes inherit it
            self.engine = AsyncLLM.from_engine_args(
                self._args, stat_loggers=[vllm_stat_logger(self.stats)]
            )
        if self.serves_adapter:
            # Every request carries the adapter from the start (a zero one: the base
            # exactly), so a swap reaches each request in flight; a request without one
            # batched with LoRA ones would also meet a bug of the CPU build's LoRA ops.
            zero = self._zero_adapter_dir = Path(tempfile.mkdtemp(prefix="reflow-lora0-"))
            tensors = lora_format.zero_adapter(self.model_path, self._lora)
            lora_format.write_adapter(zero, tensors, self._lora, self.model_path)
            await self._load_adapter(str(zero))
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
        temperature: float | None = None,
    ) -> Generation:
        """One generation (the agents' engine interface); ``stop`` strings end it, kept in
        the output. ``temperature``: this request's (an eval's: 0 is greedy), else the
        run's ``algorithm.temperature``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature if temperature is None else temperature,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=bool(stop) and self.detokenize,
            stop=stop if self.detokenize else None,
            include_stop_str_in_output=True,
            ignore_eos=ignore_eos,
        )
        final = None
        async for out in self.engine.generate(
            TokensPrompt(prompt_token_ids=prompt_ids),
            params,
            request_id=request_id,
            lora_request=self.lora_request,
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
        # ``clear_cache``: the held requests' prefixes are computed again under the new
        # weights (the KV cache of the old ones would be stale; with an adapter its hashes
        # would also name an old folder)
        await self.engine.pause_generation(mode="keep", clear_cache=True)
        try:
            if self.serves_adapter:
                await self._load_adapter(weights_dir)
            else:
                await self.engine.collective_rpc("reflow_reload_weights", args=(weights_dir,))
            await self.engine.update_weight_version(str(version))
            self.version, self.weights_valid = version, True
        finally:
            await self.engine.resume_generation()
        return time.perf_counter() - start

    async def _load_adapter(self, folder: str) -> None:
        """The adapter of ``folder`` into the engine's one LoRA slot, in place: requests in
        flight hold a request for that slot's id and go on with the new weights from their
        next step (vLLM's ``load_inplace``; its own checks refuse a malformed adapter with
        an error instead of killing the engine, as an unchecked one in ``generate`` does)."""
        from vllm.lora.request import LoRARequest

        loaded = await self.engine.add_lora(
            LoRARequest(ADAPTER_NAME, ADAPTER_ID, folder, load_inplace=True)
        )
        if not loaded:
            raise RuntimeError(f"vLLM did not load the adapter of {folder}")
        # what new requests carry (not ``load_inplace``: that would reload every step)
        self.lora_request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, folder)

    async def update_weights_nccl(
        self, header: WeightsHeader, timeout_s: float
    ) -> tuple[float, float]:
        """Partial rollout over NCCL: pause keep -> every bucket received and loaded ->
        version -> resume. Returns (seconds paused, of which finishing the load)."""
        start = time.perf_counter()
        await self.engine.pause_generation(mode="keep", clear_cache=True)
        try:
            finish_s = await weight_transfer.receive_and_load(self.engine, header, timeout_s)
            await self.engine.update_weight_version(str(header.version))
            self.version, self.weights_valid = header.version, True
        finally:
            await self.engine.resume_generation()
        return time.perf_counter() - start, finish_s

    async def join_transfer_group(
        self, header: WeightsHeader, rank: int, epoch: int, timeout_s: float
    ) -> None:
        """This engine's workers into the NCCL group a header announces (once per layout
        epoch; an older group is released first)."""
        info = weight_transfer.worker_init_info(header, rank)
        await self.leave_transfer_group(timeout_s)
        await weight_transfer.join_group(self.engine, info, timeout_s)
        self.transfer_epoch = epoch

    async def drain_transfer(self, header: WeightsHeader, timeout_s: float) -> None:
        """Take part in an NCCL transfer of a version this engine has: received, dropped,
        generation not paused."""
        await weight_transfer.drain(self.engine, header, timeout_s)

    async def leave_transfer_group(self, timeout_s: float) -> None:
        if self.transfer_epoch is not None:
            self.transfer_epoch = None
            await weight_transfer.leave_group(self.engine, timeout_s)

    async def abort(self, request_ids: list[str]) -> None:
        await self.engine.abort(request_ids)

    async def sleep(self, level: int) -> None:
        """Free the KV cache; level 1 offloads the weights to host memory, level 2 drops
        them. On CPU (no sleep mode) only the state moves."""
        if level not in (1, 2):
            raise ValueError(f"sleep level {level}: vLLM sleeps at level 1 or 2")
        if self.sleep_level:
            return  # asleep already
        if self.can_sleep:
            await self.engine.sleep(level=level)
            if level == 2:
                self.weights_valid = False  # garbage after wake-up until a reload
        self.sleep_level = level

    async def wake_up(self) -> None:
        """KV cache (and, after level 2, weight memory) allocated again."""
        if not self.sleep_level:
            return
        if self.can_sleep:
            await self.engine.wake_up()
        self.sleep_level = 0

    def shutdown(self) -> None:
        if self._zero_adapter_dir is not None:
            shutil.rmtree(self._zero_adapter_dir, ignore_errors=True)
        if self.engine is not None:
            self.engine.shutdown()
            # Collect it now: AsyncLLM.__del__ at interpreter exit prints a spurious
            # TypeError once the modules it needs are torn down.
            self.engine = None
            gc.collect()

"""Methods ReFlow adds to vLLM's worker (``worker_extension_cls``), called by name
through ``collective_rpc``. Runs inside the vLLM worker process."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class ReflowWorkerExtension:
    def reflow_reload_weights(self, weights_path: str) -> bool:
        """Load new weights from an HF folder in place, CPU-safe.

        Plain ``load_weights`` fails on the CPU backend (it repacks linear layers and leaves
        empty parameters); ``reload_weights`` repacks. It does not repack a tied
        ``lm_head``, which would keep the old embedding, so that is redone here, nor a
        mixture of experts' experts on the CPU (:func:`prepack_cpu_experts`).
        """
        self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        model = self.model_runner.get_model()
        prepack_cpu_experts(model)
        lm_head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if lm_head is not None and embed is not None:
            tied = lm_head.weight.data_ptr() == embed.weight.data_ptr()
            if tied and hasattr(lm_head, "quant_method"):
                lm_head.quant_method.process_weights_after_loading(lm_head)
        return True

    def reflow_drain_weights(self, sizes: list[int]) -> int:
        """Take part in the leader's NCCL weight broadcast without loading it: this engine
        has the version already (runtime/weights/nccl.py). ``sizes``: the
        bytes of each bucket. CUDA only."""
        import torch

        engine = getattr(self, "weight_transfer_engine", None)
        group = getattr(engine, "model_update_group", None)
        if group is None:
            raise RuntimeError("no NCCL weight-transfer group: init_weight_transfer_engine first")
        stream = torch.cuda.current_stream()
        for n in sizes:
            scratch = torch.empty(int(n), dtype=torch.uint8, device=self.device)
            group.broadcast(scratch, src=0, stream=stream)
            del scratch  # stream-ordered: the next bucket's buffer waits for this receive
        stream.synchronize()
        return sum(int(n) for n in sizes)


def prepack_cpu_experts(model: torch.nn.Module) -> int:
    """Prepack a mixture of experts' reloaded experts for vLLM's CPU kernel; the layers
    done. vLLM 0.32 prepacks them (``CPUUnquantizedExperts.process_weights_after_loading``)
    when the engine loads the model, but a reload (``_setup_kernel`` with a kernel set up
    already) copies the checkpoint's layout in and skips it: the kernel then reads
    unpacked weights (log-probs off by ~0.05 after a reload of the same weights,
    tests/integration/test_weight_stream.py). A vLLM that prepacks on reload would be
    prepacked twice here, which that test catches."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a build without the CPU kernels
        return 0
    done = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts) and not getattr(
            experts, "_use_zentorch", False
        ):
            experts.process_weights_after_loading(module)
            done += 1
    return done

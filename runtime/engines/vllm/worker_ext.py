"""Methods ReFlow adds to vLLM's worker (``worker_extension_cls``), called by name
through ``collective_rpc``. Runs inside the vLLM worker process."""

from __future__ import annotations


class ReflowWorkerExtension:
    def reflow_reload_weights(self, weights_path: str) -> bool:
        """Load new weights from an HF folder in place, CPU-safe.

        Plain ``load_weights`` fails on the CPU backend (it repacks linear layers and leaves
        empty parameters); ``reload_weights`` repacks. It does not repack a tied
        ``lm_head``, which would keep the old embedding, so that is redone here.
        """
        self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if lm_head is not None and embed is not None:
            tied = lm_head.weight.data_ptr() == embed.weight.data_ptr()
            if tied and hasattr(lm_head, "quant_method"):
                lm_head.quant_method.process_weights_after_loading(lm_head)
        return True

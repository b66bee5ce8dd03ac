"""Where a rollout rank's routes come from on the CPU (routing replay, R3): a Hugging Face
copy of every policy version its engine loads, which routes each finished sample.

vLLM's own routed-experts capture (``enable_return_routed_experts``) needs its model
runner V2, which needs Triton: no CPU build has it (tests/integration/test_moe_vllm.py).
So the probe computes what the served policy routes: each version the engine loads is
loaded here too (the last ``keep``), and a finished sample's input positions are routed by
the version that read them (see :func:`position_versions`), one forward per version its
spans name. The same weights in float32 on the CPU, through transformers' kernels rather
than vLLM's: equal choices but where two experts' scores tie within rounding. A sample
whose spans name a version no longer kept carries no routes (the trainer routes it on its
own and ``routed_rows_share`` says how often).

CPU only (``algorithm.routing_replay`` refuses GPUs): one copy per version is the tiny
models' cost, not a 30B model's.
"""

from __future__ import annotations

import collections
import copy
import threading
from pathlib import Path

import numpy as np
import torch

from runtime.checkpoint_layout import to_fused
from runtime.data.routes import ExpertRoutes, route_positions
from runtime.data.sample import Sample, token_versions
from runtime.engines.torch.route_replay import routes_of


def position_versions(
    n_prompt: int, n_response: int, spans: list[tuple[int, int, int]]
) -> list[int | None]:
    """The policy version that read each input position: the prompt is prefilled by the
    version that sampled the first response token; input position ``j >= n_prompt - 1``
    is read by the forward that sampled response token ``j - n_prompt + 1``."""
    sampled = token_versions(spans, n_response)
    n = route_positions(n_prompt, n_response)
    return [sampled[max(0, j - n_prompt + 1)] for j in range(n)]


class RouteProbe:
    def __init__(self, model_path: str, keep: int) -> None:
        from transformers import AutoModelForCausalLM

        self.model_path = model_path
        self.keep = keep
        self._lock = threading.Lock()
        self.models: collections.OrderedDict[int, torch.nn.Module] = collections.OrderedDict()
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.experts = int(model.config.num_experts)
        self._add(0, model.eval())  # the engine starts on the model's own weights

    def load(self, version: int, folder: str) -> None:
        """The policy version ``version`` the engine just loaded from ``folder`` (a
        ``model.safetensors`` in the hub's layout)."""
        from safetensors.torch import load_file

        # a copy of a kept version's module, its weights then replaced: reading the base
        # checkpoint from disk again at every sync would only be discarded (tied
        # embeddings stay tied through the copy)
        with self._lock:
            template = next(reversed(self.models.values()))
        model = copy.deepcopy(template)
        weights = to_fused(load_file(str(Path(folder) / "model.safetensors")))
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:
            raise RuntimeError(f"{folder}: weights that do not fit {self.model_path}")
        model.tie_weights()
        self._add(version, model.eval())

    def _add(self, version: int, model: torch.nn.Module) -> None:
        with self._lock:
            self.models[version] = model
            while len(self.models) > self.keep:
                self.models.popitem(last=False)

    def routes(self, s: Sample) -> bytes | None:
        """``s``'s routes (runtime/data/routes.py bytes), or None if a version its spans
        name is no longer kept."""
        prompt, response = list(s.prompt_token_ids), list(s.token_ids)
        by_position = position_versions(len(prompt), len(response), list(s.versions))
        with self._lock:
            models = {v: self.models.get(v) for v in set(by_position)}
        if any(v is None or m is None for v, m in models.items()):
            return None
        routed = {v: routes_of(m, prompt, response) for v, m in models.items()}
        ids = np.stack([routed[v][j] for j, v in enumerate(by_position)])
        return ExpertRoutes.from_array(ids, self.experts).to_bytes()

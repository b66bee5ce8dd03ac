"""Generation with the model a process holds (Hugging Face ``generate``): the agents'
:class:`~runtime.workloads.agents.base.Generator` for the trainer leader's held-out eval
(runtime/workloads/eval_sets.py), one sequence at a time.

Not a rollout engine: no batching across episodes, no log-probs (zeros: an eval trains on
nothing), no partial rollout. Stop strings end a turn where its decoded text first holds
one, the string kept, as vLLM does with ``include_stop_str_in_output``.

Sampled as the rollout engines sample: the model folder's ``generation_config.json`` may
set a repetition penalty or top-k, which vLLM's explicit ``SamplingParams`` ignore; so
does this generator (a greedy eval is greedy). It stops where vLLM stops: on the codec's
end of turn and on every end-of-sequence id of the model's generation config.
"""

from __future__ import annotations

from typing import Any

from runtime.data.codec import Codec
from runtime.workloads.agents.base import Generation


class ModelGenerator:
    def __init__(self, model: Any, codec: Codec, temperature: float, version: int) -> None:
        """``temperature`` 0 decodes greedily; ``version`` labels the tokens' span."""
        self.model, self.codec = model, codec
        self.temperature, self.version = temperature, version

    async def generate_turn(
        self,
        request_id: str,
        prompt_ids: list[int],
        max_tokens: int,
        stop: list[str] | None = None,
    ) -> Generation:
        import torch
        from transformers import GenerationConfig

        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt_ids], device=device)
        eos = self.codec.eos_id
        stops = sorted({eos, *end_ids(self.model)})
        kwargs: dict[str, Any] = {
            "attention_mask": torch.ones_like(ids),
            "max_new_tokens": max_tokens,
            "eos_token_id": stops,
            "pad_token_id": eos,
            "do_sample": self.temperature > 0,
        }
        if self.temperature > 0:  # plain sampling at the temperature, as vLLM's defaults
            kwargs.update(temperature=self.temperature, top_k=0, top_p=1.0)
        # generate() fills what a call leaves unset from model.generation_config: the
        # global defaults stand in for the folder's for this call (module doc)
        saved = self.model.generation_config
        self.model.generation_config = GenerationConfig()
        try:
            with torch.no_grad():
                out = self.model.generate(input_ids=ids, **kwargs)
        finally:
            self.model.generation_config = saved
        tokens = out[0, len(prompt_ids) :].tolist()
        finish = "stop" if tokens and tokens[-1] in stops else "length"
        hit = None
        if stop:
            tokens, hit = cut_at_stop(tokens, stop, self.codec)
            finish = "stop" if hit is not None else finish
        spans = [(self.version, 0, len(tokens))] if tokens else []
        return Generation(tokens, [0.0] * len(tokens), spans, finish, hit)


def end_ids(model: Any) -> list[int]:
    """The end-of-sequence ids of the model's generation config (an id or a list)."""
    config = getattr(model, "generation_config", None)  # a model may have none
    ids = getattr(config, "eos_token_id", None)
    if ids is None:
        return []
    return [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]


def cut_at_stop(tokens: list[int], stop: list[str], codec: Codec) -> tuple[list[int], str | None]:
    """``tokens`` up to the first token whose decoded prefix holds a stop string, and that
    string (the tokens unchanged and None when none does)."""
    for n in range(1, len(tokens) + 1):
        text = codec.decode(tokens[:n])
        hit = next((s for s in stop if s in text), None)
        if hit is not None:
            return tokens[:n], hit
    return tokens, None

"""Prompts from dataset files, for the dispatcher at rank 0 and the agents at rollout ranks.

Rank 0 streams ``{"index", "prompt_ids"}`` (the record's position and its rendered first
message) to the dispatcher; the rollout ranks load the same file and look records up by
index, so answers and test cases (APPS tests can be megabytes) never travel through the
control plane. Epochs are shuffled with ``train.seed + epoch``; prompts that leave no room
for a response within ``model.max_seq_len`` are skipped (counted in the log), as verl's
``filter_overlong_prompts`` does.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import Any

from runtime.config.schema import Config
from runtime.data.datasets import (
    REQUIRED_FIELDS,
    DatasetError,
    check_template,
    load_records,
    prompt_text,
)

log = logging.getLogger(__name__)


class PromptSet:
    def __init__(self, cfg: Config, source: str | None = None) -> None:
        d = cfg.data
        self.path = source or d.train
        self.records = load_records(
            self.path, d.format, d.fields, REQUIRED_FIELDS.get(cfg.workload.kind, ())
        )
        self.template = d.prompt_template
        check_template(self.template, self.records[0], self.path)

    def __len__(self) -> int:
        return len(self.records)

    def record(self, index: int) -> dict[str, Any]:
        return self.records[index]

    def text(self, index: int) -> str:
        return prompt_text(self.records[index], self.template)


_LOADED: dict[tuple[int, str], PromptSet] = {}


def prompt_set(cfg: Config, source: str | None = None) -> PromptSet:
    """One loaded copy per process, config and file."""
    key = (id(cfg), source or cfg.data.train)
    if key not in _LOADED:
        _LOADED[key] = PromptSet(cfg, key[1])
    return _LOADED[key]


def file_prompts(cfg: Config) -> Iterator[dict[str, Any]]:
    from runtime.data.codec import codec_for
    from runtime.embedded.resolve import resolve_model_path

    prompts = prompt_set(cfg)
    codec = codec_for(resolve_model_path(cfg), cfg.model.path)
    room = cfg.model.max_seq_len - min(cfg.workload.max_response_tokens, 16)
    epoch, skipped = 0, 0
    while True:
        order = list(range(len(prompts)))
        if cfg.data.shuffle:
            random.Random(cfg.train.seed * 1_000_003 + epoch).shuffle(order)
        served = 0
        for i in order:
            ids = codec.prompt_ids(prompts.text(i))
            if len(ids) > room:
                skipped += 1
                continue
            served += 1
            yield {"index": i, "prompt_ids": ids}
        if served == 0:
            raise DatasetError(
                f"{prompts.path}: every prompt is longer than model.max_seq_len allows"
            )
        if epoch == 0 and skipped:
            log.warning("%s: %d over-long prompts skipped", prompts.path, skipped)
        epoch += 1

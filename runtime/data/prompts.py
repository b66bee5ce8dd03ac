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
from pathlib import Path
from typing import Any

from runtime.config.schema import DataConfig
from runtime.data.datasets import (
    REQUIRED_FIELDS,
    DatasetError,
    check_template,
    load_records,
    prompt_text,
)
from runtime.data.settings import PromptsConfig

log = logging.getLogger(__name__)


class PromptSet:
    """The records of one file, or of a mix's files one after the other (a record's index
    is its place in that order; a mix's records without a ``data_source`` get their
    file's name, as verl's data files carry one)."""

    def __init__(self, config: PromptsConfig, source: str | None = None) -> None:
        d = config.data
        paths = [source] if source is not None else [f.path for f in d.files()]
        self.path = ", ".join(paths)
        self.records: list[dict[str, Any]] = []
        self.offsets: list[int] = []  # each file's first index
        for path in paths:
            records = load_records(path, d.format, d.fields, REQUIRED_FIELDS.get(config.kind, ()))
            check_template(d.prompt_template, records[0], path)
            if len(paths) > 1:
                stem = Path(path).stem
                records = [r if "data_source" in r else {**r, "data_source": stem} for r in records]
            self.offsets.append(len(self.records))
            self.records += records
        self.template = d.prompt_template

    def __len__(self) -> int:
        return len(self.records)

    def record(self, index: int) -> dict[str, Any]:
        return self.records[index]

    def text(self, index: int) -> str:
        return prompt_text(self.records[index], self.template)

    def file_range(self, i: int) -> range:
        """The indices of file ``i``'s records."""
        end = self.offsets[i + 1] if i + 1 < len(self.offsets) else len(self.records)
        return range(self.offsets[i], end)


# (id of the run's data section, workload kind, file) -> (that section, its prompts). The
# section is kept with its prompts: keyed by id alone, a config freed and a new one made at
# the same address got the old one's prompts (a test drew a 60-prompt mix's indices from a
# 7-prompt file). Keyed by the data section, not the PromptsConfig: each edge bundles its
# own PromptsConfig of the same run.
_LOADED: dict[tuple[int, str, str], tuple[DataConfig, PromptSet]] = {}


def prompt_set(config: PromptsConfig, source: str | None = None) -> PromptSet:
    """One loaded copy per process, run and file (``None``: the training files)."""
    key = (id(config.data), config.kind, source or "")
    held = _LOADED.get(key)
    if held is None or held[0] is not config.data:
        held = _LOADED[key] = (config.data, PromptSet(config, source))
    return held[1]


def file_prompts(config: PromptsConfig) -> Iterator[dict[str, Any]]:
    """The training prompts: one file's in shuffled epochs, or a mix's files drawn by
    weight, each file going through its own shuffled epochs (a small file with a large
    weight repeats sooner; none waits for another's epoch to end)."""
    from runtime.data.codec import codec_for
    from runtime.embedded.resolve import resolve_model_path

    prompts = prompt_set(config)
    codec = codec_for(resolve_model_path(config.model_path), config.model_path)
    files = config.data.files()
    streams = [
        _epochs(config, prompts, prompts.file_range(i), codec, seed=config.seed + 7919 * i)
        for i in range(len(files))
    ]
    if len(streams) == 1:
        yield from streams[0]
        return
    pick = random.Random(config.seed * 1_000_003 + 17)
    weights = [f.weight for f in files]
    while True:
        yield next(streams[pick.choices(range(len(streams)), weights)[0]])


def _epochs(
    config: PromptsConfig, prompts: PromptSet, indices: range, codec: Any, seed: int
) -> Iterator[dict[str, Any]]:
    """The prompts of ``indices``, epoch after epoch (shuffled with ``seed + epoch`` when
    ``data.shuffle``), skipping those that leave no room for a response."""
    room = config.max_seq_len - min(config.max_response_tokens, 16)
    epoch, skipped = 0, 0
    while True:
        order = list(indices)
        if config.data.shuffle:
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
        served = 0
        for i in order:
            ids = codec.prompt_ids(prompts.text(i))
            if len(ids) > room:
                skipped += 1
                continue
            served += 1
            yield {"index": i, "prompt_ids": ids}
        where = (
            prompts.path
            if len(indices) == len(prompts)
            else f"{prompts.path} [{indices.start}:{indices.stop}]"
        )
        if served == 0:
            raise DatasetError(f"{where}: every prompt is longer than model.max_seq_len allows")
        if epoch == 0 and skipped:
            log.warning("%s: %d over-long prompts skipped", where, skipped)
        epoch += 1

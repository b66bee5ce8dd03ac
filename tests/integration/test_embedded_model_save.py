"""The embedded model's folder is complete whichever rank writes it.

transformers 5 skips writing weights on a torch.distributed rank other than 0; ranks build
the embedded model after joining their process group, so a rank 1 builder once left a
folder with a tokenizer and no weights in the shared cache."""

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _save_on(rank: int, port: int, out: str) -> None:
    from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        if rank == 1:
            model = build_model(seed=3)
            save_pretrained(model, build_tokenizer(), Path(out))
            torch.save(model.state_dict(), os.path.join(out, "expected.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_non_zero_rank_writes_a_loadable_model(tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "model"
    mp.spawn(_save_on, args=(_free_port(), str(out)), nprocs=2, join=True)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]  # what vLLM picks the model by
    loaded = AutoModelForCausalLM.from_pretrained(out)
    expected = torch.load(out / "expected.pt")
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name

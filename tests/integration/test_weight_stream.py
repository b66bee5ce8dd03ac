"""Weight sync streamed from the trainer (runtime/weights/send.py) over real
gloo process groups on loopback, and into a real vLLM engine (CPU build).

Streaming: the ranks of the leader's replica group gather the model bucket by bucket and
the leader sends each bucket as it is made; the last rank receives. What arrives must be
bit for bit what ``TorchTrainer.gather_weights`` (the whole state on the leader) gives,
in several buckets, while no rank ever held more than one bucket and one gathered tensor.
Under HSDP the second replica group does not take part: it waits in a barrier, so a
gather that reached into it would time out.

Into vLLM: a 2-rank FSDP2 trainer streams its trained weights to a rank running the real
rollout side, which receives them on joining the rollout pool (after a sleep and a wake,
the role-switch path) and generates; its log-probs must be the sharded trainer's own
under teacher forcing.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.config.layout import LayoutChange
from runtime.config.recipe import build_config
from runtime.data.sample import Sample
from runtime.embedded.tiny_qwen3 import (
    BOS,
    build_model,
    build_moe_model,
    build_tokenizer,
    save_pretrained,
)
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from runtime.weights import p2p
from runtime.weights.send import WeightStreamer, streaming_ranks
from runtime.weights.settings import WeightPathConfig
from tests.integration.test_fsdp_trainer import batch, join

pytestmark = pytest.mark.integration

BUCKET = 48 << 10  # bytes: the tiny model (1.6 MB in float32) goes in many buckets


def cfg_for(model_dir: str, world: int, group: int, strategy: str, **more):
    trainers = world - 1
    return build_config(
        {
            "model": {"path": model_dir, "max_seq_len": 512},
            "workload": {"max_response_tokens": 128},
            "train": {"lr": 1e-2, "steps": 10, "strategy": strategy},
            "engine": {"weight_bucket_mb": BUCKET / 2**20, "kv_cache_memory_bytes": 64 << 20},
            "algorithm": {"temperature": 1.0},
            "resources": {
                "gpus_per_node": world,
                "trainer_gpus_per_replica": group,
                "initial_ratio": f"1:{trainers}",
            },
            **more,
        }
    )


def roles_of(world: int) -> tuple[str, ...]:
    return ("trainer",) * (world - 1) + ("rollout",)


def stream_script(rank: int, world: int, group: int, strategy: str, model_dir: str, out: str):
    c = join(rank, world, out, group)
    c.regroup(0, roles_of(world))
    cfg = cfg_for(model_dir, world, group, strategy)
    result: dict = {}
    if rank < world - 1:
        trainer = TorchTrainer(TorchTrainerConfig.from_config(cfg), model_dir, rank, c.mesh)
        trainer.train_step(batch(), c.data_parallel, c.trainer_ranks.index(rank), world - 1)
        expected = trainer.gather_weights()  # every trainer rank, the whole state on 0
        streamer = WeightStreamer(WeightPathConfig.from_config(cfg), c.sync, c.mesh)
        result["streams"] = streamer.takes_part(trainer.sharded)
        result["streaming_ranks"] = streaming_ranks(c.mesh, trainer.sharded)
        if result["streams"]:
            result["record"] = streamer.stream(trainer.model, trainer.version).as_dict()
        if rank == 0:
            result["expected"] = expected
    else:
        header = p2p.receive_weights_header(c.sync)
        result["header"] = header.to_json()
        result["received"] = p2p.receive_all(c.sync, header)
    dist.barrier()  # the ranks that do not stream wait here meanwhile
    torch.save(result, f"{out}/rank{rank}.pt")
    c.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    return str(save_pretrained(build_model(seed=5), build_tokenizer(), path))


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    """A tiny mixture of experts: the trainer holds each block's experts fused, the sync
    sends them one per expert (runtime/checkpoint_layout.py)."""
    path = tmp_path_factory.mktemp("tiny-moe")
    return str(save_pretrained(build_moe_model(seed=5), build_tokenizer(), path))


@pytest.mark.parametrize(
    ("world", "group", "strategy", "streamers", "model"),
    [
        (3, 2, "fsdp2", [0, 1], "model_dir"),
        # HSDP: replica groups {0, 1} and {2, 3}; five processes on two cores take a
        # minute or more, so in `make test-slow` (CI's budget is nearly spent)
        pytest.param(5, 2, "fsdp2", [0, 1], "model_dir", marks=pytest.mark.slow),
        (3, 2, "fsdp2", [0, 1], "moe_dir"),
    ],
    # the replicated walk (the leader alone, plain tensors, tied and untied heads) is in
    # tests/unit/test_weight_plan.py; its buckets take the same gloo path as these
    ids=["fsdp2-2-ranks", "hsdp-2x2-only-the-leaders-group", "moe-fsdp2-2-ranks"],
)
def test_streamed_weights_are_the_gathered_ones_a_bucket_at_a_time(
    world, group, strategy, streamers, model, tmp_path, request
):
    mp.start_processes(
        stream_script,
        args=(world, group, strategy, request.getfixturevalue(model), str(tmp_path)),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    r = [torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in range(world)]
    trainers = r[:-1]
    assert [i for i, x in enumerate(trainers) if x["streams"]] == streamers
    assert trainers[0]["streaming_ranks"] == streamers
    expected, received = trainers[0]["expected"], r[-1]["received"]
    assert received.keys() == expected.keys()
    assert "lm_head.weight" not in received  # tied: left out, as the checkpoint does
    if model == "moe_dir":  # every expert, under the hub's names vLLM loads
        assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in received)
        assert {k for k in received if ".experts." in k} == {
            f"model.layers.{layer}.mlp.experts.{i}.{m}_proj.weight"
            for layer in range(2)
            for i in range(4)
            for m in ("gate", "up", "down")
        }
    for k, v in expected.items():
        assert received[k].dtype == v.dtype and torch.equal(received[k], v), k

    header = r[-1]["header"]
    assert header["version"] == 1 and header["transport"] == "gloo"
    assert len(header["buckets"]) >= 6 and max(header["buckets"]) > 1  # several, some shared
    total = sum(v.numel() * v.element_size() for v in expected.values())
    rec = trainers[0]["record"]
    assert rec["leader"] and rec["bytes"] == total and rec["buckets"] == len(header["buckets"])
    assert rec["seconds"] > 0 and rec["gb_per_s"] > 0
    # The leader held at most one bucket and one gathered tensor at once, never the state
    # (float32 both sides: a tensor larger than a bucket is sent as gathered, not copied).
    largest = rec["largest_tensor_bytes"]
    assert rec["peak_gathered_bytes"] <= BUCKET + largest
    assert rec["peak_gathered_bytes"] < total / 3
    if strategy == "fsdp2":
        assert rec["peak_gathered_bytes"] >= largest  # the meter saw the gathers
        peer = trainers[1]["record"]  # gathers with the leader, keeps nothing
        assert not peer["leader"] and peer["bytes"] == 0
        assert 0 < peer["peak_gathered_bytes"] <= largest


PROMPT = [BOS, 7, 14, 9, 17]
N_TOKENS = 24
ROLES = ("trainer", "trainer", "rollout")


def _tokens_from_rank_2(tokens: list[int] | None) -> list[int]:
    """The rollout rank's generated tokens, on every rank (over the world group)."""
    n = torch.tensor([len(tokens) if tokens is not None else 0])
    dist.broadcast(n, src=2)
    t = torch.tensor(tokens) if tokens is not None else torch.zeros(int(n), dtype=torch.long)
    dist.broadcast(t, src=2)
    return t.tolist()


def vllm_script(rank: int, model_dir: str, out: str) -> None:
    from runtime.store.run_dir import RunPaths

    c = join(rank, 3, out, 2, timeout_s=600)  # the engine starts before rank 2 receives
    c.regroup(0, ROLES)
    cfg = cfg_for(model_dir, 3, 2, "fsdp2")
    result: dict = {}
    if rank < 2:
        trainer = TorchTrainer(TorchTrainerConfig.from_config(cfg), model_dir, rank, c.mesh)
        trainer.train_step(
            batch(), c.data_parallel, rank, 2
        )  # the weights move away from the file's
        result["record"] = (
            WeightStreamer(WeightPathConfig.from_config(cfg), c.sync, c.mesh)
            .stream(trainer.model, trainer.version)
            .as_dict()
        )
        tokens = _tokens_from_rank_2(None)
        sample = Sample(
            sample_id=0,
            group_id=0,
            prompt_id=0,
            versions=[(1, 0, len(tokens))],
            prompt_token_ids=PROMPT,
            token_ids=tokens,
            logprobs=[0.0] * len(tokens),
            n_valid=len(tokens),
            reward=0.0,
        )
        with torch.no_grad():  # the sharded trainer's teacher forcing (both ranks)
            result["trainer"] = trainer._forward([sample])[0, : len(tokens)].tolist()
    else:
        from runtime.engines.vllm.rollout import VLLMRolloutSide

        side = VLLMRolloutSide(cfg, rank, RunPaths(Path(out)), c)
        try:
            side.deactivate()  # a rank leaving the rollout pool
            result["asleep"] = dict(side.last_switch)
            result["asleep_level"] = side.engine.sleep_level
            side.activate()
            side.on_layout(LayoutChange(1, ("trainer",) * 3, ROLES))  # ... and joining it
            coro = side.engine.generate("lp", PROMPT, N_TOKENS, ignore_eos=True)
            tokens, logprobs, spans, _ = side._call(coro).result(300)
            _tokens_from_rank_2(tokens)
            result.update(
                tokens=tokens,
                vllm=logprobs,
                spans=spans,
                switch=dict(side.last_switch),
                syncs=list(side.sync_records),
                awake_level=side.engine.sleep_level,
            )
        finally:
            side.close()
    torch.save(result, f"{out}/rank{rank}.pt")
    c.close()


def hf_logprobs(path: str, prompt: list[int], tokens: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0, :-1], -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


# ~1 min each. The dense model in `make test-slow`: CI's 45 minutes took the colocated
# and lost-rank runs, and tests/integration/test_colocated.py checks vLLM against FSDP2
# shards (mean ratio ~1); the MoE's in `make test`: nothing else checks its experts arrive
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
@pytest.mark.parametrize(
    "model",
    [
        pytest.param("model_dir", marks=pytest.mark.slow),
        # the experts: fused in the trainer, one per expert into vLLM's loader
        "moe_dir",
    ],
    ids=["dense", "moe"],
)
def test_a_sharded_trainers_streamed_weights_give_vllm_the_trainers_logprobs(
    model, tmp_path, request
):
    model_dir = request.getfixturevalue(model)
    mp.start_processes(
        vllm_script, args=(model_dir, str(tmp_path)), nprocs=3, join=True, start_method="spawn"
    )
    r0, _, r2 = (torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in range(3))
    tokens = r2["tokens"]
    assert len(tokens) == N_TOKENS and r2["spans"] == [(1, 0, N_TOKENS)]
    # vLLM's log-probs under the streamed weights are the sharded trainer's (fp32, CPU)
    gap = max(abs(a - b) for a, b in zip(r2["vllm"], r0["trainer"], strict=True))
    assert gap < 1e-4, gap
    # ... and not the model file's, which the engine started from
    initial = hf_logprobs(model_dir, PROMPT, tokens)
    assert max(abs(a - b) for a, b in zip(r2["vllm"], initial, strict=True)) > 1e-2
    # the role switch: asleep at level 2 (the weights come on joining), awake, received
    assert r2["asleep_level"] == 2 and r2["asleep"]["sleep_level"] == 2.0
    assert r2["asleep"]["slept_on_device"] == 0.0  # CPU: the state only
    assert r2["awake_level"] == 0 and r2["switch"]["wake_s"] >= 0
    sync = r2["syncs"][-1]
    assert sync["loaded"] == 1.0 and sync["version"] == 1.0 and sync["nccl"] == 0.0
    assert r2["switch"]["weights_bytes"] == sync["bytes"] == r0["record"]["bytes"]
    assert r2["switch"]["weights_receive_s"] > 0 and r2["switch"]["weights_load_s"] > 0
    assert math.isfinite(sync["gb_per_s"]) and sync["gb_per_s"] > 0

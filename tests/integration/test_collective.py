"""Data parallelism, weight broadcast and new-replica initialisation over a real gloo
process group: three processes on loopback, the real trainer side, a real tiny Qwen3.

Script (world of 3): epoch 0 = [trainer, trainer, rollout]: ranks 0 and 1 train one
step data-parallel, rank 0 broadcasts the weights to rank 2. Epoch 1 = [trainer, rollout,
trainer]: rank 2 becomes a trainer replica and receives rank 0's model and optimizer state,
rank 1 becomes a rollout rank and receives the weights; ranks 0 and 2 train a second step.
"""

import os
import random
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from runtime.config.layout import LayoutChange
from runtime.config.recipe import build_config
from runtime.data.sample import Sample
from runtime.embedded.arith import sample_problem
from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from runtime.rank.collective import Collective
from runtime.store.run_dir import RunPaths
from runtime.weights import p2p

EPOCH0 = ("trainer", "trainer", "rollout")
EPOCH1 = ("trainer", "rollout", "trainer")


def make_batch(seed: int, n: int = 7) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prob = sample_problem(rng)
        resp = prob.solution_ids()
        out.append(
            Sample(
                sample_id=i,
                group_id=i,
                prompt_id=i,
                versions=[(0, 0, len(resp))],
                prompt_token_ids=prob.prompt_ids(),
                token_ids=resp,
                logprobs=[-2.5] * len(resp),
                n_valid=len(resp) - (i % 2),
                reward=0.0,
                advantage=[1.0, -0.5, 0.25][i % 3],
                replay_count=int(i % 3 == 0),
            )
        )
    return out


def cfg_for(model_dir: str):
    return build_config(
        {
            "model": {"path": model_dir},
            # the replicated strategy: a whole copy per rank, state broadcast to joiners
            "train": {"lr": 1e-3, "steps": 10, "strategy": "replicate"},
            "reflow": {"tau": 0.5},
        }
    )


def snapshot(trainer: TorchTrainer) -> dict:
    opt = [
        {k: v.clone() for k, v in trainer.opt.state[p].items()} for p in trainer.model.parameters()
    ]
    return {
        "params": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "opt": opt,
        "step": trainer.step,
        "version": trainer.version,
    }


def rank_script(rank: int, world: int, model_dir: str, out_dir: str) -> None:
    from runtime.engines.torch.trainer_side import TorchTrainerSide

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    c = Collective.join(
        rank=rank,
        world_size=world,
        rendezvous=Path(out_dir) / "dist.json",
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        backend="gloo",
        bucket_bytes=64 * 1024,  # many buckets
        timeout_s=120,
    )
    cfg = cfg_for(model_dir)
    side = TorchTrainerSide(cfg, rank, RunPaths(Path(out_dir)), c)
    result: dict = {}
    c.regroup(0, EPOCH0)
    if EPOCH0[rank] == "trainer":
        idx = c.trainer_ranks.index(rank)
        result["metrics1"] = side.trainer.train_step(make_batch(1), c.data_parallel, idx, 2)
        result["after1"] = snapshot(side.trainer)
        result["spread1"] = c.data_parallel.replica_spread(side.trainer.checksum())
    if rank == 0:
        p2p.send_whole(c.sync, side.trainer.version, side.trainer.export_weights(), c.bucket_bytes)
    elif rank == 2:
        result["received_v"], result["received"] = p2p.receive_whole(c.sync)
    change = LayoutChange(1, EPOCH0, EPOCH1)
    c.regroup(1, EPOCH1)
    side.on_layout(change)  # trainer state to rank 2; weights to the rollout pool (rank 1)
    if rank == 1:
        result["received_v"], result["received"] = p2p.receive_whole(c.sync)
    if EPOCH1[rank] == "trainer":
        result["joined"] = snapshot(side.trainer)
        idx = c.trainer_ranks.index(rank)
        side.trainer.train_step(make_batch(2), c.data_parallel, idx, 2)
        result["after2"] = snapshot(side.trainer)
    torch.save(result, f"{out_dir}/rank{rank}.pt")
    c.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    return str(save_pretrained(build_model(seed=5), build_tokenizer(), path))


@pytest.fixture(scope="module")
def results(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    mp.start_processes(
        rank_script, args=(3, model_dir, str(out)), nprocs=3, join=True, start_method="spawn"
    )
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(3)]


def assert_same(a: dict, b: dict) -> None:
    assert a["params"].keys() == b["params"].keys()
    for k, v in a["params"].items():
        assert torch.equal(v, b["params"][k]), k
    assert len(a["opt"]) == len(b["opt"])
    for sa, sb in zip(a["opt"], b["opt"], strict=True):
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k


def test_data_parallel_step_equals_one_process_on_the_whole_batch(results, model_dir):
    r0, r1, _ = results
    assert_same(r0["after1"], r1["after1"])  # replicas stay identical
    assert r0["spread1"] == 0.0
    single = TorchTrainer(TorchTrainerConfig.from_config(cfg_for(model_dir)), model_dir)
    ref = single.train_step(make_batch(1))
    # Sums in another order: equal up to float rounding, which Adam's first step
    # (~lr * sign(g)) can magnify for gradients near eps, so the bound is 1% of lr.
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(r0["after1"]["params"][k], v, rtol=0, atol=1e-5)
    for key in ("loss", "clip_fraction", "mean_ratio", "grad_norm"):
        assert r0["metrics1"][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key


def test_weight_broadcast_delivers_the_leaders_weights(results):
    r0, r1, r2 = results
    params = r0["after1"]["params"]
    for r in (r2, r1):  # rank 2 at the sync point, rank 1 on joining the rollout pool
        received = r["received"]
        assert r["received_v"] == 1
        assert "lm_head.weight" not in received  # tied: checkpoint format, as HF saves it
        assert received.keys() == params.keys() - {"lm_head.weight"}
        for k, v in received.items():
            assert torch.equal(v, params[k]), k


def test_a_new_trainer_replica_gets_the_leaders_model_and_optimizer_state(results):
    r0, _, r2 = results
    assert r2["joined"]["step"] == 1 and r2["joined"]["version"] == 1
    assert_same(r0["joined"], r2["joined"])
    assert all(s for s in r2["joined"]["opt"])  # Adam moments arrived, not fresh zeros
    # ... and the two replicas go on training in lockstep.
    assert r0["after2"]["step"] == r2["after2"]["step"] == 2
    assert_same(r0["after2"], r2["after2"])

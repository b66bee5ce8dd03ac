"""The weight-transfer wire format and the streaming walk, without a process group.

The header a rollout driver receives is validated before a byte of weights is allocated;
the walk sends checkpoint names (a tied head left out, an untied one kept) in the rollout
dtype, a bucket at a time; the NCCL rendezvous fields and vLLM's update infos come from
the header. The transfers themselves are in tests/integration/test_weight_stream.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from runtime.rank.collective import Collective, CollectiveError
from runtime.weights import p2p
from runtime.weights.wire import TensorSpec, WeightsHeader, plan_buckets

pytestmark = pytest.mark.unit

F32, BF16 = torch.float32, torch.bfloat16


def spec(*shapes: tuple[int, ...], dtype: torch.dtype = F32) -> list[TensorSpec]:
    return [TensorSpec(f"t{i}", dtype, s) for i, s in enumerate(shapes)]


def test_buckets_hold_consecutive_tensors_of_one_dtype_up_to_the_budget():
    s = spec((4,), (4,), (4,), (100,), (2,))  # 16 B each, then 400 B, then 8 B
    assert plan_buckets(s, 32) == [2, 1, 1, 1]  # a tensor over the budget goes alone
    assert plan_buckets(s, 1 << 20) == [5]
    mixed = [*spec((4,)), TensorSpec("h", BF16, (4,)), *spec((4,))]
    assert plan_buckets(mixed, 1 << 20) == [1, 1, 1]  # a dtype change starts a bucket


def test_a_header_round_trips_and_splits_a_bucket_into_named_views():
    s = spec((2, 3), (4,), (1, 1))
    header = WeightsHeader(3, tuple(s), (2, 1))
    back = WeightsHeader.from_json(header.to_json())
    assert back == header and back.transport == "gloo" and back.nccl is None
    assert [list(r) for r in back.ranges()] == [[0, 1], [2]]
    assert back.bucket_nbytes(0) == 40
    flat = torch.arange(10, dtype=F32)
    (n0, a), (n1, b) = back.split(0, flat)
    assert (n0, n1) == ("t0", "t1") and a.shape == (2, 3) and torch.equal(b, flat[6:])
    with pytest.raises(CollectiveError, match="bucket 0"):
        back.split(0, torch.zeros(9))  # a size the header did not announce
    with pytest.raises(CollectiveError, match="bucket 1"):
        back.check_bucket(1, torch.zeros(1, dtype=BF16))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda h: h.update(buckets=[1, 1]), "buckets of 2"),
        (lambda h: h.update(buckets=[3, 0]), "empty bucket"),
        (lambda h: h.update(version=-1), "negative version"),
        (lambda h: h["tensors"][1].__setitem__(1, "torch.uint7"), "malformed"),
        (lambda h: h["tensors"][1].__setitem__(0, "t0"), "twice"),
        (lambda h: h["tensors"][2].__setitem__(2, [-1]), "malformed"),
        (lambda h: h["tensors"][2].__setitem__(1, "torch.bfloat16"), "mixes dtypes"),
        (lambda h: h.update(transport="carrier-pigeon"), "unknown transport"),
        (lambda h: h.update(nccl=[1, 2]), "malformed"),
        (lambda h: h.pop("tensors"), "malformed"),
    ],
)
def test_a_malformed_header_is_refused_with_a_reason(change, match):
    obj = WeightsHeader(1, tuple(spec((2,), (3,), (4,))), (3,)).to_json()
    change(obj)
    with pytest.raises(CollectiveError, match=match):
        WeightsHeader.from_json(obj)


class RecordingTransport:
    """A bucket transport that keeps what it is given, in order."""

    name = "nccl"
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.events: list[object] = []

    def rendezvous(self):
        self.events.append("rendezvous")
        return {"world_size": 2}

    def open(self) -> None:
        self.events.append("open")

    def send(self, flat: torch.Tensor) -> None:
        self.events.append(flat.clone())

    def flush(self) -> None:
        self.events.append("flush")


def leader_without_a_group(monkeypatch) -> tuple[Collective, list[dict]]:
    c = Collective(0, 1, bucket_bytes=1 << 20, timeout_s=5)
    headers: list[dict] = []
    monkeypatch.setattr(p2p, "send_header", lambda group, header: headers.append(header))
    return c, headers


def test_the_header_goes_first_with_the_transports_rendezvous_then_the_buckets(monkeypatch):
    c, headers = leader_without_a_group(monkeypatch)
    t = RecordingTransport()
    header = WeightsHeader(2, tuple(spec((2,), (3,))), (1, 1))
    sent = p2p.send_stream(c.sync, header, iter([torch.ones(2), torch.zeros(3)]), t)
    assert sent == 20
    assert headers[0]["transport"] == "nccl" and headers[0]["nccl"] == {"world_size": 2}
    assert t.events[:2] == ["rendezvous", "open"] and t.events[-1] == "flush"
    assert [e.tolist() for e in t.events[2:4]] == [[1.0, 1.0], [0.0, 0.0, 0.0]]
    with pytest.raises(CollectiveError, match="1 buckets sent, 2 announced"):
        p2p.send_stream(c.sync, header, iter([torch.ones(2)]), RecordingTransport())
    with pytest.raises(CollectiveError, match="bucket 1"):
        p2p.send_stream(c.sync, header, iter([torch.ones(2), torch.ones(4)]), RecordingTransport())


def tiny_model(tied: bool):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from runtime.engines.torch import logprobs

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=tied,
    )
    model = Qwen3ForCausalLM(cfg)
    hf_names = list(model.state_dict())
    logprobs.install(model, chunk=8)  # as the trainer does
    return model, hf_names


class CapturingLeader:
    """The leader's end of the sync group (runtime/weights/protocols.py ``SyncGroup``):
    keeps what it would send, the header and each bucket's tensors, by the gloo path."""

    is_leader = True
    rank = epoch = 0

    def __init__(self) -> None:
        self.got: dict[str, torch.Tensor] = {}
        self.header: WeightsHeader | None = None
        self.buckets = 0

    def send_to_receivers(self, tensor: torch.Tensor, what: str) -> None:
        if what == "header":
            self.header = WeightsHeader.from_json(json.loads(bytes(tensor.numpy()).decode()))
        elif what.startswith("bucket"):
            assert self.header is not None and what == f"bucket {self.buckets}"
            dtype = self.header.bucket_specs(self.buckets)[0].dtype
            pairs = self.header.split(self.buckets, tensor.view(dtype))
            self.got.update((name, view.clone()) for name, view in pairs)
            self.buckets += 1
            del pairs  # as the real sends: nothing of a bucket kept past it


@pytest.mark.parametrize("tied", [True, False], ids=["tied-head", "untied-head"])
def test_the_walk_sends_checkpoint_names_in_the_rollout_dtype(tied):
    from runtime.weights.send import stream_weights

    model, hf_names = tiny_model(tied)
    leader = CapturingLeader()
    record = stream_weights(model, leader, 4, dtype=BF16, bucket_bytes=2048, tied_lm_head=tied)  # type: ignore[arg-type]
    expected = [n for n in hf_names if not (tied and n == "lm_head.weight")]
    assert list(leader.got) == expected  # HF's names and order; the head only if untied
    assert ("lm_head.weight" in leader.got) is (not tied)
    state = model.state_dict()
    for name, t in leader.got.items():
        assert t.dtype == BF16 and torch.equal(t, state[name].to(BF16)), name
    assert record.buckets == leader.buckets > 1 and record.leader
    assert record.bytes == sum(t.numel() * 2 for t in leader.got.values())
    # a replicated model is its own full copy: only the bf16 buckets were allocated
    assert 0 < record.peak_gathered_bytes <= max(2048, record.largest_bucket_bytes)


def test_a_mixture_of_experts_goes_out_one_matrix_per_expert_gathered_once():
    from runtime.checkpoint_layout import to_hub
    from runtime.embedded.tiny_qwen3 import build_moe_model
    from runtime.weights.send import stream_weights

    model = build_moe_model(seed=2)
    leader = CapturingLeader()
    record = stream_weights(model, leader, 1, dtype=F32, bucket_bytes=4096, tied_lm_head=True)  # type: ignore[arg-type]
    expected = {k: v for k, v in to_hub(model.state_dict()).items() if k != "lm_head.weight"}
    assert list(leader.got) == list(expected)  # the hub's names, in the state dict's order
    assert all(torch.equal(leader.got[k], v) for k, v in expected.items())
    fused = model.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
    # what is gathered is the fused tensor (once), what is sent its experts' matrices
    assert record.largest_tensor_bytes == fused.numel() * 4
    assert record.tensors == len(expected) and record.bytes == sum(
        v.numel() * 4 for v in expected.values()
    )


def test_nccl_rendezvous_and_update_infos_follow_the_header():
    from runtime.weights.nccl import update_infos, worker_init_info

    s = [TensorSpec("a", BF16, (2, 3)), TensorSpec("b", BF16, (4,)), TensorSpec("c", BF16, (9,))]
    nccl = {
        "unique_id_b64": "AAAA",
        "world_size": 5,
        "rank_offsets": {"2": 1, "4": 3},
        "buffer_bytes": 20,
    }
    header = WeightsHeader(7, tuple(s), (2, 1), "nccl", nccl)
    info = worker_init_info(header, 4)
    assert info["rank_offset"] == 3 and info["world_size"] == 5 and info["packed"]
    assert info["packed_buffer_size_bytes"] == 20 and info["nccl_unique_id_b64"] == "AAAA"
    with pytest.raises(CollectiveError, match="rank 3"):
        worker_init_info(header, 3)  # not a driver of this layout
    small = WeightsHeader(7, tuple(s), (2, 1), "nccl", {**nccl, "buffer_bytes": 19})
    with pytest.raises(CollectiveError, match="bucket 0"):
        worker_init_info(small, 2)  # vLLM's consumer would cut the bucket elsewhere
    assert update_infos(header) == [
        {"names": ["a", "b"], "dtype_names": ["bfloat16"] * 2, "shapes": [[2, 3], [4]]},
        {"names": ["c"], "dtype_names": ["bfloat16"], "shapes": [[9]]},
    ]

"""The pure logic of the trainer-state handoff (runtime/engines/torch/shard_handoff.py)
and of the host offload (runtime/engines/torch/offload.py), without a process group.

Bucket plans must cover every element once, in order, one dtype per bucket and never
over the size; sources must serve every joining rank from a rank that stays in the same
shard column, spread over the existing replica groups; the offload must free and restore
storages exactly; a staying rank's state must carry over to a rebuilt model as it was.
"""

from __future__ import annotations

import pytest
import torch

from runtime.engines.torch.offload import HostOffload
from runtime.engines.torch.shard_handoff import (
    Bucket,
    HandoffError,
    _pack,
    _unpack,
    adopt,
    plan_buckets,
    plan_sources,
    signature,
    training_tensors,
)

pytestmark = pytest.mark.unit

F32, BF16, I64 = torch.float32, torch.bfloat16, torch.int64


def covered(buckets: list[Bucket], specs) -> list[tuple[int, int]]:
    """Every (tensor, element) the plan moves, in wire order."""
    return [(p.tensor, i) for b in buckets for p in b.pieces for i in range(p.start, p.stop)]


@pytest.mark.parametrize("bucket_bytes", [1, 4, 12, 40, 1 << 20])
def test_a_bucket_plan_moves_every_element_once_in_order(bucket_bytes):
    specs = [(F32, 5), (F32, 0), (F32, 7), (BF16, 3), (BF16, 9), (F32, 1), (I64, 2)]
    buckets = plan_buckets(specs, bucket_bytes)
    want = [(i, e) for i, (_, n) in enumerate(specs) for e in range(n)]
    assert covered(buckets, specs) == want
    for b in buckets:
        assert all(specs[p.tensor][0] == b.dtype for p in b.pieces)  # one dtype
        assert b.numel >= 1
        # never over the size, except one element larger than the whole bucket
        assert b.numel * b.dtype.itemsize <= max(bucket_bytes, b.dtype.itemsize)


def test_a_large_tensor_is_split_and_small_ones_share_a_bucket():
    buckets = plan_buckets([(F32, 10), (F32, 2), (F32, 2)], bucket_bytes=16)  # 4 floats
    assert [b.numel for b in buckets] == [4, 4, 4, 2]
    assert [(p.tensor, p.start, p.stop) for p in buckets[2].pieces] == [(0, 8, 10), (1, 0, 2)]
    assert [(p.tensor, p.start, p.stop) for p in buckets[3].pieces] == [(2, 0, 2)]
    # a dtype change closes the bucket even with room left
    mixed = plan_buckets([(F32, 1), (BF16, 1), (F32, 1)], bucket_bytes=1 << 10)
    assert [b.dtype for b in mixed] == [F32, BF16, F32]
    assert plan_buckets([], 16) == [] and plan_buckets([(F32, 0)], 16) == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets([(F32, 1)], 0)


def test_packing_and_unpacking_a_plan_round_trips_the_tensors():
    g = torch.Generator().manual_seed(0)
    src = [
        torch.randn(3, 5, generator=g),
        torch.zeros(0),
        torch.randn(7, generator=g).to(BF16),
        torch.tensor(4.0),  # a 0-d AdamW step
        torch.randn(2, 2, generator=g),
    ]
    dst = [torch.zeros_like(t) for t in src]
    buckets = plan_buckets([(t.dtype, t.numel()) for t in src], bucket_bytes=24)
    assert len(buckets) > 3
    for b in buckets:
        _unpack(_pack(b, src, torch.device("cpu")), b, dst)
    assert all(torch.equal(a, b) for a, b in zip(src, dst, strict=True))


def test_the_plan_signature_tells_shapes_and_dtypes_apart():
    a = [torch.zeros(4, 3), torch.zeros(2)]
    assert signature(a) == signature([torch.ones(4, 3), torch.ones(2)])
    assert signature(a)[:2] == [2, 14]
    for other in (
        [torch.zeros(3, 4), torch.zeros(2)],
        [torch.zeros(4, 3), torch.zeros(2, dtype=BF16)],
    ):
        assert signature(other) != signature(a)


def test_joining_ranks_are_served_by_the_same_shard_spread_over_the_groups():
    assert plan_sources([0, 1], [0, 1, 2, 3], 2) == {2: 0, 3: 1}
    # two existing groups, two joining: each joining group from another existing one
    assert plan_sources([0, 1, 2, 3], list(range(8)), 2) == {4: 0, 5: 1, 6: 2, 7: 3}
    # one existing group serves two joining ones
    assert plan_sources([0, 1], list(range(6)), 2) == {2: 0, 3: 1, 4: 0, 5: 1}
    # three existing replicas of one rank, two joining: the first two serve
    assert plan_sources([0, 1, 2], [0, 1, 2, 3, 4], 1) == {3: 0, 4: 1}
    # a group leaves: nothing moves
    assert plan_sources([0, 1, 2, 3], [0, 1], 2) == {}
    # a replicated trainer whose ranks are not contiguous (one leaves, one joins)
    assert plan_sources([0, 1], [0, 2], 1) == {2: 0}


@pytest.mark.parametrize(
    ("before", "after", "size", "match"),
    [
        ([0, 1], [0, 2, 1, 3], 2, "from shard 1 to shard 0"),  # rank 1 would change shard
        ([0, 1], [0, 1, 2], 2, "whole replica groups"),
        ([0, 1, 2], [0, 1], 2, "whole replica groups"),
        ([0, 1], [2, 3], 2, "no trainer rank that stays"),
        ([0], [0, 1], 0, "at least 1"),
    ],
)
def test_a_handoff_between_layouts_that_break_the_rules_is_refused(before, after, size, match):
    with pytest.raises(HandoffError, match=match):
        plan_sources(before, after, size)


def tensors_of_storages():
    base = torch.arange(12, dtype=F32)
    view = base[3:7]  # shares base's storage: counted and moved once
    other = torch.ones(2, 3, dtype=BF16)
    return base, view, other


def test_a_host_offload_that_moves_frees_each_storage_once_and_restores_it():
    base, view, other = tensors_of_storages()
    want = [base.clone(), view.clone(), other.clone()]
    off = HostOffload([base, view, other], torch.device("cpu"), move=True)
    assert off.nbytes == 12 * 4 + 6 * 2
    assert off.offload().bytes == off.nbytes
    assert base.untyped_storage().nbytes() == 0 and other.untyped_storage().nbytes() == 0
    assert off.restore().bytes == off.nbytes
    for got, w in zip((base, view, other), want, strict=True):
        assert torch.equal(got, w)
    with pytest.raises(RuntimeError, match="without an offload"):
        off.restore()


def test_a_host_offload_that_does_not_move_leaves_the_tensors_alone():
    base, _, other = tensors_of_storages()
    off = HostOffload([base, other], torch.device("cpu"), move=False)
    assert off.offload().bytes == 0 and off.restore().bytes == 0
    assert base.untyped_storage().nbytes() == 48 and torch.equal(base, torch.arange(12.0))


def stepped_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    return model, opt


def test_a_staying_rank_carries_its_state_into_the_rebuilt_model():
    old, old_opt = stepped_model(0)
    want = [t.clone() for t in training_tensors(old, old_opt)]
    new = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    new_opt = torch.optim.AdamW(new.parameters(), lr=1e-2)
    kept = adopt(old, old_opt, new, new_opt)
    assert kept == sum(t.numel() * t.element_size() for t in want)
    got = training_tensors(new, new_opt)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    assert not old_opt.state  # handed over, not duplicated


def test_a_rebuilt_model_of_other_shapes_is_refused_before_anything_moves():
    old, old_opt = stepped_model(0)
    new = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    new_opt = torch.optim.AdamW(new.parameters(), lr=1e-2)
    with pytest.raises(HandoffError, match="parameter 0"):
        adopt(old, old_opt, new, new_opt)
    assert len(old_opt.state) == 4  # untouched


def test_missing_adam_state_is_created_as_adamw_would_and_other_optimizers_refused():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    tensors = training_tensors(model, opt)
    assert len(tensors) == 8  # weight, bias: parameter, exp_avg, exp_avg_sq, step
    assert float(tensors[3]) == 0.0 and not tensors[1].any()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    sgd.step()
    with pytest.raises(HandoffError, match="not AdamW"):
        training_tensors(model, sgd)

"""A mixture of experts' routes on a sample (runtime/data/routes.py): one declaration,
carried by both messages and kept by checkpoints, refused when they cannot be the model's."""

import numpy as np
import pytest

from runtime.data.micro_batches import rank_plans
from runtime.data.routes import ExpertRoutes, RoutesError, route_positions
from runtime.data.sample import Batch, Sample, sample_digest, sample_from_state, sample_state
from runtime.transport import frames as wire
from runtime.transport import protocol as p


def routes(positions: int, layers: int = 2, k: int = 2, experts: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = np.stack(
        [[rng.permutation(experts)[:k] for _ in range(layers)] for _ in range(positions)]
    )
    return ExpertRoutes.from_array(ids, experts)


def sample(r: ExpertRoutes | None) -> Sample:
    return Sample(
        sample_id=1,
        group_id=0,
        prompt_id=0,
        versions=[(0, 0, 2), (1, 2, 3)],
        prompt_token_ids=[5, 6],
        token_ids=[1, 2, 3],
        logprobs=[-1.0, -2.0, -3.0],
        n_valid=3,
        reward=1.0,
        routes=None if r is None else r.to_bytes(),
    )


def test_routes_travel_with_a_sample_and_stay_in_its_checkpoint():
    r = routes(route_positions(2, 3))
    s = sample(r)
    got = wire.sample(p.decode(p.encode(wire.sample_done(s, 2))))
    assert got.routes == s.routes
    assert ExpertRoutes.from_bytes(got.routes).array().tolist() == r.array().tolist()
    kept = sample_from_state(sample_state(got))
    assert kept.routes == s.routes and sample_digest(kept) == sample_digest(got)
    assert sample_digest(got) != sample_digest(sample(routes(4, seed=1)))
    b = Batch(0, 0, [got, sample(None)], 2, 0)
    (part,) = rank_plans([5, 5], [3, 3], [False, False], 1, 1, None)
    for msg in (wire.batch_message(b), wire.batch_message(b, part)):
        carried = wire.batch(p.decode(p.encode(msg))).samples
        assert [t.routes for t in carried] == [s.routes, None]


def test_a_wide_model_takes_two_bytes_an_id():
    r = routes(3, layers=1, k=8, experts=300)
    assert r.width == 2 and ExpertRoutes.from_bytes(r.to_bytes()).array().max() < 300


@pytest.mark.parametrize(
    ("ids", "shape", "reason"),
    [
        (routes(4).array(), (4, 2, 2, 4), None),
        (routes(4).array(), (5, 2, 2, 4), "4 positions, the sample has 5"),
        (routes(4).array(), (4, 3, 2, 4), "the model's 3 x 2"),
        (routes(4, experts=8).array() + 4, (4, 2, 2, 4), "an expert id"),
        (np.zeros((4, 2, 2), dtype=int), (4, 2, 2, 4), "an expert chosen twice"),
    ],
)
def test_routes_that_cannot_be_the_models_are_named(ids, shape, reason):
    r = ExpertRoutes.from_array(ids, experts=16)
    problem = r.problem(*shape)
    assert problem is None if reason is None else reason in problem


def test_malformed_routes_are_refused_with_a_reason():
    good = routes(2).to_bytes()
    for data, reason in (
        (good[:5], "shorter than their header"),
        (b"XY" + good[2:], "unknown format"),
        (good[:-1], "not whole positions"),
    ):
        with pytest.raises(RoutesError, match=reason):
            ExpertRoutes.from_bytes(data)


def test_every_blob_field_is_shape_checked_where_it_arrives():
    # a blob's frame is checked by its own declaration (runtime/transport/sample_shape.py
    # runs each ``Wire.check``); a blob declared without one would arrive unchecked
    from runtime.data.routes import wire_problem
    from runtime.data.sample import blob_wires

    assert blob_wires() and all(callable(w.check) for w in blob_wires().values())
    good = routes(route_positions(2, 3)).to_bytes()
    assert wire_problem(good, 2, 3) is None
    assert wire_problem(good, 2, 4) == "routes length"
    assert "shorter than their header" in wire_problem(good[:5], 2, 3)

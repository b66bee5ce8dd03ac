import random

import pytest

from runtime.data.micro_batches import assign_ranks, pack, padded_tokens, plan, rank_plans

pytestmark = pytest.mark.unit


def test_ranks_get_balanced_token_loads_and_every_sample_once():
    lengths = [1000, 10, 10, 10, 900, 20, 30, 500, 500, 40]
    per_rank = assign_ranks(lengths, 2)
    assert sorted(i for r in per_rank for i in r) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in r) for r in per_rank]
    # round-robin by index (the old split) gives 1000+10+900+30+500 vs 10+10+20+500+40
    assert max(loads) - min(loads) <= max(lengths)
    assert abs(loads[0] - loads[1]) < 200


def test_micro_batches_stay_under_the_padded_budget_unless_one_sample_exceeds_it():
    rng = random.Random(3)
    lengths = [rng.randint(5, 300) for _ in range(60)] + [700]
    batches = pack(lengths, range(len(lengths)), 600)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert padded_tokens(lengths, b) <= 600 or len(b) == 1
    assert [len(b) for b in batches if padded_tokens(lengths, b) > 600] == [1]
    assert pack(lengths, [0, 1, 2], None) == [sorted([0, 1, 2], key=lambda i: -lengths[i])]


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("budget", [None, 64, 250, 10_000])
def test_every_rank_takes_the_same_number_of_micro_steps(ranks, budget):
    rng = random.Random(ranks * 100 + (budget or 0))
    lengths = [rng.randint(4, 200) for _ in range(rng.randint(1, 13))]
    p = plan(lengths, ranks, budget)
    assert len(p) == ranks
    assert len({len(batches) for batches in p}) == 1
    assert sorted(i for batches in p for b in batches for i in b) == list(range(len(lengths)))


def test_a_rank_with_too_few_samples_gets_empty_micro_steps():
    # LPT: 50 to rank 0, 40 and 30 to rank 1, which needs two micro-batches (2 x 40 > 50)
    assert plan([50, 40, 30], ranks=2, budget=50) == [[[0], []], [[1], [2]]]
    # with samples to spare, a rank splits its largest micro-batch instead
    assert plan([50, 10, 10, 45], ranks=2, budget=None) == [[[0, 2]], [[3, 1]]]
    # rank 0 packs 50+10 and 10 (3 x 50 > 100); rank 1's 45+44 is split to match
    assert plan([50, 10, 10, 45, 44], ranks=2, budget=100) == [[[0, 1], [2]], [[3], [4]]]
    assert plan([], ranks=3, budget=10) == [[[]], [[]], [[]]]


def test_rank_plans_send_each_rank_its_samples_its_micro_batches_and_the_update_normalisers():
    lengths = [9, 3, 7, 5, 2, 8, 4, 6, 1, 10]
    n_valid = [n - 1 for n in lengths]
    replayed = [i >= 7 for i in range(10)]
    parts = rank_plans(lengths, n_valid, replayed, mini_batches=2, ranks=3, budget=16)
    # every sample of the batch goes to exactly one rank
    carried = sorted(i for part in parts for i in part.batch_positions)
    assert carried == list(range(10))
    for j in range(2):  # the strided update j: batch[j::2]
        mini = list(range(j, 10, 2))
        updates = [part.updates[j] for part in parts]
        for u in updates:  # each rank sees the whole update's normalisers
            assert u.n_valid == [n_valid[i] for i in mini]
            assert u.replayed == [replayed[i] for i in mini]
            assert sorted(i for m in u.micro_batches for i in m) == u.positions
        # the ranks take as many micro-steps (FSDP2), and together train the update once
        assert len({len(u.micro_batches) for u in updates}) == 1
        assert sorted(i for u in updates for i in u.positions) == list(range(len(mini)))
    for part in parts:  # carried update by update, in the order of the positions
        expect = [j + 2 * i for j, u in enumerate(part.updates) for i in u.positions]
        assert part.batch_positions == expect

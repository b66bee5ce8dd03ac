import pytest

from runtime.config.layout import Layout, LayoutError, Role, check_split, default_split, parse_ratio


def make(rollout: int, trainer: int, *, per_node: int = 8, s_t: int = 8, s_r: int = 1) -> Layout:
    return Layout.from_ratio(
        rollout,
        trainer,
        world_size=rollout + trainer,
        gpus_per_node=per_node,
        trainer_group_size=s_t,
        rollout_group_size=s_r,
    )


def test_parse_ratio():
    assert parse_ratio("24:8") == (24, 8)
    assert parse_ratio(" 24 : 8 ") == (24, 8)
    # superscript digits raised ValueError out of int(), full-width ones were taken, and a
    # 23-digit count reached msgpack (OverflowError): refused here, in one line
    for bad in (
        "24",
        "a:b",
        "3:-1",
        "1:2:3",
        "",
        "\u00b2:1",
        "\uff12\uff14:\uff18",
        "1" * 23 + ":1",
    ):
        with pytest.raises(LayoutError, match="ROLLOUT:TRAINER in ASCII digits") as got:
            parse_ratio(bad)
        assert "\n" not in str(got.value) and len(str(got.value)) < 120


def test_groups_are_contiguous_and_cover_every_rank():
    layout = make(24, 8)
    assert layout.groups(Role.TRAINER) == [tuple(range(8))]
    assert len(layout.groups(Role.ROLLOUT)) == 24
    assert layout.role_of(7) is Role.TRAINER and layout.role_of(8) is Role.ROLLOUT
    ranks = sorted(r for role in Role for g in layout.groups(role) for r in g)
    assert ranks == list(range(32))


def test_rebalance_moves_only_ranks_between_boundaries():
    a = make(24, 8)
    b = a.with_ratio(16, 16)
    assert a.moved_ranks(b) == list(range(8, 16))
    assert b.ratio == "16:16"


@pytest.mark.parametrize(
    ("rollout", "trainer", "reason"),
    [
        (20, 8, "adds up to 28, not 32"),
        (20, 12, "multiple of 8"),
        (32, 0, "fewer than one trainer replica"),
    ],
)
def test_infeasible_splits(rollout, trainer, reason):
    with pytest.raises(LayoutError, match=reason):
        make(24, 8).with_ratio(rollout, trainer)


def test_rollout_replicas_never_straddle_a_boundary():
    with pytest.raises(LayoutError, match="multiples of the rollout replica size 2"):
        check_split(3, 1, world_size=4, trainer_group_size=1, rollout_group_size=2)
    check_split(2, 2, world_size=4, trainer_group_size=1, rollout_group_size=2)


def test_default_split_follows_the_fraction():
    assert default_split(4, 1, 1) == (2, 2)
    assert default_split(32, 8, 1, 0.75) == (24, 8)
    assert default_split(64, 8, 1, 0.75) == (48, 16)
    with pytest.raises(LayoutError, match="no split"):
        default_split(4, 3, 2)


def test_layout_change_names_who_joined_each_pool():
    from runtime.config.layout import LayoutChange

    change = LayoutChange(2, ("trainer", "trainer", "rollout"), ("trainer", "rollout", "trainer"))
    assert change.ranks("trainer") == [0, 2]
    assert change.ranks("trainer", after=False) == [0, 1]
    assert change.joined("trainer") == [2] and change.joined("rollout") == [1]
    same = LayoutChange(3, change.after, change.after)
    assert same.joined("trainer") == [] and same.joined("rollout") == []

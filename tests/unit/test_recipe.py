"""Recipe validation: every bad recipe gets one exact line naming file, field and rule."""

import re
from pathlib import Path

import pytest
import yaml

from runtime.config.recipe import RecipeError, build_config, dump_config, load_recipe, rebuild
from runtime.config.schema import BASELINE_FIXED, BASELINES, MODES, Config

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


BAD = [
    (
        "resources: {gpus_per_node: 8, rollout_gpus_per_replica: 3}",
        "resources.rollout_gpus_per_replica: 3 does not divide gpus_per_node=8",
    ),
    (
        "reflow: {sigmma: 0.3}",
        "reflow.sigmma: unknown key (allowed here: B_max, B_max_per_gpu, age_from, delta, "
        "fresh_order, max_stragglers, mode, replay_filter, sampler, sigma, tau)",
    ),
    ("train: {steps: ten}", "train.steps: expected an integer, got 'ten'"),
    ("train: {steps: 1.5}", "train.steps: expected an integer, got 1.5"),
    ("reflow: {sigma: 1.5}", "reflow.sigma: 1.5 is out of range (allowed: 0 <= sigma < 1)"),
    ("reflow: {tau: 0}", "reflow.tau: 0.0 is out of range (allowed: 0 < tau <= 1)"),
    (
        "reflow: {mode: turbo}",
        "reflow.mode: 'turbo' is not one of: "
        "colocated_sync, disaggregated_sync, one_step_off, async, reflow",
    ),
    (
        "reflow: {mode: async, sigma: 0.5}",
        "reflow.sigma: 0.5 needs mode=reflow (replay is off in mode=async)",
    ),
    ("scheduler: {auto_rebalance: 1}", "scheduler.auto_rebalance: expected true or false, got 1"),
    (
        "resources: {gpus_per_node: 4, initial_ratio: '3:2'}",
        "resources.initial_ratio: 3:2 adds up to 5, not 4",
    ),
    (
        "resources: {gpus_per_node: 8, trainer_gpus_per_replica: 8, initial_ratio: '8:0'}",
        "resources.initial_ratio: 8:0 leaves fewer than one trainer replica (8 ranks)",
    ),
    (
        "train: {sync_every: 2, checkpoint_every: 5}",
        "train.checkpoint_every: 5 is not a multiple of sync_every=2 (checkpoints are taken "
        "at sync points)",
    ),
    (
        "model: {max_seq_len: 256}\nworkload: {max_response_tokens: 256}",
        "workload.max_response_tokens: 256 leaves no room for the prompt within "
        "model.max_seq_len=256",
    ),
    ("train: [1, 2]", "train: expected a mapping of keys, got [1, 2]"),
    (
        "modle: {path: x}",
        "modle: unknown key (allowed here: algorithm, control, data, engine, eval, "
        "logging, model, name, reflow, resources, sandbox, scheduler, slurm, train, workload)",
    ),
    ("train: {lr: .nan}", "train.lr: expected a finite number, got nan"),
    (
        "train: {batch_prompts: 4, batch_size: 30}\nalgorithm: {group_size: 8}",
        "train.batch_size: 30 != batch_prompts x group_size = 4 x 8 = 32 (give one of the two)",
    ),
    (
        "train: {batch_size: 30, mini_batches: 4}",
        "train.mini_batches: 4 does not divide batch_size=30",
    ),
    (
        "train: {steps: 10, sync_every: 4}",
        "train.steps: 10 is not a multiple of sync_every=4 (a run ends at a sync point, "
        "where its last policy version is published)",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_recipe_gets_one_exact_line(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value) == f"{path}: {message}"
    assert "\n" not in str(info.value)


def test_the_peer_wait_follows_a_shortened_heartbeat_unless_set(tmp_path):
    # A recipe that only shortens the heartbeat (as the fault tests do) must load: the
    # weight sync's wait on a receiver defaults to a third of it.
    cfg = load_recipe(write(tmp_path, "control: {heartbeat_timeout_s: 3}"))
    assert cfg.control.peer_timeout_s is None and cfg.control.peer_wait_s == 1.0
    cfg = load_recipe(write(tmp_path, "control: {heartbeat_timeout_s: 3, peer_timeout_s: 2}"))
    assert cfg.control.peer_wait_s == 2.0
    with pytest.raises(RecipeError, match=r"control\.peer_timeout_s: 3\.0 must be below"):
        load_recipe(write(tmp_path, "control: {heartbeat_timeout_s: 3, peer_timeout_s: 3}"))


def test_not_yaml_and_missing_file(tmp_path):
    path = write(tmp_path, "train: {steps: [1,\n")
    with pytest.raises(RecipeError, match=r"x\.yaml: not valid YAML \(line \d+\)"):
        load_recipe(path)
    with pytest.raises(RecipeError, match=r"nope\.yaml: no such recipe file"):
        load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match="top level must be a mapping"):
        load_recipe(write(tmp_path, "- 1\n- 2\n"))


def test_overrides_use_the_same_validation(tmp_path):
    path = write(tmp_path, "reflow: {sigma: 0.5}")
    cfg = load_recipe(path, ["reflow.sigma=0.3", "train.steps=7"])
    assert cfg.reflow.sigma == 0.3 and cfg.train.steps == 7
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["reflow.sigma=2"])
    assert str(info.value) == (
        f"{path} (--set reflow.sigma=2): reflow.sigma: 2.0 is out of range "
        "(allowed: 0 <= sigma < 1)"
    )
    with pytest.raises(RecipeError, match=r"--set reflow\.sigma: expected KEY=VALUE"):
        load_recipe(path, ["reflow.sigma"])


def test_a_config_changed_in_code_goes_through_the_recipe_checks_again():
    cfg = build_config({"reflow": {"mode": "reflow", "sigma": 0.3}})
    assert rebuild(cfg, {}, source="x") == cfg
    synced = rebuild(
        cfg,
        {"reflow.mode": "disaggregated_sync", "reflow.sigma": None},
        source="--mode disaggregated_sync",
    )
    assert (
        synced.reflow.mode == "disaggregated_sync" and synced.reflow.sigma == 0.0
    )  # the mode's default
    assert cfg.reflow.mode == "reflow"  # the original is left as it was
    for changes, message in [
        (
            {"reflow.mode": "bogus"},
            "--mode bogus: reflow.mode: 'bogus' is not one of: "
            "colocated_sync, disaggregated_sync, one_step_off, async, reflow",
        ),
        (
            {"reflow.mode": "disaggregated_sync"},  # sigma 0.3 kept: replay is off outside reflow
            "--mode bogus: reflow.sigma: 0.3 needs mode=reflow "
            "(replay is off in mode=disaggregated_sync)",
        ),
        (
            {"reflow.sigma": 1.5},
            "--mode bogus: reflow.sigma: 1.5 is out of range (allowed: 0 <= sigma < 1)",
        ),
    ]:
        with pytest.raises(RecipeError) as info:
            rebuild(cfg, changes, source="--mode bogus")
        assert str(info.value) == message
    with pytest.raises(KeyError, match=r"reflow\.nope: no such config field"):
        rebuild(cfg, {"reflow.nope": 1}, source="x")  # a caller's bug, not a user error


def test_yaml_1_1_exponents_are_numbers(tmp_path):
    # YAML 1.1 reads 3e-5 (no dot) as a string; a float field accepts it all the same.
    assert load_recipe(write(tmp_path, "train: {lr: 3e-5}")).train.lr == 3e-5
    with pytest.raises(RecipeError, match=r"train\.lr: expected a number, got 'fast'"):
        load_recipe(write(tmp_path, "train: {lr: fast}"))


def test_an_unquoted_off_for_a_choice_is_named_as_yaml_reads_it(tmp_path):
    # YAML 1.1 reads `off` as false: the field of choices says so and lists them
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, "algorithm: {routing_replay: off}"))
    assert "algorithm.routing_replay: expected a string, got false (YAML reads" in str(info.value)
    assert str(info.value).endswith("one of disabled, rollout")


def test_each_mode_is_what_its_definition_says():
    # the old name says what it is now
    renamed = r"reflow\.mode: 'sync' was renamed: use disaggregated_sync"
    with pytest.raises(RecipeError, match=renamed):
        build_config({"reflow": {"mode": "sync"}})
    # a baseline keeps its placement and fixed caps: asking for more is refused, not run
    for field in ("auto_rebalance", "adaptive_caps"):
        with pytest.raises(RecipeError, match=f"scheduler.{field}: true is not part of mode=async"):
            build_config({"reflow": {"mode": "async"}, "scheduler": {field: True}})
        assert getattr(
            build_config({"reflow": {"mode": "reflow"}, "scheduler": {field: True}}).scheduler,
            field,
        )
    # colocated: every rank in a trainer replica and in a rollout replica
    cfg = build_config({"reflow": {"mode": "colocated_sync"}})
    assert cfg.reflow.sigma == 0.0
    with pytest.raises(RecipeError, match="trainer_gpus_per_replica: 3 does not divide the 8"):
        build_config(
            {
                "reflow": {"mode": "colocated_sync"},
                "resources": {
                    "nodes": 2,
                    "trainer_gpus_per_replica": 3,
                    "rollout_gpus_per_replica": 1,
                },
            }
        )
    # no split applies: a ratio is refused, and one trainer replica may span every rank
    # (FSDP over the whole world, as verl colocates)
    with pytest.raises(RecipeError, match="initial_ratio: '2:2' does not apply to mode=colocated"):
        build_config({"reflow": {"mode": "colocated_sync"}, "resources": {"initial_ratio": "2:2"}})
    whole = build_config(
        {"reflow": {"mode": "colocated_sync"}, "resources": {"trainer_gpus_per_replica": 4}}
    )
    assert whole.resources.trainer_gpus_per_replica == whole.world_size == 4


def test_an_eval_interval_needs_something_to_evaluate():
    assert build_config({"train": {"eval_every": 10}}).train.eval_every == 10  # arith
    with pytest.raises(RecipeError, match=r"train\.eval_every: nothing to evaluate"):
        build_config({"train": {"eval_every": 10}, "workload": {"kind": "code_agent"}})
    sets = {"data": {"eval": {"apps": "test.jsonl"}}}  # named held-out sets: any kind
    cfg = build_config({"train": {"eval_every": 10}, "workload": {"kind": "code_agent"}, **sets})
    assert cfg.data.eval == {"apps": "test.jsonl"}


def test_mode_dependent_defaults():
    assert build_config({}).reflow.sigma == 0.5
    assert build_config({"reflow": {"mode": "disaggregated_sync"}}).reflow.sigma == 0.0
    cfg = build_config({"train": {"batch_size": 48}})
    assert cfg.reflow.B_max == 48
    assert cfg.resources.initial_ratio == "2:2"


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_shipped_recipes_load_and_round_trip(tmp_path, recipe):
    cfg = load_recipe(recipe)
    assert isinstance(cfg, Config)
    out = tmp_path / "resolved.yaml"
    dump_config(cfg, out)
    assert load_recipe(out) == cfg
    assert yaml.safe_load(out.read_text())["reflow"]["B_max"] == cfg.reflow.B_max


@pytest.mark.parametrize(
    ("name", "prompts_per_update", "updates_per_sync"),
    [("apps_coding", 16, 4), ("dapo_math", 32, 16), ("retool", 16, 4)],
)
def test_cluster_recipes_use_the_paper_settings(name, prompts_per_update, updates_per_sync):
    # DAPO: 512 prompts x 16 per weight sync in mini-batches of 32 prompts; ReTool (verl
    # recipe, which the APPS agent follows): 64 prompts x 16 in mini-batches of 16
    cfg = load_recipe(REPO / "recipes" / f"{name}.yaml")
    train = cfg.train
    assert cfg.algorithm.group_size == 16 and train.batch_prompts == prompts_per_update
    assert train.sync_every == updates_per_sync and train.mini_batches == 1
    # one weight publication's worth of samples may be in flight
    assert cfg.reflow.B_max == train.batch_size * train.sync_every
    assert cfg.reflow.sigma == cfg.reflow.tau == 0.5
    assert cfg.reflow.delta == 1
    assert "Qwen3" in cfg.model.path


def test_a_ratio_is_a_ratio_not_a_base_60_number(tmp_path):
    # YAML 1.1 reads 2:2 as 122; in a recipe or a --set it means 2 rollout : 2 trainer.
    recipe = tmp_path / "r.yaml"
    recipe.write_text("resources: {gpus_per_node: 4, initial_ratio: 3:1}\n")
    assert load_recipe(recipe).resources.initial_ratio == "3:1"
    cfg = load_recipe(recipe, ["resources.initial_ratio=2:2"])
    assert cfg.resources.initial_ratio == "2:2"
    assert load_recipe(recipe, ["train.lr=1e-5"]).train.lr == 1e-5


def test_a_batch_given_in_prompts_is_prompts_times_group_size(tmp_path):
    text = "train: {batch_prompts: 32, mini_batches: 16}\nalgorithm: {group_size: 16}"
    path = write(tmp_path, text)
    train = load_recipe(path).train
    assert (train.batch_size, train.mini_batches) == (512, 16)


def test_B_max_per_gpu_grows_with_the_cluster():
    cfg = build_config(
        {"reflow": {"B_max_per_gpu": 64}, "resources": {"nodes": 2, "gpus_per_node": 4}}
    )
    assert cfg.reflow.B_max == 512
    bigger = rebuild(
        cfg, {"resources.nodes": 8, "resources.initial_ratio": None}, source="--gpus 32"
    )
    assert bigger.reflow.B_max == 2048  # derived again, not the 512 carried over
    with pytest.raises(
        RecipeError, match=r"^<recipe>: reflow.B_max_per_gpu: set with reflow.B_max=5"
    ):
        build_config({"reflow": {"B_max_per_gpu": 64, "B_max": 5}})


def test_a_saved_config_with_B_max_per_gpu_loads_again(tmp_path):
    # a run saves its resolved config (both fields set) and every rank loads it back: it
    # was refused, so no run with B_max_per_gpu could start or resume
    cfg = build_config(
        {"reflow": {"B_max_per_gpu": 64}, "resources": {"nodes": 1, "gpus_per_node": 4}}
    )
    dump_config(cfg, tmp_path / "config.yaml")
    again = load_recipe(tmp_path / "config.yaml")
    assert (again.reflow.B_max, again.reflow.B_max_per_gpu) == (256, 64)
    # a B_max given outright (reflow tune's B_max search) replaces the per-GPU one
    fixed = rebuild(cfg, {"reflow.B_max": 1000}, source="--b-max")
    assert (fixed.reflow.B_max, fixed.reflow.B_max_per_gpu) == (1000, None)


def refused_by(raw: dict, mode: str) -> list[str]:
    """The fields a recipe file sets for its own mode that ``mode`` refuses."""
    refused = []
    if mode == "colocated_sync" and raw.get("resources", {}).get("initial_ratio") is not None:
        refused.append("resources.initial_ratio")
    if mode != "reflow" and (raw.get("reflow", {}).get("sigma") or 0) > 0:
        refused.append("reflow.sigma")
    for dotted in BASELINE_FIXED:
        section, name = dotted.split(".")
        if mode in BASELINES and raw.get(section, {}).get(name):
            refused.append(dotted)
    return refused


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_one_set_runs_a_shipped_recipe_in_any_mode(recipe, mode):
    # comparing a recipe with a baseline is one --set: what the file set for its own mode
    # and this one refuses is left out, in one note naming each field; the rest is kept
    notes: list[str] = []
    cfg = load_recipe(recipe, [f"reflow.mode={mode}"], on_note=notes.append)
    base = load_recipe(recipe, on_note=notes.append)
    assert cfg.reflow.mode == mode
    refused = refused_by(yaml.safe_load(recipe.read_text()), mode)
    if refused:
        assert len(notes) == 1 and "\n" not in notes[0]
        verb = "does" if len(refused) == 1 else "do"
        assert notes[0].startswith(f"note: --set reflow.mode={mode}: ")
        assert notes[0].endswith(f" from {recipe} {verb} not apply to this mode; left out")
        named = re.findall(r"([a-z_]+\.[a-z_]+) \S+ \(", notes[0])
        assert sorted(named) == sorted(refused)
    else:
        assert notes == []
    if mode != "reflow":  # the baseline's own values in place of the file's
        assert cfg.reflow.sigma == 0.0
        assert not cfg.scheduler.auto_rebalance and not cfg.scheduler.adaptive_caps
    else:
        assert cfg == base
    if mode == "colocated_sync":
        assert cfg.resources.initial_ratio == f"{cfg.world_size}:0"
    else:
        assert cfg.resources.initial_ratio == base.resources.initial_ratio
    for section in ("model", "data", "workload", "algorithm", "train", "engine", "slurm"):
        assert getattr(cfg, section) == getattr(base, section)
    assert (cfg.reflow.tau, cfg.reflow.delta, cfg.reflow.B_max, cfg.world_size) == (
        base.reflow.tau,
        base.reflow.delta,
        base.reflow.B_max,
        base.world_size,
    )


def test_the_note_names_each_field_left_out_and_its_file(capsys):
    demo = REPO / "recipes" / "demo.yaml"
    load_recipe(demo, ["train.steps=4", "reflow.mode=colocated_sync"])
    printed = capsys.readouterr()
    assert printed.out == ""  # stderr: --json output stays parseable
    assert printed.err == (
        "note: --set reflow.mode=colocated_sync: resources.initial_ratio 2:2 (every rank "
        "plays both roles in turn), reflow.sigma 0.5 (replay is off in mode=colocated_sync) "
        f"from {demo} do not apply to this mode; left out\n"
    )
    notes: list[str] = []
    load_recipe(REPO / "recipes" / "dapo_math.yaml", ["reflow.mode=async"], on_note=notes.append)
    assert notes == [
        "note: --set reflow.mode=async: reflow.sigma 0.5 (replay is off in mode=async), "
        "scheduler.auto_rebalance true (the baselines keep their placement) from "
        f"{REPO / 'recipes' / 'dapo_math.yaml'} do not apply to this mode; left out"
    ]
    # a field the --set items put right themselves is theirs, not left out
    sets = ["reflow.mode=colocated_sync", "resources.initial_ratio=null", "reflow.sigma=0"]
    assert load_recipe(demo, sets, on_note=notes.append).resources.initial_ratio == "4:0"
    assert len(notes) == 1


def test_a_contradiction_within_the_file_or_within_the_sets_is_still_refused(tmp_path):
    notes: list[str] = []
    ratio = (
        "resources.initial_ratio: '2:2' does not apply to mode=colocated_sync (every rank "
        "plays both roles in turn): leave it unset (null)"
    )
    path = write(tmp_path, "reflow: {mode: colocated_sync}\nresources: {initial_ratio: '2:2'}")
    # the file contradicts itself; a --set of its own mode changes nothing to yield to
    for sets in ([], ["reflow.mode=colocated_sync"]):
        with pytest.raises(RecipeError) as info:
            load_recipe(path, sets, on_note=notes.append)
        assert str(info.value) == f"{path}: {ratio}"
    path = write(tmp_path, "reflow: {mode: async, sigma: 0.5}")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["reflow.mode=async"], on_note=notes.append)
    assert (
        str(info.value)
        == f"{path}: reflow.sigma: 0.5 needs mode=reflow (replay is off in mode=async)"
    )
    # both on the command line: the --set that the mode refuses is named
    demo = REPO / "recipes" / "demo.yaml"
    for sets, message in [
        (["reflow.mode=colocated_sync", "resources.initial_ratio=2:2"], ratio),
        (
            ["reflow.mode=async", "reflow.sigma=0.3"],
            "reflow.sigma: 0.3 needs mode=reflow (replay is off in mode=async)",
        ),
        (
            ["reflow.mode=async", "scheduler.auto_rebalance=true"],
            "scheduler.auto_rebalance: true is not part of mode=async (the baselines keep "
            "their placement)",
        ),
    ]:
        with pytest.raises(RecipeError) as info:
            load_recipe(demo, sets, on_note=notes.append)
        assert str(info.value) == f"{demo} (--set {sets[1]}): {message}"
    assert notes == []  # refused: nothing was left out


def test_the_command_line_notes_a_field_left_out_and_refuses_a_contradiction():
    from tests.helpers import reflow

    demo = "recipes/demo.yaml"
    done = reflow("plan", demo, "--set", "reflow.mode=colocated_sync")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "note: --set reflow.mode=colocated_sync: resources.initial_ratio 2:2 (every rank "
        "plays both roles in turn), reflow.sigma 0.5 (replay is off in mode=colocated_sync) "
        f"from {demo} do not apply to this mode; left out"
    ]
    done = reflow(
        "plan", demo, "--set", "reflow.mode=colocated_sync", "--set", "resources.initial_ratio=2:2"
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"reflow: {demo} (--set resources.initial_ratio=2:2): resources.initial_ratio: '2:2' "
        "does not apply to mode=colocated_sync (every rank plays both roles in turn): leave "
        "it unset (null)"
    ]


def test_the_sandbox_is_sized_for_a_node_of_the_recipe():
    """Every conversation of every engine on a node may be in the sandbox at once, each
    holding up to max(2, parallel) processes: the uid pool has a uid for each."""
    cfg = load_recipe(REPO / "recipes" / "apps_coding.yaml")
    assert cfg.sandbox.concurrency == cfg.scheduler.max_concurrency == 128
    assert cfg.resources.gpus_per_node == 8 and cfg.sandbox.parallel == 4
    assert cfg.sandbox.uid_slots == 8 * 128 * 4
    given = load_recipe(
        REPO / "recipes" / "apps_coding.yaml", ["sandbox.concurrency=16", "sandbox.uid_slots=100"]
    )
    assert (given.sandbox.concurrency, given.sandbox.uid_slots) == (16, 100)
    with pytest.raises(RecipeError, match=r"sandbox.uid_slots: .* pass 2147483647"):
        load_recipe(REPO / "recipes" / "apps_coding.yaml", ["sandbox.uid_base=2147483000"])


def test_a_rebuilt_config_sizes_its_sandbox_again():
    """The simulator's --gpus gives rollout replicas a new size: a node's engines, and so
    its uid pool, change with it (the old derived pool was carried over before); a size the
    recipe gave stays."""
    cfg = load_recipe(REPO / "recipes" / "apps_coding.yaml")
    assert cfg.resources.rollout_gpus_per_replica == 1 and cfg.sandbox.uid_slots == 4096
    wider = rebuild(
        cfg,
        {"resources.rollout_gpus_per_replica": 2, "scheduler.max_concurrency": 64},
        source="--gpus 16",
    )
    assert wider.sandbox.concurrency == 64
    assert wider.sandbox.uid_slots == 4 * 64 * 4
    given = load_recipe(
        REPO / "recipes" / "apps_coding.yaml", ["sandbox.concurrency=16", "sandbox.uid_slots=100"]
    )
    kept = rebuild(given, {"resources.rollout_gpus_per_replica": 2}, source="--gpus 16")
    assert (kept.sandbox.concurrency, kept.sandbox.uid_slots) == (16, 100)
    named = rebuild(cfg, {"sandbox.uid_slots": 512}, source="x")
    assert named.sandbox.uid_slots == 512

"""The CPU route source (runtime/engines/vllm/route_probe.py): each input position routed
by the policy version that read it, from copies of the versions the engine loaded."""

import numpy as np
import pytest

from runtime.checkpoint_layout import to_hub
from runtime.data.routes import ExpertRoutes
from runtime.data.sample import Sample
from runtime.embedded.tiny_qwen3 import build_moe_model, build_tokenizer, save_pretrained
from runtime.engines.torch.route_replay import routes_of
from runtime.engines.vllm.route_probe import RouteProbe, position_versions

pytestmark = pytest.mark.unit


def test_a_position_is_routed_by_the_version_that_read_it():
    # 3 prompt tokens, 4 response tokens: v0 sampled tokens 0-1, v2 tokens 2-3
    assert position_versions(3, 4, [(0, 0, 2), (2, 2, 4)]) == [0, 0, 0, 0, 2, 2]


def test_the_probe_routes_each_span_with_its_own_version(tmp_path):
    from safetensors.torch import save_file

    base = save_pretrained(build_moe_model(seed=5), build_tokenizer(), tmp_path / "base")
    later = build_moe_model(seed=6)  # version 3: other weights, other routes
    (tmp_path / "v3").mkdir()
    tied = {
        k: v.contiguous() for k, v in to_hub(later.state_dict()).items() if k != "lm_head.weight"
    }
    save_file(tied, str(tmp_path / "v3" / "model.safetensors"))
    probe = RouteProbe(str(base), keep=2)
    probe.load(3, str(tmp_path / "v3"))
    prompt, response = [1, 7, 14], [9, 17, 5, 6]
    s = Sample(
        sample_id=0,
        group_id=0,
        prompt_id=0,
        versions=[(0, 0, 2), (3, 2, 4)],
        prompt_token_ids=prompt,
        token_ids=response,
        logprobs=[-1.0] * 4,
        n_valid=4,
        reward=0.0,
    )
    got = ExpertRoutes.from_bytes(probe.routes(s)).array()
    first = routes_of(probe.models[0], prompt, response)
    second = routes_of(later.eval(), prompt, response)
    assert np.array_equal(got[:4], first[:4]) and np.array_equal(got[4:], second[4:])
    assert not np.array_equal(first, second)  # the versions route differently
    # a version no longer kept: no routes rather than another version's
    probe.load(4, str(tmp_path / "v3"))  # keep 2: version 0 goes
    assert probe.routes(s) is None
    assert list(probe.models) == [3, 4]


def test_a_loaded_version_is_its_own_weights_without_the_base_checkpoint(tmp_path):
    # a version's copy is built from a kept one in memory: the base checkpoint is read
    # once, at the start, not again at every sync (before, each load re-read it)
    import shutil

    import torch
    from safetensors.torch import save_file

    base = save_pretrained(build_moe_model(seed=5), build_tokenizer(), tmp_path / "base")
    probe = RouteProbe(str(base), keep=3)
    shutil.rmtree(base)
    later = build_moe_model(seed=6)
    (tmp_path / "v1").mkdir()
    hub = {
        k: v.contiguous() for k, v in to_hub(later.state_dict()).items() if k != "lm_head.weight"
    }
    save_file(hub, str(tmp_path / "v1" / "model.safetensors"))
    probe.load(1, str(tmp_path / "v1"))
    mine, theirs = probe.models[1].state_dict(), later.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert probe.models[1].lm_head.weight is probe.models[1].model.embed_tokens.weight
    # version 0 kept as it was: the copy shares nothing with it
    assert not torch.equal(
        probe.models[0].model.embed_tokens.weight, mine["model.embed_tokens.weight"]
    )

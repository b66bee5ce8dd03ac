"""The rollout engine on a real vLLM (CPU build): log-probs, weight updates, partial rollout.

One warm engine is shared by the module (engine start is ~15 s here).
"""

import asyncio
import threading
from pathlib import Path

import pytest
import torch

from runtime.config.recipe import build_config
from runtime.embedded.tiny_qwen3 import BOS, build_model, build_tokenizer, save_pretrained


def hf_logprobs(path: Path, prompt: list[int], tokens: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0, :-1], -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    root = tmp_path_factory.mktemp("w")
    return (
        save_pretrained(build_model(seed=0), build_tokenizer(), root / "a"),
        save_pretrained(build_model(seed=1), build_tokenizer(), root / "b"),
    )


@pytest.fixture(scope="module")
def engine(weights):
    from runtime.engines.vllm.engine import VLLMEngine
    from runtime.engines.vllm.settings import VLLMEngineConfig

    cfg = build_config(
        {
            "model": {"path": str(weights[0]), "max_seq_len": 512},
            "engine": {"kv_cache_memory_bytes": 64 << 20},
            "workload": {"max_response_tokens": 400},
        }
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    eng = VLLMEngine(str(weights[0]), VLLMEngineConfig.from_config(cfg))

    def run(coro, timeout=120):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    run(eng.start(0), timeout=300)
    yield eng, run, loop
    eng.shutdown()
    loop.call_soon_threadsafe(loop.stop)


PROMPT = [BOS, 7, 14, 9, 17]


def test_logprobs_are_the_models(engine, weights):
    eng, run, _ = engine
    tokens, logprobs, spans, _ = run(eng.generate("lp", PROMPT, 24, ignore_eos=True))
    assert len(tokens) == 24 and spans == [(0, 0, 24)]
    ref = hf_logprobs(weights[0], PROMPT, tokens)
    assert max(abs(a - b) for a, b in zip(logprobs, ref, strict=True)) < 1e-3


def test_partial_rollout_spans_two_versions_and_uses_the_new_weights(engine, weights):
    eng, run, loop = engine
    long = asyncio.run_coroutine_threadsafe(
        eng.generate("held", PROMPT, 380, ignore_eos=True), loop
    )
    # Let it produce some tokens under version 0, then update weights mid-generation.
    import time

    time.sleep(0.3)
    assert not long.done(), "generation finished before the update; make it longer"
    took = run(eng.update_weights(str(weights[1]), 1))
    tokens, logprobs, spans, finish = long.result(120)
    assert finish == "length" and len(tokens) == 380
    assert [v for v, _, _ in spans] == [0, 1], spans
    cut = spans[0][2]
    assert 0 < cut < 380 and spans[1] == (1, cut, 380)
    # Tokens after the cut were sampled by the new weights: their log-probs are the new
    # model's under teacher forcing (KV cache recomputed after the update).
    new = hf_logprobs(weights[1], PROMPT, tokens)
    old = hf_logprobs(weights[0], PROMPT, tokens)
    after = range(cut + 1, 380)
    assert max(abs(logprobs[i] - new[i]) for i in after) < 1e-3
    assert max(abs(logprobs[i] - old[i]) for i in after) > 1e-2
    before = range(0, cut)
    assert max(abs(logprobs[i] - old[i]) for i in before) < 1e-3
    assert took < 30
    # Back to version 0 weights for the other tests of the module.
    run(eng.update_weights(str(weights[0]), 2))


def test_abort_ends_a_request(engine):
    eng, run, loop = engine
    fut = asyncio.run_coroutine_threadsafe(eng.generate("ab", PROMPT, 380, ignore_eos=True), loop)
    import time

    time.sleep(0.2)
    run(eng.abort(["ab"]))
    tokens, _, _, finish = fut.result(60)
    assert finish == "abort" and len(tokens) < 380


def test_a_turn_cut_by_a_stop_continues_from_its_last_token(engine, weights):
    """What a stop keeps (runtime/workloads/agents/base.py): the tokens of a generation cut
    off by an abort, with their log-probs; continued after the resume on prompt + those
    tokens, the turn is the one an uninterrupted generation would be: every log-prob the
    model's on the whole sequence, and its length budget the turn's."""
    import time

    from runtime.workloads.agents.base import AgentEnv
    from runtime.workloads.agents.settings import AgentEnvConfig

    eng, run, loop = engine

    class LongTurns:  # no early EOS, so that the stop lands inside the turn
        async def generate_turn(self, request_id, prompt_ids, max_tokens, stop):
            return await eng.generate_turn(request_id, prompt_ids, max_tokens, stop, True)

    cfg = build_config({"model": {"max_seq_len": 512}, "workload": {"max_response_tokens": 300}})
    env = AgentEnv(AgentEnvConfig.from_config(cfg), None, LongTurns(), None, None)
    ep = env.episode("cut", {"prompt_ids": PROMPT})
    fut = asyncio.run_coroutine_threadsafe(env.generate(ep, "cut"), loop)
    time.sleep(0.3)
    run(eng.abort(["cut"]))
    cut = fut.result(60)
    assert cut.finish == "abort" and 0 < len(cut.tokens) < 300, len(cut.tokens)
    parked = ep.parked_rollout()
    assert parked is not None and parked.token_ids == cut.tokens

    resumed = AgentEnv(AgentEnvConfig.from_config(cfg), None, LongTurns(), None, None)
    resumed.resume("cut", parked)
    again = resumed.episode("cut", {"prompt_ids": PROMPT})
    whole = run(resumed.generate(again, "cut"))
    k = len(cut.tokens)
    assert whole.tokens[:k] == cut.tokens and whole.logprobs[:k] == cut.logprobs
    assert len(whole.tokens) == 300 and whole.finish == "length"
    ref = hf_logprobs(weights[0], PROMPT, whole.tokens)
    assert max(abs(a - b) for a, b in zip(whole.logprobs, ref, strict=True)) < 1e-3
    assert again.info["resumed_tokens"] == k


def test_a_rollout_side_told_to_park_reports_what_it_had_generated(engine):
    """``VLLMRolloutSide`` at a stop (``Park``): the request in flight is aborted on the
    engine, its episode's tokens so far come back in ``Parked`` (a parked rollout the wire
    and rank 0 accept), and nothing starts afterwards."""
    import time

    from runtime.data.sample import Request, Turn
    from runtime.engines.vllm.eval_player import EvalPlayer
    from runtime.engines.vllm.rollout import VLLMRolloutSide
    from runtime.rank.rollout_loop import RolloutSide
    from runtime.transport import frames as wire
    from runtime.transport import protocol as p
    from runtime.workloads.agents.base import AgentEnv
    from runtime.workloads.agents.settings import AgentEnvConfig
    from runtime.workloads.agents.single_turn import ArithAgent

    eng, _run, loop = engine

    class LongTurns:  # no early EOS, so that the stop lands inside the turn
        async def generate_turn(self, request_id, prompt_ids, max_tokens, stop):
            return await eng.generate_turn(request_id, prompt_ids, max_tokens, stop, True)

    cfg = build_config({"model": {"max_seq_len": 512}, "workload": {"max_response_tokens": 400}})
    side = VLLMRolloutSide.__new__(VLLMRolloutSide)  # on the module's warm engine
    RolloutSide.__init__(side, cfg, 2)
    side.cfg, side._loop, side.engine, side._updating = cfg, loop, eng, None
    side.agent, side.env = (
        ArithAgent(),
        AgentEnv(AgentEnvConfig.from_config(cfg), None, LongTurns(), None, None),
    )
    side.evals = EvalPlayer(  # none handed out
        AgentEnvConfig.from_config(cfg),
        lambda name: None,
        1.0,
        eng,
        None,
        None,
        side.agent,
        side._call,
    )
    sent: list[p.Message] = []
    side.attach(sent.append, 2)
    prompt = {"prompt_ids": PROMPT, "answer": 3}
    side.on_message(wire.work_message([Request(7, 1, 1, prompt)], 0))
    deadline = time.monotonic() + 60
    while not side.env.generating and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # some tokens in
    side.on_message(p.Park(step=1))
    (report,) = [m for m in sent if isinstance(m, p.Parked)]
    (cut,) = wire.parked(p.decode(p.encode(report))).values()
    assert 0 < len(cut) < 400 and cut.turns == [Turn(0, len(cut), "abort", None)]
    assert cut.versions == [(eng.version, 0, len(cut))] and not side.env.episodes
    side.on_message(wire.work_message([Request(8, 1, 1, prompt)], 0))
    assert side.loop.running == {}  # parked: nothing starts again


def test_sleep_levels_on_cpu_are_a_state_and_the_engine_generates_after_waking(engine):
    """The CPU build has no sleep mode: the role-switch state machine still runs (level,
    weights kept), the device work is skipped."""
    eng, run, _ = engine
    assert not eng.can_sleep and eng.sleep_level == 0
    run(eng.sleep(2))
    assert eng.sleep_level == 2 and eng.weights_valid  # nothing dropped on CPU
    run(eng.sleep(1))
    assert eng.sleep_level == 2  # asleep already: the first level stands
    with pytest.raises(ValueError, match="level 3"):
        run(eng.sleep(3))
    run(eng.wake_up())
    assert eng.sleep_level == 0
    tokens, _, spans, _ = run(eng.generate("woken", PROMPT, 8, ignore_eos=True))
    assert len(tokens) == 8 and spans[0][0] == eng.version

import random

from runtime.embedded.arith import Problem, eval_problems, reward, sample_problem
from runtime.embedded.tiny_qwen3 import EOS, VOCAB, decode, encode


def test_response_lengths_are_long_tailed():
    rng = random.Random(0)
    lengths = sorted(len(sample_problem(rng).solution_ids()) for _ in range(20000))
    p50, p99 = lengths[len(lengths) // 2], lengths[int(len(lengths) * 0.99)]
    assert p99 / p50 >= 4, (p50, p99)


def test_worked_solutions_score_and_wrong_ones_do_not():
    for prob in eval_problems(200):
        assert reward(prob.solution(), prob.answer) == 1.0
        wrong = prob.solution().rsplit("#", 1)[0] + f"#{prob.answer + 1}"
        assert reward(wrong, prob.answer) == 0.0
        assert reward(prob.solution().replace("#", ""), prob.answer) == 0.0


def test_solution_format():
    p = Problem((3, 5, 2, 7))
    assert p.prompt == "S3+5+2+7="
    assert p.solution() == "3+5=8;8+2=10;10+7=17;#17"
    assert p.solution_ids()[-1] == EOS
    assert decode(encode(p.solution())) == p.solution()


def test_the_tokenizer_is_an_ordinary_hf_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained

    save_pretrained(build_model(), build_tokenizer(), tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok("S3+5=").input_ids == encode("S3+5=")
    assert tok.eos_token_id == EOS and len(tok) == len(VOCAB)
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()

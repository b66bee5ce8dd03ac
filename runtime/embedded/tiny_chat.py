"""The embedded chat model for the text workloads (math, code agent, tool reasoning) on
CPU: the tiny Qwen3 architecture with a byte-level tokenizer (every UTF-8 byte is a
token, so any prompt encodes) and ChatML turns (``<|im_start|>``/``<|im_end|>``, as Qwen
writes them).

It is built and cached like the arithmetic model, after a short supervised warm start
on synthetic conversations in the three workloads' formats: a boxed answer, a fenced
program, a ``<code>`` tool call followed by its ``<interpreter>`` output. It learns the
formats, not the tasks: enough for the agent loops' every path (program runs, feedback
turns, tool calls, masks) to run on real data with a model this size, which is what the
CPU recipes are for.
"""

from __future__ import annotations

import random
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    vocab.update({ch: len(SPECIALS) + i for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


VOCAB_SIZE = len(SPECIALS) + 256
PAD, BOS, EOS = 0, 1, 2


def build_model(seed: int = 0):
    from runtime.embedded.tiny_qwen3 import build_model as build

    return build(seed, vocab_size=VOCAB_SIZE, specials=(BOS, EOS, PAD), max_positions=2048)


# --- format warm start -----------------------------------------------------------------

# About a minute on two CPU cores, once; the formats are learned, the arithmetic is not.
SFT = {"steps": 300, "batch": 32, "lr": 3e-3, "seed": 0, "version": 2}


def embedded_chat_model_path() -> Path:
    from runtime.embedded.tiny_qwen3 import save_pretrained
    from runtime.embedded.warm_start import cached_build

    def build(folder: Path) -> None:
        tok = build_tokenizer()
        model, _ = warm_start(
            build_model(SFT["seed"]), tok, SFT["steps"], SFT["batch"], SFT["lr"], SFT["seed"]
        )
        save_pretrained(model, tok, folder)

    return cached_build("tiny-qwen3-chat", SFT, build)


_WORDS = (  # noqa: SIM905
    "the a of to and in is for how many much each total more than if she he they it has "
    "had sold bought makes pays costs apples books miles hours dollars minutes friends "
    "week day year store school garden train car water cookies pages students given list "
    "string number numbers function returns write find sum product largest smallest"
).split()


def _filler(rng: random.Random) -> str:
    """Problem-like text: the real prompts differ, the formats must key on the suffix."""
    words = [rng.choice(_WORDS) for _ in range(rng.randint(0, 60))]
    for i in range(0, len(words), 9):
        words[i] = str(rng.randint(1, 500))
    return (" ".join(words) + ". ") if words else ""


def synthetic_conversation(rng: random.Random) -> tuple[str, str]:
    """(user message, assistant reply) in one of the three workloads' formats."""
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    kind = rng.randrange(3)
    if kind == 0:
        return (
            f"{_filler(rng)}What is {a} {op} {b}? Put the final answer in \\boxed{{}}.",
            f"{a} {op} {b} = {value}, so the answer is \\boxed{{{value}}}.",
        )
    if kind == 1:
        return (
            f"Write a Python program. {_filler(rng)}It must pass: assert f({a}, {b}) == {value}",
            f"```python\ndef f(a, b):\n    return a {op} b\n```",
        )
    return (
        f"{_filler(rng)}Compute {a} {op} {b}. You may run Python code in <code></code>.",
        f"<code>print({a} {op} {b})</code>\n<interpreter>\n{value}\n</interpreter>\n"
        f"The answer is \\boxed{{{value}}}.",
    )


def warm_start(model, tokenizer, steps: int, batch: int, lr: float, seed: int):
    import torch

    from runtime.embedded.warm_start import sft_step

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        rows = []
        for _ in range(batch):
            user, reply = synthetic_conversation(rng)
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False
            )
            p_ids = tokenizer.encode(prompt, add_special_tokens=False)
            r_ids = tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)
            rows.append((p_ids, r_ids))
        loss = sft_step(model, opt, rows, PAD)
    model.eval()
    return model, float(loss)

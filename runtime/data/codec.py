"""Text <-> token ids for the rollout side's agent loops.

Agents think in text (extract a program, append test feedback) and the engine in token
ids. A codec turns a user message into the model's input ids (its chat template) and an
environment turn into the ids appended to the context:

- :class:`CharCodec`: the embedded arithmetic model's character vocabulary (no chat);
- :class:`ChatCodec`: a Hugging Face tokenizer with a chat template. Turns after the first
  are written in ChatML (``<|im_end|>`` / ``<|im_start|>user``), the Qwen family's format,
  the only one the shipped recipes use.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol


class Codec(Protocol):
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def prompt_ids(self, text: str) -> list[int]:
        """The first user message, ready for the assistant's reply."""
        ...

    def user_turn_ids(self, text: str, closed: bool) -> list[int]:
        """A new user message after an assistant reply (``closed``: it ended with EOS),
        ready for the next reply."""
        ...


class CharCodec:
    def __init__(self) -> None:
        from runtime.embedded.tiny_qwen3 import BOS, EOS

        self.bos_id, self.eos_id = BOS, EOS

    def encode(self, text: str) -> list[int]:
        from runtime.embedded.tiny_qwen3 import encode

        return encode(text)

    def decode(self, ids: list[int]) -> str:
        from runtime.embedded.tiny_qwen3 import decode

        return decode(ids)

    def prompt_ids(self, text: str) -> list[int]:
        return [self.bos_id, *self.encode(text)]

    def user_turn_ids(self, text: str, closed: bool) -> list[int]:
        return self.encode(text)


class ChatCodec:
    def __init__(self, path: str | None = None, tokenizer=None) -> None:
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path)
        self.tok = tokenizer
        self.eos_id = self.tok.convert_tokens_to_ids("<|im_end|>")
        if self.eos_id is None or self.eos_id == self.tok.unk_token_id:
            self.eos_id = self.tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def prompt_ids(self, text: str) -> list[int]:
        messages = [{"role": "user", "content": text}]
        if self.tok.chat_template:
            rendered = self.tok.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            return self.encode(rendered)
        return self.encode(text)

    def user_turn_ids(self, text: str, closed: bool) -> list[int]:
        close = "" if closed else "<|im_end|>"
        return self.encode(f"{close}\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


@lru_cache(maxsize=4)
def codec_for(model_path: str, embedded_name: str) -> Codec:
    """The codec of a resolved model folder; ``embedded_name`` is the recipe's model.path."""
    from runtime.embedded.resolve import ARITH_MODELS

    return CharCodec() if embedded_name in ARITH_MODELS else ChatCodec(model_path)

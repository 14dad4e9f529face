"""The load client's prompts, each exactly its planned length in the model's tokens.

Fresh prompts are random token ids: no two share a cached block. A workload whose tenants share prefixes
is sent as text instead, because Ray Serve LLM's prefix-aware router matches prompt *text* (a prompt of token
ids gives it nothing to match): words that are each one token of the model's tokenizer, so a prompt of N
words is N tokens. A prefix's words come from a generator seeded by its id, so every system in a run, and
every run, sees the same prefix text.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from bench.workload import PlannedRequest

_WORD = re.compile(r" [a-z]{2,}")  # one space, then letters: a pre-token of its own in a byte-level BPE


class Prompts:
    """Prompts for one model: token ids, or text of one-token words."""

    def __init__(self, vocab: int, words: list[str] | None = None) -> None:
        self.vocab = vocab  # random ids stay below it
        self._words = words or []

    @classmethod
    def for_model(cls, model_path: Path) -> "Prompts":
        """Prompts in the tokens of the model at ``model_path``."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        return cls(len(tokenizer), one_token_words(tokenizer))

    def for_workload(self, workload: list[PlannedRequest], rng: random.Random) -> dict[str, list[int] | str]:
        """Every request's prompt by id: text when any request opens with a shared prefix, else token ids."""
        if not any(request.prefix_id for request in workload):
            return {r.request_id: [rng.randrange(16, self.vocab) for _ in range(r.prompt_tokens)]
                    for r in workload}
        if not self._words:
            raise RuntimeError("this tokenizer has no one-token words to write shared-prefix prompts in")
        return {r.request_id: self._text(r, rng) for r in workload}

    def _text(self, request: PlannedRequest, rng: random.Random) -> str:
        prefix = ""
        if request.prefix_id is not None:
            seeded = random.Random(request.prefix_id)  # a str seed is hashed with SHA-512: the same everywhere
            prefix = "".join(seeded.choice(self._words) for _ in range(request.prefix_tokens))
        fresh = request.prompt_tokens - request.prefix_tokens  # prefix_tokens is 0 without a prefix
        return prefix + "".join(rng.choice(self._words) for _ in range(max(1, fresh)))


def one_token_words(tokenizer, limit: int = 2_000) -> list[str]:
    """Up to ``limit`` of the vocabulary's " word" tokens that encode back to themselves alone, in id order
    (a 128k vocabulary is not walked to its end)."""
    words: list[str] = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if _WORD.fullmatch(text) and tokenizer(text, add_special_tokens=False).input_ids == [token_id]:
            words.append(text)
            if len(words) == limit:
                break
    return words

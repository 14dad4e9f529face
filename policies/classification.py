"""Request classification: length class and cost estimate from the counted prompt tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LengthClass:
    """A named range of prompt lengths: prompts of at most ``max_prompt_tokens`` (None: no upper bound)."""

    name: str
    max_prompt_tokens: int | None = None


@dataclass(frozen=True)
class LengthClasses:
    """Ordered prompt-length classes, shortest first; the last one is unbounded.

    A prompt belongs to the first class whose ``max_prompt_tokens`` it does not exceed. The default is two
    classes: ``short`` (at most 512 tokens) and ``long``.
    """

    classes: tuple[LengthClass, ...] = (LengthClass("short", 512), LengthClass("long"))

    def __post_init__(self) -> None:
        if not self.classes or self.classes[-1].max_prompt_tokens is not None:
            raise ValueError("the last length class must be unbounded (max_prompt_tokens: null)")
        bounds = [c.max_prompt_tokens for c in self.classes[:-1]]
        if any(b is None for b in bounds) or bounds != sorted(set(bounds)):  # type: ignore[type-var]
            raise ValueError("length classes must have strictly increasing bounds, shortest first")
        if len({c.name for c in self.classes}) != len(self.classes):
            raise ValueError("length class names must be unique")

    @classmethod
    def from_bounds(cls, bounds: Sequence[tuple[str, int | None]]) -> LengthClasses:
        """Classes from (name, max_prompt_tokens) pairs, shortest first."""
        return cls(tuple(LengthClass(name, bound) for name, bound in bounds))

    @property
    def names(self) -> list[str]:
        """Class names, shortest first."""
        return [c.name for c in self.classes]

    def classify(self, prompt_tokens: int) -> str:
        """The length class of a prompt of ``prompt_tokens`` tokens."""
        for length_class in self.classes:
            if length_class.max_prompt_tokens is None or prompt_tokens <= length_class.max_prompt_tokens:
                return length_class.name
        raise AssertionError("unreachable: the last class is unbounded")


def estimate_cost(prompt_tokens: int, max_tokens: int | None, default_output_tokens: int, max_model_len: int,
                  sequences: int = 1) -> int:
    """Tokens a request is expected to cost: its prompt plus the output it may produce, for each of the
    ``sequences`` it asks for (``n``, or the beam width).

    ``max_tokens`` bounds the output when the client sets it; otherwise a configured typical output length,
    never beyond what the context leaves.
    """
    room = max(max_model_len - prompt_tokens, 1)
    output = max_tokens if max_tokens is not None else default_output_tokens
    return prompt_tokens + max(1, sequences) * max(1, min(output, room))


def estimate_batch_cost(prompts: Sequence[int], max_tokens: int | None, default_output_tokens: int,
                        max_model_len: int, sequences: int = 1) -> int:
    """A batch of prompts (a completions request's list) costs each prompt's estimate."""
    return sum(estimate_cost(p, max_tokens, default_output_tokens, max_model_len, sequences) for p in prompts)

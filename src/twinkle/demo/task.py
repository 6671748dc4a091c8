"""The task: copy a digit string. A verifiable reward a tiny model learns in minutes.

Prompt: ``BOS d1 .. dk SEP`` (k digits, k in [min_digits, max_digits]). The model answers
with digits and ends with ``EOS``. Reward in [0, 1], with partial credit: 0.8 times the
fraction of the k digits answered correctly in place, plus 0.2 when the answer has
exactly k digits.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

__all__ = [
    "BOS",
    "EOS",
    "SEP",
    "VOCAB",
    "make_prompts",
    "max_response_tokens",
    "reward",
]

DIGITS = 10
BOS, SEP, EOS, PAD = 10, 11, 12, 13
VOCAB = 14


def max_response_tokens(max_digits: int) -> int:
    """Room for every digit, one extra, and EOS."""
    return max_digits + 2


def make_prompts(rng: random.Random, n: int, min_digits: int, max_digits: int) -> list[list[int]]:
    """``n`` prompts of random digits (token ids), drawn from ``rng``."""
    prompts = []
    for _ in range(n):
        k = rng.randint(min_digits, max_digits)
        prompts.append([BOS, *(rng.randrange(DIGITS) for _ in range(k)), SEP])
    return prompts


def reward(prompt: Sequence[int], response: Sequence[int]) -> float:
    """Partial-credit reward of ``response`` (token ids, EOS-terminated or cut) in [0, 1]."""
    target = list(prompt[1:-1])
    answer = []
    for tok in response:
        if tok == EOS:
            break
        answer.append(tok)
    correct = sum(1 for a, t in zip(answer, target, strict=False) if a == t)
    # 0.8 * (correct / k), not 0.8 * correct / k: 0.8 * 3 / 3 is 0.8000000000000002.
    return 0.8 * (correct / len(target)) + (0.2 if len(answer) == len(target) else 0.0)

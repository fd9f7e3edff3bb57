"""Comparing two policies on the same trials: the paired test the experiment's claim is judged by.

Two arms scored on the same panel see the same trial layouts (trial ``i`` of a panel starts from lab
seed ``episode_seed(eval_seed, i)`` for every arm), so their outcomes pair up trial by trial:

    both succeed | arm only | other only | both fail

Only the discordant trials say which arm is better. ``mcnemar_exact`` is the exact (binomial)
McNemar test on them: under "the arms are equally good", the arm-only count among the n
discordant trials is Binomial(n, 1/2); the two-sided p-value is the probability of a split at
least as uneven. ``paired_difference`` gives the difference in success rate with its 95% interval
(Wald on the paired differences, with Agresti-Min's +1/2 per cell so that 0 or 1 rates keep a
width), from the same table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959964


def binomial_two_sided_p(k: int, n: int) -> float:
    """Exact two-sided p-value of ``k`` successes in ``n`` fair coin flips: the probability of an outcome no
    more likely than ``k`` (for p = 1/2: min(1, 2 * P(X <= min(k, n - k))))."""
    if n == 0:
        return 1.0
    lo = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(lo + 1)) / 2 ** n
    return min(1.0, 2 * tail)


@dataclass
class PairedTable:
    both: int = 0  # both arms succeed
    arm_only: int = 0
    other_only: int = 0
    neither: int = 0

    @property
    def n(self) -> int:
        return self.both + self.arm_only + self.other_only + self.neither

    def add(self, arm: bool, other: bool) -> None:
        if arm and other:
            self.both += 1
        elif arm:
            self.arm_only += 1
        elif other:
            self.other_only += 1
        else:
            self.neither += 1


def paired_table(arm: dict[int, bool], other: dict[int, bool]) -> PairedTable:
    """The 2x2 table of two arms' outcomes on the trials both have (keys: trial seeds); trials only one arm
    has are an error (the panels differ)."""
    if set(arm) != set(other):
        only = sorted(set(arm) ^ set(other))[:5]
        raise ValueError(f"the arms were not scored on the same trials (seeds only one of them has: {only}...)")
    t = PairedTable()
    for seed in sorted(arm):
        t.add(bool(arm[seed]), bool(other[seed]))
    return t


def mcnemar_exact(t: PairedTable) -> float:
    """Exact two-sided McNemar p-value of the table (1.0 when no trial is discordant)."""
    return binomial_two_sided_p(t.arm_only, t.arm_only + t.other_only)


def paired_difference(t: PairedTable, z: float = Z95) -> tuple[float, tuple[float, float]]:
    """Difference in success rate (arm - other) and its 95% interval (Agresti-Min adjusted Wald)."""
    if t.n == 0:
        return 0.0, (-1.0, 1.0)
    diff = (t.arm_only - t.other_only) / t.n
    b, c, n = t.arm_only + 0.5, t.other_only + 0.5, t.n + 2.0
    d = (b - c) / n
    se = math.sqrt(max(0.0, (b + c) - (b - c) ** 2 / n)) / n
    return diff, (max(-1.0, d - z * se), min(1.0, d + z * se))


def meets(res: dict, min_effect: float, alpha: float) -> bool:
    """The pre-registered rule on one paired comparison (``compare``'s result): the arm's success rate higher by
    at least ``min_effect`` and the exact McNemar two-sided p below ``alpha``."""
    return res["effect"] >= min_effect and res["p_value"] < alpha


def rule_text(min_effect: float, alpha: float) -> str:
    return (f"paired on the same trials (every training seed both arms ran): the arm's success rate higher "
            f"by >= {min_effect:g} and the exact McNemar two-sided p < {alpha:g}")


def compare(arm: dict[int, bool], other: dict[int, bool]) -> dict:
    """The paired comparison of two arms' per-trial outcomes: table, effect, interval, exact McNemar p."""
    t = paired_table(arm, other)
    diff, (lo, hi) = paired_difference(t)
    return {"trials": t.n, "both": t.both, "arm_only": t.arm_only, "other_only": t.other_only, "neither": t.neither,
            "effect": diff, "ci95": [lo, hi], "p_value": mcnemar_exact(t), "test": "exact McNemar (two-sided)"}

"""The paired test the experiment's claim is judged by, on tables whose answer is known."""
import math

import pytest

from comsim.pipeline.stats import PairedTable, binomial_two_sided_p, compare, mcnemar_exact, paired_table


def test_exact_mcnemar_on_a_constructed_table():
    # 50 shared trials: 10 both, 8 only the arm, 1 only the other, 31 neither. Only the 9 discordant
    # trials count: P(X <= 1 | Binomial(9, 1/2)) = (1 + 9) / 512, doubled for two sides.
    arm = {i: i < 18 for i in range(50)}                          # trials 0-17 succeed
    other = {i: i < 10 or i == 40 for i in range(50)}             # 0-9 and 40
    res = compare(arm, other)
    assert (res["both"], res["arm_only"], res["other_only"], res["neither"]) == (10, 8, 1, 31)
    assert res["p_value"] == pytest.approx(20 / 512)
    assert res["effect"] == pytest.approx(7 / 50)
    lo, hi = res["ci95"]
    assert lo < 7 / 50 < hi and lo > 0  # significant at 5%: the interval is above 0 as well


def test_the_test_is_symmetric_and_blind_to_concordant_trials():
    t = PairedTable(both=30, arm_only=3, other_only=3, neither=14)
    assert mcnemar_exact(t) == 1.0  # an even split says nothing
    many_ties = PairedTable(both=300, arm_only=6, other_only=0, neither=300)
    assert mcnemar_exact(many_ties) == pytest.approx(2 / 64)  # 6 of 6 discordant: 2 * (1/2)^6
    assert binomial_two_sided_p(2, 10) == binomial_two_sided_p(8, 10) == pytest.approx(2 * 56 / 1024)
    assert binomial_two_sided_p(0, 0) == 1.0 and math.isclose(binomial_two_sided_p(5, 10), 1.0)


def test_arms_scored_on_other_trials_are_refused():
    with pytest.raises(ValueError, match="not scored on the same trials"):
        paired_table({1: True, 2: False}, {1: True, 3: True})


def test_the_claims_rule_needs_both_the_effect_and_the_p_value():
    from comsim.pipeline.stats import meets
    # 16 trials the arm alone wins, 3 the other alone, of 50: +26 points, p = 2320 / 2^19 = 0.0044
    res = compare({i: i < 16 or 19 <= i < 30 for i in range(50)}, {i: 16 <= i < 30 for i in range(50)})
    assert res["effect"] == pytest.approx(0.26) and res["p_value"] == pytest.approx(2320 / 2 ** 19)
    assert meets(res, min_effect=0.10, alpha=0.05)
    assert not meets(res, min_effect=0.30, alpha=0.05)  # significant, but smaller than the effect asked for
    assert not meets(res, min_effect=0.10, alpha=res["p_value"])  # p must be below alpha, not equal to it

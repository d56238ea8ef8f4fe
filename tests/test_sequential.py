"""Group-sequential verdicts (babygpt/sequential.py): the spending boundaries against published values,
and the error rates they keep, checked by simulation with fixed seeds (paired differences drawn with a
known effect, or none)."""

import math

import pytest
import torch

from babygpt.sequential import boundaries, nominal_levels, obrien_fleming_spent, sequential_verdicts

LOOKS = [5, 10, 15, 20, 25, 30]


def test_the_boundaries_are_the_published_lan_demets_obrien_fleming_ones():
    """Five equally spaced looks, two-sided 0.05 (Lan & DeMets 1983's O'Brien-Fleming spending, alpha / 2 a
    side: 4.8769, 3.3569, 2.6803, 2.2898, 2.0310 as gsDesign and ldbounds give them); two looks: 2.9626, 1.9686;
    one look is the fixed-sample test."""
    assert boundaries([1, 2, 3, 4, 5]) == pytest.approx([4.8769, 3.3569, 2.6803, 2.2898, 2.0310], abs=2e-4)
    assert boundaries([5, 10]) == pytest.approx([2.9626, 1.9686], abs=2e-4)
    assert boundaries([10]) == pytest.approx([1.959964], abs=1e-5)
    assert obrien_fleming_spent(1.0, 0.05) == pytest.approx(0.05)
    assert all(a > b for a, b in zip(boundaries(LOOKS), boundaries(LOOKS)[1:]))  # early looks are strict


@pytest.mark.slow
def test_with_known_variance_the_chance_of_ever_crossing_is_alpha():
    """200,000 paths of sums of standard-normal differences, looked at after 5, 10, ..., 30 pairs."""
    generator = torch.Generator().manual_seed(0)
    sums = torch.randn(200_000, LOOKS[-1], generator=generator, dtype=torch.float64).cumsum(dim=1)
    z = torch.stack([sums[:, n - 1] / math.sqrt(n) for n in LOOKS], dim=1)
    crossed = (z.abs() >= torch.tensor(boundaries(LOOKS), dtype=torch.float64)).any(dim=1).double().mean().item()
    assert crossed == pytest.approx(0.05, abs=0.002)  # (MC standard error 0.0005)
    naive = (z.abs() >= 1.959964).any(dim=1).double().mean().item()
    assert naive > 0.10  # looking six times at a fixed 5% would make it more than twice that


def tables(effects: list[float], count: int, seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randn(count, len(effects), LOOKS[-1], generator=generator, dtype=torch.float64)
    return [{f"c{j}": (draws[t, j] + effects[j]).tolist() for j in range(len(effects))} for t in range(count)]


@pytest.mark.slow
def test_a_table_with_no_differences_says_better_or_worse_at_most_alpha_of_the_time():
    """Six comparisons, none with a difference, unit spread, margin 0.5: the chance that a table shows
    any "better" or "worse" is at most 5% (family-wise, over the looks and the rows)."""
    wrong = 0
    for diffs in tables([0.0] * 6, 1500, seed=1):
        paths = sequential_verdicts(diffs, LOOKS, margin=0.5)
        wrong += any(path[-1].verdict in ("better", "worse") for path in paths.values())
    assert wrong / 1500 <= 0.05 + 0.017  # (3 MC standard errors at 5%)


@pytest.mark.slow
def test_equivalence_is_claimed_at_most_alpha_of_the_time_when_the_difference_is_the_margin():
    claimed = 0
    for diffs in tables([0.5], 3000, seed=2):
        claimed += sequential_verdicts(diffs, LOOKS, margin=0.5)["c0"][-1].verdict == "equivalent"
    assert claimed / 3000 <= 0.05 + 0.012


def test_a_real_difference_is_found_with_the_right_sign_and_stops_early():
    found, early, wrong_sign = 0, 0, 0
    for diffs in tables([-1.0], 200, seed=3):
        path = sequential_verdicts(diffs, LOOKS, margin=0.1)["c0"]
        found += path[-1].verdict == "better"
        wrong_sign += path[-1].verdict == "worse"
        early += path[-1].pairs < LOOKS[-1]
    assert found >= 190 and wrong_sign == 0 and early >= 150  # one SD: decided by 10 to 20 pairs


def test_a_decided_comparison_stops_and_keeps_its_verdict():
    diffs = {"clear": [-5.0 + 0.001 * (i % 3) for i in range(30)], "null": [(-1) ** i * 1.0 for i in range(30)]}
    paths = sequential_verdicts(diffs, LOOKS, margin=0.01)
    assert [look.verdict for look in paths["clear"]] == ["better"] * 6 and {look.pairs for look in paths["clear"]} == {5}
    assert [look.pairs for look in paths["null"]] == LOOKS and paths["null"][-1].verdict is None
    assert nominal_levels(LOOKS)[-1] == pytest.approx(2 * (1 - 0.5 * (1 + math.erf(boundaries(LOOKS)[-1] / 2 ** 0.5))))


@pytest.mark.parametrize("looks", [[], [0, 5], [10, 5], [5, 5]])
def test_looks_must_be_increasing_pair_counts(looks):
    with pytest.raises(ValueError, match="looks must be increasing pair counts"):
        boundaries(looks)


def test_the_paths_end_at_the_first_look_an_open_comparison_has_not_reached():
    """Between a campaign's rounds: a decided comparison needs no more pairs; the looks go on while
    every open one has its pairs, and what they say is what the whole data would say up to there."""
    clear = [-5.0 + 0.001 * (i % 3) for i in range(5)]
    null = [(-1) ** i * 1.0 for i in range(12)]
    paths = sequential_verdicts({"clear": clear, "null": null}, LOOKS, margin=0.01)
    assert [look.pairs for look in paths["null"]] == [5, 10] and paths["null"][-1].verdict is None
    assert [look.verdict for look in paths["clear"]] == ["better", "better"]
    whole = sequential_verdicts({"clear": clear + [0.0] * 25, "null": null + [0.0] * 18}, LOOKS, margin=0.01)
    assert [whole[name][:2] for name in whole] == [paths[name] for name in paths]
    assert sequential_verdicts({"clear": clear[:4], "null": null}, LOOKS, margin=0.01) == {"clear": [], "null": []}

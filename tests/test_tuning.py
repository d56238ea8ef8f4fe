"""The LR search (babygpt/tuning.py): mean over tuning seeds, grid extension past an edge, quarter-decade refinement."""

import math

import pytest

from babygpt.tuning import mean_loss, ranked, refinement, round_sig, search_all, snap_half_decade

GRID = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2]


def bowl(best: float, width: float = 1.0):
    """A loss that is lowest at ``best`` and rises by ``width`` per decade squared."""
    return lambda lr: 2.0 + width * math.log10(lr / best) ** 2


def search(loss_by_seed, grid=GRID, max_extensions=3):
    """Run search_all for one configuration whose seed s has loss loss_by_seed(lr, s); returns
    (search, means, every round's LRs)."""
    rounds = []
    tried: dict = {}

    def train_round(wanted):
        rounds.append(sorted(wanted["c"]))
        for lr in wanted["c"]:
            tried[lr] = [loss_by_seed(lr, s) for s in (0, 1)]
        return {"c": dict(tried)}
    (s, means), = search_all({"c": grid}, train_round, max_extensions).values()
    return s, means, rounds


def test_lattice_and_rounding():
    assert [snap_half_decade(x) for x in (3e-2 * math.sqrt(10), 3e-4 / math.sqrt(10), 1e-3 / math.sqrt(10))] == \
        [0.1, 1e-4, 3e-4]
    assert round_sig(math.sqrt(1e-3 * 3e-3)) == 1.7e-3 and round_sig(math.sqrt(3e-3 * 1e-2)) == 5.5e-3
    assert mean_loss([2.0, 2.2]) == pytest.approx(2.1) and mean_loss([2.0, math.inf]) == math.inf
    assert ranked({1e-3: 2.2, 3e-3: 2.0, 1e-2: math.inf, 3e-2: 2.1}) == [3e-3, 3e-2, 1e-3]


def test_an_interior_best_is_refined_to_quarter_decades_and_nothing_more():
    s, means, rounds = search(lambda lr, seed: bowl(3e-3)(lr) + 0.01 * seed)
    assert rounds == [GRID, [1.7e-3, 5.5e-3]]
    assert ranked(means)[0] == 3e-3 and not s.censored(means)
    assert means[3e-3] == pytest.approx(2.005)  # the mean of the two tuning seeds


def test_the_seeds_mean_decides_not_one_seed():
    # seed 0 alone prefers 3e-2 (by 0.012); seed 1 prefers 3e-3 by much more: the mean picks 3e-3
    losses = {3e-4: (2.6, 2.6), 1e-3: (2.4, 2.4), 1.7e-3: (2.36, 2.36), 3e-3: (2.342, 2.30), 5.5e-3: (2.34, 2.36),
              1e-2: (2.335, 2.40), 1.7e-2: (2.40, 2.46), 3e-2: (2.330, 2.45)}
    _, means, _ = search(lambda lr, seed: losses[lr][seed])
    assert ranked(means)[:2] == [3e-3, 5.5e-3]


@pytest.mark.parametrize("best, side, added", [(3e-1, "high", [0.1, 0.3, 1.0]), (2e-5, "low", [1e-4, 3e-5, 1e-5])])
def test_a_best_at_the_edge_extends_the_grid_until_the_loss_rises(best, side, added):
    s, means, rounds = search(lambda lr, seed: bowl(best)(lr))
    extensions = [r[0] for r in rounds[1:] if len(r) == 1]
    assert extensions == added
    top = ranked(means)[0]
    assert min(means) < top < max(means) and not s.censored(means)  # the loss rises on both sides
    assert len(rounds[-1]) == 2 and s.extended[side] == 3  # then the refinement


def test_a_search_that_runs_out_of_extensions_says_it_is_censored():
    s, means, rounds = search(lambda lr, seed: bowl(10.0)(lr), max_extensions=1)
    assert rounds[1] == [0.1] and s.censored(means) and max(means) == 0.1 == ranked(means)[0]
    assert len(rounds) == 3  # the grid, one extension, the one refinement point below the edge
    assert rounds[2] == [round_sig(math.sqrt(0.1 * 3e-2))]


def test_divergence_counts_as_the_loss_rising_and_all_diverged_extends_down():
    diverges_above = lambda lr, seed: math.inf if lr > 1e-2 or (seed == 1 and lr > 5e-3) else bowl(1e-1)(lr)
    _, means, rounds = search(diverges_above)
    assert means[1e-2] == math.inf  # one tuning seed diverged: the LR is out
    assert ranked(means)[0] == 3e-3 and rounds[1] == [1.7e-3, 5.5e-3]
    s, means, rounds = search(lambda lr, seed: math.inf if lr > 3e-5 else 2.5)
    assert [r[0] for r in rounds[1:4]] == [1e-4, 3e-5, 1e-5] and ranked(means)[0] == 1e-5
    assert refinement({1e-3: math.inf, 3e-3: 2.0, 1e-2: 2.1}) == [1.7e-3, 5.5e-3]


def test_every_configuration_searches_at_once_and_each_stops_on_its_own():
    calls = []

    def train_round(wanted):
        calls.append({n: sorted(v) for n, v in wanted.items()})
        out = {}
        for name, best in (("a", 3e-3), ("b", 0.5)):
            lrs = {lr for c in calls for lr in c[name]}
            out[name] = {lr: [bowl(best)(lr)] * 2 for lr in lrs}
        return out
    result = search_all({"a": GRID, "b": GRID}, train_round)
    assert calls[1]["a"] == [1.7e-3, 5.5e-3] and calls[1]["b"] == [0.1]
    assert calls[2]["a"] == [] and calls[2]["b"] == [0.3]
    assert ranked(result["a"][1])[0] == 3e-3 and ranked(result["b"][1])[0] == 0.55
    assert not result["b"][0].censored(result["b"][1])

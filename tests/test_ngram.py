"""babygpt/ngram.py and the references command: the data's n-gram reference losses (the add-one
unigram, Kneser-Ney and modified Kneser-Ney, each against a plain implementation), their
discounts, the floors scored as a transformer is scored (each target with at most the context the
transformer's evaluation gives it: the contexts of consecutive and of sliding windows), their
cache beside the data, and where the floors are used: the command, the plots and the reports,
the whole-split final evaluation and the collapsed status."""

import ast
import collections
import json
import math
import os
import sys

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from babygpt import ngram
from babygpt.config import load_config
from babygpt.data import load_dataset
from babygpt.model import GPT, GPTConfig
from babygpt.ngram import COLLAPSE_MARGIN, is_collapsed
from babygpt.trainer import full_split_loss, train
from conftest import ROOT, TINY_TRAIN_ARGS, once


# --- the add-one unigram -----------------------------------------------------------------------

def counted_unigram(train, val, vocab_size):
    """The add-one unigram cross-entropy of val[2:], written plainly with a Counter."""
    counts, targets = collections.Counter(train.tolist()), val.tolist()[2:]
    return sum(-math.log((counts[c] + 1) / (len(train) + vocab_size)) for c in targets) / len(targets)


@pytest.mark.parametrize("vocab_size", [3, 65, 70000])
def test_unigram_matches_counting(vocab_size):
    gen = np.random.default_rng(vocab_size)
    train = gen.integers(0, min(vocab_size, 50), 3000) % vocab_size
    val = gen.integers(0, min(vocab_size, 50), 400) % vocab_size
    assert ngram.unigram_cross_entropy(train, val, vocab_size) == pytest.approx(
        counted_unigram(train, val, vocab_size), rel=1e-12)


def test_collapse_rule():
    refs = {"unigram": 3.0, "kn5": 1.5}
    assert is_collapsed(3.0, refs) and is_collapsed(4.0, refs) and is_collapsed(3.0 - COLLAPSE_MARGIN + 1e-6, refs)
    assert not is_collapsed(3.0 - COLLAPSE_MARGIN - 1e-6, refs)
    assert not is_collapsed(None, refs) and not is_collapsed(math.nan, refs)


# --- Kneser-Ney against a plain reference ---------------------------------------------------

class DictKneserNey:
    """Interpolated Kneser-Ney of order n written plainly: dictionaries of counts and a recursion
    (Chen & Goodman 1998), to check the vectorised one against. ``discounts[k - 1]`` is order k's
    [D] (plain KN) or [D1, D2, D3+] (modified KN: the discount of an n-gram seen once, twice, three
    times or more, and gamma(h) = D1 N1(h .) + D2 N2(h .) + D3+ N3+(h .))."""

    def __init__(self, train, n, discounts, vocab_size):
        text = [int(c) for c in train]
        self.n, self.discounts, self.vocab_size = n, discounts, vocab_size
        grams = lambda k: [tuple(text[i:i + k]) for i in range(len(text) - k + 1)]  # noqa: E731
        # order n: raw counts c(h c); orders k < n: N1+(. g c), distinct characters seen before g c
        self.counts = {n: collections.Counter(grams(n))}
        for k in range(1, n):
            self.counts[k] = collections.Counter(gram[1:] for gram in set(grams(k + 1)))
        self.totals, self.gamma = {}, {}  # c(h .), and the mass the discounts take off h's followers
        for k, table in self.counts.items():
            self.totals[k], self.gamma[k] = collections.Counter(), collections.Counter()
            for gram, count in table.items():
                self.totals[k][gram[:-1]] += count
                self.gamma[k][gram[:-1]] += self.discount(k, count)

    def discount(self, k: int, count: int) -> float:
        """D of an n-gram of order k seen ``count`` times: the one D of plain KN, else D1, D2 or D3+."""
        ds = self.discounts[k - 1]
        return 0.0 if count == 0 else ds[min(count, len(ds)) - 1]

    def prob(self, context: tuple, c: int, k: int | None = None) -> float:
        """P_k(c | the last k - 1 characters of context)."""
        k = self.n if k is None else k
        if k == 0:
            return 1 / self.vocab_size
        h = tuple(context[len(context) - (k - 1):]) if k > 1 else ()
        lower = self.prob(context, c, k - 1)
        total = self.totals[k][h]
        if total == 0:
            return lower
        count = self.counts[k][h + (c,)]
        return (max(count - self.discount(k, count), 0) + self.gamma[k][h] * lower) / total

    def cross_entropy(self, val, start: int = ngram.FIRST_TARGET) -> float:
        """Mean -log P_n over val[start:], each target with the ``start`` characters before it."""
        val = [int(c) for c in val]
        losses = [-math.log(self.prob(tuple(val[t - start:t]), val[t])) for t in range(start, len(val))]
        return sum(losses) / len(losses)


PLAIN = [[0.3], [0.55], [0.8], [0.95], [0.7]]
MODIFIED = [[0.4, 1.1, 1.7], [0.2, 0.9, 2.5], [0.8, 1.6, 1.2], [0.6, 1.3, 2.9], [0.95, 0.3, 0.05]]


def texts(seed: int, vocab_size: int = 6):
    """(train, val) with repeated phrases and noise, so that contexts are seen, unseen and shared."""
    gen = np.random.default_rng(seed)
    phrase = gen.integers(0, vocab_size - 1, 9)  # the last id is rare: only in the noise
    pieces = [phrase if gen.random() < 0.6 else gen.integers(0, vocab_size, gen.integers(1, 7)) for _ in range(80)]
    text = np.concatenate(pieces)
    return text[:int(len(text) * 0.8)], text[int(len(text) * 0.8):]


@pytest.mark.parametrize("family, discounts", [(ngram.KN, PLAIN), (ngram.MKN, MODIFIED)], ids=["kn", "mkn"])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kneser_ney_matches_a_plain_implementation(family, discounts, n, seed):
    train_ids, val_ids = texts(seed)
    vocab_size = 7  # one id never occurs at all: only the uniform gives it probability
    expected = DictKneserNey(train_ids, n, discounts[:n], vocab_size).cross_entropy(val_ids)
    got = ngram.cross_entropies(train_ids, val_ids, vocab_size, {family.key(n): discounts[:n]})
    assert got == {family.key(n): pytest.approx(expected, abs=1e-9)}


def codes_of(grams, vocab_size):
    return np.array([sum(c * vocab_size ** (len(g) - 1 - i) for i, c in enumerate(g)) for g in grams], dtype=np.int64)


@pytest.mark.parametrize("family, discounts", [(ngram.KN, [[0.2], [0.7], [0.4], [1.0], [0.05]]),
                                               (ngram.MKN, [[1.0, 2.0, 3.0], [0.01, 0.3, 2.2], [0.5, 1.9, 0.1],
                                                            [0.9, 1.2, 1.4], [0.3, 0.6, 2.9]])], ids=["kn", "mkn"])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_every_context_has_a_distribution(family, discounts, n):
    """Sum over the vocabulary of P(c | h) = 1 for contexts seen often, once, and never, and for
    contexts never seen whose end was (partially seen), with discounts up to their bounds."""
    train_ids, _ = texts(2)
    vocab_size = 7
    counts = ngram.Counts(train_ids, n, vocab_size)
    seen = [tuple(int(c) for c in train_ids[i:i + n - 1]) for i in (0, 5, len(train_ids) - n + 1)]
    partly = (6,) + seen[0][1:]  # an unseen context (6 is rare) ending as a seen one does
    contexts = seen + [(6,) * (n - 1), (0, 6, 1, 6, 2)[:n - 1], partly]  # 6 occurs rarely or never in a row
    plain = DictKneserNey(train_ids, n, discounts[:n], vocab_size)
    for h in contexts:
        codes = codes_of([h + (c,) for c in range(vocab_size)], vocab_size)
        levels = counts.lookups(codes, (n,)).levels(family, (n,))[n]
        p = ngram.probabilities(levels, plain.discounts, vocab_size, vocab_size)
        assert p.sum() == pytest.approx(1.0, abs=1e-12) and (p > 0).all()
        assert_close(p, np.array([plain.prob(h, c) for c in range(vocab_size)]), rtol=1e-12, atol=0)


@pytest.mark.slow
def test_discounts_are_chosen_on_train_alone():
    train_ids, val_ids = texts(3)
    chosen = ngram.measure(train_ids, val_ids, 7)
    other_val = ngram.measure(train_ids, np.roll(val_ids, 11)[:-5], 7)
    assert chosen["discounts"] == other_val["discounts"] and chosen["floors"] != other_val["floors"]
    assert ngram.measure(np.roll(train_ids, 40), val_ids, 7)["discounts"] != chosen["discounts"]  # it can tell
    assert list(chosen["discounts"]) == [f"kn{n}" for n in range(2, 11)] + [f"mkn{n}" for n in range(2, 11)]


@pytest.mark.parametrize("family", ngram.FAMILIES, ids=["kn", "mkn"])
@pytest.mark.parametrize("seed, n", [(3, 4), (4, 3), (5, 6)])
def test_discounts_are_within_bounds_and_minimise_the_held_out_loss(family, seed, n):
    """Each discount of class i is in (0, i], and nudging any one of them does not lower the loss
    of the held-out tenth of train they were chosen on."""
    train_ids, _ = texts(seed)
    cut = int(len(train_ids) * 0.9)
    found = ngram.fit_discounts(train_ids, 7, (n,))[family.key(n)]
    assert len(found) == n and all(len(level) == family.classes for level in found)
    assert all(0 < d <= bound for level in found for d, bound in zip(level, family.bounds()))

    def held_out(discounts):
        return ngram.cross_entropies(train_ids[:cut], train_ids[cut:], 7, {family.key(n): discounts})[family.key(n)]
    best = held_out(found)
    for j in range(n):
        for i, bound in enumerate(family.bounds()):
            for step in (-0.02, 0.02):
                nudged = [list(level) for level in found]
                nudged[j][i] = min(max(nudged[j][i] + step, 1e-3), bound)
                assert held_out(nudged) >= best - 1e-9


def test_modified_discounts_start_from_chen_and_goodmans_estimates():
    table = ngram.count_table(np.arange(10), np.array([1, 1, 1, 1, 2, 2, 3, 4, 4, 9]), 5)  # n1..n4 = 4, 2, 1, 2
    y = 4 / (4 + 2 * 2)
    assert ngram.start_discounts(table, ngram.KN) == [pytest.approx(y)]  # = 1 - 2 Y n2 / n1: Ney's estimate
    # D3+ = 3 - 4 Y n4 / n3 = -1 would make a probability negative: it starts at MIN_START instead
    assert ngram.start_discounts(table, ngram.MKN) == pytest.approx([1 - 2 * y * 2 / 4, 2 - 3 * y * 1 / 2, 0.01])
    lonely = ngram.count_table(np.arange(3), np.array([5, 7, 9]), 5)  # no n-gram seen once or twice
    assert ngram.start_discounts(lonely, ngram.MKN) == [0.5, 0.5, 0.5]
    # per context (code // 5: codes 0-4, 5-9), how many followers are seen once, twice, 3 times or more
    assert table.by_class.tolist() == [[4, 0], [1, 1], [0, 4]] and table.totals.tolist() == [6, 22]


def test_floors_keys_order_and_strongest():
    text = np.array([0, 1, 2, 0, 1, 2, 0, 1, 1, 2, 0, 2] * 200)
    refs = ngram.floors(text[:2000], text[2000:], 3)
    assert list(refs) == ["unigram"] + [f"kn{n}" for n in range(2, 11)] + [f"mkn{n}" for n in range(2, 11)]
    assert refs["unigram"] > refs["kn2"] > refs["kn3"] and refs["unigram"] > refs["mkn2"] > refs["mkn3"]
    key, nats = ngram.strongest(refs)
    assert nats == min(v for k, v in refs.items() if k != "unigram") and refs[key] == nats
    assert ngram.label(key).split()[-1] == f"{ngram.kn_order(key)}-gram" and ngram.label("unigram") == "unigram"
    assert ngram.label("kn5") == "KN 5-gram" and ngram.label("mkn10") == "modified KN 10-gram"
    orders = [ngram.kn_order(k) for k in ("kn5", "mkn10", "unigram", "bigram", "mkn", "kn")]
    assert orders == [5, 10, None, None, None, None]
    assert ngram.strongest({"unigram": 3.3, "bigram": 2.5, "trigram": 2.1}) is None  # a summary from before
    assert ngram.strongest({"kn2": 2.0, "kn7": 1.5, "kn8": 1.5}) == ("kn7", 1.5)  # a tie: the lower order
    assert ngram.strongest({"kn8": 1.52, "mkn7": 1.50, "mkn8": 1.49}) == ("mkn8", 1.49)  # either family
    assert ngram.strongest({"mkn7": 1.5, "kn7": 1.5, "mkn6": 1.6}) == ("kn7", 1.5)  # a tie: then plain KN
    old = {"unigram": 3.3473, "kn2": 2.4836, "kn5": 1.5634, "kn7": 1.5196, "kn8": 1.5195}  # a summary of before
    assert ngram.strongest(old) == ("kn8", 1.5195) and ngram.label("kn8") == "KN 8-gram"


def test_large_vocabularies_get_the_orders_whose_codes_fit():
    assert ngram.highest_order(65) == 10 and ngram.highest_order(78) == 10 and ngram.highest_order(79) == 9
    assert ngram.highest_order(234) == 8 and ngram.highest_order(235) == 7
    assert ngram.kn_orders(65) == tuple(range(2, 11)) and ngram.kn_orders(70000) == (2, 3)
    with pytest.raises(ValueError, match="do not fit 64 bits"):
        ngram.gram_codes(np.arange(10), 4, 70000, 3)
    gen = np.random.default_rng(0)
    refs = ngram.floors(gen.integers(0, 70000, 500), gen.integers(0, 70000, 100), 70000)
    assert list(refs) == ["unigram", "kn2", "kn3", "mkn2", "mkn3"] and all(math.isfinite(v) for v in refs.values())


def test_too_little_data_still_gives_finite_floors():
    refs = ngram.floors(np.array([0, 1, 2, 1, 0, 1, 2, 1, 0]), np.array([0, 1, 2, 1, 0, 3, 2, 1, 0, 1]), 4)
    assert all(math.isfinite(v) for v in refs.values()) and "kn10" in refs and "mkn10" in refs
    assert list(ngram.floors(np.array([0, 1, 2, 1]), np.array([0, 1, 2] * 3), 3)) == ["unigram"]  # no 10th character


# --- the cache ----------------------------------------------------------------------------------

def floors_of(data_dir):
    train_ids, val_ids, tok = load_dataset(data_dir)
    return ngram.load_or_measure(data_dir, train_ids, val_ids, tok.vocab_size)


@pytest.mark.slow
def test_floors_are_cached_beside_the_data_and_recomputed_when_it_changes(fresh_data, monkeypatch):
    record, cached = floors_of(fresh_data)
    path = os.path.join(fresh_data, ngram.FLOORS_FILE)
    assert not cached and os.path.isfile(path)
    with open(path) as f:
        assert json.load(f)["floors"] == record["floors"]
    train_ids, val_ids, tok = load_dataset(fresh_data)
    assert record["floors"] == ngram.floors(train_ids, val_ids, tok.vocab_size)

    def no_measuring(*args):
        raise AssertionError("measured again")
    with monkeypatch.context() as m:  # a second look reads the file and computes nothing
        m.setattr(ngram, "measure", no_measuring)
        again, cached = floors_of(fresh_data)
        assert cached and again == record
        train_ids, val_ids, tok = load_dataset(fresh_data)
        assert ngram.data_floors(fresh_data, train_ids, val_ids, tok.vocab_size) == record["floors"]
    # A changed val.bin (the same size, one character another) makes the cache stale.
    val_path = os.path.join(fresh_data, "val.bin")
    ids = np.fromfile(val_path, dtype=np.uint16)
    ids[10] = (ids[10] + 1) % tok.vocab_size
    ids.tofile(val_path)
    changed, cached = floors_of(fresh_data)
    assert not cached and changed["key"]["val.bin"] != record["key"]["val.bin"]
    assert changed["key"]["train.bin"] == record["key"]["train.bin"]
    assert floors_of(fresh_data)[1]  # and the new one is cached in turn


@pytest.mark.parametrize("damage", ["{not json", "", '{"key": 1}', "[]", "null"])
@pytest.mark.slow
def test_a_damaged_cache_is_recomputed(fresh_data, damage):
    record, _ = floors_of(fresh_data)
    path = os.path.join(fresh_data, ngram.FLOORS_FILE)
    with open(path, "w") as f:
        f.write(damage)
    again, cached = floors_of(fresh_data)
    assert not cached and again["floors"] == record["floors"]
    assert floors_of(fresh_data)[1]


def test_a_cache_that_cannot_be_written_is_skipped(fresh_data, monkeypatch):
    from babygpt.errors import BabyGPTError

    def read_only(path, data):
        raise BabyGPTError(f"writing '{path}' failed: Read-only file system")
    monkeypatch.setattr(ngram, "write_atomic", read_only)
    record, cached = floors_of(fresh_data)
    assert not cached and "kn8" in record["floors"]
    assert not os.path.exists(os.path.join(fresh_data, ngram.FLOORS_FILE))


# --- the floors scored as a transformer is scored -------------------------------------------------

VOCAB = 7  # texts() uses ids 0..5: one id never occurs at all


# --- the contexts of the two evaluations ---------------------------------------------------------

class Recorder(torch.nn.Module):
    """Stands in for a GPT: records the windows full_split_loss gives it (inputs and targets)."""

    def __init__(self):
        super().__init__()
        self.windows = []

    def forward(self, x, y):
        self.windows += list(zip(x.tolist(), y.tolist()))
        return None, torch.zeros(())


@pytest.mark.parametrize("length, block_size", [(203, 8), (17, 4), (9, 16), (65, 64), (66, 64), (130, 64)])
def test_window_contexts_are_what_full_split_loss_scores(length, block_size):
    """Fed positions as ids, full_split_loss's windows show each target's position and the inputs
    before it in its window: window_contexts counts exactly those."""
    model = Recorder()
    cfg = load_config(["--batch_size=3", f"--block_size={block_size}", "--device=cpu", "--dtype=float32"])
    _, targets = full_split_loss(model, np.arange(length, dtype=np.uint16), cfg, torch.device("cpu"))
    seen = np.zeros(length, dtype=np.int64)
    for inputs, window_targets in model.windows:
        for j, t in enumerate(window_targets):
            assert inputs[:j + 1] == list(range(t - j - 1, t)) and seen[t] == 0  # the window's inputs up to t
            seen[t] = j + 1
    assert targets == length - 1 and seen.tolist() == ngram.window_contexts(length, block_size).tolist()


def sliding_windows(length, block_size, stride):
    """{target: its context} built window by window: windows start at 0, S, 2S, ...; the first
    scores all its targets, each later one its last S (the last window cut at the end)."""
    scored, start = {}, 0
    while True:
        first = 1 if start == 0 else start + block_size - stride + 1
        if first > length - 1:
            return scored
        for t in range(first, min(start + block_size, length - 1) + 1):
            assert t not in scored
            scored[t] = t - start
        start += stride


@pytest.mark.parametrize("length, block_size, stride", [(300, 64, 32), (300, 16, 5), (40, 8, 8), (10, 16, 4),
                                                         (129, 64, 32), (131, 64, 1), (7, 3, 2)])
def test_sliding_contexts_score_every_target_once(length, block_size, stride):
    contexts = ngram.sliding_contexts(length, block_size, stride)
    scored = sliding_windows(length, block_size, stride)
    assert sorted(scored) == list(range(1, length)) and contexts[0] == 0
    assert contexts[1:].tolist() == [scored[t] for t in range(1, length)]
    later = contexts[block_size + 1:]  # after the first window: at least T - S + 1 characters
    assert (later >= block_size - stride + 1).all() and (contexts <= block_size).all()
    if stride == block_size:  # no overlap: the consecutive windows
        assert contexts.tolist() == ngram.window_contexts(length, block_size).tolist()


def test_schemes_are_named_and_bad_ones_refused():
    assert ngram.scheme_contexts("windows64", 300).tolist() == ngram.window_contexts(300, 64).tolist()
    assert ngram.scheme_contexts("sliding64s32", 300).tolist() == ngram.sliding_contexts(300, 64, 32).tolist()
    for bad in ("windows", "windows0", "sliding64", "sliding32s64", "Windows64", "windows64 ", "full"):
        with pytest.raises(ValueError):
            ngram.scheme_contexts(bad, 300)
    with pytest.raises(ValueError, match="block_size"):
        ngram.window_contexts(10, 0)


# --- scoring with a cap on each target's context -----------------------------------------------

def each_order_its_own(discounts, orders, family):
    """{key: discounts} of a family's models of ``orders``, each model with discounts of its own."""
    return {family.key(n): [[d * (1 - 0.03 * n) for d in level] for level in discounts[:n]] for n in orders}


@pytest.mark.parametrize("family, discounts", [(ngram.KN, PLAIN), (ngram.MKN, MODIFIED)], ids=["kn", "mkn"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_capped_target_is_scored_by_the_model_of_its_context(family, discounts, seed):
    """P of target t under the order-n model with a cap c_t is the (min(n - 1, c_t) + 1)-gram
    model's, with that model's own discounts, as a plain implementation computes it."""
    train_ids, val_ids = texts(seed)
    gen = np.random.default_rng(seed)
    contexts = np.array([0] + [gen.integers(1, t + 1) for t in range(1, len(val_ids))])
    models = each_order_its_own(discounts, (2, 3, 4, 5), family)
    got = ngram.target_probabilities(train_ids, val_ids, VOCAB, contexts, models)
    plain = {n: DictKneserNey(train_ids, n, models[family.key(n)], VOCAB) for n in (2, 3, 4, 5)}
    val = [int(c) for c in val_ids]
    for n in (2, 3, 4, 5):
        expected = [plain[min(n, c + 1)].prob(tuple(val[:t]), val[t]) for t, c in enumerate(contexts) if t > 0]
        np.testing.assert_allclose(got[family.key(n)], expected, rtol=1e-12, atol=0)


@pytest.mark.slow
def test_full_context_everywhere_is_the_full_context_floor():
    """Where every target has the context the models ask for, matched scoring is the floors'
    scoring: the mean over val[9:] with contexts[t] = t is what floors() reports, and the 2-grams,
    which need one character, give the same on the whole text with any caps."""
    train_ids, val_ids = texts(4)
    measured = ngram.measure(train_ids, val_ids, VOCAB)
    fitted = ngram.fit_discounts(train_ids, VOCAB)
    every = np.arange(len(val_ids))
    scored = ngram.target_probabilities(train_ids, val_ids, VOCAB, every, fitted)
    assert {key: round(ngram.cross_entropy(p[ngram.FIRST_TARGET - 1:]), 4) for key, p in scored.items()} == \
        {key: v for key, v in measured["floors"].items() if key != "unigram"}
    windowed = ngram.scored_floors(train_ids, val_ids, VOCAB, ngram.window_contexts(len(val_ids), 3), fitted)
    for family in ngram.FAMILIES:
        assert windowed[family.key(2)] == round(ngram.cross_entropy(scored[family.key(2)]), 4)
        plain = DictKneserNey(train_ids, 2, fitted[family.key(2)], VOCAB).cross_entropy(val_ids, start=1)
        assert windowed[family.key(2)] == pytest.approx(plain, abs=1e-4)


@pytest.mark.parametrize("cap", [1, 2, 4])
@pytest.mark.slow
def test_a_cap_for_every_target_makes_higher_orders_the_capped_order(cap):
    train_ids, val_ids = texts(5)
    contexts = np.minimum(np.arange(len(val_ids)), cap)
    refs = ngram.scored_floors(train_ids, val_ids, VOCAB, contexts)
    for family in ngram.FAMILIES:
        for n in range(cap + 2, ngram.MAX_ORDER + 1):
            assert refs[family.key(n)] == refs[family.key(cap + 1)]
    # the unigram scores the same targets, text[1:] (counted_unigram scores its text from [2:])
    assert refs["unigram"] == pytest.approx(counted_unigram(train_ids, np.r_[0, val_ids], VOCAB), abs=5e-5)


def test_bad_contexts_are_refused():
    train_ids, val_ids = texts(6)
    fine = np.minimum(np.arange(len(val_ids)), 3)
    for bad in (fine[:-1], np.r_[fine[:5], 6, fine[6:]], np.r_[fine[:5], 0, fine[6:]], fine[None]):
        with pytest.raises(ValueError):
            ngram.scored_floors(train_ids, val_ids, VOCAB, bad)
    with pytest.raises(ValueError, match="fewer than 2"):
        ngram.scored_floors(train_ids, val_ids[:1], VOCAB, [0])


# --- the cache of a scheme's floors ------------------------------------------------------------

@pytest.mark.slow
def test_scheme_floors_are_cached_by_scheme_text_and_data(fresh_data, monkeypatch):
    train_ids, val_ids, tok = load_dataset(fresh_data)
    half = val_ids[len(val_ids) // 2:]
    asked = [(val_ids, "windows8"), (val_ids, "sliding8s4"), (half, "windows8")]
    first = [ngram.load_or_score(fresh_data, train_ids, text, tok.vocab_size, scheme) for text, scheme in asked]
    assert not any(cached for _, cached in first)
    for (text, scheme), (entry, _) in zip(asked, first):
        expected = ngram.scored_floors(train_ids, text, tok.vocab_size, ngram.scheme_contexts(scheme, len(text)))
        assert entry["floors"] == expected and entry["key"]["scheme"] == scheme
    assert first[0][0]["floors"] != first[1][0]["floors"] and first[0][0]["floors"] != first[2][0]["floors"]
    full = ngram.data_floors(fresh_data, train_ids, val_ids, tok.vocab_size)  # the full-context floors keep them

    def no_scoring(*args, **kwargs):
        raise AssertionError("scored again")
    with monkeypatch.context() as m:
        m.setattr(ngram, "scored_floors", no_scoring)
        m.setattr(ngram, "measure", no_scoring)
        for (text, scheme), (entry, _) in zip(asked, first):
            assert ngram.load_or_score(fresh_data, train_ids, text, tok.vocab_size, scheme) == (entry, True)
            assert ngram.scheme_floors(fresh_data, train_ids, text, tok.vocab_size, scheme) == entry["floors"]
        assert ngram.data_floors(fresh_data, train_ids, val_ids, tok.vocab_size) == full
    with open(os.path.join(fresh_data, ngram.FLOORS_FILE)) as f:
        assert len(json.load(f)[ngram.SCHEMES]) == 3
    # A changed train.bin makes every entry stale: scored again, and the stale ones dropped.
    train_path = os.path.join(fresh_data, "train.bin")
    ids = np.fromfile(train_path, dtype=np.uint16)
    ids[10] = (ids[10] + 1) % tok.vocab_size
    ids.tofile(train_path)
    train_ids, val_ids, tok = load_dataset(fresh_data)
    entry, cached = ngram.load_or_score(fresh_data, train_ids, val_ids, tok.vocab_size, "windows8")
    assert not cached and entry["key"]["train.bin"] != first[0][0]["key"]["train.bin"]
    with open(os.path.join(fresh_data, ngram.FLOORS_FILE)) as f:
        assert [e["key"]["scheme"] for e in json.load(f)[ngram.SCHEMES]] == ["windows8"]


@pytest.mark.parametrize("damage", ["{not json", "[]", '{"schemes": 3}', '{"schemes": [1, {"key": 2}]}'])
@pytest.mark.slow
def test_a_damaged_cache_is_scored_again(fresh_data, damage):
    train_ids, val_ids, tok = load_dataset(fresh_data)
    with open(os.path.join(fresh_data, ngram.FLOORS_FILE), "w") as f:
        f.write(damage)
    entry, cached = ngram.load_or_score(fresh_data, train_ids, val_ids, tok.vocab_size, "windows8")
    assert not cached and all(math.isfinite(v) for v in entry["floors"].values())
    assert ngram.load_or_score(fresh_data, train_ids, val_ids, tok.vocab_size, "windows8") == (entry, True)


def test_a_read_only_cache_still_gives_the_floors(fresh_data, monkeypatch):
    from babygpt.errors import BabyGPTError

    def read_only(path, data):
        raise BabyGPTError(f"writing '{path}' failed: Read-only file system")
    monkeypatch.setattr(ngram, "write_atomic", read_only)
    train_ids, val_ids, tok = load_dataset(fresh_data)
    floors = ngram.scheme_floors(fresh_data, train_ids, val_ids, tok.vocab_size, "sliding8s2")
    assert "mkn10" in floors and not os.path.exists(os.path.join(fresh_data, ngram.FLOORS_FILE))
    with pytest.raises(ValueError, match="unknown scoring scheme"):
        ngram.scheme_floors(fresh_data, train_ids, val_ids, tok.vocab_size, "windows")


# --- the command, the plots and the reports -----------------------------------------------------

def test_references_command_prints_every_floor_and_the_strongest(fresh_data, capsys):
    from babygpt import references

    for cached in (False, True):
        assert references.main([f"--data_dir={fresh_data}"]) == 0
        out = capsys.readouterr().out
        record, _ = floors_of(fresh_data)
        printed = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()[:len(record["floors"])]}
        assert printed == record["floors"]
        assert list(printed) == ["unigram"] + [f"kn{n}" for n in range(2, 11)] + [f"mkn{n}" for n in range(2, 11)]
        lines = dict(zip(printed, out.splitlines()))
        assert "modified KN 8-gram" in lines["mkn8"] and "discounts D1/D2/D3+" in lines["mkn8"]
        assert "KN 8-gram" in lines["kn8"] and "discounts D_1..D_n" in lines["kn8"]
        key, nats = ngram.strongest(record["floors"])
        assert f"strongest: {ngram.label(key)}, {nats:.4f} nats" in out
        assert ("read from" in out) == cached and ("computed in" in out) != cached


def test_plots_draw_the_unigram_the_5_gram_and_the_strongest():
    from babygpt.plot import new_figure, reference_lines

    refs = {"unigram": 3.3473, "kn2": 2.48, "kn3": 2.04, "kn4": 1.72, "kn5": 1.5634, "kn6": 1.53, "kn7": 1.5196,
            "kn8": 1.5195}
    fig, ax = new_figure()
    reference_lines(ax, refs)
    drawn = {line.get_label(): (line.get_ydata()[0], line.get_linestyle()) for line in ax.get_lines()}
    assert drawn == {"unigram 3.347": (3.3473, ":"), "KN 5-gram 1.563": (1.5634, "--"),
                     "KN 8-gram 1.520": (1.5195, "-.")}
    fig, ax = new_figure()
    reference_lines(ax, {"unigram": 3.3473, "kn5": 1.5634})  # the 5-gram is the strongest: one line for both
    assert [line.get_label() for line in ax.get_lines()] == ["unigram 3.347", "KN 5-gram 1.563"]
    fig, ax = new_figure()  # both families: still three lines, the strongest a modified KN order
    reference_lines(ax, {**refs, "kn9": 1.5204, "mkn5": 1.5555, "mkn8": 1.4915, "mkn9": 1.4905, "mkn10": 1.4907})
    assert [line.get_label() for line in ax.get_lines()] == ["unigram 3.347", "KN 5-gram 1.563",
                                                             "modified KN 9-gram 1.490"]


def test_report_table_lists_every_floor_and_marks_the_strongest(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common

    refs = {"unigram": 3.3473, "kn2": 2.4836, "kn8": 1.5195, "mkn2": 2.4835, "mkn8": 1.4915}
    as_runs = {"unigram": 3.3473, "kn2": 2.4836, "kn8": 1.5457, "mkn2": 2.4836, "mkn8": 1.5190}
    text = _common.references_section(refs, _common.Floors(as_runs, "windows64", "the runs' windows"))
    lines = text.splitlines()
    at = lines.index("<!-- table: references -->")
    assert lines[at + 1] == "| model (nats) | unigram | n = 2 | n = 8 |"
    assert lines[at + 3:at + 7] == ["| KN, full context | 3.3473 | 2.4836 | 1.5195 |",
                                    "| modified KN, full context | 3.3473 | 2.4835 | **1.4915** |",
                                    "| KN, as the runs: `windows64` | 3.3473 | 2.4836 | 1.5457 |",
                                    "| modified KN, as the runs: `windows64` | 3.3473 | 2.4836 | **1.5190** |"]
    assert "Strongest: full context: modified KN 8-gram, 1.4915; as the runs: `windows64`: modified KN 8-gram, " \
           "1.5190" in text
    assert "Kneser-Ney" in text and "held-out tenth of the train split" in text and "never on" in text
    plain = _common.references_section({"unigram": 3.3473, "kn2": 2.4836, "kn8": 1.5195})
    assert "| KN, full context | 3.3473 | 2.4836 | **1.5195** |" in plain and "as the runs" not in plain


# --- no import circle ----------------------------------------------------------------------------

def imports_of(path: str, modules: set) -> set:
    """The babygpt modules a module imports anywhere in it (at the top or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith("babygpt")):
            parts = (node.module or "").split(".")
            named = parts[1] if node.level == 0 and len(parts) > 1 else parts[0] if node.level == 1 else ""
            found |= {named} if named else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("babygpt.")}
    return found & modules


@pytest.mark.slow
def test_no_module_of_the_package_imports_itself_round_a_circle():
    package = os.path.join(ROOT, "babygpt")
    modules = {name[:-3] for name in os.listdir(package) if name.endswith(".py")}
    graph = {m: imports_of(os.path.join(package, m + ".py"), modules) for m in modules}
    assert "trainer" in graph["cli"] and "ngram" in graph["trainer"] and "cli" in graph["references"]
    assert not any("references" in deps for deps in graph.values())  # the command only
    for start in modules:
        reached, todo = set(), [start]
        while todo:
            for dep in graph[todo.pop()] - reached:
                reached.add(dep)
                todo.append(dep)
        assert start not in reached, f"{start} imports itself through {sorted(reached)}"


@pytest.mark.slow
def test_ngram_needs_only_numpy():
    """babygpt/ngram.py imports numpy, the standard library and two small modules, never torch."""
    tree = ast.parse(open(os.path.join(ROOT, "babygpt", "ngram.py"), encoding="utf-8").read())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {("." * node.level) + (node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    third_party = {name for name in names if name.split(".")[0] not in sys.stdlib_module_names and name[0] != "."}
    assert third_party == {"numpy"} and {name for name in names if name[0] == "."} == {".errors", ".files"}


# --- the final evaluation --------------------------------------------------------------------------

def test_full_split_loss_scores_every_target_once():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=16, block_size=8, dropout=0.0))
    data = np.random.default_rng(0).integers(0, 11, 203).astype(np.uint16)  # 202 targets: 25 windows + 2
    ids = torch.from_numpy(data.astype(np.int64))
    with torch.no_grad():  # one window at a time, summed token by token
        losses = [torch.nn.functional.cross_entropy(model(ids[s:min(s + 8, 202)][None])[0][0], ids[s + 1:s + 9],
                                                    reduction="sum") for s in range(0, 202, 8)]
    expected = (sum(losses) / 202).item()
    for batch_size in (1, 4, 32):
        cfg = load_config([f"--batch_size={batch_size}", "--block_size=8", "--device=cpu", "--dtype=float32"])
        loss, targets = full_split_loss(model, data, cfg, torch.device("cpu"))
        assert targets == 202
        assert_close(loss, expected, rtol=1e-5, atol=0)


@pytest.mark.slow
def test_summary_reports_whole_split_loss_references_and_collapse(fresh_data, tmp_path):
    base = once(f"--data_dir={fresh_data}", *TINY_TRAIN_ARGS, "--max_iters=30")
    trained = train(load_config([*base, f"--out_dir={tmp_path / 'a'}"]))
    assert trained["status"] == "finished" and trained["val_targets_full"] > 0 and trained["val_time_full_s"] > 0
    refs = trained["references"]
    assert refs == floors_of(fresh_data)[0]["floors"] and floors_of(fresh_data)[1]  # and cached by the run
    assert refs["unigram"] > refs["kn2"] > refs["kn3"] and ngram.strongest(refs)
    assert trained["val_loss_full"] < refs["unigram"] - COLLAPSE_MARGIN
    # Barely moved from its initialisation: no better than character frequencies.
    stuck = train(load_config([*base, "--learning_rate=1e-7", "--min_lr=0", f"--out_dir={tmp_path / 'b'}"]))
    assert stuck["status"] == "collapsed" and stuck["val_loss_full"] >= refs["unigram"] - COLLAPSE_MARGIN
    with open(tmp_path / "b" / "summary.json") as f:
        assert json.load(f)["status"] == "collapsed"

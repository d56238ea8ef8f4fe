"""The n-gram floors scored as a transformer is scored (babygpt/ngram.py's matched scoring): each
target with at most the context the transformer's evaluation gives it, the contexts of consecutive
and of sliding windows, and the cache of a named scheme's floors beside the data."""

import json
import math
import os

import numpy as np
import pytest
import torch
from test_references import PLAIN, MODIFIED, DictKneserNey, counted_unigram, texts

from babygpt import ngram
from babygpt.config import load_config
from babygpt.data import load_dataset
from babygpt.trainer import full_split_loss

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

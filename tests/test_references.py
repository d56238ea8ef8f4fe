"""The data's n-gram reference losses, the whole-split final evaluation and the collapsed status."""

import collections
import json
import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from babygpt.config import load_config
from babygpt.model import GPT, GPTConfig
from babygpt.references import COLLAPSE_MARGIN, is_collapsed, ngram_cross_entropy, references
from babygpt.trainer import full_split_loss, train
from conftest import TINY_TRAIN_ARGS, prepare_small_data


def counted_cross_entropy(train, val, order, vocab_size):
    """The add-one smoothed n-gram cross-entropy written plainly with dictionaries."""
    train, val = train.tolist(), val.tolist()
    full = collections.Counter(tuple(train[i:i + order]) for i in range(len(train) - order + 1))
    context = collections.Counter(tuple(train[i:i + order - 1]) for i in range(len(train) - order + 1))
    losses = []
    for t in range(2, len(val)):
        gram = tuple(val[t - order + 1:t + 1])
        losses.append(-math.log((full[gram] + 1) / (context[gram[:-1]] + vocab_size)))
    return sum(losses) / len(losses)


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("vocab_size", [3, 65, 70000])  # 70000: codes beyond 32 bits at order 3
def test_ngram_cross_entropy_matches_counting(order, vocab_size):
    gen = np.random.default_rng(order)
    train = gen.integers(0, min(vocab_size, 50), 3000) % vocab_size
    val = gen.integers(0, min(vocab_size, 50), 400) % vocab_size
    train[:200] = val[:200]  # some n-grams seen, some not
    assert ngram_cross_entropy(train, val, order, vocab_size) == pytest.approx(
        counted_cross_entropy(train, val, order, vocab_size), rel=1e-12)


def test_references_order_and_collapse_rule():
    text = np.array([0, 1, 2, 0, 1, 2, 0, 1, 1] * 200)
    refs = references(text[:1500], text[1500:], 3)
    assert refs["unigram"] > refs["bigram"] > refs["trigram"]
    assert is_collapsed(refs["unigram"], refs) and is_collapsed(refs["unigram"] + 1, refs)
    assert not is_collapsed(refs["unigram"] - COLLAPSE_MARGIN - 1e-6, refs)
    assert not is_collapsed(None, refs) and not is_collapsed(math.nan, refs)


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


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("refs"))


@pytest.mark.slow
def test_summary_reports_whole_split_loss_references_and_collapse(data_dir, tmp_path):
    base = [f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--max_iters=30"]
    trained = train(load_config([*base, f"--out_dir={tmp_path / 'a'}"]))
    assert trained["status"] == "finished" and trained["val_targets_full"] > 0 and trained["val_time_full_s"] > 0
    refs = trained["references"]
    assert refs["unigram"] > refs["bigram"] > refs["trigram"]
    assert trained["val_loss_full"] < refs["unigram"] - COLLAPSE_MARGIN
    # Barely moved from its initialisation: no better than character frequencies.
    stuck = train(load_config([*base, "--learning_rate=1e-7", "--min_lr=0", f"--out_dir={tmp_path / 'b'}"]))
    assert stuck["status"] == "collapsed" and stuck["val_loss_full"] >= refs["unigram"] - COLLAPSE_MARGIN
    with open(tmp_path / "b" / "summary.json") as f:
        assert json.load(f)["status"] == "collapsed"


def test_references_command_prints_the_three_losses(data_dir, capsys):
    from babygpt import references as module
    from babygpt.data import load_dataset

    assert module.main([f"--data_dir={data_dir}"]) == 0
    train, val, tok = load_dataset(data_dir)
    expected = references(train, val, tok.vocab_size)
    printed = dict(line.split()[:2] for line in capsys.readouterr().out.splitlines())
    assert {k: float(v) for k, v in printed.items()} == expected

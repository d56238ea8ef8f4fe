"""Data preparation, the tokenizer and the batch sampler."""

import json
import os

import numpy as np
import pytest
import torch

from babygpt import data
from babygpt.data import BatchSampler, CharTokenizer, load_dataset, prepare
from babygpt.errors import BabyGPTError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL_INPUT = os.path.join(ROOT, "data", "shakespeare_char", "input.txt")
SMALL_TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 20


@pytest.fixture
def small_corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(SMALL_TEXT, encoding="utf-8")
    return str(path)


def test_tokenizer_round_trip():
    tok = CharTokenizer.from_text(SMALL_TEXT)
    assert tok.chars == sorted(set(SMALL_TEXT))
    assert tok.decode(tok.encode(SMALL_TEXT)) == SMALL_TEXT


def test_tokenizer_names_unknown_characters():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(BabyGPTError, match=r"'z'.*remove them"):
        tok.encode("abz")


def test_prepare_small_corpus(tmp_path, small_corpus):
    out = tmp_path / "data"
    meta = prepare(str(out), input_path=small_corpus)
    n = len(SMALL_TEXT)
    assert meta["train_tokens"] == int(n * 0.9) and meta["val_tokens"] == n - int(n * 0.9)
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    with open(out / "meta.json", encoding="utf-8") as f:
        tok = CharTokenizer(json.load(f)["vocab"])
    assert tok.decode(np.concatenate([train, val]).tolist()) == SMALL_TEXT
    tr, va, tok2 = load_dataset(str(out))
    assert np.array_equal(tr, train) and np.array_equal(va, val) and tok2.chars == tok.chars


@pytest.mark.skipif(not os.path.exists(REAL_INPUT), reason="TinyShakespeare input.txt not present")
def test_prepare_real_tinyshakespeare(tmp_path):
    data_dir = tmp_path / "shakespeare_char"
    data_dir.mkdir()
    (data_dir / "input.txt").write_bytes(open(REAL_INPUT, "rb").read())
    meta = prepare(str(data_dir))
    assert (meta["vocab_size"], meta["train_tokens"], meta["val_tokens"]) == (65, 1_003_854, 111_540)
    assert os.path.getsize(data_dir / "train.bin") == 2 * 1_003_854


def test_altered_tinyshakespeare_is_rejected(tmp_path):
    (tmp_path / "input.txt").write_text("not shakespeare")
    with pytest.raises(BabyGPTError, match="sha256 differs"):
        prepare(str(tmp_path))
    assert not (tmp_path / "train.bin").exists()


def test_failed_download_says_how_to_place_the_file(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("network unreachable")
    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    with pytest.raises(BabyGPTError) as err:
        prepare(str(tmp_path / "d"))
    msg = str(err.value)
    assert "could not download" in msg and "input.txt" in msg and data.TINYSHAKESPEARE_URL in msg


def test_non_utf8_input(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"hello \xff\xfe world")
    with pytest.raises(BabyGPTError, match="not UTF-8"):
        prepare(str(tmp_path / "d"), input_path=str(bad))


def test_truncated_bin_and_corrupt_meta_are_detected(tmp_path, small_corpus):
    out = tmp_path / "data"
    prepare(str(out), input_path=small_corpus)
    train = (out / "train.bin").read_bytes()
    (out / "train.bin").write_bytes(train[:100])
    with pytest.raises(BabyGPTError, match="truncated or stale"):
        load_dataset(str(out))
    (out / "train.bin").write_bytes(train)
    (out / "meta.json").write_text("{not json")
    with pytest.raises(BabyGPTError, match="cannot read"):
        load_dataset(str(out))


@pytest.mark.parametrize("vocab, fragment", [(["\u2603", "\u2603"], "'\u2603' twice"),
                                             (["\u2603\u2604"], "an entry that is not one character")])
def test_a_vocab_with_a_repeated_or_long_entry_is_refused(tmp_path, small_corpus, vocab, fragment):
    """Each distinct character is one token id: a meta.json whose vocab repeats one would decode two ids
    as the same character (and encode it as one of them) without a word."""
    import json

    out = tmp_path / "data"
    prepare(str(out), input_path=small_corpus)
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "vocab": vocab + meta["vocab"][len(vocab):]}))
    with pytest.raises(BabyGPTError, match=f"meta.json is damaged: its vocab lists {fragment}"):
        load_dataset(str(out))


def test_batch_sampler_windows_are_shifted_slices():
    ids = np.arange(1000, dtype=np.uint16)
    sampler = BatchSampler(ids, block_size=8, batch_size=16, seed=0)
    x, y = sampler.next_batch()
    assert x.shape == y.shape == (16, 8) and x.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(16, 7, dtype=torch.int64))  # contiguous windows
    assert int(y.max()) <= 999  # never reads past the end


def test_batch_sampler_is_reproducible_and_restorable():
    ids = np.arange(1000, dtype=np.uint16)
    a = BatchSampler(ids, 8, 4, seed=1)
    b = BatchSampler(ids, 8, 4, seed=1)
    assert torch.equal(a.next_batch()[0], b.next_batch()[0])
    state = a.state_dict()
    first = a.next_batch()[0]
    a.load_state_dict(state)
    assert torch.equal(a.next_batch()[0], first)


def test_block_size_larger_than_split_is_an_error():
    with pytest.raises(BabyGPTError, match="block_size"):
        BatchSampler(np.arange(10, dtype=np.uint16), block_size=10, batch_size=2, seed=0, split="val")

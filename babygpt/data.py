"""TinyShakespeare as character ids: preparation, a tokenizer and a batch sampler.

``prepare`` turns ``input.txt`` into ``train.bin`` / ``val.bin`` (uint16 ids, the
first 90% / last 10% of the text) and ``meta.json`` (the vocabulary). ``tune_and_test`` cuts the
validation split in two: learning rates are chosen on its first half and the reported numbers come
from its second (a number chosen on a split is not an estimate on it). Training
reads the .bin files through ``np.memmap``, so a batch costs one vectorised
gather, never a Python loop over rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .errors import BabyGPTError
from .files import existing_ancestor, write_atomic
from .options import option

TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TRAIN_FRACTION = 0.9
TUNE_FRACTION = 0.5  # of the validation split: its first half tunes, the rest is the test part
META_FORMAT = "babygpt-char-v1"
PREPARE = "python data/shakespeare_char/prepare.py"
MIN_SPLIT_TOKENS = 2  # what prepare writes at least: one input and one target


class CharTokenizer:
    """Maps each character of a fixed vocabulary to its index in that vocabulary."""

    def __init__(self, chars: list[str]):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            shown = ", ".join(repr(c) for c in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
            # A prompt file saved with Windows line endings is the usual source of a stray '\r'.
            crlf = " (for '\\r': save the prompt file with LF line endings)" if "\r" in unknown else ""
            raise BabyGPTError(f"{len(unknown)} character(s) not in the model's vocabulary: {shown}; "
                               f"remove them from the prompt{crlf}")
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(path: str) -> None:
    how = (f"download {TINYSHAKESPEARE_URL} by hand and save it as {path} "
           f"(or pass --input PATH to prepare.py)")
    try:
        with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=30) as r:
            data = r.read()
    except OSError as e:
        raise BabyGPTError(f"could not download TinyShakespeare ({e}); {how}") from None
    if hashlib.sha256(data).hexdigest() != TINYSHAKESPEARE_SHA256:
        raise BabyGPTError(f"the downloaded TinyShakespeare has the wrong sha256; {how}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # only once there is a file to keep
    write_atomic(path, data)


def read_corpus(data_dir: str, input_path: str | None = None) -> str:
    """The training text: ``input_path`` if given (any UTF-8 file), else
    ``data_dir/input.txt``, downloaded first if missing and checked against the
    known sha256 so that a truncated or altered copy cannot slip through."""
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise BabyGPTError(f"data_dir '{data_dir}' is a file, not a directory; pass another --data_dir")
    if input_path is None:
        input_path = os.path.join(data_dir, "input.txt")
        if not os.path.exists(input_path):
            print(f"downloading TinyShakespeare to {input_path}")
            _download(input_path)
        elif os.path.isdir(input_path):
            raise BabyGPTError(f"'{input_path}' is a directory, not the corpus; remove it and re-run "
                               f"{prepare_command(data_dir)} to download TinyShakespeare, or pass --input PATH")
        elif os.path.getsize(input_path) == 0:
            raise BabyGPTError(f"{input_path} is empty; delete it and re-run {prepare_command(data_dir)} to "
                               f"download TinyShakespeare again, or pass your own corpus with --input PATH")
        elif sha256_of(input_path) != TINYSHAKESPEARE_SHA256:
            raise BabyGPTError(
                f"{input_path} is not the TinyShakespeare file (sha256 differs: truncated or altered); "
                f"delete it to download it again, or use your own corpus with prepare.py --input PATH")
    elif os.path.isdir(input_path):
        raise BabyGPTError(f"input file '{input_path}' is a directory; pass the text file itself to --input")
    elif not os.path.isfile(input_path):
        raise BabyGPTError(f"input file '{input_path}' not found; check the path")
    with open(input_path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BabyGPTError(f"{input_path} is not UTF-8 text (bad byte at offset {e.start}); "
                           f"convert it to UTF-8") from None
    return text


@dataclass
class PrepareOptions:
    """data/shakespeare_char/prepare.py's command line."""

    input: Optional[str] = option(None, "a UTF-8 text file to use instead of TinyShakespeare")
    data_dir: Optional[str] = option(None, "where to write the files (none = next to prepare.py); "
                                           "train with --data_dir=DIR")


def prepare(data_dir: str, input_path: str | None = None) -> dict:
    """Write train.bin, val.bin and meta.json into ``data_dir``; return the meta dict."""
    text = read_corpus(data_dir, input_path)
    source = input_path or os.path.join(data_dir, "input.txt")
    tok = CharTokenizer.from_text(text)
    if tok.vocab_size > np.iinfo(np.uint16).max + 1:
        raise BabyGPTError(f"the corpus has {tok.vocab_size} distinct characters; uint16 ids allow 65536")
    ids = np.array(tok.encode(text), dtype=np.uint16)
    n_train = int(len(ids) * TRAIN_FRACTION)
    if n_train < 2 or len(ids) - n_train < 2:
        what = "is empty" if not len(ids) else f"has only {len(ids)} characters, too few for a train and a val split"
        raise BabyGPTError(f"the corpus {source} {what}; re-run {prepare_command(data_dir)} with a longer text "
                           f"(--input FILE)")
    os.makedirs(data_dir, exist_ok=True)
    write_atomic(os.path.join(data_dir, "train.bin"), ids[:n_train].tobytes())
    write_atomic(os.path.join(data_dir, "val.bin"), ids[n_train:].tobytes())
    meta = {"format": META_FORMAT, "vocab": tok.chars, "vocab_size": tok.vocab_size,
            "train_tokens": n_train, "val_tokens": len(ids) - n_train}
    write_atomic(os.path.join(data_dir, "meta.json"), json.dumps(meta, ensure_ascii=False).encode())
    return meta


def prepare_command(data_dir: str) -> str:
    """``python data/shakespeare_char/prepare.py --data_dir DIR``: how to make ``data_dir`` again."""
    return f"{PREPARE} --data_dir {data_dir}"


def _paths(data_dir: str) -> dict:
    return {name: os.path.join(data_dir, name) for name in ("train.bin", "val.bin", "meta.json")}


def is_prepared(data_dir: str) -> bool:
    return all(os.path.exists(p) for p in _paths(data_dir).values())


def load_meta(data_dir: str) -> dict:
    path = _paths(data_dir)["meta.json"]
    fix = f"delete {data_dir}/meta.json, train.bin and val.bin and run again to re-prepare"
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise BabyGPTError(f"cannot read {path} ({e}); {fix}") from None
    ok = (isinstance(meta, dict) and meta.get("format") == META_FORMAT
          and isinstance(meta.get("vocab"), list) and all(isinstance(c, str) for c in meta["vocab"])
          and isinstance(meta.get("train_tokens"), int) and isinstance(meta.get("val_tokens"), int))
    if not ok:
        raise BabyGPTError(f"{path} is not a BabyGPT meta.json; {fix}")
    repeated = sorted({c for c in meta["vocab"] if meta["vocab"].count(c) > 1})
    if repeated or any(len(c) != 1 for c in meta["vocab"]):
        what = f"{repeated[0]!r} twice" if repeated else "an entry that is not one character"
        raise BabyGPTError(f"{path} is damaged: its vocab lists {what} (one token id per distinct character); {fix}")
    return meta


def load_split(data_dir: str, split: str, meta: dict) -> np.ndarray:
    """Memory-map ``split``.bin after checking it against meta.json."""
    path = _paths(data_dir)[f"{split}.bin"]
    fix = f"delete {data_dir}/*.bin and meta.json and run again to re-prepare"
    if os.path.isdir(path):
        raise BabyGPTError(f"'{path}' is a directory, not a data file; remove it, {data_dir}/meta.json and the "
                           f"other .bin, and run again to re-prepare")
    expected = meta[f"{split}_tokens"]
    size = os.path.getsize(path) if os.path.exists(path) else -1
    if size != 2 * expected:
        raise BabyGPTError(f"{path} holds {max(size, 0)} bytes but meta.json expects {2 * expected} "
                           f"({expected} uint16 tokens): truncated or stale; {fix}")
    if size < 2 * MIN_SPLIT_TOKENS:  # an empty file cannot even be memory-mapped
        raise BabyGPTError(f"{path} holds {size // 2} tokens, too few to train on; re-run "
                           f"{prepare_command(data_dir)} with a longer text (--input FILE)")
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if int(data.max()) >= len(meta["vocab"]):
        raise BabyGPTError(f"{path} holds ids outside the vocabulary of meta.json: corrupt; {fix}")
    return data


def load_dataset(data_dir: str) -> tuple[np.ndarray, np.ndarray, CharTokenizer]:
    """(train ids, val ids, tokenizer), preparing the data first if any file is missing."""
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise BabyGPTError(f"data_dir '{data_dir}' is a file, not a directory; pass another --data_dir")
    if not is_prepared(data_dir):
        existing = existing_ancestor(data_dir)
        if not os.access(existing, os.W_OK):  # before downloading anything
            raise BabyGPTError(f"data_dir '{data_dir}' is not prepared and '{existing}' is read-only to you; "
                               f"prepare it where you can write (prepare.py --data_dir DIR) and pass --data_dir=DIR")
        print(f"preparing data in {data_dir}")
        prepare(data_dir)
    meta = load_meta(data_dir)
    return load_split(data_dir, "train", meta), load_split(data_dir, "val", meta), CharTokenizer(meta["vocab"])


def tune_and_test(val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tuning part, test part) of the validation split: its first TUNE_FRACTION and the rest.
    Each part is scored as a text of its own, so no test target is seen as context while tuning."""
    cut = int(len(val) * TUNE_FRACTION)
    return val[:cut], val[cut:]


class BatchSampler:
    """Random windows of ``block_size + 1`` ids from one split.

    Owns its torch.Generator, so the sequence of batches depends only on the
    seed and on how many batches were drawn, and can be saved and restored
    (``state_dict``) for an exact resume.
    """

    def __init__(self, data: np.ndarray, block_size: int, batch_size: int, seed: int,
                 device: str | torch.device = "cpu", split: str = "train"):
        if len(data) <= block_size:
            path = getattr(data, "filename", None)  # a split read by load_split is a memmap of its file
            where, rerun = (f" in {path}", prepare_command(os.path.dirname(path))) if path else ("", PREPARE)
            raise BabyGPTError(f"block_size ({block_size}) must be smaller than the {split} split ({len(data)} tokens"
                               f"{where}); lower --block_size, or re-run {rerun} with a longer text (--input FILE)")
        self.data, self.block_size, self.batch_size = data, block_size, batch_size
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)
        self._window = np.arange(block_size + 1)  # (T+1,)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: (B, T) int64; y is x shifted left by one position."""
        starts = torch.randint(len(self.data) - self.block_size, (self.batch_size,),
                               generator=self.generator).numpy()  # (B,)
        chunk = torch.from_numpy(self.data[starts[:, None] + self._window].astype(np.int64))  # (B, T+1)
        x, y = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()
        if self.device.type == "cuda":  # pinned host memory lets the copy overlap with compute
            return x.pin_memory().to(self.device, non_blocking=True), \
                y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

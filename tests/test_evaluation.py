"""The sliding-window evaluation (trainer.sliding_split_loss) and the validation split's tuning and
test parts (data.tune_and_test), against a brute-force reference that scores each target alone."""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from babygpt.config import load_config
from babygpt.data import tune_and_test
from babygpt.model import GPT, GPTConfig
from babygpt.trainer import eval_stride, full_split_loss, sliding_split_loss, sliding_windows

CPU = torch.device("cpu")


def tiny_model(block_size: int) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=16, block_size=block_size, dropout=0.0))


def eval_config(block_size: int, batch_size: int = 4):
    return load_config([f"--batch_size={batch_size}", f"--block_size={block_size}", "--device=cpu",
                        "--dtype=float32"])


def reference_loss(model: GPT, ids: torch.Tensor, contexts: dict[int, int]) -> float:
    """Mean -log p(ids[t] | the ``contexts[t]`` ids before it), one forward pass per target."""
    total = 0.0
    with torch.no_grad():
        for t, c in contexts.items():
            logits = model(ids[t - c:t][None])[0][0, -1]  # (V,) at the last position
            total -= torch.log_softmax(logits.double(), -1)[ids[t]].item()
    return total / len(contexts)


def scored_contexts(length: int, block_size: int, stride: int) -> dict[int, int]:
    """{target: its context} that sliding_windows scores, read off its windows one by one."""
    out = {}
    for start, first in sliding_windows(length, block_size, stride):
        for j in range(first, min(block_size, length - 1 - start)):
            assert start + j + 1 not in out, "a target scored twice"
            out[start + j + 1] = j + 1
    return out


@pytest.mark.parametrize("length", [2, 5, 8, 9, 10, 33, 203])
@pytest.mark.parametrize("block_size,stride", [(8, 4), (8, 1), (8, 8), (8, 3), (5, 2)])
def test_every_target_is_scored_once_with_at_least_the_stated_context(length, block_size, stride):
    contexts = scored_contexts(length, block_size, stride)
    assert sorted(contexts) == list(range(1, length))
    for t, c in contexts.items():
        assert c == min(t, block_size) if t <= block_size else block_size - stride < c <= block_size


@pytest.mark.parametrize("length", [2, 9, 33, 203])
@pytest.mark.parametrize("block_size,stride", [(8, 4), (8, 8), (8, 3), (5, 2)])
def test_the_transformer_and_the_n_gram_floors_score_the_same_targets_with_the_same_context(length, block_size,
                                                                                               stride):
    from babygpt.ngram import sliding_contexts, window_contexts

    contexts = scored_contexts(length, block_size, stride)
    assert [contexts[t] for t in range(1, length)] == sliding_contexts(length, block_size, stride)[1:].tolist()
    if stride == block_size:
        assert sliding_contexts(length, block_size, stride).tolist() == window_contexts(length, block_size).tolist()


@pytest.mark.parametrize("length", [9, 40, 203])
@pytest.mark.parametrize("batch_size", [1, 3, 32])
@pytest.mark.slow
def test_sliding_loss_matches_scoring_each_target_alone(length, batch_size):
    model, block_size = tiny_model(8), 8
    data = np.random.default_rng(length).integers(0, 11, length).astype(np.uint16)
    expected = reference_loss(model, torch.from_numpy(data.astype(np.int64)),
                              scored_contexts(length, block_size, eval_stride(block_size)))
    loss, targets = sliding_split_loss(model, data, eval_config(block_size, batch_size), CPU)
    assert targets == length - 1
    assert_close(loss, expected, rtol=1e-5, atol=0)


def test_a_stride_of_a_whole_window_is_the_non_overlapping_evaluation():
    model, data = tiny_model(8), np.random.default_rng(1).integers(0, 11, 203).astype(np.uint16)
    cfg = eval_config(8)
    assert_close(sliding_split_loss(model, data, cfg, CPU, stride=8)[0], full_split_loss(model, data, cfg, CPU)[0],
                 rtol=1e-6, atol=0)


def test_the_sliding_loss_leaves_the_model_in_training_mode():
    model = tiny_model(8).train()
    sliding_split_loss(model, np.arange(30, dtype=np.uint16) % 11, eval_config(8), CPU)
    assert model.training


@pytest.mark.parametrize("length", [2, 3, 1000, 111540])
def test_tuning_and_test_parts_split_the_validation_text_in_two(length):
    val = np.arange(length)
    tune, test = tune_and_test(val)
    assert np.array_equal(np.concatenate([tune, test]), val) and len(tune) == length // 2


@pytest.mark.slow
def test_a_finished_run_reports_both_parts_of_the_split_with_floors_on_the_same_targets(tmp_path):
    from babygpt import ngram
    from babygpt.data import load_dataset
    from babygpt.sampling import load_model
    from babygpt.trainer import train
    from conftest import TINY_TRAIN_ARGS, once, prepare_small_data

    data = prepare_small_data(tmp_path)
    cfg = load_config(once(f"--data_dir={data}", *TINY_TRAIN_ARGS, "--max_iters=20", "--dtype=float32",
                      f"--out_dir={tmp_path / 'run'}"))
    summary = train(cfg)
    train_ids, val, tok = load_dataset(str(data))
    tune, test = tune_and_test(val)
    assert summary["eval_stride"] == 8 and summary["test_targets"] == len(test) - 1
    model = load_model(str(tmp_path / "run" / "ckpt.pt"), CPU)[0]
    assert_close(summary["test_loss"], sliding_split_loss(model, test, cfg, CPU)[0], rtol=1e-6, atol=0)
    assert_close(summary["tune_loss"], sliding_split_loss(model, tune, cfg, CPU)[0], rtol=1e-6, atol=0)
    # the floors of the test part, scored on its targets with the context each had in the windows
    assert summary["references_test"] == ngram.scheme_floors(str(data), train_ids, test, tok.vocab_size, "sliding16s8")
    assert ngram.strongest(summary["references_test"])

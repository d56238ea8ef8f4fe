import itertools
import os
import subprocess
import sys

import pytest

# One CPU thread for torch, in this process and (through the environment, unless OMP_NUM_THREADS is
# set already) in every process the tests start: train.py, sweeps, experiments, bench.py. The tests'
# tiny models gain nothing from a second thread, whose synchronisation only burns CPU: on a 2-core
# machine with other work on it, the suite takes a fraction of the time (tests/test_faults.py and
# test_scaleout.py pinned their own processes to one thread for the same reason). Nothing here
# depends on the thread count; runs compared bit for bit train on one thread on both sides.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after OMP_NUM_THREADS: OpenMP reads it once, when torch loads it)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The test files whose module-scoped fixtures cost seconds (a training run, a sweep, the fault-injection
# scenarios): under pytest-xdist (pytest.ini's --dist loadgroup) each runs whole on one worker, so
# those fixtures are built once; every other test goes to whichever worker is free.
ONE_WORKER_MODULES = {"test_faults", "test_distributed", "test_sweep", "test_plot", "test_runstore", "test_cli",
                      "test_compare_runs", "test_half"}


def off_the_cross(item) -> bool:
    """A (placement, norm) grid test's case that the fast loop leaves to the whole suite: the fast loop
    runs each such grid on the cross through the default model (every norm under the default
    placement, every placement with the default norm), so that it stays under half a minute."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    placement, norm = params.get("placement"), params.get("norm", params.get("norm_type"))
    return (isinstance(placement, str) and isinstance(norm, str)
            and placement != DEFAULT_MODEL.norm_placement and norm != DEFAULT_MODEL.norm_type)


# before pytest-xdist's own hook, which reads the group mark into the test's id, and before -m reads
# the slow marks
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        if module in ONE_WORKER_MODULES and item.get_closest_marker("xdist_group") is None:  # (test_faults: its own)
            item.add_marker(pytest.mark.xdist_group(module))
        if off_the_cross(item):
            item.add_marker(pytest.mark.slow)
sys.path.insert(0, ROOT)

from babygpt.model import PLACEMENTS, GPTConfig  # noqa: E402
from babygpt.norms import NORMS, norm_class, qk_norm_refusal  # noqa: E402
from babygpt.placements import PLACEMENTS as PLACEMENT_CLASSES  # noqa: E402

DEFAULT_MODEL = GPTConfig()
# every placement x norm_type, where the placement builds norms of norm_type (nGPT builds none: norm_type none only)
# Every placement with every norm it accepts: nGPT builds none, HybridNorm's q/k norms refuse what qk_norm refuses,
# Admin needs a norm that normalizes, and a placement that only moves norms is Pre-LN's model without one.
GRID = [(p, n) for p, n in itertools.product(PLACEMENTS, NORMS)
        if (PLACEMENT_CLASSES[p].uses_norm_type or n == "none")
        and not (PLACEMENT_CLASSES[p].normalizes_qkv and qk_norm_refusal(n))
        and not ((PLACEMENT_CLASSES[p].needs_a_norm or PLACEMENT_CLASSES[p].only_moves_norms)
                 and norm_class(NORMS[n]).is_identity)]
GRID_IDS = [f"{p}-{n}" for p, n in GRID]
# The placements that build norms of norm_type, and those that take residual dropout (nGPT neither).
NORMED_PLACEMENTS = [p for p in PLACEMENTS if PLACEMENT_CLASSES[p].uses_norm_type]
DROPOUT_PLACEMENTS = [p for p in PLACEMENTS if not PLACEMENT_CLASSES[p].on_sphere]
INIT_PLACEMENTS = DROPOUT_PLACEMENTS  # whose weights are the init's: nGPT puts its matrices on the sphere


def tiny_config(**overrides) -> GPTConfig:
    """2 layers, width 32: big enough to have every part of the model, small enough for CPU tests."""
    # biases, except where the placement has none (nGPT)
    placement = PLACEMENT_CLASSES.get(overrides.get("norm_placement", "pre"))
    sphere = placement is not None and placement.on_sphere
    values = dict(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=not sphere)
    values.update(overrides)
    return GPTConfig(**values)


@pytest.fixture(autouse=True)
def _seed():
    # torch.manual_seed also queues a seed for each accelerator torch has not initialised (CUDA, XPU,
    # MTIA), formatting a stack trace for each: milliseconds, before every one of thousands of tests.
    # Without a GPU the CPU generator is all it seeds.
    if torch.cuda.is_available():
        torch.manual_seed(0)
    else:
        torch.default_generator.manual_seed(0)


class NaNAfter(torch.nn.Module):
    """Wraps a model; once ``k`` training forward calls have run, the loss of the chosen kind of
    call (training by default, else evaluation) is NaN."""

    def __init__(self, model, k, in_eval=False):
        super().__init__()
        self.model, self.k, self.in_eval, self.calls = model, k, in_eval, 0

    def forward(self, x, y):
        logits, loss = self.model(x, y)
        self.calls += self.training
        poisoned = self.calls >= self.k and self.training != self.in_eval
        return logits, loss * float("nan") if poisoned else loss


@pytest.fixture
def deterministic_mode_restored(monkeypatch):
    """deterministic=True switches the whole process (torch's flag and CUBLAS_WORKSPACE_CONFIG): put
    both back as they were once the test is done, so no later test runs under it by accident."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def assert_same_weights(ckpt_a, ckpt_b) -> None:
    """The model weights of two checkpoints are equal bit for bit, tensor by tensor."""
    a, b = (torch.load(path, weights_only=True)["model"] for path in (ckpt_a, ckpt_b))
    assert a.keys() == b.keys()
    for name, w in a.items():
        torch.testing.assert_close(w, b[name], rtol=0, atol=0, msg=name)


# Training arguments for a tiny model that trains in about a second on CPU.
TINY_TRAIN_ARGS = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=8",
                   "--eval_interval=10", "--eval_iters=2", "--log_interval=5", "--device=cpu",
                   "--warmup_iters=5"]
SMALL_CORPUS = "".join(f"{i}: To be, or not to be, that is the question.\n" for i in range(600))


def once(*args: str) -> list[str]:
    """Command-line arguments with each ``--key`` given once: a later ``--key=value`` replaces an
    earlier one in its place (train.py refuses a key given twice), e.g. once(*TINY_TRAIN_ARGS,
    "--max_iters=3"). Arguments that are not ``--key=value`` are kept as they are."""
    last = {arg.partition("=")[0]: arg for arg in args if arg.startswith("--") and "=" in arg}
    out, seen = [], set()
    for arg in args:
        key = arg.partition("=")[0]
        if key in last:
            if key not in seen:
                out.append(last[key])
                seen.add(key)
        else:
            out.append(arg)
    return out


def prepare_small_data(directory) -> str:
    """Prepare SMALL_CORPUS into ``directory``/data; return that data_dir."""
    from babygpt.data import prepare

    corpus = os.path.join(directory, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(SMALL_CORPUS)
    data_dir = os.path.join(directory, "data")
    prepare(data_dir, input_path=corpus)
    return data_dir


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """SMALL_CORPUS prepared once per test module (copy it with fresh_data to change it)."""
    return prepare_small_data(tmp_path_factory.mktemp("small"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished 10-iteration run of the tiny model on SMALL_CORPUS, trained in this process once per
    test module: (its run directory, the argv it was trained with)."""
    from babygpt.config import load_config
    from babygpt.trainer import train

    root = tmp_path_factory.mktemp("tiny_run")
    data_dir = prepare_small_data(root)
    argv = [f"--data_dir={data_dir}", f"--out_dir={root / 'run'}", *TINY_TRAIN_ARGS, "--max_iters=10"]
    train(load_config(argv))
    return root / "run", argv


@pytest.fixture
def fresh_data(small_data, tmp_path):
    """A copy of small_data, without its cached n-gram floors, that a test may change."""
    import shutil

    from babygpt import ngram

    copy = tmp_path / "data"
    shutil.copytree(small_data, copy, ignore=shutil.ignore_patterns(ngram.FLOORS_FILE))
    return str(copy)


def experiment_command(name: str):
    """experiments/<name>.py's main as its ``__main__`` runs it (_common.main: an error or a stop also
    says where the results --overwrite was replacing are kept), for a test to call in its process."""
    import importlib

    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    try:
        module = importlib.import_module(name)
        common = importlib.import_module("_common")
    finally:
        sys.path.remove(os.path.join(ROOT, "experiments"))
    return common.noting_replaced(module.main)


def run_script(script, *args, cwd, timeout=120):
    """Run one of the project's scripts as a user would, in ``cwd``."""
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def assert_user_error(stderr: str, returncode: int, *fragments):
    """Exit 2, one 'error: ...' line per problem, no traceback, and the expected words."""
    assert returncode == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), stderr
    for fragment in fragments:
        assert fragment in stderr, (fragment, stderr)


def assert_refused_in_process(main, argv, capsys, *fragments) -> str:
    """A script's ``main`` run in this process through babygpt.cli.run, as the script itself runs it,
    refused as a user error (assert_user_error); returns its stderr. For tests where the refusal, not
    the process, is under test: no interpreter to start, and a failure shows this test's traceback."""
    from babygpt import cli

    capsys.readouterr()  # what earlier steps printed is not this refusal's
    code = cli.run(main, list(argv))
    err = capsys.readouterr().err
    assert_user_error(err, code, *fragments)
    return err

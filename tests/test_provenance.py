"""Every run's config.json names the code that made it: the git commit, whether tracked files had
uncommitted changes, and the record's format version; each resume records its own."""

import json
import subprocess

import pytest

from babygpt import provenance
from babygpt.config import load_config
from babygpt.trainer import train
from conftest import ROOT, TINY_TRAIN_ARGS, once, prepare_small_data

pytestmark = pytest.mark.slow  # not in the fast loop: each test trains runs and reads their records


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("provenance"))


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout.strip()


def test_the_source_is_this_checkouts_head_and_its_tracked_changes():
    if not git("rev-parse", "HEAD"):
        pytest.skip("not a git checkout")
    provenance.source.cache_clear()
    assert provenance.source() == {"commit": git("rev-parse", "HEAD"),
                                   "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def test_without_git_the_source_is_unknown_not_an_error(monkeypatch):
    provenance.source.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")  # no git to run
    try:
        assert provenance.source() == {"commit": None, "dirty": None}
    finally:
        provenance.source.cache_clear()


def test_a_run_and_each_resume_record_their_source_and_the_format(data_dir, tmp_path):
    args = once(f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *TINY_TRAIN_ARGS)
    train(load_config([*args, "--max_iters=10"]))
    train(load_config([*args, "--max_iters=20", "--init_from=resume"]))
    record = json.loads((tmp_path / "config.json").read_text())
    assert record["format"] == provenance.RUN_RECORD_FORMAT == 2
    assert record["source"] == provenance.source() == record["resumes"][0]["source"]
    assert set(record["source"]) == {"commit", "dirty"}

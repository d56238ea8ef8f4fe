"""sample.py's pieces, in process (babygpt/sampling.py and its entry point): its options, prompt
files and --help, and its conveniences (a run directory as --ckpt, one greedy sample)."""

import pytest

from babygpt import cli
from babygpt.errors import BabyGPTError
from babygpt.options import ShowHelp, parse_into
from babygpt.sampling import USAGE, SampleOptions, read_prompt


def test_prompt_file_is_read_byte_for_byte(tmp_path):
    """A CRLF prompt reaches the model as CRLF: no newline translation on the way in."""
    path = tmp_path / "prompt.txt"
    path.write_bytes(b"ROMEO:\r\nO, she doth teach\r\n")
    assert read_prompt(f"FILE:{path}") == "ROMEO:\r\nO, she doth teach\r\n"
    assert read_prompt("plain text") == "plain text"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_prompt_path_that_is_not_a_regular_file_is_refused_without_waiting(tmp_path, kind):
    """A FIFO with no writer would block open() forever: refused before it is opened."""
    import os

    path = tmp_path / "prompt"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(BabyGPTError, match=f"prompt file '{path}' is (a directory|a pipe or socket, not a file)"):
        read_prompt(f"FILE:{path}")


def test_a_checkpoint_that_is_a_fifo_is_refused_as_such_without_waiting(tmp_path, capsys):
    """A FIFO at the checkpoint's path exists but is no file: saying "not found" would send the user
    looking for a file that is there; reading it would block."""
    import os

    from babygpt.checkpoint import load_checkpoint

    path = tmp_path / "ckpt.pt"
    os.mkfifo(path)
    with pytest.raises(BabyGPTError, match=f"checkpoint '{path}' is not a regular file"):
        load_checkpoint(str(path))
    assert cli.run(cli.sample_main, [f"--ckpt={path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not a regular file" in err and "Traceback" not in err


def test_sample_refuses_a_closed_stdout_before_loading_anything(tmp_path, monkeypatch, capsys):
    """Started with stdout closed (`sample.py ... >&-`), Python has no sys.stdout to write to."""
    import sys

    monkeypatch.setattr(sys, "stdout", None)
    code = cli.run(cli.sample_main, [f"--ckpt={tmp_path / 'missing.pt'}"])
    assert code == 2 and "standard output is closed" in capsys.readouterr().err


def test_a_crlf_prompt_for_a_model_without_carriage_returns_says_how_to_fix_it():
    from babygpt.data import CharTokenizer

    with pytest.raises(BabyGPTError, match="save the prompt file with LF line endings"):
        CharTokenizer(list("ROMEO:\n")).encode("ROMEO:\r\n")


def test_sample_options_in_both_spellings():
    a = parse_into(SampleOptions, ["--ckpt", "x.pt", "--temperature", "0", "--no_kv_cache", "--top_k=5"], USAGE)
    b = parse_into(SampleOptions, ["--ckpt=x.pt", "--temperature=0", "--no_kv_cache=true", "--top_k", "5"], USAGE)
    assert a == b and a.ckpt == "x.pt" and a.temperature == 0.0 and a.no_kv_cache and a.top_k == 5
    assert a.start == "\n" and a.num_samples == 3


def test_sample_option_problems_are_reported_together():
    with pytest.raises(BabyGPTError) as err:
        parse_into(SampleOptions, ["--temp=1", "--num_samples=two"], USAGE)
    joined = "\n".join(err.value.problems)
    assert "unknown option '--temp' (did you mean '--temperature'?)" in joined
    assert "num_samples must be an integer, got 'two'" in joined
    assert "--ckpt is required" in joined


def test_sample_range_problems_come_with_the_parsing_ones():
    with pytest.raises(BabyGPTError) as err:
        parse_into(SampleOptions, ["--ckpt=x.pt", "--num_samples=0", "--tempx=1", "--temperature=-1"], USAGE)
    joined = "\n".join(err.value.problems)
    assert "--num_samples must be positive" in joined and "did you mean '--temperature'" in joined
    assert "--temperature must be a finite number >= 0" in joined


def test_resume_hint_drops_init_from_in_either_spelling():
    from babygpt.cli import without_option

    argv = ["cfg.py", "--init_from", "scratch", "--max_iters=5", "--init_from=scratch", "--seed", "3"]
    assert without_option(argv, "init_from") == ["cfg.py", "--max_iters=5", "--seed", "3"]


def test_sample_help_lists_every_option():
    with pytest.raises(ShowHelp) as h:
        parse_into(SampleOptions, ["--help"], USAGE)
    for name in ("--ckpt", "--start", "--temperature", "--top_k", "--no_kv_cache"):
        assert name in h.value.text


@pytest.mark.slow
def test_sample_takes_a_run_directory_and_prints_one_greedy_sample(tiny_run, capsys):
    out, _ = tiny_run
    assert cli.run(cli.sample_main, [f"--ckpt={out}", "--temperature=0", "--max_new_tokens=5", "--device=cpu"]) == 0
    captured = capsys.readouterr()
    assert f"sampling from {out}/best.pt" in captured.err and "1 is printed, not 3" in captured.err
    assert captured.out.count("-" * 40) == 1


def test_sample_help_shows_the_newline_default_as_an_escape(capsys):

    assert cli.run(cli.sample_main, ["--help"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("--start"))
    assert "\\n" in line and "prompt text" in line

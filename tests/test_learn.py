"""The learning path (docs/learn/): every lesson has its parts, and every code block in it runs.

A lesson's Python blocks are pasted in order into one interactive console, from the repository
root, as the lessons tell a reader to run them (a blank line ends an indented block there); their
asserts are what the lesson claims. The tables
under "Look at" are generated blocks, kept equal to the reports by test_doctables."""

import code
import os
import re

import pytest

from babygpt import doctables
from conftest import ROOT

LEARN = os.path.join(ROOT, "docs", "learn")
LESSONS = sorted(name for name in os.listdir(LEARN) if re.fullmatch(r"\d\d-[\w-]+\.md", name))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
PARTS = ("## The idea", "## Try it", "## Look at", "## Check yourself")


def read(name: str) -> str:
    with open(os.path.join(LEARN, name), encoding="utf-8") as f:
        return f.read()


def test_the_path_links_every_lesson_in_order_and_the_readme_links_the_path():
    index = read("README.md")
    assert len(LESSONS) >= 6
    positions = [index.index(f"]({name})") for name in LESSONS]
    assert positions == sorted(positions)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert "](docs/learn/)" in readme[:readme.index("## Quick start")]  # near the top


@pytest.mark.parametrize("lesson", LESSONS)
def test_a_lesson_has_the_idea_code_a_measured_table_and_questions(lesson):
    text = read(lesson)
    assert [text.index(part) for part in PARTS] == sorted(text.index(part) for part in PARTS), "parts in order"
    look_at = text[text.index("## Look at"):text.index("## Check yourself")]
    assert doctables.blocks(look_at), "the lesson ends on a table from results/"
    questions = re.findall(r"^\d+\. \*.+?\?\*", text[text.index("## Check yourself"):], re.MULTILINE | re.DOTALL)
    assert len(questions) >= 2
    assert os.path.join("docs", "learn", lesson) in doctables.DOCUMENTS  # its tables are regenerated


class Paste(code.InteractiveConsole):
    """The interactive ``python`` prompt a reader pastes a lesson into, line by line: a blank line
    ends an indented block there, and a statement right after one without a blank line is a
    SyntaxError. Whatever the prompt would show as an error is kept in ``errors``."""

    def __init__(self):
        super().__init__({"__name__": "__console__"})
        self.errors = []

    def write(self, data):
        self.errors.append(data)

    def paste(self, block: str) -> None:
        for line in block.splitlines():
            self.push(line)
        self.push("")  # the Enter after the pasted block


@pytest.mark.parametrize("lesson", LESSONS)
@pytest.mark.slow
def test_every_code_block_of_a_lesson_runs_pasted_into_the_prompt(lesson, monkeypatch, capsys):
    blocks = FENCE.findall(read(lesson))
    assert blocks, "a lesson shows its idea in code"
    assert [language for language, _ in blocks] == ["python"] * len(blocks), "only Python blocks, all of them run"
    monkeypatch.chdir(ROOT)
    console = Paste()
    for number, (_, block) in enumerate(blocks, 1):
        console.paste(block)
        assert not console.errors, f"{lesson}, block {number}:\n{''.join(console.errors)}"
    assert capsys.readouterr().out, "each lesson prints what it shows"

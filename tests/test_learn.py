"""The learning path (docs/learn/): every lesson has its parts, and every code block in it runs.

A lesson's Python blocks run in order in one namespace, from the repository root, as a reader
pasting them into ``python`` would run them; their asserts are what the lesson claims. The tables
under "Look at" are generated blocks, kept equal to the reports by test_doctables."""

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


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_code_block_of_a_lesson_runs(lesson, monkeypatch, capsys):
    blocks = FENCE.findall(read(lesson))
    assert blocks, "a lesson shows its idea in code"
    assert [language for language, _ in blocks] == ["python"] * len(blocks), "only Python blocks, all of them run"
    monkeypatch.chdir(ROOT)
    namespace = {"__name__": "__lesson__"}
    for number, (_, code) in enumerate(blocks, 1):
        exec(compile(code, f"{lesson}, block {number}", "exec"), namespace)
    assert capsys.readouterr().out, "each lesson prints what it shows"

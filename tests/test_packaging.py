"""pyproject.toml: `pip install -e .` installs the library the scripts use, with the same dependencies
as requirements.txt (which pins them for the tests and CI)."""

import os
import re
import tomllib

from conftest import ROOT


def project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def names(requirements):
    return {re.split(r"[<>=!~\[ ;]", r.strip(), maxsplit=1)[0].lower() for r in requirements if r.strip()}


def test_the_package_declares_requirements_txt_dependencies():
    meta = project()["project"]
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        pinned = names(line for line in f if not line.startswith("#"))
    declared = names(meta["dependencies"]) | names(meta["optional-dependencies"]["test"])
    assert declared == pinned


def test_the_package_is_the_library_directory_and_has_no_subpackage_left_out():
    packages = project()["tool"]["setuptools"]["packages"]
    found = sorted(os.path.relpath(d, ROOT).replace(os.sep, ".") for d, _, files in os.walk(os.path.join(ROOT, "babygpt"))
                   if "__init__.py" in files)
    assert packages == found == ["babygpt"]

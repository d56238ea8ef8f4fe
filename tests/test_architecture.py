"""The package's layers (docs/architecture.md): every module is in one, imports only from its own
layer or a lower one, and no imports form a circle."""

import ast
import glob
import os
import re

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # not in the fast loop: each test parses the whole package

LAYERS = {  # docs/architecture.md's table, lowest first
    "foundation": ["errors", "options", "files", "runtime", "signals", "foreign", "provenance", "stats", "sequential"],
    "model": ["norms", "placements", "init", "model", "diagnostics"],
    "data and records": ["data", "ngram", "checkpoint", "state", "rundir", "memory", "tracker"],
    "training": ["config", "optim", "step", "averaging", "distributed", "trainer", "sampling", "cli"],
    "study": ["runstore", "sweepdir", "sweep", "launcher", "scaleout", "tuning", "verdicts", "compare_runs", "plot", "references",
              "experimentdir", "bench"],
    "maintenance": ["doctables", "docfigures", "docverdicts", "resultsindex", "rankings"],
}
LEVEL = {module: level for level, modules in enumerate(LAYERS.values()) for module in modules}
NAMES = list(LAYERS)


def package_imports() -> dict[str, set[str]]:
    """{module: the babygpt modules it imports}, from the source (imports inside functions count)."""
    found = {}
    for path in glob.glob(os.path.join(ROOT, "babygpt", "*.py")):
        name = os.path.basename(path)[:-3]
        if name == "__init__":
            continue
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom):
                parts = ([] if node.level == 0 else ["babygpt"]) + (node.module or "").split(".")
                parts = [p for p in parts if p]
                if parts[:1] != ["babygpt"]:
                    continue
                deps |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith("babygpt.")}
        found[name] = deps - {name}
    return found


def test_every_module_is_in_exactly_one_layer():
    modules = set(package_imports())
    placed = [m for ms in LAYERS.values() for m in ms]
    assert len(placed) == len(set(placed)), "a module is in two layers"
    assert modules - set(placed) == set(), "add these modules to a layer here and in docs/architecture.md"
    assert set(placed) - modules == set(), "these modules no longer exist"


def test_no_module_imports_from_a_higher_layer():
    upward = [f"{m} ({NAMES[LEVEL[m]]}) imports {d} ({NAMES[LEVEL[d]]})"
              for m, deps in package_imports().items() for d in sorted(deps) if LEVEL[d] > LEVEL[m]]
    assert upward == []


def test_the_imports_form_no_circle():
    graph, state, circles = package_imports(), {}, []

    def visit(module, path):
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_the_architecture_page_lists_the_same_layers():
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    for level, (name, modules) in enumerate(LAYERS.items()):
        row = next(line for line in text.splitlines() if line.startswith(f"| {level} {name} |"))
        assert row.split("|")[2].strip() == ", ".join(f"`{m}`" for m in modules), name


def test_the_architecture_page_describes_every_module_once():
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    listed = re.findall(r"^babygpt/(\w+)\.py ", text, re.MULTILINE)
    assert sorted(listed) == sorted(package_imports()), "docs/architecture.md's module list"


def test_no_placement_is_named_outside_placements_py():
    """What the rest of the package needs of a placement is declared on its class (placements.py):
    a name compared anywhere else is a contract that leaks, and a new placement would miss it."""
    from babygpt.placements import HYBRID_FIRST, PLACEMENTS

    names = {*PLACEMENTS, HYBRID_FIRST.name}
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "babygpt", "*.py"))):
        if os.path.basename(path) == "placements.py":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{os.path.basename(path)}:{node.lineno} {node.value!r}")
    assert found == []


def test_the_readmes_lists_of_norms_and_placements_are_the_registries():
    """A norm or placement added to its registry and not to the README's lists fails here by name."""
    import re

    from babygpt.norms import NORMS
    from babygpt.placements import PLACEMENTS

    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    norms = re.search(r"`norm_type` is one of `([^`]+)`", text).group(1).split(", ")
    placements = re.search(r"`norm_placement` one of `([^`]+)`", text).group(1).split(", ")
    assert norms == list(NORMS)
    assert placements == list(PLACEMENTS)


def test_the_front_page_stays_two_screens():
    """The README is the front page: what it is, set-up, what to expect, sampling, an ablation, the
    configs, the bottom line and links; the rest lives in docs/."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= 250


def test_the_costly_modules_tests_are_grouped_onto_one_worker(request):
    """Under pytest-xdist's --dist loadgroup (pytest.ini), each test of conftest.ONE_WORKER_MODULES
    carries its group in its id (its module's, or in test_faults its scenario's), which is what keeps
    the group on one worker (and its module fixtures built once). pytest 9 broke that silently with pytest-xdist 3.8: requirements.txt."""
    import pytest

    from conftest import ONE_WORKER_MODULES

    if not (os.environ.get("PYTEST_XDIST_WORKER") and request.config.getvalue("loadgroup")):
        pytest.skip("not run by a pytest-xdist worker under --dist loadgroup")
    items = [i for i in request.session.items if i.module.__name__.rpartition(".")[2] in ONE_WORKER_MODULES]
    if not items:
        pytest.skip("none of the costly modules was collected with this test")
    ungrouped = [i.nodeid for i in items if "@" not in i.nodeid.rpartition("::")[2]]
    assert not ungrouped, f"{len(ungrouped)} tests without their group, e.g. {ungrouped[0]}"

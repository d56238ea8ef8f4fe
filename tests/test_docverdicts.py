"""The verdict check of doctables --check (babygpt/docverdicts.py): every verdict the docs state
names its table, and the table draws it."""

import os

import pytest

from babygpt import doctables
from babygpt.docverdicts import claims_in, verdict_problems, verdict_problems_in_file
from conftest import ROOT

TABLE = """| configuration | tuned LR | runner-up LR | paired Δ | verdict |
|---|---|---|---|---|
| prenorm_rms | 0.0055 | 0.01 | (baseline) | — |
| periln_rms | 0.003 | 0.0055 | -0.033 ± 0.010 | better |
| prenorm_ln | 0.0055 | 0.003 | +0.002 ± 0.008 | inconclusive |
| prenorm_none | 0.0055 | 0.003 | +0.060 ± 0.018 | worse |
| prenorm_scale | 0.0055 | 0.003 | +0.001 ± 0.002 | equivalent within ±0.010 |
"""
REPORT = "results/x/report.md"


def read(report, key):
    assert (report, key) == (REPORT, "tuned")
    return TABLE


def problems(text):
    return verdict_problems(text, read, "doc.md")


@pytest.mark.parametrize("sentence", [
    # the kinds of sentence an outside reading found stale, each a claim the check must see
    "Under the protocol: RMSNorm = LayerNorm still holds.",
    "ScaleNorm and gain-less RMSNorm are worse at their own LRs.",
    "QK-norm is worse with an interval that barely excludes zero.",
    "Peri-LN is level with Pre-LN.",
    "- **No norm is worse**, by 0.060.",
    "Post-LN stays inconclusive.",
])
def test_each_kind_of_verdict_sentence_is_a_claim_and_needs_a_marker(sentence):
    assert claims_in(sentence)
    found = problems(sentence + "\n")
    assert len(found) == 1 and "without a <!-- verdict" in found[0] and found[0].startswith("doc.md:1:")


@pytest.mark.parametrize("sentence", [
    "A better LR would help.",
    "`norm_type = RMSNorm` sets it.",
    "Set `final_norm = True` to force it.",
    "The worse of the two seeds ended at 1.60.",
])
def test_ordinary_sentences_are_no_claims(sentence):
    assert claims_in(sentence) == [] and problems(sentence + "\n") == []


def test_a_marker_that_matches_its_table_passes():
    text = ("**Peri-LN is better** and no norm is worse. "
            f"<!-- verdict: {REPORT}#tuned periln_rms=better prenorm_none=worse prenorm_rms=baseline -->\n"
            f"Pre-LN LayerNorm is inconclusive at 0.0055. <!-- verdict: {REPORT}#tuned prenorm_ln=inconclusive "
            f"prenorm_ln:tuned=5.5e-3 prenorm_ln:runner_up=0.003 -->\n"
            f"ScaleNorm is equivalent. <!-- verdict: {REPORT}#tuned prenorm_scale=equivalent -->\n")
    assert problems(text) == []


def test_a_stale_verdict_is_named_with_the_table_and_its_verdict():
    found = problems(f"Peri-LN is level with Pre-LN. <!-- verdict: {REPORT}#tuned periln_rms=inconclusive -->\n")
    assert found == [f"doc.md:1: periln_rms is 'better' in {REPORT}#tuned, not 'inconclusive'"]


def test_a_wrong_tuned_lr_is_named():
    found = problems(f"The baseline is worse at its tuned 1e-2. <!-- verdict: {REPORT}#tuned "
                     f"prenorm_none=worse prenorm_rms:tuned=1e-2 -->\n")
    assert found == [f"doc.md:1: prenorm_rms's tuned LR is 0.0055 in {REPORT}#tuned, not 1e-2"]


def test_a_verdict_over_the_runs_that_trained_is_read_from_its_own_column():
    table = ("| configuration | verdict | verdict on the runs that trained |\n|---|---|---|\n"
             "| prenorm_rms | — | — |\n| postnorm_ln | inconclusive | better (4 pairs) |\n"
             "| prenorm_ln | inconclusive | — (every run trained) |\n")
    def check(text):
        return verdict_problems(text, lambda report, key: table, "doc.md")
    assert check(f"Post-LN is inconclusive, and better where it trained. <!-- verdict: {REPORT}#tuned "
                 f"postnorm_ln=inconclusive postnorm_ln:trained=better -->\n") == []
    assert check(f"Post-LN is inconclusive on the runs that trained. <!-- verdict: {REPORT}#tuned "
                 f"postnorm_ln:trained=inconclusive -->\n") == [
        f"doc.md:1: postnorm_ln's verdict on the runs that trained is 'better (4 pairs)' in {REPORT}#tuned, "
        f"not inconclusive"]
    assert "is '— (every run trained)'" in check(f"LayerNorm is inconclusive where it trained. <!-- verdict: "
                                                 f"{REPORT}#tuned prenorm_ln:trained=inconclusive -->\n")[0]
    assert "'great' is no verdict" in check(f"Post-LN is better. <!-- verdict: {REPORT}#tuned "
                                            f"postnorm_ln:trained=great -->\n")[0]
    assert problems(f"Peri-LN is better. <!-- verdict: {REPORT}#tuned periln_rms:trained=better -->\n") == [
        f"doc.md:1: {REPORT}#tuned has no column 'verdict on the runs that trained'"]


def test_a_marker_on_its_own_line_covers_the_block_above():
    text = ("- **No norm is worse**,\n- **Peri-LN is better**.\n"
            f"<!-- verdict: {REPORT}#tuned prenorm_none=worse periln_rms=better -->\n")
    assert problems(text) == []


@pytest.mark.parametrize("body,message", [
    ("none", "needs its reason"),
    (f"{REPORT}#tuned periln_rms=great", "'great' is no verdict"),
    (f"{REPORT}#tuned periln_rms:best=1e-3", "'best' is no column"),
    ("periln_rms=better", "cannot read"),
    (f"{REPORT}#tuned nosuch=better", "has no row 'nosuch'"),
])
def test_a_marker_that_cannot_be_read_or_checked_is_a_problem(body, message):
    found = problems(f"Peri-LN is better. <!-- verdict: {body} -->\n")
    assert len(found) == 1 and message in found[0]


def test_none_with_a_reason_covers_a_sentence_that_is_no_verdict_of_a_table():
    assert problems("Kim et al. report that Peri-LN is better. <!-- verdict: none: the paper's claim -->\n") == []


def test_a_marker_that_covers_no_claim_is_a_problem():
    found = problems(f"The runs took 5 minutes. <!-- verdict: {REPORT}#tuned periln_rms=better -->\n")
    assert found == ["doc.md:1: verdict marker covers no verdict claim: move it after the sentence that states "
                     "the verdict, or remove it"]


def test_claims_in_code_and_generated_tables_are_not_read():
    text = ("```\nPeri-LN is better\n```\n"
            f"<!-- generated: {REPORT}#tuned -->\n| a | is worse |\n<!-- end generated -->\n")
    assert problems(text) == []


@pytest.mark.parametrize("name", doctables.FIGURE_DOCUMENTS)
def test_every_verdict_of_the_committed_documents_is_its_tables(name):
    """Run python -m babygpt.doctables --check to see these with the rule's hint."""
    assert verdict_problems_in_file(os.path.join(ROOT, name), ROOT, doctables.table_in_repository) == []

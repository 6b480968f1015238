"""Every template that embeds a marked block holds a verbatim copy of the library's: a copied
template runs alone, and a fix in one place reaches every copy. A copy may sit indented (under
``except ImportError:``, where it stands in for the installed package); its lines, less that
indentation, are the library's."""
import difflib

import pytest

from conftest import ROOT

BLOCKS = {"telemetry": ROOT / "supervise" / "telemetry.py", "hf callback": ROOT / "supervise" / "hf.py"}
TEMPLATES = sorted((ROOT / "templates").glob("*.py"))


def marked_block(text: str, where: str, name: str = "telemetry") -> str | None:
    """The lines from ``# --- NAME: begin ---`` to ``# --- NAME: end ---`` inclusive, less the
    begin marker's indentation; None when the file has no markers."""
    begin, end = f"# --- {name}: begin ---", f"# --- {name}: end ---"
    if begin not in text and end not in text:
        return None
    assert text.count(begin) == 1 and text.count(end) == 1, f"{where}: one {begin!r} and one {end!r}, in order"
    start, stop = text.index(begin), text.index(end)
    assert start < stop, f"{where}: {end!r} comes before {begin!r}"
    line_start = text.rfind("\n", 0, start) + 1
    indent = text[line_start:start]
    assert not indent.strip(), f"{where}: {begin!r} must start its line"
    lines = text[line_start:stop + len(end)].splitlines()
    assert all(ln.startswith(indent) or not ln for ln in lines), f"{where}: the {name} block is not indented evenly"
    return "\n".join(ln[len(indent):] for ln in lines)


def test_there_are_templates():
    assert {p.name for p in TEMPLATES} >= {"train_hf.py", "train_torch.py"}, TEMPLATES


@pytest.mark.parametrize("name", BLOCKS)
def test_the_library_has_the_markers(name):
    assert marked_block(BLOCKS[name].read_text(), str(BLOCKS[name].relative_to(ROOT)), name)


@pytest.mark.parametrize("name", BLOCKS)
@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_template_copy_is_verbatim(template, name):
    source = BLOCKS[name].relative_to(ROOT)
    original = marked_block(BLOCKS[name].read_text(), str(source), name)
    copy = marked_block(template.read_text(), f"templates/{template.name}", name)
    if copy is None:
        assert name != "telemetry", f"templates/{template.name} has no {name} block: every template embeds it"
        return  # only train_hf.py carries the HF callback block
    if copy != original:
        diff = "".join(list(difflib.unified_diff(original.splitlines(True), copy.splitlines(True),
                                                 str(source), f"templates/{template.name}"))[:40])
        pytest.fail(f"templates/{template.name} drifted from {source}; copy the block between the markers "
                    f"again (indented as the template's markers are):\n{diff}")


def test_the_hf_template_holds_both_blocks():
    text = (ROOT / "templates" / "train_hf.py").read_text()
    assert marked_block(text, "train_hf.py") and marked_block(text, "train_hf.py", "hf callback")

"""Every template embeds the Telemetry class as a verbatim copy of supervise/telemetry.py's marked
block: a copied template runs alone, and a fix in one place reaches every copy."""
import difflib

import pytest

from conftest import ROOT

BEGIN, END = "# --- telemetry: begin ---", "# --- telemetry: end ---"
TEMPLATES = sorted((ROOT / "templates").glob("*.py"))


def marked_block(text: str, where: str) -> str | None:
    """The lines from BEGIN to END inclusive; None when the file has no markers."""
    if BEGIN not in text and END not in text:
        return None
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{where}: one {BEGIN!r} and one {END!r}, in order"
    start, end = text.index(BEGIN), text.index(END)
    assert start < end, f"{where}: {END!r} comes before {BEGIN!r}"
    return text[start:end + len(END)]


def test_there_are_templates():
    assert {p.name for p in TEMPLATES} >= {"train_hf.py", "train_torch.py"}, TEMPLATES


def test_the_library_has_the_markers():
    assert marked_block((ROOT / "supervise" / "telemetry.py").read_text(), "supervise/telemetry.py")


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_template_copy_is_verbatim(template):
    original = marked_block((ROOT / "supervise" / "telemetry.py").read_text(), "supervise/telemetry.py")
    copy = marked_block(template.read_text(), f"templates/{template.name}")
    assert copy is not None, f"templates/{template.name} has no {BEGIN!r} markers: every template embeds the block"
    if copy != original:
        diff = "".join(list(difflib.unified_diff(original.splitlines(True), copy.splitlines(True),
                                                 "supervise/telemetry.py", f"templates/{template.name}"))[:40])
        pytest.fail(f"templates/{template.name} drifted from supervise/telemetry.py; copy the block between the "
                    f"markers again:\n{diff}")

"""SKILL.md and its references against the real scripts: nothing missing, nothing stale."""
import argparse
import importlib
import re
import shlex

import pytest

from conftest import ROOT
from supervise.judge.table import KINDS

SKILL = (ROOT / "SKILL.md").read_text()
DOCS = SKILL + "".join(p.read_text() for p in sorted((ROOT / "references").glob("*.md")))
SCRIPTS = sorted(p.stem for p in (ROOT / "scripts").glob("*.py"))
PARSERS = {"watchdog": "supervise.tools.watch:build_parser"}


def front_matter():
    m = re.match(r"^---\n(.*?)\n---\n", SKILL, re.S)
    return dict(re.findall(r"^(\w[\w-]*): (.*)$", m.group(1), re.M))


def test_front_matter_is_portable():
    fm = front_matter()
    assert fm["name"] == "supervising-training-runs"
    assert set(fm) <= {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
    assert len(fm["description"]) <= 1024 and "<" not in fm["description"] and ">" not in fm["description"]
    assert len(fm["description"].split()) <= 90  # about 120 tokens: it is always in context
    assert "15 minutes" in fm["description"]


def test_body_is_short():
    assert len(SKILL.splitlines()) < 500
    assert len(SKILL) <= 10_000  # front matter and body, read on every invocation: ~2,500 tokens; detail lives in references/


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s != "demo"])
def test_every_script_appears(script):
    assert f"scripts/{script}.py" in DOCS


@pytest.mark.parametrize("kind", KINDS)
def test_every_anomaly_kind_is_documented_with_a_recovery(kind):
    recovery = (ROOT / "references" / "recovery.md").read_text()
    assert f"`{kind}`" in recovery and f"`{kind}`" in DOCS


def parser_of(script):
    """The script's real argparse parser, captured by running its main with --help."""
    front = re.search(r"^from (supervise\.[\w.]+) import main", (ROOT / "scripts" / f"{script}.py").read_text(), re.M)
    mod = importlib.import_module(front.group(1))   # the module the script is the front door of
    import argparse
    captured = {}
    real = argparse.ArgumentParser.parse_args

    def grab(self, args=None, namespace=None):
        captured["p"] = self
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab
    try:
        try:
            mod.main([])
        except SystemExit:
            pass
    finally:
        argparse.ArgumentParser.parse_args = real
    return captured["p"]


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s != "demo"])
def test_every_flag_is_documented(script):
    p = parser_of(script)
    flags = [o for a in p._actions for o in a.option_strings if o.startswith("--") and o != "--help"
             and a.help != argparse.SUPPRESS]  # the detached watchdog's own internal flag
    missing = [f for f in flags if f not in DOCS and f"{f} " not in DOCS]
    if script == "watchdog":
        assert missing == [], missing  # the watchdog's flags are all in references/thresholds.md
    else:
        assert all(f in p.format_help() for f in flags)  # documented in --help, which SKILL.md points to
        assert f"scripts/{script}.py" in SKILL


def skill_commands():
    for block in re.findall(r"```bash\n(.*?)```", SKILL, re.S):
        for line in block.strip().splitlines():
            m = re.search(r"\$\{CLAUDE_SKILL_DIR\}/scripts/(\w+)\.py(.*)", line)
            if m:
                yield m.group(1), m.group(2)


@pytest.mark.parametrize("script,rest", list(skill_commands()))
def test_every_skill_command_parses(script, rest):
    words = shlex.split(rest.split(" > ")[0])
    if script == "smoke" and "--" in words:
        words = words[:words.index("--")]
    p = parser_of(script)
    ns = p.parse_args(words)  # raises SystemExit(2) on a flag the script does not take
    assert ns is not None


def launch_lines():
    """Every launch line of SKILL.md: the launch step's, and the torchrun one of the telemetry step."""
    return [ln for block in re.findall(r"```bash\n(.*?)```", SKILL, re.S) for ln in block.strip().splitlines()
            if "/scripts/launch.py " in ln]


@pytest.mark.parametrize("line", launch_lines())
def test_the_launch_lines_are_the_launcher_on_one_line(line):
    assert " -- python -u " in line  # detached, outliving the session
    from supervise.guard.hook import decide
    from supervise.guard.shell import Call
    for background in (False, True):
        assert decide(Call("Bash", line, background=background)) is None
    assert decide(Call("Bash", line.replace(" -- ", "\n-- "), background=True)).startswith("[one_line]")


def test_the_steps_come_in_order_telemetry_before_bench_and_smoke():
    heads = re.findall(r"^## (\d)\. (.+)$", SKILL, re.M)
    assert [int(n) for n, _ in heads] == list(range(1, 9))
    order = [title.split()[0].lower() for _, title in heads]
    assert order.index("put") < order.index("bench") < order.index("smoke") < order.index("launch")
    assert any("-m torch.distributed.run" in x for x in launch_lines())  # never a bare torchrun
    assert 'pip install -e "${CLAUDE_SKILL_DIR}[trl]"' in SKILL and "supervising-training-runs[" not in SKILL


@pytest.mark.parametrize("line", ["exit 2", "NOT STARTED", "watchdog: gone", "STOPPED", "OK done", "FINISHING",
                                  "exit other than 0, 2, 7", "no relaunch line"])
def test_every_result_has_a_branch(line):
    results = SKILL[SKILL.index("## What each result means"):SKILL.index("## Healthy trajectory")]
    assert line in results


def test_the_alarm_table_says_what_thresholds_holds():
    """SKILL.md's alarm table against Thresholds(): every number it states is the default."""
    from supervise.thresholds import Thresholds
    th = Thresholds()
    table = SKILL[SKILL.index("## Healthy trajectory"):SKILL.index("## Red flags")]
    said = {
        "after 400 steps (`chance_loss`)": th.chance_step == 400,
        "< 0.70 after step 500 (`stuck_auroc`)": (th.min_auroc, th.min_auroc_step) == (0.70, 500),
        "≤ 0.30 (`inverted_labels`)": round(1 - th.min_auroc, 2) == 0.30,
        "> 50 (`grad_explode`) or < 1e-3 (`grad_collapse`) for 5 records": (th.grad_high, th.grad_low, th.sustain) == (50, 1e-3, 5),
        "10x max(chance, its best median) for 5 records (`diverged`)": (th.diverge_factor, th.sustain) == (10, 5),
        "2x its rolling mean for 5 records (`loss_spike`)": (th.spike_factor, th.sustain) == (2, 5),
        "25% below the baseline for 5 min (`throughput`)": (th.throughput_drop, th.throughput_window) == (0.25, 300),
        "0.75x the others (`straggler`)": th.straggler_ratio == 0.75,
        "or 6 min, or stopped (`stall`": th.max_stall == 360,
        "no step record after 5 min (`no_telemetry`)": th.startup_grace == 300,
        "GPU idle 5 min (`gpu_idle`)": th.gpu_idle == 300,
        "the launcher's `--window`, else 1.5x the projected time (`timeout`)": th.timeout_margin == 1.5 and th.hard_timeout == 0,
    }
    for text, true in said.items():
        assert text in table, text
        assert true, f"SKILL.md says {text!r}, Thresholds() says otherwise"


def test_the_alarm_table_names_every_kind():
    from supervise.judge.table import KINDS
    table = SKILL[SKILL.index("## Healthy trajectory"):SKILL.index("## Red flags")]
    assert [k for k in KINDS if f"`{k}`" not in table] == ["overfit"]   # a check-in warning, no alarm by default


def test_the_readmes_ok_done_example_has_the_lines_shape():
    """The README's OK done example against judge._done's shape, rendered by the judge itself."""
    import re
    readme = (ROOT / "README.md").read_text()
    (example,) = re.findall(r"^OK done: .*$", readme, re.M)
    from supervise.judge.table import _done
    from supervise.observe.observation import Observation, Records
    obs = Observation(now=12.0, watch_started=0.0, records=Records(start={"total_steps": 376, "attempt": 1}, last_step=376),
                      sentinel={"eval_auroc": 1, "eval_acc": 0.9983}, sentinel_name="final_val_metrics.json")
    assert _done(obs, ()).line == example

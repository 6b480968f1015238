"""The documents against what the code does: each test reads a doc (SKILL.md, README.md,
references/*.md) and the code or its behaviour, and fails when they disagree."""
import inspect
import json
import re
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, need, run_script, start_script, wait_for_lines, wait_for_polls
from supervise.judge.table import KINDS
from supervise.thresholds import Thresholds

SKILL = (ROOT / "SKILL.md").read_text()
README = (ROOT / "README.md").read_text()
TH = Thresholds()


def section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end, text.index(start))]


def heads() -> dict:
    """SKILL.md's numbered steps: {n: title}."""
    return {int(n): t for n, t in re.findall(r"^## (\d)\. (.+)$", SKILL, re.M)}


def test_skill_leaves_room_under_its_limit():
    assert len(SKILL) <= 9_600, len(SKILL)  # 10,000 is the hard limit (test_skill.py); room for step 8 to grow


# --- 1. diverged ------------------------------------------------------------------------------

def _diverged(losses, start=None):
    """The step Diverged first fires at over step records with these losses, or None."""
    from supervise.judge.table import RECORD_RULES
    from supervise.observe.records import RecordRules
    rules = RecordRules(TH, RECORD_RULES)
    rules.add({"event": "start", "t": 0, **(start or {})})
    for i, loss in enumerate(losses):
        rules.add({"step": 10 * (i + 1), "t": float(i), "loss": loss})
    hit = rules.hits.get("diverged")
    return hit.step if hit else None


def test_the_diverged_row_is_the_rule():
    table = section(SKILL, "## Healthy trajectory", "## Red flags")
    m = re.search(r"(\d+)x max\(chance, its best median\) for (\d+) records \(`diverged`\)", table)
    assert m, "SKILL.md's diverged row"
    factor, n = float(m.group(1)), int(m.group(2))
    assert (factor, n) == (TH.diverge_factor, TH.sustain)
    best = 0.05                                       # below chance (ln 2): the limit is factor x chance
    limit = factor * max(0.6931, best)
    healthy = [best] * 20
    # n records above the limit: diverged at the n-th, not before
    assert _diverged(healthy + [limit * 1.05] * n) == 10 * (20 + n)
    assert _diverged(healthy + [limit * 1.05] * (n - 1)) is None
    assert _diverged(healthy + [limit * 0.9] * 3 * n) is None          # below the factor: never
    best = 2.0                                        # above chance: the limit is factor x the best median
    assert _diverged([best] * 20 + [factor * best * 1.05] * n) == 10 * (20 + n)
    assert _diverged([best] * 20 + [factor * best * 0.9] * 3 * n) is None


def test_contract_md_says_the_other_two_diverged_conditions():
    contract = (ROOT / "references" / "contract.md").read_text()
    assert "`diverged`" in contract and "max(chance, the run's best rolling median)" in contract
    n, k = TH.sustain, TH.diverge_factor
    # the median of the last n above k x a declared chance: before n records are all above it
    assert _diverged([0.3] * 20 + [k * 0.6931 * 1.5] * n, {"task": "classification", "num_labels": 2}) == 10 * (20 + n // 2 + 1)
    # 2n records rising at every one to k x where they began, on a task with no chance level
    rise = [1.0 * (k * 1.2) ** (i / (2 * n - 1)) for i in range(2 * n)]
    assert _diverged(rise, {"task": "regression"}) == 10 * 2 * n


# --- 2. SIGTERM is STOPPED, exit 0 ------------------------------------------------------------

ALIVE = ("--no-sentinel", "--linger", "60")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_is_stopped_exit_0_as_the_table_says(tmp_path, trainer, sig):
    from supervise.tools.watch import STOP_SIGNALS
    results = section(SKILL, "## What each result means", "## Healthy trajectory")
    stopped = [r for r in results.splitlines() if "`STOPPED: watchdog ended by" in r]
    assert len(stopped) == 1 and "watchdog exit 0" in stopped[0] and sig.name in stopped[0], stopped
    (died,) = [r for r in results.splitlines() if "exit other than 0, 2, 7" in r]
    listed = {int(c) for c in re.findall(r"\b(\d{2,3})\b", died)}
    assert sig in STOP_SIGNALS and 128 + sig not in listed, f"SKILL.md lists {128 + sig} ({sig.name}) as a death"
    trainer(tmp_path, "--records", 2000, *ALIVE)
    wait_for_lines(tmp_path / "metrics.jsonl", 3)
    wd = start_script("watchdog.py", tmp_path, "--poll", "0.3")
    wait_for_polls(tmp_path, 1, wd)
    wd.send_signal(sig)
    out, err = wd.communicate(timeout=30)
    assert wd.returncode == 0, out + err
    prefix = re.search(r"`(STOPPED: watchdog ended by )SIG\w+ \.\.\.`", stopped[0]).group(1)
    assert out.startswith(prefix + sig.name), out


# --- 3. bench exits 7 on DOES NOT FIT ---------------------------------------------------------

WRITER = """import json, sys, os
run = sys.argv[1]
os.makedirs(run, exist_ok=True)
with open(os.path.join(run, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"event": "start", "t": 0, "pid": os.getpid(), "batch_size": 8}) + "\\n")
    for i in range(1, 6):
        f.write(json.dumps({"step": i, "t": i * 0.1, "loss": 0.5, "sps": 100.0}) + "\\n")
"""


@pytest.mark.parametrize("samples,code", [(10**9, 7), (1000, 0)])
def test_bench_exit_code_is_what_the_docs_say(tmp_path, samples, code):
    step2 = section(SKILL, "## 2. ", "## 3. ")
    assert "`DOES NOT FIT: subsample to N samples` (exit 7)" in step2
    (row,) = [r for r in README.splitlines() if r.startswith("| 2. bench |")]
    assert "(exit 7: DOES NOT FIT)" in row
    (tmp_path / "writer.py").write_text(WRITER)
    run = tmp_path / "run"
    rc, out, err = run_script("bench.py", "--cmd", f"{sys.executable} {tmp_path / 'writer.py'} {run}", "--run-dir", run,
                              "--samples", samples, "--epochs", 1, "--window", "10m")
    assert rc == code, out + err
    last = out.strip().splitlines()[-1]
    if code == 7:
        assert re.match(r"DOES NOT FIT: subsample to [\d,]+ samples", last), last
    else:
        assert last == "FITS", last


# --- 4. the copied telemetry file -------------------------------------------------------------

def test_the_copied_telemetry_files_import_line_works_alone(tmp_path):
    line = "from telemetry import Telemetry"
    assert f"`{line}`" in section(SKILL, "## 1. ", "## 2. ") and f"`{line}`" in README
    shutil.copy(ROOT / "supervise" / "telemetry.py", tmp_path / "telemetry.py")
    body = (f"{line}\ntm = Telemetry('run', num_labels=2, total_steps=2, batch_size=2)\n"
            "tm.step(1, 0.6)\ntm.step(2, 0.5)\ntm.done(eval_loss=0.5)\n")
    (tmp_path / "train.py").write_text(body)
    # -S: no site-packages, so no installed supervise package: the copy alone
    p = subprocess.run([sys.executable, "-S", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "run" / "final_val_metrics.json").exists()
    kinds = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert kinds[0]["event"] == "start" and [r["step"] for r in kinds[1:]] == [1, 2]
    (tmp_path / "train.py").write_text(body.replace(line, "from supervise.telemetry import Telemetry"))
    p = subprocess.run([sys.executable, "-S", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "ModuleNotFoundError" in p.stderr  # the package's line needs the install


# --- 5. next: no relaunch line ----------------------------------------------------------------

def test_the_no_relaunch_row_quotes_what_checkin_prints(tmp_path):
    results = section(SKILL, "## What each result means", "## Healthy trajectory")
    m = re.search(r"check-in `(next: no relaunch line: )<why>`", results)
    assert m, "SKILL.md's no relaunch line row"
    gone = subprocess.Popen(["true"])
    gone.wait()
    recs = [{"event": "start", "t": 0, "pid": gone.pid, "run_id": "r1", "attempt": 1, "task": "classification",
             "num_labels": 2, "total_steps": 100, "argv": ["train.py"], "cwd": str(tmp_path), "python": sys.executable}]
    recs += [{"step": 10 * i, "t": float(i), "loss": 0.5} for i in (1, 2, 3)]
    recs += [{"step": 30, "t": 3.5, "FATAL": "ValueError: bad row 7 in shard 3"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rc, out, err = run_script("watchdog.py", tmp_path, "--poll", "0.2", "--orphan-grace", "0.3")
    assert rc == 7 and out.startswith("ANOMALY fatal"), out + err
    rc, out, err = run_script("checkin.py", tmp_path)
    assert [ln for ln in out.splitlines() if ln.startswith(m.group(1))], out


# --- 6. step numbers --------------------------------------------------------------------------

# a label's word -> the word SKILL.md's heading of that step holds
WORDS = {"telemetry": "telemetry", "bench": "bench", "audit": "audit", "smoke": "smoke", "launch": "launch",
         "watchdog": "watchdog", "check-in": "polling", "check": "polling", "recover": "recover"}


def _step_of(word: str) -> int:
    (n,) = [n for n, t in heads().items() if WORDS[word] in t.lower()]
    return n


def test_the_readme_table_numbers_skills_steps():
    table = section(README, "## The procedure", "## The loop")
    rows = re.findall(r"^\| (\d)(?:[–-](\d))?\. ([\w-]+)", table, re.M)
    assert rows
    seen = set()
    for a, b, word in rows:
        first, last = int(a), int(b or a)
        assert _step_of(word) == first, (a, b, word)
        seen.update(range(first, last + 1))
    assert seen == set(heads()) == set(range(1, 9)), seen


def test_the_demo_labels_skills_steps():
    from supervise.tools import demo
    src = inspect.getsource(demo._main)
    labels = re.findall(r"""(?:step|say)\(f?["'](\d)\. ([\w-]+)""", src)
    assert {int(n) for n, _ in labels} == set(range(1, 9)), labels
    for n, word in labels:
        assert _step_of(word) == int(n), (n, word)


def test_step_numbers_in_the_references_point_at_skills_steps():
    """Every 'step N' of the references and the demo (not a training step: 'at step 120') has heading
    N's subject within a line of it."""
    subject = {1: ("telemetry",), 2: ("bench",), 3: ("audit",), 4: ("smoke",), 5: ("launch",), 6: ("watchdog",),
               7: ("check-in", "checkin"), 8: ("recover", "next:")}
    for n, words in subject.items():
        assert _step_of({"check-in": "check-in", "next:": "recover"}.get(words[0], words[0])) == n
    from supervise.tools import demo
    texts = {p.name: p.read_text() for p in sorted((ROOT / "references").glob("*.md"))}
    texts["demo.py"] = inspect.getsource(demo)
    found = 0
    for name, text in texts.items():
        for m in re.finditer(r"(?<!at )(?<!from )\bstep ([1-8])\b(?![\d/,])", text):
            near = text[max(0, m.start() - 90):m.end() + 90].lower()
            assert any(w in near for w in subject[int(m.group(1))]), (name, m.group(0), near)
            found += 1
    assert found >= 2  # session.md's and the demo's at least
    assert "step 5 starts the trainer with the launcher" in texts["session.md"]


# --- 7. check-in's headlines ------------------------------------------------------------------

def test_skill_and_checkin_help_list_the_same_verdicts():
    from supervise.tools.checkin import HEADLINES
    said = re.search(r"Its first line is the verdict \(([^)]*)\)", SKILL.replace("\n", " ")).group(1)
    assert [x.strip(" `") for x in said.split(",")] == list(HEADLINES)
    rc, out, _ = run_script("checkin.py", "--help")
    assert rc == 0 and "STOPPED" in " ".join(out.split())


# --- 9. the watchdog's flags in references/thresholds.md ---------------------------------------

def test_thresholds_md_lists_every_watchdog_flag_and_no_other():
    rc, out, _ = run_script("watchdog.py", "--help")
    assert rc == 0
    helped = set(re.findall(r"^  (?:-\w, )?(--[a-z][a-z0-9-]*)", out, re.M)) - {"--help"}
    doc = (ROOT / "references" / "thresholds.md").read_text()
    rows = [r.split("|")[1] for r in doc.splitlines() if r.startswith("| `--")]
    listed = set(re.findall(r"`(--[a-z][a-z0-9-]*)", "".join(rows)))
    assert helped - listed == set(), f"missing from references/thresholds.md: {sorted(helped - listed)}"
    assert listed - helped == set(), f"not watchdog flags: {sorted(listed - helped)}"
    assert {f"--{name.replace('_', '-')}" for name, *_ in Thresholds.describe()} <= listed


# --- 10. every kind in a table ----------------------------------------------------------------

def test_every_kind_is_in_a_table_of_skill_or_a_linked_reference():
    linked = sorted(set(re.findall(r"\]\((references/[\w-]+\.md)\)", SKILL)))
    rows = [ln for text in [SKILL] + [(ROOT / p).read_text() for p in linked]
            for ln in text.splitlines() if ln.startswith("|")]
    missing = [k for k in KINDS if not any(f"`{k}`" in r for r in rows)]
    assert missing == [], f"no table row of SKILL.md or {linked} names {missing}"
    table = section(SKILL, "## Healthy trajectory", "## Red flags")
    for kind in ("disk", "fatal", "node_fail", "preempted", "no_progress"):
        assert f"`{kind}`" in table, kind


# --- 11. the demo flips data only for the fault -----------------------------------------------

@pytest.mark.parametrize("fault", [None, "dead", "nan"])
def test_the_demo_writes_no_flipped_data_without_the_inverted_fault(tmp_path, fault):
    from supervise.tools import demo
    args = demo.fault_args(fault, tmp_path)
    assert args == (["--lr", "1e4"] if fault == "nan" else [])
    assert list(tmp_path.iterdir()) == []
    src = inspect.getsource(demo._main)
    assert "flipped_data(" not in src and "fault_args(a.fault, run_dir)" in src


def test_the_inverted_fault_flips_the_eval_labels(tmp_path):
    need("pandas")
    from supervise.tools import demo
    args = demo.fault_args("inverted", tmp_path)
    assert args[:4] == ["--data", str(tmp_path / "train.csv"), "--eval-data", str(tmp_path / "eval.csv")]
    assert (tmp_path / "train.csv").exists() and (tmp_path / "eval.csv").exists()


# --- 12. the README's install lines -----------------------------------------------------------

def test_the_readme_install_keeps_its_commands_and_says_how_to_get_cpu_torch():
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert blocks[0].strip() == ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e "
                                 "'.[hf,trl,lightning,plot,audit,dev,hang,ray]' && .venv/bin/python scripts/demo.py")
    assert blocks[1].strip() == ".venv/bin/python -m pytest -q"
    pin = re.search(r"torch==([\d.]+)", blocks[0]).group(1)
    cpu = re.search(r"`([^`]*--index-url https://download\.pytorch\.org/whl/cpu[^`]*)`", README)
    assert cpu and f"torch=={pin}" in cpu.group(1), "the CPU build's install, with the same pin"

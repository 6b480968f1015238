"""What a writer leaves out is never an alarm (issue 36): every writer with every optional
argument left out runs to OK done under the real watchdog with no word about the missing field;
a real NaN in each field that is given is ``nan`` at that step."""
import subprocess
import sys

import pytest

from conftest import ROOT, WATCHDOG, end_group, kind_of, launch, launch_line, need, records, shell, step_of
from supervised import USER_SCRIPTS, WATCH, env

HF = ["--do_train", "--per_device_train_batch_size", "16", "--learning_rate", "1e-2", "--logging_steps", "10",
      "--save_steps", "20", "--report_to", "none", "--max_steps", "40"]
HF_EVAL = ["--do_eval", "--eval_strategy", "steps", "--eval_steps", "20"]

# writer -> (script, its run-folder words, {what is left out: the arguments that leave it out})
WRITERS = {
    "telemetry": ("plain_loop.py", ["--out", "{run}"],
                  {f: ["--without", f] for f in ("grad_norm", "lr", "sps", "eval")}
                  | {"all": ["--without", "grad_norm,lr,sps,eval"]}),
    "hf": ("run_classification.py", ["--output_dir", "{run}", *HF],
           {"grad_norm (max_grad_norm=0)": ["--max_grad_norm", "0", *HF_EVAL], "eval": []}),
    "lightning": ("lightning_lm.py", ["--out", "{run}", "--steps", "40"],
                  {"manual optimization": ["--manual"], "grad accumulation": ["--accumulate", "2"],
                   "eval": ["--no-val"]}),
}
HEALTHY = [pytest.param(w, what, id=f"{w}-without-{what}") for w, (_, _, cases) in WRITERS.items() for what in cases]
# a real NaN in each field the plain loop gives: (field, injected at step, the record's step)
NANS = [("loss", 30, 40), ("grad_norm", 30, 30), ("lr", 30, 30), ("eval_loss", 40, 40)]


def supervise(tmp_path, script, words):
    """The script launched as the README launches it, the watchdog beside it: (rc, out + err)."""
    run = tmp_path / "run"
    argv = [sys.executable, "-u", USER_SCRIPTS / script, *(w.replace("{run}", str(run)) for w in words)]
    sh = shell(launch_line(argv, run), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p = subprocess.run([sys.executable, str(WATCHDOG), str(run), *WATCH], capture_output=True, text=True,
                           env=env(), timeout=400)
    finally:
        end_group(sh)
    return p.returncode, p.stdout + p.stderr, run


@pytest.mark.parametrize("writer,what", HEALTHY)
def test_a_field_left_out_is_not_measured_never_an_alarm(writer, what, tmp_path):
    script, words, cases = WRITERS[writer]
    need("torch")
    if writer != "telemetry":
        need("lightning" if writer == "lightning" else "transformers")
    rc, said, run = supervise(tmp_path, script, [*words, *cases[what]])
    assert rc == 0 and said.startswith("OK done: "), said + (run / "train.log").read_text()[-3000:]
    steps = [r for r in records(run) if "loss" in r]
    assert steps and all(v is not None for r in steps for v in r.values()), steps[:3]   # left out, never null
    # the plain loop leaves out what it is told; transformers 5.25 logs a grad norm even with
    # max_grad_norm=0 (measured, not clipped), and the callback writes what the Trainer logs
    gone = ({"grad_norm", "lr", "sps"} if what == "all" else {what} & {"grad_norm", "lr", "sps"}) \
        if writer == "telemetry" else set()
    assert not any(f in r for r in steps for f in gone), steps[:3]
    assert not any(word in said for word in ("grad_norm", "sps", "null", "not finite", "WARNING")), said
    checkin = subprocess.run([sys.executable, str(ROOT / "scripts" / "checkin.py"), str(run)], capture_output=True,
                             text=True, env=env(), timeout=120)
    assert checkin.stdout.startswith("DONE") and "poisoned" not in checkin.stdout and "nan" not in checkin.stdout.split(
        "\n")[0], checkin.stdout


@pytest.mark.parametrize("field,at,step", NANS, ids=[n[0] for n in NANS])
def test_a_real_nan_in_a_given_field_is_nan_at_that_step(field, at, step, tmp_path):
    need("torch")
    rc, said, run = supervise(tmp_path, "plain_loop.py", ["--out", "{run}", "--nan-at", str(at),
                                                          "--nan-in", "weights" if field == "loss" else field])
    assert rc == 7 and kind_of(said) == "nan" and step_of(said) == step, said
    assert field in said, said


def test_nanogpt_with_the_five_lines_and_no_grad_norm_runs_to_ok_done(tmp_path):
    """The issue's case: nanoGPT's train.py (vendored) with SKILL.md's five lines, discarding
    clip_grad_norm_'s value as nanoGPT does, started with the launcher, the watchdog beside it."""
    need("torch")
    run = tmp_path / "run"
    p = launch(tmp_path, run, sys.executable, "-u", USER_SCRIPTS / "nanogpt_train.py", f"--out_dir={run}",
               "--max_iters=60", env=env())
    assert p.returncode == 0, p.stdout + p.stderr
    wd = subprocess.run([sys.executable, str(WATCHDOG), str(run), *WATCH], capture_output=True, text=True,
                        env=env(), timeout=400)
    said = wd.stdout + wd.stderr
    assert wd.returncode == 0 and said.startswith("OK done: final_val_metrics.json written at step 60"), \
        said + (run / "train.log").read_text()[-3000:]
    steps = [r for r in records(run) if "loss" in r]
    assert [r["step"] for r in steps] == [0, 10, 20, 30, 40, 50, 60] and not any("grad_norm" in r for r in steps)
    checkin = subprocess.run([sys.executable, str(ROOT / "scripts" / "checkin.py"), str(run)], capture_output=True,
                             text=True, env=env(), timeout=120)
    assert checkin.stdout.startswith("DONE") and "poisoned" not in checkin.stdout, checkin.stdout


def fold(*steps):
    """The record rules over a start record and these step records (as a reader sanitizes them)."""
    from supervise.contract import sanitize
    from supervise.judge.table import RECORD_RULES
    from supervise.observe.records import RecordRules, Thresholds
    rules = RecordRules(Thresholds(), RECORD_RULES)
    for rec in ({"event": "start", "t": 0}, *steps):
        rules.add(sanitize(rec))
    return rules.hits


@pytest.mark.parametrize("field", ["grad_norm", "lr"])
def test_a_null_is_nan_only_after_the_field_was_reported_as_a_number(field):
    """The seed's format through a strict JSON encoder writes null for a NaN: after numbers it is
    nan at that step; a field that was null from the first record on was never measured."""
    never = fold(*({"step": s, "t": s, "loss": 1.0, field: None} for s in (10, 20, 30)))
    assert "nan" not in never, never
    after = fold({"step": 10, "t": 1, "loss": 1.0, field: 0.5}, {"step": 20, "t": 2, "loss": 1.0, field: None})
    assert after["nan"].step == 20 and f"{field} = null is not finite" in after["nan"].message, after
    token = fold({"step": 10, "t": 1, "loss": 1.0, field: float("nan")})   # a NaN token: always nan
    assert token["nan"].step == 10, token
    assert fold({"step": 10, "t": 1, "loss": None})["nan"].step == 10   # the loss is always measured

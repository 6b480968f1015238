"""The smoke preflight as a table of checks: run the command (or read an existing run), then
one PASS/FAIL row per check with the measured value. Exit 0 when all pass, 7 otherwise.

The rows follow the task the start record declares and the metrics the run reports:
classification (loss below ln(num_labels); eval AUROC rising and not inverted, else accuracy),
lm (loss below ln(vocab_size); eval_loss falling), any other task (the loss falls). The resume
row kills the run after its first checkpoint and relaunches it with the start record's resume
recipe (the same words a relaunch line uses); a script without one is run to its end, and the
row says so. torch and transformers are imported only for the checkpoint reload, when present."""
from __future__ import annotations

import importlib.util
import math
import os
import shlex
import stat
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from supervise.cli import Parser, UsageError, duration, fraction, front_door, positive_float, positive_int, run_dir_arg
from supervise.observe.checkpoints import examine, run_checkpoints
from supervise.contract import is_finite, read_json, read_run, validate_file, why_unreadable
from supervise.guard.transformers import V4_ARGS
from supervise.vocabulary import ANOMALY, DONE, EXIT_ANOMALY, EXIT_OK, LOG, METRICS, QUIET, SENTINEL


@dataclass
class Row:
    name: str
    ok: Optional[bool]   # None: skipped
    value: str

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "SKIP"}[self.ok]
        return f"{mark}  {self.name:<16} {self.value}"


def _records(run_dir: Path):
    return read_run(run_dir / METRICS)


def check_contract(run_dir: Path) -> Row:
    """Every line valid; the optional fields no record carries (grad_norm; sps, which is absent
    only where no interval was measured yet: an attempt's first record) noted, with the rules
    that cannot fire without them."""
    path = run_dir / METRICS
    if not path.exists():
        return Row("contract", False, f"{path} does not exist: the script must write RUN_DIR/metrics.jsonl")
    unreadable = why_unreadable(path)
    if unreadable:
        return Row("contract", False, f"{unreadable}: the script must append JSON lines to a plain file")
    problems = validate_file(path)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return Row("contract", False, problems[0] + more)
    _, steps, evals = _records(run_dir)
    if not steps:
        return Row("contract", False, "no step record: write {step, t, loss, lr, grad_norm, sps} every ~10 steps")
    blind = []   # optional fields no record carries: the rules that read them cannot fire
    if not any(r.get("grad_norm") is not None for r in steps):
        blind.append("grad_norm (grad_explode, grad_collapse; HF: logging_steps <= 10 logs it)")
    if len(steps) > 1 and not any(r.get("sps") is not None for r in steps[1:]):
        blind.append("sps (throughput; give the writer batch_size, samples per optimizer step)")
    note = "; not measured, so their rules cannot fire: " + ", ".join(blind) if blind else ""
    return Row("contract", True, f"{len(steps)} step and {len(evals)} eval records valid"
               f"{', sps measured' if 'sps' not in note else ''}{note}")


def _final_loss(steps) -> Optional[float]:
    losses = [r["loss"] for r in steps[-3:] if is_finite(r.get("loss"))]
    return statistics.median(losses) if losses else None


def check_loss(steps, num_labels: int, margin: float, vocab: bool = False) -> Row:
    med = _final_loss(steps)
    if med is None:
        return Row("loss < chance", False, "no finite loss in the last step records")
    chance = math.log(max(num_labels, 2))
    limit = chance * (1 - margin)
    what = f"ln({num_labels}){' (vocab)' if vocab else ''} - {margin:.0%}"
    return Row("loss < chance", med < limit, f"final loss {med:.4g} {'<' if med < limit else '>='} {limit:.4g} "
               f"({what})" + ("" if med < limit else ": the model learns nothing; check the learning rate and the "
                              "labels" if not vocab else ": the model learns nothing; check the learning rate and "
                              "that the loss sees the shifted labels"))


def check_loss_falls(steps, margin: float) -> Row:
    """For a task without a chance level: the last records' median loss below the first's."""
    losses = [r["loss"] for r in steps if is_finite(r.get("loss"))]
    if len(losses) < 2:
        return Row("loss falls", False, "fewer than two finite losses: log a step record every ~10 steps")
    k = min(3, len(losses) // 2)
    first, last = statistics.median(losses[:k]), statistics.median(losses[-k:])
    ok = last < first * (1 - margin)
    return Row("loss falls", ok, f"median loss {first:.4g} -> {last:.4g}" + (
        f" (< {1 - margin:.0%} of the start)" if ok else ": it does not fall; check the learning rate and the data"))


def check_auroc(evals, rise: float, inverted: float) -> Row:
    values = [e["eval_auroc"] for e in evals if is_finite(e.get("eval_auroc"))]
    if not values:
        return Row("auroc rises", False, "no eval record with eval_auroc or eval_accuracy: evaluate every ~20 steps "
                   "in the smoke run")
    last, best = values[-1], max(values)
    trail = " -> ".join(f"{v:.3f}" for v in values[-4:])
    if last <= inverted:
        return Row("auroc rises", False, f"eval_auroc {trail}: {last:.3f} <= {inverted:g}, the labels are inverted: flip them")
    if best < 0.5 + rise:
        return Row("auroc rises", False, f"eval_auroc {trail}: never above {0.5 + rise:g}, stuck at chance")
    return Row("auroc rises", True, f"eval_auroc {trail} (best {best:.3f} > {0.5 + rise:g})")


ACCURACY = ("eval_accuracy", "eval_acc")


def check_accuracy(evals, num_labels: int, rise: float) -> Row:
    """A classifier that reports accuracy and no AUROC (HF's examples): above chance (1/k) by
    ``rise`` at its best, and for two labels not far below chance at the end (inverted)."""
    name = next((n for n in ACCURACY if any(is_finite(e.get(n)) for e in evals)), None)
    values = [e[name] for e in evals if is_finite(e.get(name))] if name else []
    chance = 1 / max(num_labels, 2)
    trail = " -> ".join(f"{v:.3f}" for v in values[-4:])
    if num_labels == 2 and values[-1] <= chance - 2 * rise:
        return Row("accuracy rises", False, f"{name} {trail}: {values[-1]:.3f} <= {chance - 2 * rise:g}, the labels "
                   "are inverted: flip them")
    if max(values) < chance + rise:
        return Row("accuracy rises", False, f"{name} {trail}: never above {chance + rise:.3g} (chance 1/{num_labels} "
                   f"+ {rise:g}), stuck at chance: check the labels and the learning rate")
    return Row("accuracy rises", True, f"{name} {trail} (best {max(values):.3f} > {chance + rise:.3g}, "
               f"chance 1/{num_labels})")


def check_eval_loss(evals) -> Row:
    values = [e["eval_loss"] for e in evals if is_finite(e.get("eval_loss"))]
    if not values:
        return Row("eval_loss falls", None, "no eval record with eval_loss: evaluate every ~20 steps to check it")
    trail = " -> ".join(f"{v:.4g}" for v in values[-4:])
    if len(values) < 2:
        return Row("eval_loss falls", None, f"eval_loss {trail}: one eval only; evaluate every ~20 steps to see it fall")
    ok = values[-1] < values[0]
    return Row("eval_loss falls", ok, f"eval_loss {values[0]:.4g} -> {trail}" + (
        "" if ok else ": it does not fall; check the learning rate and the eval data"))


def task_rows(start: dict, steps, evals, num_labels: Optional[int], margin: float) -> list[Row]:
    """The learning checks for the task the start record declares (classification without one)."""
    task = start.get("task") if isinstance(start.get("task"), str) and start.get("task") else "classification"
    if task == "lm":
        vocab = start.get("vocab_size")
        if not (is_finite(vocab) and vocab >= 2):
            return [Row("loss < chance", False, "an lm without vocab_size in its start record: pass vocab_size to "
                        "the writer (chance is ln(vocab_size))"), check_eval_loss(evals)]
        return [check_loss(steps, int(vocab), margin, vocab=True), check_eval_loss(evals)]
    if task != "classification":
        return [check_loss_falls(steps, margin)]
    known = start.get("num_labels")
    k = num_labels or (int(known) if is_finite(known) and 2 <= known <= 1e9 else 2)
    has_auroc = any(is_finite(e.get("eval_auroc")) for e in evals)
    has_acc = any(is_finite(e.get(n)) for e in evals for n in ACCURACY)
    quality = check_accuracy(evals, k, 0.1) if has_acc and not has_auroc else check_auroc(evals, 0.1, 0.3)
    return [check_loss(steps, k, margin), quality]


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:  # a dangling link
        return 0.0


def _checkpoints(run_dir: Path, start: Optional[dict] = None) -> list[Path]:
    """The run's complete checkpoints, oldest step first: ``checkpoints.run_checkpoints``, the
    resolver check-in and the relaunch use (a save still under a temporary name is none yet)."""
    return [Path(c.path) for c in run_checkpoints(run_dir, start) if c.complete]


def _shown(ck: Path, run_dir: Path) -> str:
    try:
        rel = str(ck.relative_to(run_dir))
    except ValueError:
        return str(ck)
    return f"{run_dir} (the saved model)" if rel == "." else rel


def _state_dict(state):
    """The tensors of a torch checkpoint: the state dict itself, or under model/state_dict."""
    import torch
    if isinstance(state, dict):
        for key in ("model", "state_dict", "model_state_dict"):
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    return [v for v in state.values() if torch.is_tensor(v)] if isinstance(state, dict) else []


def check_checkpoint(run_dir: Path, script: Optional[Path], start: Optional[dict] = None) -> Row:
    ckpts = _checkpoints(run_dir, start)
    if not ckpts:
        return Row("checkpoint", False, f"no checkpoint under {run_dir}: a late crash would lose the whole run")
    ck = ckpts[-1]
    shown = _shown(ck, run_dir)
    try:
        import torch
    except ImportError:
        return Row("checkpoint", None, f"{ck.name} saved; reload not checked (torch is not installed)")
    try:
        if ck.is_dir():
            import transformers
            transformers.utils.logging.disable_progress_bar()
            config = transformers.AutoConfig.from_pretrained(ck)
            arch = (getattr(config, "architectures", None) or [None])[0]
            cls = getattr(transformers, arch, None) if arch else None
            model = (cls or transformers.AutoModel).from_pretrained(ck).eval()
            with torch.no_grad():
                out = model(input_ids=torch.ones(1, 8, dtype=torch.long))
            out = out.logits if getattr(out, "logits", None) is not None else out[0]
            ok = bool(torch.isfinite(out).all())
            return Row("checkpoint", ok, f"{shown} reloads (from_pretrained) and a forward pass "
                       f"gives {tuple(out.shape)} {'finite' if ok else 'NON-FINITE'} logits")
        tensors = _state_dict(torch.load(ck, map_location="cpu", weights_only=False))
        if not tensors:
            return Row("checkpoint", False, f"{ck.name} holds no state dict of tensors")
        if not all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point()):
            return Row("checkpoint", False, f"{ck.name} holds non-finite weights")
        loader = _script_attr(script, "load_checkpoint")
        if loader is None:
            return Row("checkpoint", True, f"{shown}: {len(tensors)} finite tensors "
                       "(define load_checkpoint(path) in the script for a strict reload)")
        loader(str(ck))  # the script rebuilds its model and calls load_state_dict(strict=True)
        return Row("checkpoint", True, f"{shown} reloads with load_state_dict(strict=True)")
    except Exception as e:
        return Row("checkpoint", False, f"{ck.name} does not reload: {type(e).__name__}: {str(e).splitlines()[0][:160]}")


def _script_attr(script: Optional[Path], name: str):
    """``name`` from the script, imported only when its text defines it: a script whose training
    loop runs at module level (nanoGPT's) would train again on import."""
    if script is None or not script.is_file():
        return None
    if f"def {name}(" not in script.read_text(errors="replace"):
        return None
    spec = importlib.util.spec_from_file_location(f"_smoke_{script.stem}", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name, None)


def check_sentinel(run_dir: Path) -> Row:
    """Written means a JSON object: a file still being written (empty, torn) is not yet a sentinel."""
    path = run_dir / SENTINEL
    if isinstance(read_json(path), dict):
        return Row("sentinel", True, f"{SENTINEL} written")
    if not os.path.lexists(path):
        return Row("sentinel", False, f"{SENTINEL} missing: write it atomically, last")
    why = why_unreadable(path) or "it is not a JSON object"
    return Row("sentinel", False, f"{SENTINEL} present but {why}: write it atomically (temp file + os.replace), last")


def check_v5(script: Optional[Path]) -> Row:
    if script is None:
        return Row("v5 arguments", None, "no script to read (pass -- COMMAND or --script PATH)")
    try:
        if not stat.S_ISREG(os.stat(script).st_mode):
            return Row("v5 arguments", False, f"{script} is not a regular file")
        text = script.read_text(errors="replace")
    except OSError as e:
        return Row("v5 arguments", False, f"cannot read {script}: {e.strerror}")
    for n, line in enumerate(text.splitlines(), 1):
        m = V4_ARGS.search(line)
        if m and not line.lstrip().startswith("#"):
            return Row("v5 arguments", False, f"{script.name}:{n} passes {m.group(1)}=, removed in transformers v5: "
                       "use eval_strategy= and drop overwrite_output_dir=")
    return Row("v5 arguments", True, f"{script.name}: no evaluation_strategy= or overwrite_output_dir=")


def check_projection(steps, samples: Optional[int], epochs: float, window: Optional[float]) -> Row:
    if not samples:
        return Row("projection", None, "pass --full-samples N --epochs E --window W to project the full run")
    sps = [r["sps"] for r in steps if is_finite(r.get("sps")) and r["sps"] > 0]
    if not sps:
        return Row("projection", False, "no sps in the step records")
    rate = statistics.median(sps[len(sps) // 4:] or sps)  # skip the warm-up quarter
    need = samples * epochs / rate
    if window is None:
        return Row("projection", True, f"{samples:,} x {epochs:g} / {rate:.4g} sps = {need / 3600:.2f} h")
    fits = need <= window
    tail = "" if fits else f": subsample to {int(samples * window / need):,} samples ({window / need:.0%})"
    return Row("projection", fits, f"{samples:,} x {epochs:g} / {rate:.4g} sps = {need / 3600:.2f} h "
               f"{'<=' if fits else '>'} window {window / 3600:.2f} h{tail}")


def script_of(command: list[str]) -> Optional[Path]:
    return next((Path(w) for w in command if w.endswith(".py")), None)


def run_command(run_dir: Path, command: list[str], timeout: float, env: Optional[dict] = None) -> Row:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **QUIET, **(env or {})}
    t0 = time.time()
    log_path = run_dir / LOG
    print(f"smoke: running {shlex.join(command)} >> {log_path} 2>&1", file=sys.stderr, flush=True)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if why_unreadable(log_path):  # a FIFO would block the append below
            return Row("command", False, f"{why_unreadable(log_path)}: remove it, the smoke run writes its log there")
        log = open(log_path, "ab")
    except OSError as e:
        return Row("command", False, f"cannot write {log_path}: {e.strerror or e}; pass a writable run directory")
    with log:
        try:
            p = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout)
        except FileNotFoundError:
            return Row("command", False, f"{command[0]}: not found")
        except OSError as e:
            return Row("command", False, f"{command[0]}: cannot run it ({e.strerror or e})")
        except subprocess.TimeoutExpired:
            return Row("command", False, f"still running after {timeout:.0f}s: a smoke run should take minutes")
    took = time.time() - t0
    if p.returncode != 0:
        from supervise.observe.logs import log_tail
        from supervise.observe.logs import last_error
        err = last_error(log_tail(run_dir / "train.log")) or f"exit {p.returncode}"
        return Row("command", False, f"exit {p.returncode} after {took:.0f}s: {err[:200]}")
    return Row("command", True, f"exit 0 after {took:.0f}s")


def _saved_step(ck: Path, evals) -> Optional[int]:
    """The step a checkpoint holds (``checkpoints.examine``: its name, else the step field its
    pickle holds), else the last eval's step (checkpoints follow evals)."""
    found = examine(ck)
    if found is not None and found.step is not None:
        return found.step
    return int(evals[-1]["step"]) if evals else None


def _this_start(run_dir: Path, before: Optional[str]) -> Optional[dict]:
    """The start record the launch wrote: the last one, once its run_id differs from ``before``."""
    try:
        start = read_run(run_dir / METRICS)[0] if (run_dir / METRICS).exists() else {}
    except OSError:
        return None
    return start if start and start.get("run_id") != before else None


def run_resumed(run_dir: Path, command: list[str], timeout: float) -> list[Row]:
    """The command SIGKILLed once its first checkpoint is saved, then relaunched with the start
    record's resume recipe (its argv words, its variables) and run to the end: rows 'command'
    (the resumed run) and 'resume' (it continued from the checkpoint's step: its first step
    record lies at most one logging interval after it). A script whose start record declares no
    recipe runs to its end once, and the resume row is a SKIP that says so."""
    import signal
    from supervise.act.recovery import recipe, resume_words, with_resume
    log_path = run_dir / LOG
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        log = None if why_unreadable(log_path) else open(log_path, "ab")
    except OSError:
        log = None
    if log is None:
        return [run_command(run_dir, command, timeout)]  # it says what is wrong with the log
    before = (_this_start(run_dir, None) or {}).get("run_id")
    print(f"smoke: running {shlex.join(command)} >> {log_path} 2>&1 until its first checkpoint", file=sys.stderr,
          flush=True)
    t0, saved, killed, start0 = time.time(), [], False, None
    with log:
        try:
            p = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1", **QUIET})
        except OSError:
            return [run_command(run_dir, command, timeout)]  # it says why the command cannot run
        try:
            while p.poll() is None and time.time() - t0 < timeout:
                time.sleep(0.2)
                start0 = start0 or _this_start(run_dir, before)
                if start0 is not None and recipe(start0)[0] is None:
                    continue  # nothing to resume with: let it run to its end
                saved = _checkpoints(run_dir, start0) if start0 is not None else []
                if saved:
                    break
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                killed = True
            p.wait()
    took = time.time() - t0
    start0 = start0 or _this_start(run_dir, before) or {}
    if not killed or not saved:
        if not killed:
            from supervise.observe.logs import log_tail
            from supervise.observe.logs import last_error
            err = "" if p.returncode == 0 else ": " + (last_error(log_tail(log_path)) or f"exit {p.returncode}")[:200]
            ran = Row("command", p.returncode == 0, f"exit {p.returncode} after {took:.0f}s{err}")
        else:
            ran = Row("command", False, f"still running after {timeout:.0f}s: a smoke run should take minutes")
        if start0 and recipe(start0)[0] is None:
            return [ran, Row("resume", None, "the start record declares no resume recipe, so a relaunch starts over: "
                             "declare one (references/recovery.md) to check that the script continues")]
        if _checkpoints(run_dir, start0):
            return [ran, Row("resume", None, "the run ended before it could be killed after its first checkpoint")]
        return [ran, Row("resume", False, "no checkpoint was saved before the run ended: nothing to resume from")]
    _, steps0, evals0 = _records(run_dir)
    words, env, note = resume_words(start0, run_dir)
    if words is None:
        return [Row("command", False, f"killed after {_shown(saved[-1], run_dir)}, then no relaunch: {note}"),
                Row("resume", False, f"the recipe {start0.get('resume')} found no checkpoint under the start record's "
                    "checkpoint_dir: point checkpoint_dir at the folder the saves go to")]
    paths = [x for w in [*words, *env.values()] for x in (w, w.partition("=")[2]) if x and os.path.exists(x)]
    chosen = Path(paths[0]) if paths else saved[-1]  # the recipe's checkpoint, else the script picks its newest
    ckpt_step = _saved_step(chosen, evals0)
    gap = steps0[1]["step"] - steps0[0]["step"] if len(steps0) > 1 else (steps0[0]["step"] if steps0 else 0)
    again = with_resume(command, words)
    rows = [run_command(run_dir, again, max(1.0, timeout - (time.time() - t0)), env)]
    start, steps, _ = _records(run_dir)
    how = shlex.join([*(f"{k}={v}" for k, v in env.items()), *words]) or "(the recipe adds nothing)"
    where = f"killed after the checkpoint at step {ckpt_step}, then relaunched with {how}"
    if start.get("run_id") == start0.get("run_id") or not steps:
        return rows + [Row("resume", False, f"{where}: no new attempt logged a step")]
    first = steps[0]["step"]
    # the checkpoint's step or one logging interval after it: a checkpoint may hold the steps done
    # (the Trainer's checkpoint-N) or the next step to run (nanoGPT's iter_num)
    ok = ckpt_step is not None and ckpt_step <= first <= ckpt_step + max(gap, 1)
    return rows + [Row("resume", ok, f"{where}: the new attempt's first step record is step {first}" +
                       ("" if ok else f", not within {gap} steps from {ckpt_step}: the script does not continue "
                        "from its last checkpoint"))]


def check_verdict(run_dir: Path) -> Row:
    """The watchdog's engine on the finished smoke run: the same verdict a watchdog would give."""
    from supervise.judge.assess import assess
    v = assess(run_dir)[2]
    if v.state == ANOMALY:
        return Row("verdict", False, v.line[:300])
    if v.state == DONE:
        return Row("verdict", True, "the watchdog's engine says OK done")
    return Row("verdict", False, "the watchdog's engine sees no finished run (no sentinel of this attempt)")


def smoke(run_dir: Path, command: list[str], script: Optional[Path], num_labels: Optional[int], margin: float,
          samples: Optional[int], epochs: float, window: Optional[float], timeout: float) -> list[Row]:
    rows = run_resumed(run_dir, command, timeout) if command else []
    script = script or (script_of(command) if command else None)
    rows.append(check_contract(run_dir))
    start, steps, evals = _records(run_dir) if (run_dir / METRICS).exists() else ({}, [], [])
    rows += task_rows(start, steps, evals, num_labels, margin)
    rows += [check_checkpoint(run_dir, script, start), check_sentinel(run_dir), check_verdict(run_dir),
             check_v5(script), check_projection(steps, samples, epochs, window)]
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    p = Parser(prog="smoke.py", description="The smoke preflight: run COMMAND (after --), or check an existing "
               "run, then one PASS/FAIL row per check; exit 0 when all pass, 7 otherwise.",
               epilog="example: python scripts/smoke.py runs/smoke -- python -u train.py --out runs/smoke --smoke")
    p.add_argument("run_dir", metavar="RUN_DIR", type=run_dir_arg, help="the run directory the command writes (its --out)")
    p.add_argument("--script", type=Path, help="the training script to read [the .py in COMMAND]")
    p.add_argument("--num-labels", type=positive_int, help="classes of a classifier [the start record's, else 2]")
    p.add_argument("--margin", type=fraction, default=0.05, help="loss must end this fraction below chance, ln(num_labels) or ln(vocab_size) (default: 0.05)")
    p.add_argument("--full-samples", type=positive_int, metavar="N", help="training samples of the full run")
    p.add_argument("--epochs", type=positive_float, default=1.0, metavar="E", help="epochs of the full run (default: 1)")
    p.add_argument("--window", type=duration, metavar="W", help="the GPU window, e.g. 8h")
    p.add_argument("--timeout", type=duration, default=1800.0, help="longest the smoke command may run (default: 30m)")
    return front_door(p, lambda a: _main(a, command), argv)


def _main(a, command: list) -> int:
    run_dir = Path(a.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"{run_dir} is a file, not a run directory")
    if not command and not run_dir.is_dir():
        raise UsageError(f"{run_dir} does not exist; give the command to run after --")
    unreadable = why_unreadable(run_dir / METRICS)
    if not command and unreadable:
        raise UsageError(f"{unreadable}; point RUN_DIR at a run whose script appends to a plain "
              f"{METRICS}")
    if a.script is not None and (not a.script.is_file() or why_unreadable(a.script)):
        raise UsageError(f"--script {a.script} is not a readable regular file; pass the training script")
    rows = smoke(run_dir, command, a.script, a.num_labels, a.margin, a.full_samples, a.epochs, a.window, a.timeout)
    for r in rows:
        print(r.line())
    failed = [r for r in rows if r.ok is False]
    print(f"SMOKE FAILED: {', '.join(r.name for r in failed)}" if failed else
          f"SMOKE PASSED: {sum(r.ok is True for r in rows)} checks")
    return EXIT_ANOMALY if failed else EXIT_OK

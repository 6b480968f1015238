"""Recovery: the one line that relaunches a run from its last checkpoint, and the watchdog's
line beside it (the judge's ``no_progress`` stops an agent relaunching a run that makes none).

The relaunch line is built from the start record (contract v0.2: ``argv``, ``cwd``, ``python``;
v0.3: ``resume``, ``resume_env``, ``checkpoint_dir``, ``flags``, ``launcher``, ``slurm``) and
goes through the launcher like the first launch (scripts/launch.py ``--replace``: detached,
appended to ``RUN_DIR/train.log``, the quiet variables, recorded in launch.json's chain); it is
one physical line that passes the launch guard and returns at once. It keeps the script's own grammar: a flag it changes keeps
its spelling and its form (``--lr=0.001`` stays one word, ``--lr 0.001`` two), a learning rate
stays a float literal, a batch an integer, and a flag the script was not seen to take is never
added. The change is the verdict's (``Verdict.change``: the ``change`` column of
``judge.RULES``; references/recovery.md explains each row): ``lr`` halves the learning rate,
``batch`` halves the per-device batch and doubles gradient accumulation (the same effective
batch), ``same`` relaunches the same command resumed, None gives no line, since relaunching
does not fix that kind.

Resumed means the start record's recipe (``resume``: argv words, ``{checkpoint}`` standing for
the checkpoint; ``resume_env``: variables), filled with the checkpoint given or the newest one
under ``checkpoint_dir``. No recipe, or no checkpoint yet: the line starts over, and its note
says so; a flag is never guessed. Values the command does not spell out come from the start
record's ``flags``, else ``RUN_DIR/hparams.json`` (the templates write it). The launcher is the
one the run was started with (``python -m torch.distributed.run`` and its arguments); a Slurm
job is resubmitted through the launcher (``--slurm``: sbatch). Standard library only: check-in imports this on the hot path.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

from supervise.observe import engines
from supervise.observe.checkpoints import checkpoint_dirs, resume_choice
from supervise.observe.observation import Verdict
from supervise.vocabulary import BUNDLE, HPARAMS, PYTHON

CHECKPOINT = "{checkpoint}"


# Flag spellings per knob, the templates' first (a value from hparams.json takes that one):
# the templates', the Trainer's (both spellings) and nanoGPT's.
BATCH_FLAGS = ("--batch-size", "--batch", "--batch_size", "--per-device-train-batch-size",
               "--per_device_train_batch_size")
ACCUM_FLAGS = ("--grad-accum", "--grad_accum", "--gradient-accumulation-steps", "--gradient_accumulation_steps")
LR_FLAGS = ("--lr", "--learning-rate", "--learning_rate")
HPARAM_KEYS = {BATCH_FLAGS: "batch_size", ACCUM_FLAGS: "grad_accum", LR_FLAGS: "lr"}


def _find(argv: list[str], names: tuple) -> Optional[tuple[int, str, str, bool]]:
    """(index, flag as spelled, value, one word?) of the last occurrence of any of ``names``."""
    hit = None
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if flag in names:
            if eq:
                hit = (i, flag, value, True)
            elif i + 1 < len(argv):
                hit = (i, flag, argv[i + 1], False)
    return hit


def _drop(argv: list[str], names, with_value: bool = True) -> list[str]:
    """argv without any of ``names``: ``--f=v``, and ``--f v`` (``--f`` alone when not ``with_value``)."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
            if not word.startswith("--"):
                continue
        flag, eq, _ = word.partition("=")
        if flag in names:
            skip = with_value and not eq
            continue
        out.append(word)
    return out


def _set(argv: list[str], names: tuple, value: str, spelled: Optional[str] = None) -> list[str]:
    """argv with the flag set to ``value``: where the command has it, in place and in its own
    form (``--f=v`` or ``--f v``; earlier repeats dropped); else appended as ``--f=value`` in
    the spelling ``spelled`` (argparse and nanoGPT-style configurators both read that form)."""
    found = _find(argv, names)
    if found is None:
        return argv + [f"{spelled or names[0]}={value}"]
    i, flag, _, one_word = found
    new = [f"{flag}={value}"] if one_word else [flag, value]
    return _drop(argv[:i], names) + new + argv[i + (1 if one_word else 2):]


def _number(text) -> Optional[float]:
    if isinstance(text, bool):
        return None
    try:
        x = float(text)
    except (TypeError, ValueError):
        return None
    return x if x == x and x not in (float("inf"), float("-inf")) else None


def _hparams(run_dir: Path) -> dict:
    try:
        data = json.loads((run_dir / HPARAMS).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _knob(argv: list[str], names: tuple, start: dict, hparams: dict) -> tuple[Optional[float], Optional[str]]:
    """(value, flag spelling) of a knob: from the command, else from the start record's
    ``flags`` (the flags the script's parser takes, with their values), else from hparams.json
    (the templates' flags); (None, None) when the script was not seen to take such a flag."""
    found = _find(argv, names)
    if found:
        return _number(found[2]), found[1]
    flags = start.get("flags") if isinstance(start.get("flags"), dict) else {}
    for flag, value in flags.items():
        if flag in names and _number(value) is not None:
            return _number(value), flag
    value = _number(hparams.get(HPARAM_KEYS[names]))
    return (value, names[0]) if value is not None else (None, None)


def _int(x: float) -> str:
    return str(int(x))


def _float(x: float) -> str:
    """A float literal, always (``0.0005``, ``2.5e-05``, ``500.0``): a configurator that checks
    the literal's type (nanoGPT's) must read a float where the script has one."""
    return repr(float(x))


def changed_argv(start: dict, change: Optional[str], run_dir, kind: Optional[str] = None
                 ) -> tuple[Optional[list[str]], str]:
    """(the script's argv with ``change`` made (a verdict's: 'lr', 'batch', 'same'), or None; a
    note: why there is no argv (``change`` None: a relaunch does not fix ``kind``), or what the
    change could not do)."""
    if change is None:
        return None, f"a relaunch does not fix {kind or 'this'}"
    argv = start.get("argv") if isinstance(start, dict) else None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return None, "the start record has no argv/cwd (an older writer): relaunch it by hand"
    argv, hp = list(argv), _hparams(Path(run_dir))
    if change == "batch":
        batch, flag = _knob(argv, BATCH_FLAGS, start, hp)
        if batch is None:
            return None, ("the batch size is neither on the command line nor in the start record's flags or "
                          "hparams.json: halve it in the script (and double gradient accumulation)")
        if batch < 2 or not float(batch).is_integer():
            return None, (f"the per-device batch is {batch:g}: it cannot be halved; a smaller model or sequence, "
                          "gradient checkpointing or a bigger GPU")
        accum, accum_flag = _knob(argv, ACCUM_FLAGS, start, hp)
        argv = _set(argv, BATCH_FLAGS, _int(batch // 2), flag)
        if accum is None or not float(accum).is_integer() or accum < 1:
            return argv, (f"gradient accumulation is not a flag the script was seen to take: {flag} halved "
                          "alone, so each step sees half the samples")
        return _set(argv, ACCUM_FLAGS, _int(accum * 2), accum_flag), ""
    if change == "lr":
        lr, flag = _knob(argv, LR_FLAGS, start, hp)
        if lr is None:
            return None, ("the learning rate is neither on the command line nor in the start record's flags or "
                          "hparams.json: lower it in the script")
        if lr <= 0:
            return None, f"the learning rate is {lr:g}: it cannot be halved"
        return _set(argv, LR_FLAGS, _float(lr / 2), flag), ""
    return argv, ""


# ----------------------------------------------------------------------------- resuming
def recipe(start: dict) -> tuple[Optional[list[str]], dict]:
    """The start record's recipe: (argv words or None, environment)."""
    words = start.get("resume") if isinstance(start, dict) else None
    env = start.get("resume_env") if isinstance(start, dict) else None
    env = {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(env, dict) else {}
    if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
        words = [] if env else None
    return words, env


def resume_words(start: dict, run_dir, *, checkpoint: Optional[str] = None,
                 first_bad_step: Optional[int] = None,
                 dirs: Optional[tuple] = None) -> tuple[Optional[list[str]], dict, str]:
    """(argv words, environment, note) that make the script continue: the start record's recipe
    with ``{checkpoint}`` filled in (``checkpoint``, else ``checkpoints.resume_choice``: the newest
    complete one in the run's checkpoint folders written before ``first_bad_step``, the first
    non-finite record's). ``dirs``: the checkpoint folders an observation resolved and chose
    ``checkpoint`` in (``Observation.checkpoint_dirs``): then the disk is not scanned again.
    (None, {}, why) when the relaunch cannot resume: no recipe, or no checkpoint yet."""
    words, env = recipe(start)
    if words is None:
        return None, {}, ("the script declares no resume recipe (the start record has no 'resume'): this relaunch "
                          "starts over from step 0; see references/recovery.md to declare one")
    needs = any(CHECKPOINT in w for w in [*words, *env.values()])
    resolved = dirs is not None
    dirs = [str(d) for d in (dirs if resolved else checkpoint_dirs(run_dir, start))]
    if checkpoint is None and not resolved and (needs or dirs):
        chosen, _skipped = resume_choice(run_dir, start, first_bad_step)
        checkpoint = str(chosen.path) if chosen is not None else None
    if checkpoint is None and (needs or dirs):
        where = " or ".join(dirs) if dirs else "(the start record names no checkpoint_dir)"
        before = f" before the first non-finite record (step {first_bad_step})" if first_bad_step is not None else ""
        return None, {}, f"no complete checkpoint under {where}{before}: this relaunch starts over from step 0"
    fill = (lambda w: w.replace(CHECKPOINT, checkpoint)) if checkpoint else (lambda w: w)
    note = f"resumes from {checkpoint}" if checkpoint and needs else ""
    return [fill(w) for w in words], {k: fill(v) for k, v in env.items()}, note


def with_resume(argv: list[str], words: list[str]) -> list[str]:
    """argv with the recipe's words appended, and any earlier occurrence of its flags removed
    (a relaunch of a relaunch holds them once, with the new checkpoint)."""
    out = list(argv)
    for i, w in enumerate(words):
        if w.startswith("-"):
            flag, eq, _ = w.partition("=")
            out = _drop(out, (flag,), with_value=bool(eq) or (i + 1 < len(words) and not words[i + 1].startswith("-")))
    return out + list(words)


# ----------------------------------------------------------------------------- the launch
def _launch(start: dict, argv: list[str], python: Optional[str]) -> tuple[list[str], str]:
    """(the words before the script's argv, a note): the start record's launcher (torchrun as
    ``python -m torch.distributed.run`` with its arguments), else ``python -u``."""
    if start.get("whole_command"):   # launch.json's one-word command (a manifest): nothing goes before it
        return list(argv), ""
    exe = python or start.get("python") or "python"
    exe = exe if isinstance(exe, str) and exe else "python"
    launcher = start.get("launcher")
    if isinstance(launcher, list) and launcher and all(isinstance(w, str) for w in launcher):
        head = list(launcher)
        if PYTHON.match(head[0]):
            head[0] = python or head[0]
            if "-u" not in head[1:3]:
                head.insert(1, "-u")
        return head + argv, ""
    world = start.get("world_size")
    if isinstance(world, int) and not isinstance(world, bool) and world > 1:
        return ([exe, "-u", "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", *argv],
                f"the start record does not say how its {world} processes were launched: this line assumes "
                "torchrun on one node")
    return [exe, "-u", *argv], ""


def relaunch_plan(start: dict, verdict: Verdict, run_dir, *, python: Optional[str] = None,
                  checkpoint: Optional[str] = None, first_bad_step: Optional[int] = None,
                  window_s: Optional[float] = None, engine: Optional[str] = None,
                  options: Optional[list] = None, checkpoint_dirs: Optional[tuple] = None,
                  launched: Optional[dict] = None) -> tuple[Optional[str], str]:
    """(the relaunch line or None, a note). The line is one physical line the agent runs as is
    (it passes supervise.guard.hook and returns at once): ``cd CWD && PY scripts/launch.py RUN
    --replace [--window W] [--env K=V] -- LAUNCHER ARGV RESUME`` with the change the verdict
    calls for (``verdict.change``, the rule table's). Every attempt is a launch: the launcher stops the folder's live trainer first
    (``--replace``), starts the new one detached (own session, stdin /dev/null, appended to
    train.log, the quiet variables) and records it in launch.json's chain. A Slurm job's line is
    resubmitted through the launcher to its engine (``engines.of_start``: ``--slurm``, sbatch). The note says why there is no line (relaunching does not fix the
    kind; the learning rate or batch is not a flag of the script; no argv/cwd), or what the line
    cannot do (no resume recipe or no checkpoint yet: it starts over); '' when there is nothing
    to add.

    ``python``: the interpreter [the start record's ``python``, else ``python``]; ``checkpoint``:
    the checkpoint to resume from [the newest complete one under the start record's
    ``checkpoint_dir`` written before ``first_bad_step``, the first non-finite record's step];
    ``checkpoint_dirs``: the folders an observation resolved and chose it in (none is rescanned);
    ``window_s``: the launch's --window, kept for the new attempt; ``engine`` and ``options``: the
    engine and its options of a job the launcher submitted (launch.json's: ``slurm``, sbatch's), kept
    for its resubmission; else the engine the start record says the attempt ran in. ``launched``:
    launch.json's record, whose command an engine with ``WORKER_ARGV`` resubmits (its start record
    is a worker's: Ray's actors run the writer, not the command)."""
    eng = engines.engine(engine) if engine and engine != engines.LOCAL else (engines.of_start(start) or (None,))[0]
    if eng is not None and getattr(eng, "WORKER_ARGV", False):
        start = _launched_command(start, launched)
        if start is None:
            return None, (f"the attempt ran in {eng.NAME}'s workers (its start record holds a worker's argv, not the "
                          f"command) and no launch.json records the command: resubmit it by hand with the resume recipe")
    argv, note = changed_argv(start, verdict.change, run_dir, verdict.kind)
    cwd = start.get("cwd") if isinstance(start, dict) else None
    if argv is None or not isinstance(cwd, str) or not cwd:
        return None, note or "the start record has no argv/cwd (an older writer): relaunch it by hand"
    notes = [note]
    words, renv, why = resume_words(start, run_dir, checkpoint=checkpoint, first_bad_step=first_bad_step,
                                    dirs=checkpoint_dirs)
    notes.append(why)
    if words is not None:
        argv = with_resume(argv, words)
    launch, why = _launch(start, argv, python)
    notes.append(why)
    run = Path(os.path.abspath(run_dir))
    opts = ["--replace"] + (["--window", f"{window_s:g}s"] if window_s else [])
    opts += [f"--env={k}={v}" for k, v in (renv or {}).items()]
    if eng is not None:
        words, why = eng.resubmit(start, options)
        opts += words
        notes.append(why)
    line = f"cd {shlex.quote(cwd)} && " + shlex.join([sys.executable or "python3", str(BUNDLE / "scripts" / "launch.py"),
                                                      str(run), *opts, "--", *launch])
    return line, "; ".join(n for n in notes if n)


def _launched_command(start: dict, launched: Optional[dict]) -> Optional[dict]:
    """``start`` with the launch record's command and folder in place of a worker's argv (``python
    train.py ...``: the interpreter and the script's argv; another command: its first word as the
    launcher), None without a recorded command."""
    argv = list((launched or {}).get("argv") or [])
    cwd = (launched or {}).get("cwd")
    if not argv or not all(isinstance(w, str) for w in argv) or not isinstance(cwd, str):
        return None
    if PYTHON.match(os.path.basename(argv[0])):
        rest = argv[2:] if argv[1:2] == ["-u"] else argv[1:]
        return {**start, "argv": rest, "python": argv[0], "launcher": None, "world_size": None, "cwd": cwd}
    if len(argv) == 1:
        return {**start, "argv": argv, "whole_command": True, "world_size": None, "cwd": cwd}
    return {**start, "argv": argv[1:], "launcher": [argv[0]], "world_size": None, "cwd": cwd}


def fresh_folder(run_dir) -> Path:
    """A folder beside ``run_dir`` that does not exist yet: RUN-fresh, RUN-fresh2, ..."""
    run = Path(os.path.abspath(run_dir))
    n, new = 1, run.with_name(run.name + "-fresh")
    while new.exists():
        n += 1
        new = run.with_name(f"{run.name}-fresh{n}")
    return new


def _moved(words, cwd: str, old: Path, new: Path) -> tuple[list[str], bool]:
    """(``words`` with each one naming ``old`` or a path under it (a path, or --flag=path)
    naming the same under ``new``, whether any did)."""
    out, hit = [], False
    real = os.path.realpath(old)
    for w in words:
        flag, eq, value = w.partition("=") if w.startswith("-") and "=" in w else ("", "", w)
        path = os.path.realpath(os.path.join(cwd, value)) if value and not value.startswith("-") else ""
        if path == real or path.startswith(real + os.sep):
            w, hit = f"{flag}{eq}{new if path == real else os.path.join(str(new), os.path.relpath(path, real))}", True
        out.append(w)
    return out, hit


def moved_flags(flags, run_dir, new: Path) -> list[str]:
    """A watchdog's flags for the run in ``new`` (its folders that were under ``run_dir`` moved)."""
    return _moved(list(flags), os.getcwd(), Path(run_dir), new)[0]


def fresh_plan(start: dict, run_dir, *, python: Optional[str] = None, window_s: Optional[float] = None
               ) -> tuple[Optional[str], Optional[Path], str]:
    """(a launch of the start record's command started over in a new folder, that folder, a note
    when there is no line): for a run to stop and ask about, the line the user can approve. The
    folder is ``fresh_folder``; the command's words that name the run folder name the new one;
    the resume recipe's words are left out (a fresh start, never the old checkpoints)."""
    argv, cwd = start.get("argv") if isinstance(start, dict) else None, start.get("cwd") if isinstance(start, dict) else None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv) and isinstance(cwd, str) and cwd):
        return None, None, "the start record has no argv/cwd: start it over by hand in a new folder"
    scheduled = engines.of_start(start)
    if scheduled is not None:
        return None, None, scheduled[0].FRESH
    new = fresh_folder(run_dir)
    words, _env = recipe(start)
    for i, w in enumerate(words or []):
        if w.startswith("-"):
            flag, eq, _ = w.partition("=")
            argv = _drop(argv, (flag,), with_value=bool(eq) or (i + 1 < len(words) and not words[i + 1].startswith("-")))
    argv, hit = _moved(argv, cwd, Path(run_dir), new)
    if not hit:
        return None, None, (f"the command does not name {run_dir} (it writes its records there some other way): "
                            "start it over by hand in a new folder")
    launch, _ = _launch(start, argv, python)
    opts = ["--window", f"{window_s:g}s"] if window_s else []
    line = f"cd {shlex.quote(cwd)} && " + shlex.join([sys.executable or "python3", str(BUNDLE / "scripts" / "launch.py"),
                                                      str(new), *opts, "--", *launch])
    return line, new, ""


def stop_line(run_dir, launch: Optional[dict], pid: Optional[int]) -> Optional[str]:
    """The line that stops the run's trainer: stop.py for a launched one, else ``kill`` of its pid."""
    if launch:
        return shlex.join([sys.executable or "python3", str(BUNDLE / "scripts" / "stop.py"), os.path.abspath(run_dir)])
    return f"kill -TERM {pid}" if pid else None


def relaunch_line(start: dict, verdict: Verdict, run_dir, **how) -> Optional[str]:
    """The line of ``relaunch_plan``, or None (then its note says why, and the agent asks the user)."""
    return relaunch_plan(start, verdict, run_dir, **how)[0]


# a watchdog's flags that name the old attempt's processes: a relaunch's watchdog finds its own
ATTEMPT_FLAGS = ("--pid", *(eng.WATCH_FLAG for eng in engines.scheduled()))


def watchdog_line(run_dir, *, python: Optional[str] = None, job: Optional[tuple] = None,
                  flags=(), relaunch: bool = False, from_now: bool = False) -> str:
    """The watchdog line for the run: ``flags`` are the last watchdog's (``--on-exit`` and
    ``--detach`` included, so a run supervised headlessly stays so); for a relaunch
    (``relaunch``) its ``--pid`` and ``--slurm-job`` are dropped, since they name the old
    attempt's processes (it watches the records after the last start record, so the new
    attempt's); ``job``: (engine, job id) to follow (``--slurm-job ID``); ``from_now``: judge only what is written after
    its start (``--from-now``: watch on after an alarm that needs no relaunch)."""
    exe = python or sys.executable or "python3"
    kept, skip = [], False
    for f in flags:
        if skip:
            skip = False
            continue
        name = f.partition("=")[0]
        if relaunch and name in ATTEMPT_FLAGS:
            skip = "=" not in f
            continue
        if name == "--from-now":
            continue
        kept.append(f)
    extra = [engines.engine(job[0]).WATCH_FLAG, str(job[1])] if job else []
    extra += ["--from-now"] if from_now else []
    return shlex.join([exe, str(BUNDLE / "scripts" / "watchdog.py"), os.path.abspath(run_dir), *kept, *extra])

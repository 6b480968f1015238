"""The detached launch: a training command started in its own session, so that it outlives the
agent's session (a ``claude -p`` that ends, an ``/exit``, a closed terminal), recorded in
``RUN_DIR/launch.json`` and the registry; the record read back and checked alive by pid and start
time; and the watchdog's ``--on-exit`` command, run detached the same way.

    python3 scripts/launch.py RUN_DIR [--window 8h] [--session-id ID] [--env K=V] [--replace] -- python -u train.py --out RUN_DIR

The launcher checks everything before it starts anything (a command that is not found or not
executable, an unwritable run folder, a trainer of the same folder still alive: exit 2, one
line, nothing started, no record written), then starts the command with stdin from /dev/null,
stdout and stderr appended to ``RUN_DIR/train.log`` and the quiet variables set, writes the
record atomically and returns at once, printing one line: the pid and the watchdog line.

Every attempt is a launch. A trainer of the folder is the launch record's process (the same
process: pid and start time) and every process whose output is ``RUN_DIR/train.log`` (a run
started some other way). A plain launch refuses while one lives. The relaunch line (check-in's
``next:``, ``recovery.relaunch_plan``) passes ``--replace``: it stops the folder's live trainer
first (``stop.py``'s way: SIGTERM to its group, a grace, SIGKILL, recorded as a stop by the
relaunch), because every kind that has a relaunch line is one where the old attempt must end
before the new one starts; this is the one place that decides it.

``launch.json`` (written atomically; ``read_launch`` gives it back with every field typed):
engine (``local``, or the scheduler's: ``slurm``; ``supervise/observe/engines/``), pid, pgid,
sid, host, create_time (the process's start time, so that a recycled pid is told apart), or for
a scheduled job job_id and options (the engine's: sbatch's) with no pid, launched_at, argv (the
command as given), cwd, window_s, session_id, log, run_dir; and,
once ``stop.py`` ended it: stop {requested_at, by, grace_s, signals, exited_after_s} and
stopped_at; earlier: [{pid, launched_at, create_time}] of the folder's previous launches, newest
first (a relaunch that died before its start record still counts toward no_progress); env:
the variables ``--env`` added; replaced: the pids ``--replace`` stopped; on_exit: every
``--on-exit`` command the watchdogs of this folder ran, oldest first [{at, pid, headline,
verdict}], carried from launch to launch (``pid``: the launch it was about; a verdict already
sent for a launch is not sent again, so a watchdog restarted on a finished run never resumes a
conversation twice). ``stop`` is written before the first signal, so a death seen during the
grace is already known as the user's stop. Standard library (+psutil through probes): hot-path safe.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from supervise.observe import engines, registry
from supervise.observe import stacks as st
from supervise.cli import CommandParser, UsageError, duration, front_door, run_dir_arg
from supervise.contract import atomic_write_json, is_number, why_unreadable, why_unwritable
from supervise.observe.probes import log_writers, process
from supervise.act.recovery import watchdog_line
from supervise.observe.state import launch_alive, launched, read_launch, update_launch
from supervise.vocabulary import BUNDLE, ENV, EXIT_OK, LAUNCH, LOG, ON_EXIT_LOG

LOCK = ".launch.lock"
# Where the session id comes from when --session-id is not given: Claude Code sets the first in
# the environment of every Bash command it runs (checked with 2.1.197); the second is the name
# an earlier draft of the skill documented.
SESSION_VARS = ("CLAUDE_CODE_SESSION_ID", "CLAUDE_SESSION_ID")

# ----------------------------------------------------------------------------- the launch
def _writable(run: Path) -> None:
    why = why_unwritable(run)
    if why:
        raise UsageError(f"run directory {run} is not writable ({why}); pass a folder the launcher "
                         f"can write {LOG} and {LAUNCH} into")
    why = why_unreadable(run / LOG)
    if why:  # a FIFO would block the open, a folder would fail it: say so before anything starts
        raise UsageError(f"{why}; remove it, the launcher appends the trainer's output there")


@contextlib.contextmanager
def _locked(run: Path):
    """One launcher at a time per run folder (two racing launchers cannot both start)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the launch.json check still refuses a live trainer
        yield
        return
    with open(run / LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _ago(t: float) -> str:
    s = max(0.0, time.time() - t)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def stop_line(run_dir, *, python: Optional[str] = None) -> str:
    """The line that stops the run launched in ``run_dir`` (scripts/stop.py)."""
    exe = python or sys.executable or "python3"
    return shlex.join([exe, str(BUNDLE / "scripts" / "stop.py"), os.path.abspath(run_dir)])


def launcher_line(run_dir: str, command: str, *, python: str = "python3") -> str:
    """The one physical line that launches ``command`` (shell text, its quoting kept) detached
    into ``run_dir`` with this bundle's launcher: what the guard offers for a raw detached launch."""
    return f"{python} {shlex.quote(str(BUNDLE / 'scripts' / 'launch.py'))} {run_dir} -- {command}"


def trainers(run: Path, prev: Optional[dict]) -> list[tuple[int, str]]:
    """The folder's live trainer: (pid, why) of the launch record's process when it still runs,
    and of every process whose stdout or stderr is ``RUN_DIR/train.log``."""
    out = [(prev["pid"], "launch record")] if prev is not None and launch_alive(prev) else []
    for pid in log_writers(run / LOG, exclude=(os.getpid(),)):
        if pid not in {p for p, _ in out} and process(pid).alive:
            out.append((pid, "writes train.log"))
    return out


def _refuse_live(run_dir, run: Path, prev: Optional[dict], live: list) -> None:
    pid, why = live[0]
    since = f", launched {_ago(prev['launched_at'])} ago" if why == "launch record" else f", {why}"
    raise UsageError(f"{run_dir} already has a live trainer (pid {pid}{since}): stop it first "
                     f"({stop_line(run) if why == 'launch record' else f'kill {pid}'}), relaunch with --replace, "
                     "or launch into another run folder")


def _replace(run: Path, prev: Optional[dict], live: list, grace_s: float) -> list:
    """Stop the folder's live trainer before a relaunch: the launch record's group as stop.py does
    (recorded as a stop by the relaunch), other train.log writers by pid; [{pid, how}]."""
    from supervise.act.stop import stop, stop_pids  # the relaunch path only
    done = []
    if any(why == "launch record" for _, why in live):
        out = stop(run, grace_s, by="launch.py --replace")
        if out.code != EXIT_OK:
            raise UsageError(f"--replace could not stop the live trainer: {out.line}; nothing was started")
        done.append({"pid": prev["pid"], "how": out.line})
    others = [pid for pid, why in live if why != "launch record" and process(pid).alive]
    if others:
        left = stop_pids(others, grace_s)
        if left:
            raise UsageError(f"--replace could not stop pid {left[0]} (it writes train.log and outlived SIGKILL); "
                             "nothing was started")
        done += [{"pid": pid, "how": "SIGTERM, then SIGKILL after the grace"} for pid in others]
    return done


def launch(run_dir, argv: list[str], *, engine: str = engines.LOCAL, options: tuple = (),
           window_s: Optional[float] = None, session_id: Optional[str] = None, cwd=None, env: Optional[dict] = None,
           extra_env: Optional[dict] = None, replace: bool = False, grace_s: float = 30.0) -> dict:
    """Start ``argv`` through ``engine`` (``local``: detached here, in its own session; ``slurm``:
    sbatch, with ``options`` its sbatch options), stdin /dev/null, output appended to
    RUN_DIR/train.log, ENV and ``extra_env`` set; record it in ``RUN_DIR/launch.json`` and the
    registry, return the record at once.

    ``session_id`` [the environment's CLAUDE_CODE_SESSION_ID, else CLAUDE_SESSION_ID, else None]
    is kept for ``--on-exit`` recipes (``claude --resume``). ``cwd`` [the current folder] and
    ``env`` [os.environ] are the command's. ``replace``: end the folder's live trainer or held job
    first (SIGTERM, ``grace_s``, SIGKILL; scancel) instead of refusing. UsageError (one line) when
    anything is wrong, before anything starts: no command, a command not found or not executable,
    the engine's command missing, an unwritable folder, a trainer or job of this folder still there
    (without ``replace``)."""
    eng = engines.engine(engine)
    if not argv:
        raise UsageError("no command to launch: put it after --, e.g. launch.py runs/a -- python -u train.py "
                         "--out runs/a")
    run = Path(os.path.abspath(run_dir))
    cwd = Path(os.path.abspath(cwd or os.getcwd()))
    env = dict(os.environ if env is None else env)
    variables = {**ENV, **(extra_env or {})}
    how = eng.check(argv, cwd, env)   # what the engine needs found before anything starts (the executable)
    _writable(run)
    if session_id is None:
        session_id = next((env[v] for v in SESSION_VARS if env.get(v)), None)
    with _locked(run):
        prev = read_launch(run)
        if session_id is None and prev is not None:
            session_id = prev.get("session_id")  # a relaunch run by a shell keeps the chain's conversation
        live = trainers(run, prev)
        held = prev if prev is not None and prev["engine"] != engines.LOCAL and engines.engine(prev["engine"]).held(prev) \
            else None
        if (live or held) and not replace:
            if live:
                _refuse_live(run_dir, run, prev, live)
            raise UsageError(f"{run_dir} already has {launched(held)} queued or running: stop it first "
                             f"({stop_line(run)}), relaunch with --replace, or launch into another run folder")
        replaced = _replace(run, prev, live, grace_s) if live else []
        if held:   # the scheduler's job of the last launch, still queued or running
            replaced.append({"job_id": held["job_id"], "how": engines.engine(held["engine"]).cancel(held, grace_s).line})
        if live or held:
            prev = read_launch(run)
        if engine == engines.LOCAL and st.cuda_machine(env):   # a GPU here: NCCL's flight recorder for a hang
            nccl = st.flight_recorder_env({**env, **variables}, run)
            if nccl:
                (run / st.STACKS / st.NCCL).mkdir(parents=True, exist_ok=True)
            variables = {**nccl, **variables}
        named = eng.submit(run, argv, cwd=cwd, env=env, variables=variables, log=run / LOG, options=tuple(options),
                           **how)
        rec = {**named, "engine": engine, "launched_at": time.time(), "argv": list(argv), "cwd": str(cwd),
               "window_s": window_s, "session_id": session_id, "log": str(run / LOG), "run_dir": str(run),
               "env": dict(extra_env or {}) or None, "replaced": replaced or None,
               "on_exit": list((prev or {}).get("on_exit") or [])[-50:] or None, "earlier": _earlier(prev)}
        try:
            atomic_write_json(run / LAUNCH, rec)
        except OSError as e:  # nothing half-started: no record, no trainer
            with contextlib.suppress(OSError, UsageError):
                eng.cancel(rec, 0.0)
            raise UsageError(f"cannot write {run / LAUNCH} ({e.strerror or e}); {launched(rec)} was stopped again")
    registry.record_launch(run, rec)
    return rec


def _earlier(prev: Optional[dict], keep: int = 15) -> list:
    """The previous launches of a folder, newest first: the last record's and its own list."""
    if prev is None:
        return []
    old = [e for e in prev.get("earlier") or [] if isinstance(e, dict) and is_number(e.get("launched_at"))]
    first = {k: prev.get(k) for k in ("pid", "launched_at", "create_time")}
    if prev.get("job_id"):
        first.update(engine=prev["engine"], job_id=prev["job_id"])
    return ([first] + old)[:keep]


def launched_line(rec: dict) -> str:
    """The launcher's one line: what it started and the watchdog line to run next."""
    what = f"submitted {launched(rec)}" if rec.get("job_id") else f"launched pid {rec['pid']} (group {rec['pgid']})"
    return f"{what}, output >> {rec['log']}; next, with run_in_background: true: {watchdog_line(rec['run_dir'])}"


# ----------------------------------------------------------------------------- on exit
def session_id(run_dir, rec: Optional[dict] = None) -> Optional[str]:
    """The conversation an --on-exit command resumes: launch.json's session_id, else this
    environment's (CLAUDE_CODE_SESSION_ID, CLAUDE_SESSION_ID); None when neither is known."""
    rec = read_launch(Path(run_dir)) or {} if rec is None else rec
    found = rec.get("session_id") if isinstance(rec, dict) else None
    return found if isinstance(found, str) and found else next(
        (os.environ[v] for v in SESSION_VARS if os.environ.get(v)), None)


def run_on_exit(cmd: str, *, line: str, kind: Optional[str], code: int, run_dir, headline: str = "") -> bool:
    """Run the shell command ``cmd`` once, detached (own session, stdin /dev/null, output
    appended to RUN_DIR/on_exit.log after a header line), with SUPERVISE_VERDICT (the verdict
    line), SUPERVISE_KIND (the anomaly kind, empty when none), SUPERVISE_EXIT_CODE,
    SUPERVISE_RUN_DIR and, when known, SUPERVISE_SESSION_ID (launch.json's, else the caller's
    CLAUDE_CODE_SESSION_ID) in its environment. It runs in the caller's working folder.

    Once per verdict and launch: the run is recorded in launch.json's ``on_exit`` list first; a
    verdict with the same ``headline`` for the same launched pid already there is not sent again
    (a watchdog restarted on an ended run must not resume a conversation a second time), and
    False is returned. Never raises: a command that cannot start is one warning line on stderr."""
    try:
        run = Path(run_dir).resolve()
        rec = read_launch(run) or {}
        if rec and headline:
            who = rec["pid"] or rec["job_id"]   # the launch: its pid, or its job
            sent = next((e for e in rec.get("on_exit") or [] if isinstance(e, dict)
                         and (e.get("pid") or e.get("job_id")) == who and e.get("headline") == headline), None)
            if sent is not None:
                what = launched(rec)
                print(f"watchdog.py: --on-exit not run again: it ran for {headline} of {what} "
                      f"{_ago(sent.get('at') or 0)} ago; check in with checkin.py", file=sys.stderr, flush=True)
                return False
            entry = {"at": time.time(), "pid": rec["pid"], "headline": headline, "verdict": line[:300],
                     **({"job_id": rec["job_id"]} if rec["job_id"] else {})}
            with contextlib.suppress(OSError, UsageError):
                update_launch(run, on_exit=[*(rec.get("on_exit") or []), entry][-50:])
        env = {k: v for k, v in os.environ.items() if k != "SUPERVISE_SESSION_ID"}
        env.update({"SUPERVISE_VERDICT": line, "SUPERVISE_KIND": kind or "", "SUPERVISE_EXIT_CODE": str(int(code)),
                    "SUPERVISE_RUN_DIR": str(run)})
        session = session_id(run, rec)
        if session:
            env["SUPERVISE_SESSION_ID"] = session
        with open(run / ON_EXIT_LOG, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} on-exit ({line[:200]}): {cmd}\n".encode())
            log.flush()
            subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             env=env, start_new_session=True, close_fds=True)
        return True
    except Exception as e:  # the verdict is printed already; the on-exit command is a bonus
        with contextlib.suppress(Exception):
            print(f"watchdog.py: warning: --on-exit did not start ({type(e).__name__}: {str(e)[:200]})",
                  file=sys.stderr, flush=True)
        return False


# ----------------------------------------------------------------------------- the front door
def env_pair(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` -> (NAME, VALUE); NAME a shell variable name."""
    import argparse
    import re
    name, eq, value = text.partition("=")
    if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not NAME=VALUE (e.g. SUPERVISE_CKPT_PATH=runs/a/last.ckpt)")
    return name, value


def build_parser() -> CommandParser:
    p = CommandParser(prog="launch.py", description=(
        "Start a training command detached from this session (its own session, stdin /dev/null, output "
        "appended to RUN_DIR/train.log, PYTHONUNBUFFERED=1 and the quiet variables set), so that it outlives "
        "the agent; record it in RUN_DIR/launch.json and the registry; print one line (the pid and the "
        "watchdog line to run next) and return at once. Exit 2, one line, nothing started: no command, a "
        "command not found, an unwritable folder, a trainer of RUN_DIR still alive."))
    p.add_argument("run_dir", metavar="RUN_DIR", type=run_dir_arg,
                   help="the run folder (train.log, launch.json, metrics.jsonl); made when missing")
    p.add_argument("--window", type=duration, metavar="DURATION",
                   help="the GPU window the run has (90s, 6m, 8h): recorded for the watchdog's time limit")
    p.add_argument("--session-id", metavar="ID",
                   help="the agent's session id, for --on-exit recipes [$CLAUDE_CODE_SESSION_ID, which Claude "
                        "Code sets]")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", type=env_pair,
                   help="a variable for the command's environment (repeatable), e.g. a resume recipe's "
                        "SUPERVISE_CKPT_PATH=...; recorded in launch.json")
    p.add_argument("--replace", action="store_true",
                   help="stop the folder's live trainer first (SIGTERM to its group, --grace, SIGKILL; recorded as "
                        "a stop by the relaunch) instead of refusing: the relaunch line passes it")
    for eng in engines.scheduled():   # --slurm [--sbatch=OPTION ...]: submit through that engine
        p.add_argument(eng.LAUNCH_FLAG, dest=f"engine_{eng.NAME}", action="store_true", help=eng.LAUNCH_HELP)
        p.add_argument(eng.OPTION_FLAG, dest=f"options_{eng.NAME}", action="append", default=[], metavar="OPTION",
                       help=eng.OPTION_HELP)
    p.add_argument("--grace", type=duration, default=30.0, metavar="DURATION",
                   help="with --replace: how long SIGTERM has before SIGKILL [default: 30s]")
    p.epilog = "usage after the options: -- CMD [ARG ...] (the training command, as you would type it)"
    return p


def main(argv=None) -> int:
    def body(args) -> int:
        chosen = [eng for eng in engines.scheduled() if getattr(args, f"engine_{eng.NAME}")]
        for eng in engines.scheduled():
            if getattr(args, f"options_{eng.NAME}") and eng not in chosen:
                raise UsageError(f"{eng.OPTION_FLAG} needs {eng.LAUNCH_FLAG} (it is an option of the "
                                 f"{eng.NAME.capitalize()} submission)")
        if len(chosen) > 1:
            raise UsageError(f"{chosen[0].LAUNCH_FLAG} and {chosen[1].LAUNCH_FLAG}: choose one engine")
        eng = chosen[0] if chosen else engines.engine(engines.LOCAL)
        rec = launch(args.run_dir, args.command, engine=eng.NAME, options=tuple(getattr(args, f"options_{eng.NAME}", ())),
                     window_s=args.window, session_id=args.session_id or None, extra_env=dict(args.env),
                     replace=args.replace, grace_s=args.grace)
        print(launched_line(rec), flush=True)
        return EXIT_OK
    return front_door(build_parser(), body, argv)

"""The watchdog's poll loop: observe (engine.py) -> judge (judge.py) -> watchdog.json, until a
verdict.

``python scripts/watchdog.py RUN_DIR`` exits 0 with ``OK done: ...`` when the current run's
completion sentinel appears (and its visible trainer exited), 7 with ``ANOMALY <kind>: ...`` the
first poll an anomaly holds, 2 on bad usage. Nothing else is printed per poll: the agent reads
this output when the job ends. Each poll also writes ``RUN_DIR/watchdog.json`` atomically.
Check-in, smoke and plot call ``engine.assess(run_dir)``: the same observer and judge, once.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from supervise.observe import registry
from supervise.observe import engines
from supervise.observe import stacks as st
from supervise.cli import Parser, UsageError, front_door, count, duration, fraction, positive_float, positive_int, run_dir_arg
from supervise.contract import atomic_write_json, read_json, why_unreadable, why_unwritable
from supervise.observe.observer import Observer
from supervise.judge.table import RECORD_RULES, is_hang, judge
from supervise.act.launch import run_on_exit, session_id
from supervise.observe.observation import Verdict
from supervise.observe.probes import process
from supervise.observe.state import WatchState
from supervise.thresholds import COUNT, DURATION, FRACTION, NONNEGATIVE, POSITIVE, POSITIVE_INT, Thresholds
from supervise.vocabulary import ANOMALY, BUNDLE, GOING_ON, LOG, METRICS, SENTINEL, STOPPED, WATCHDOG_LOG, WATCHDOG_STATE, WATCHING

LOCK = ".watchdog.lock"


class Watchdog:
    """The watchdog: an ``Observer`` and ``judge`` per poll, the state saved to watchdog.json."""

    def __init__(self, run_dir, thresholds: Thresholds = Thresholds(), stacks: bool = True, native: bool = False,
                 **observer):
        self.observer = Observer(run_dir, thresholds, RECORD_RULES, sample_frames=stacks, native=native, **observer)
        self.stacks, self.native = stacks, native   # capture a hang's stacks (py-spy --native when native)
        self.capture: Optional[st.Capture] = None
        self.th = thresholds
        self.run_dir = self.observer.run_dir
        self.verdict = Verdict(WATCHING)
        self.save_error = ""
        self.argv: tuple = ()   # the flags this watchdog was started with (check-in offers them again)
        self.ended_by: Optional[str] = None
        self._thresholds = dataclasses.asdict(thresholds)
        self._me = process(os.getpid()).create_time

    def poll(self) -> Verdict:
        """One look, one verdict. A hang's stacks are taken before the line, so that the verdict
        names the frames; stacks showing a checkpoint save in a stall's silence go to the stall
        clock (``StallClock.hold``), which decides the limit: the judge then reads its answer."""
        obs = self.observer.observe()
        self.verdict = judge(obs, self.th)
        if self.stacks and is_hang(self.verdict, obs):
            found = st.capture(self.run_dir, st.targets(obs), native=self.native)
            if found.saving and self.verdict.kind == "stall":
                clock = self.observer.run.stall
                clock.hold(obs.quiet_since, "the stacks showed a checkpoint save")
                after, why = clock.limit(obs.quiet_since)
                if after > obs.stall_after or obs.frames is not None:   # a save keeps the clock's slow-save rule
                    obs = dataclasses.replace(obs, stall_after=max(after, obs.stall_after),
                                              stall_why=why if after > obs.stall_after else obs.stall_why, frames=None)
                    self.verdict = judge(obs, self.th)
            if self.verdict.state == ANOMALY:
                self.capture = found
                obs = dataclasses.replace(obs, hang=found)
                self.verdict = judge(obs, self.th)
        self.observer.last = obs
        self.save()
        return self.verdict

    def stop(self, signame: str) -> Verdict:
        o = self.observer
        self.verdict = Verdict(STOPPED, f"STOPPED: watchdog ended by {signame} after {o.polls} polls; "
                                          f"no anomaly seen up to step {o.run.last_step}", headline="STOPPED")
        self.ended_by = signame
        self.save()
        return self.verdict

    def snapshot(self) -> WatchState:
        o, obs, v = self.observer, self.observer.last, self.verdict
        r, run = o.reader, o.run
        return WatchState(
            run_dir=str(self.run_dir.resolve()), watchdog_pid=os.getpid(), started=o.watch_started,
            last_poll=o.clock(), polls=o.polls, poll_interval=self.th.poll, state=v.state,
            kind=v.kind, message=v.line or None, step=run.last_step,
            total_steps=run.start.get("total_steps"), run_id=run.start.get("run_id"),
            attempt=run.start.get("attempt"),
            records={"lines": r.lines, "steps": run.n_steps, "evals": run.n_evals, "bad_lines": r.bad_lines,
                     "last_bad": r.last_bad or None, "unknown": run.unknown, "resets": r.resets,
                     "starts": o.rules.starts, "torn_tail": r.torn, "bytes_read": r.bytes_read,
                     "skipped_bytes": r.skipped_bytes},
            pids=[{"pid": p.pid, "state": p.state, "why": p.why} for p in (obs.processes if obs else ())],
            gpu=list(obs.gpu_lines) if obs else None,
            warnings=[w.message for w in v.warnings] + list(v.notes),
            engine=o.job[0] if o.job else None, job_id=o.job[1] if o.job else None,
            job_state=obs.job.state if obs and obs.job else None,
            thresholds=self._thresholds, argv=list(self.argv), checkpoint_dirs=list(o.explicit_checkpoint_dirs), watchdog_create_time=self._me,
            launch_pid=(o.launch_record() or {}).get("pid"), headline=v.headline or None, ended_by=self.ended_by,
            stacks=self.capture.to_json() if self.capture is not None else None)

    def save(self) -> None:
        try:
            atomic_write_json(self.run_dir / WATCHDOG_STATE, self.snapshot().to_json(), indent=None)
            self.save_error = ""
        except OSError as e:
            if not self.save_error:  # say it once; the verdict still reaches stdout
                print(f"watchdog.py: warning: cannot write {self.run_dir / WATCHDOG_STATE}: {e.strerror or e}; "
                      "check-in will not see this watchdog", file=sys.stderr, flush=True)
            self.save_error = str(e)


class _Wake(Exception):
    pass


class Heartbeat:
    """A dead-man's switch (any healthchecks-style URL): a GET of ``url`` at the first poll and
    then at most once every ``every`` seconds while the watchdog lives, and one of ``url/<exit
    code>`` with the verdict, so that a machine that dies with its watchdog still wakes someone.
    Each ping runs in a daemon thread with a short timeout: it never delays a poll. A failed ping
    is one line on stderr (RUN_DIR/watchdog.log when detached), said once per kind of failure,
    never a crash."""

    def __init__(self, url: str, every: float = 60.0, timeout: float = 5.0):
        self.url, self.every, self.timeout = url.rstrip("/"), every, timeout
        self.last: Optional[float] = None
        self.said: set = set()
        self.threads: list = []

    def _get(self, url: str) -> None:
        import urllib.request   # only with --heartbeat-url: off the watchdog's start-up
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as r:
                r.read(64)
        except Exception as e:   # noqa: BLE001: a ping that fails is a line, never a crash
            why = f"{type(e).__name__}: {str(e)[:160]}"
            if why not in self.said:
                self.said.add(why)
                with contextlib.suppress(Exception):
                    print(f"watchdog.py: warning: heartbeat ping {url} failed ({why}); the watch goes on",
                          file=sys.stderr, flush=True)

    def _ping(self, url: str) -> None:
        import threading
        t = threading.Thread(target=self._get, args=(url,), daemon=True)
        t.start()
        self.threads.append(t)

    def beat(self, now: float) -> None:
        if self.last is None or now - self.last >= self.every:
            self.last = now
            self._ping(self.url)

    def end(self, code: int) -> None:
        """The verdict's ping (``url/0`` done or stopped, ``url/7`` an anomaly), waited for."""
        self._ping(f"{self.url}/{code}")
        for t in self.threads:
            t.join(self.timeout + 1)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run(watcher: Watchdog, out=None, on_exit: Optional[str] = None, heartbeat: Optional[Heartbeat] = None) -> int:
    """Poll until done, an anomaly, or SIGTERM/SIGINT/SIGHUP; print the one final line; exit code.
    A second signal while stopping changes nothing: one line, exit 0, never a traceback.
    ``on_exit``: a shell command run once, detached, after the line (launch.run_on_exit)."""
    out = out or sys.stdout
    flags = {"sleeping": False, "signal": None}

    def on_signal(signum, frame):
        if flags["signal"] is None:
            flags["signal"] = signal.Signals(signum).name
        if flags["sleeping"]:
            flags["sleeping"] = False
            raise _Wake()

    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        while True:
            if flags["signal"]:
                verdict = watcher.stop(flags["signal"])
                break
            verdict = watcher.poll()
            if verdict.state not in GOING_ON:
                break
            if heartbeat is not None:
                heartbeat.beat(time.monotonic())
            try:
                flags["sleeping"] = True
                if not flags["signal"]:
                    time.sleep(min(watcher.th.poll, verdict.recheck_in or watcher.th.poll))
            except _Wake:
                pass
            finally:
                flags["sleeping"] = False
        try:
            print(verdict.line, file=out, flush=True)
        except (BrokenPipeError, OSError):
            pass  # whoever read stdout is gone; the verdict is in watchdog.json all the same
        if heartbeat is not None:
            heartbeat.end(verdict.code)
        if on_exit:
            run_on_exit(on_exit, line=verdict.line, kind=verdict.kind, code=verdict.code, run_dir=watcher.run_dir,
                        headline=verdict.headline)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return verdict.code


def _threshold_type(name: str):
    """The parser of a threshold's flag, from the kind its field declares (thresholds.KINDS)."""
    return {DURATION: duration, FRACTION: fraction, COUNT: count, POSITIVE_INT: positive_int,
            POSITIVE: positive_float, NONNEGATIVE: _nonnegative}[Thresholds.kind(name)]


def _nonnegative(text):
    return 0.0 if str(text).strip() in ("0", "0.0") else positive_float(text)


def _show(default, unit, is_duration):
    if is_duration:
        return f"{default:g}s"
    if unit in ("%", "fraction", "AUROC", "grad norm", "x"):
        return f"{default:g}{unit}" if unit in ("%", "x") else f"{default:g}"
    return f"{default:g} {unit}"


def build_parser() -> Parser:
    p = Parser(prog="watchdog.py", description=(
        "Watch a training run directory; exit 0 with 'OK done: ...' when the current run's completion "
        "sentinel appears, 7 with 'ANOMALY <kind>: ...' on the first poll an anomaly holds, 2 on bad usage. "
        "The run's processes are found by themselves: --pid, the start record's pid, and every process "
        "whose output goes to RUN_DIR/train.log. Durations are seconds, or a number with s, m or h "
        "(90s, 6m, 3h)."))
    p.add_argument("run_dir", metavar="RUN_DIR", type=run_dir_arg,
                   help="the run directory (metrics.jsonl, train.log, final_val_metrics.json)")
    p.add_argument("--pid", type=positive_int, action="append", default=[], metavar="PID",
                   help="a training process to watch (repeatable); default: found from the start record and train.log")
    p.add_argument("--log", metavar="PATH", help="the training log [default: RUN_DIR/train.log]")
    for eng in engines.scheduled():   # --slurm-job ID: follow a job of that engine
        p.add_argument(eng.WATCH_FLAG, dest=f"job_{eng.NAME}", metavar="ID", type=_job_id(eng), help=eng.WATCH_HELP)
    p.add_argument("--checkpoint-dir", action="append", default=[], metavar="DIR",
                   help="a folder of the run's checkpoints to follow for the disk rule (repeatable); default: the "
                        "start record's checkpoint_dir, else RUN_DIR/checkpoints")
    p.add_argument("--on-exit", metavar="CMD",
                   help="a shell command run once, detached, when the watchdog ends, with SUPERVISE_VERDICT, "
                        "SUPERVISE_KIND, SUPERVISE_EXIT_CODE, SUPERVISE_RUN_DIR, SUPERVISE_SESSION_ID set "
                        "(references/session.md)")
    p.add_argument("--heartbeat-url", metavar="URL", type=http_url,
                   help="a dead-man's switch (a healthchecks-style URL): GET it every minute while the watchdog "
                        "lives and URL/<exit code> with the verdict, so that a machine that dies with its watchdog "
                        "still wakes someone; a failed ping is a line in the log, never a crash")
    p.add_argument("--detach", action="store_true",
                   help="start the watchdog detached (its own session, stdin /dev/null, its line appended to "
                        f"RUN_DIR/{WATCHDOG_LOG}) and return at once: for a session that ends (claude -p), with "
                        "--on-exit to wake whoever is there; check-in's next: lines keep it")
    p.add_argument("--from-now", action="store_true",
                   help="judge only what is written after this watchdog starts (the record rules' baselines anew, "
                        "the ranks' rates from now): watch on after an alarm that needs no relaunch (throughput, "
                        "straggler, gpu_idle), as check-in's next: line says")
    p.add_argument("--detached", action="store_true", help=argparse.SUPPRESS)  # the detached child itself
    p.add_argument("--no-stacks", action="store_true",
                   help="on a hang (stall, rank_hang, a live process past no_telemetry or timeout) take no stacks; by "
                        "default every process's Python stack goes to RUN_DIR/stacks/ (the integrations' faulthandler "
                        "on SIGRTMIN+6, else py-spy dump) and the line names the frames (references/hangs.md)")
    p.add_argument("--native-stacks", action="store_true",
                   help="py-spy dump --native: C/C++ frames too, for a process without the integration (slower)")
    p.add_argument("--sentinel", default=SENTINEL, metavar="NAME", type=sentinel_name,
                   help=f"completion sentinel, a file name in RUN_DIR [default: {SENTINEL}]")
    for name, default, unit, doc, is_duration in Thresholds.describe():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            p.add_argument(flag, dest=name, action="store_true", default=None, help=doc)
            continue
        metavar = "DURATION" if is_duration else {"%": "PERCENT", "x": "FACTOR"}.get(unit, unit.upper().replace(" ", "_"))
        p.add_argument(flag, dest=name, default=None, metavar=metavar,
                       type=_threshold_type(name),
                       help=f"{doc} (default: {_show(default, unit, is_duration)})".replace("%", "%%"))
    return p


def http_url(text: str) -> str:
    """An http(s) URL with a host."""
    import argparse
    import re
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text or ""):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL; give the ping URL of your dead-man's-switch "
                                         "service (e.g. https://hc-ping.com/UUID)")
    return text


def _job_id(eng):
    """The argparse type of an engine's job id (its ``job_id`` check)."""
    def job_id(text: str) -> str:
        import argparse
        try:
            return eng.job_id(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e))
    job_id.__name__ = f"{eng.NAME} job id"
    return job_id


def followed(args) -> Optional[tuple]:
    """(engine, job id) a watchdog's flags name (``--slurm-job ID``), else None."""
    return next(((eng.NAME, getattr(args, f"job_{eng.NAME}")) for eng in engines.scheduled()
                 if getattr(args, f"job_{eng.NAME}", None)), None)


def sentinel_name(text: str) -> str:
    """A plain file name inside RUN_DIR: not empty, no folder, not . or .."""
    import argparse
    if not text or text in (".", "..") or "/" in text or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name; give the sentinel's name inside RUN_DIR "
                                         f"(default {SENTINEL})")
    return text


def main(argv=None, gpu=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return front_door(build_parser(), lambda args: watch(args, argv, gpu), argv)


def watch(args, argv: list, gpu=None) -> int:
    """The watchdog from its parsed flags: check what it will read and write (UsageError, before
    anything starts), then watch in the foreground, or start it detached (``--detach``)."""
    given = {n: getattr(args, n) for n, *_ in Thresholds.describe() if getattr(args, n) is not None}
    th = Thresholds(**given)
    if th.grad_low >= th.grad_high:
        raise UsageError(f"--grad-low {th.grad_low:g} must be below --grad-high {th.grad_high:g}")
    run_dir = Path(args.run_dir)
    why = why_unwritable(run_dir)
    if why:
        raise UsageError(f"run directory {run_dir} is not writable ({why}); pass a folder the watchdog can write "
                         "watchdog.json into")
    log = Path(args.log) if args.log else run_dir / LOG
    for path in (run_dir / METRICS, log, run_dir / args.sentinel):
        why = why_unreadable(path)
        if why:
            raise UsageError(f"{why}; the watchdog would be blind: fix it (a readable regular file) and start again")
    if args.on_exit and "SUPERVISE_SESSION_ID" in args.on_exit and not _session_known(run_dir):
        raise UsageError("--on-exit names $SUPERVISE_SESSION_ID but no session id is known (none in launch.json, "
                         "no CLAUDE_CODE_SESSION_ID here): pass --session-id to the launcher, or start the "
                         "watchdog from the session")
    job = followed(args)
    if job is not None:
        said = engines.engine(job[0]).state(job[1])
        if said.error:
            raise UsageError(said.error)
    flags = list(argv)
    flags.remove(args.run_dir)
    flags = ["--detach" if f == "--detached" else f for f in flags]  # what check-in offers again
    if args.detach and not args.detached:
        return detach(run_dir, flags)
    with sole_watchdog(run_dir):
        watcher = Watchdog(run_dir, th, stacks=not args.no_stacks, native=args.native_stacks,
                           pids=args.pid, log=log, sentinel=args.sentinel, gpu=gpu,
                           num_labels_given="num_labels" in given, job=job,
                           checkpoint_dirs=tuple(args.checkpoint_dir), from_now=args.from_now)
        watcher.argv = tuple(flags)
        registry.register(run_dir, os.getpid(), args.pid)
        return run(watcher, on_exit=args.on_exit,
                   heartbeat=Heartbeat(args.heartbeat_url) if args.heartbeat_url else None)


def _session_known(run_dir: Path) -> bool:
    """Whether the --on-exit command will get a SUPERVISE_SESSION_ID (launch.run_on_exit's)."""
    return bool(session_id(run_dir))


def _holder(run_dir: Path) -> str:
    """Who holds the watch: 'watchdog pid N, last poll Xs ago' as far as the files say."""
    try:
        pid = int((run_dir / LOCK).read_text().strip() or 0)
    except (OSError, ValueError):
        pid = 0
    wd = WatchState.from_json(read_json(run_dir / WATCHDOG_STATE))
    ago = f", last poll {time.time() - wd.last_poll:.0f}s ago" if wd and wd.last_poll and wd.watchdog_pid == pid else ""
    return f"watchdog pid {pid}{ago}" if pid else "another watchdog"


@contextlib.contextmanager
def sole_watchdog(run_dir: Path):
    """Hold ``RUN_DIR/.watchdog.lock`` while watching, its pid inside: one watchdog per run, so a
    watchdog line given twice never makes two (nor two wakes, two resumed conversations). The
    kernel drops the lock when the process ends, however it ends. UsageError when it is held."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    try:
        f = open(run_dir / LOCK, "a+")
    except OSError as e:
        raise UsageError(f"cannot open {run_dir / LOCK} ({e.strerror or e}); pass a run folder the watchdog can write")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UsageError(f"{run_dir} is already watched by {_holder(run_dir)}: check in (checkin.py "
                             f"{run_dir}) instead of starting a second watchdog")
        f.seek(0)
        f.truncate()
        with contextlib.suppress(OSError):   # a full volume: the lock holds without its pid in it
            os.write(f.fileno(), f"{os.getpid()}\n".encode())
        yield
    finally:
        f.close()


def detach(run_dir: Path, flags: list) -> int:
    """Start this watchdog again as a detached process (own session, stdin /dev/null, output
    appended to RUN_DIR/watchdog.log), wait until it holds the watch, print one line."""
    with sole_watchdog(run_dir):
        pass  # refuse now, in the caller's terminal, when another watchdog holds the run
    argv = [sys.executable, "-u", str(BUNDLE / "scripts" / "watchdog.py"), str(run_dir),
            *["--detached" if f == "--detach" else f for f in flags]]
    with open(run_dir / WATCHDOG_LOG, "ab") as out:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True)
    end = time.monotonic() + 20
    while time.monotonic() < end and child.poll() is None:
        with contextlib.suppress(OSError, ValueError):
            if int((run_dir / LOCK).read_text().strip() or 0) == child.pid:
                break
        time.sleep(0.02)
    if child.poll() is not None:
        said = (run_dir / WATCHDOG_LOG).read_bytes().decode(errors="replace").strip().splitlines()
        last = said[-1] if said else f"exit {child.returncode}"
        raise UsageError(f"the detached watchdog ended at once: {last.removeprefix('watchdog.py: error: ')}")
    print(f"watchdog pid {child.pid} detached: it watches {run_dir}; its line goes to {run_dir / WATCHDOG_LOG}, "
          "its state to watchdog.json; check in with checkin.py", flush=True)
    return 0

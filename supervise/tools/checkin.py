"""One cheap read of a run's whole state: the verdict first, then the next: lines, progress,
recent steps, evals, watchdog, process, GPU, disk and the last error. At most 1,500 characters.
A renderer: one ``engine.assess`` (one Observation, one Verdict) and nothing read besides."""
from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import Optional

from supervise.observe import registry
from supervise.observe.checkpoints import resume_lines
from supervise.cli import Parser, UsageError, count, front_door
from supervise.contract import atomic_write_text, is_number
from supervise.judge.assess import assess
from supervise.judge.table import watchdog_ended
from supervise.observe.ranks import rank_lines
from supervise.observe.scan import WINDOW
from supervise.act.recovery import fresh_plan, moved_flags, relaunch_plan, stop_line, watchdog_line
from supervise.observe.state import launch_alive, typed_launch
from supervise.observe.volumes import room_line
from supervise.vocabulary import ANOMALY, AS_IS, DONE, EXIT_OK, FIX_FIRST, GOING_ON, METRICS, PYTHON, STOP_ASK, WATCH_ON

LIMIT = 1500
HEADLINES = ("RUNNING healthy", "STARTING", "FINISHING", "DONE", "ANOMALY <kind>", "NOT STARTED", "STOPPED")
FIX = re.compile(r" at step \d+\. (?!.* at step \d+\. )(.*)$", re.S)   # the fix: after the last "at step N."
SKIP_DIRS = {".git", "node_modules", ".venv", "venv", "__pycache__", "checkpoints", "tb", ".cache"}


def find_run(cwd: Path, depth: int = 4) -> Optional[Path]:
    """The registry's newest run whose launched trainer still lives (a new session re-attaching),
    else its newest run, else the newest metrics.jsonl below ``cwd``."""
    live = next((r for r in registry.runs() if os.path.isdir(r["run_dir"]) and launch_alive(typed_launch(r.get("launch")))),
                None)
    rec = live or registry.latest()
    if rec:
        return Path(rec["run_dir"])
    best, best_m = None, -1.0
    base = len(cwd.parts)
    for root, dirs, files in os.walk(cwd):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        if len(Path(root).parts) - base >= depth:
            dirs[:] = []
        if METRICS in files:
            m = os.stat(os.path.join(root, METRICS)).st_mtime
            if m > best_m:
                best, best_m = Path(root), m
    return best


def _age(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _num(v, digits=4) -> str:
    """A number as a table cell: ``digits`` significant digits, ``null`` for none."""
    if v is None:
        return "null"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _fix(verdict) -> str:
    """The fix sentence of the verdict's line (what follows its ``at step N.``)."""
    m = FIX.search(verdict.line)
    return m[1].rstrip(".") if m else "see the line above"


def _start(obs) -> dict:
    """The start record, else what launch.json says of the command (a launch that died before
    writing one: at import, on a rejected flag)."""
    start = dict(obs.records.start)
    launch = obs.launch or {}
    if not start.get("argv") and isinstance(launch.get("argv"), list) and isinstance(launch.get("cwd"), str):
        argv = list(launch["argv"])
        python = argv.pop(0) if argv and PYTHON.match(argv[0]) else None
        argv = argv[1:] if argv[:1] == ["-u"] else argv
        start.update(argv=argv, cwd=launch["cwd"], **({"python": python} if python else {}))
    return start


def _next(run_dir: Path, obs, verdict, th) -> tuple[list, list]:
    """(what to run next, each one physical line; the notes that go with them): the verdict's
    move (references/recovery.md). After an anomaly: a relaunch (with the kind's change, or as
    it is) is the relaunch line (the start record's command through the launcher, resumed from
    the checkpoint this check-in names) and the new attempt's watchdog line (the last watchdog's
    flags, --on-exit and --detach kept); watch on is a ``--from-now`` watchdog line (after
    ``kill -CONT`` of a stopped process); fix first is why there is no line; stop and ask is
    the stop line, then the same command started over in a fresh folder and its watchdog, for
    the user to approve. For a run not yet over that no live watchdog watches, the watchdog line
    with the flags the last watchdog used."""
    wd = obs.watchdog
    flags = wd.argv if wd is not None else ()
    if verdict.state != ANOMALY:
        if verdict.state in GOING_ON and not (wd is not None and wd.alive) and (
                obs.alive or obs.visibility):
            return [watchdog_line(run_dir, flags=flags)], []
        return [], []
    if obs.relaunch is not None and not obs.relaunch.alive:
        return [f"no relaunch line: the last relaunch (pid {obs.relaunch.pid}) died before its start record; "
                "fix the error above in its command, then relaunch; see references/recovery.md"], []
    kind, move, start = verdict.kind, verdict.move or AS_IS, _start(obs)
    see = f"see references/recovery.md ({kind})"
    if move == WATCH_ON:
        lines = [f"kill -CONT {p.pid}" for p in obs.processes if p.state == "stopped"]
        return lines + [watchdog_line(run_dir, flags=flags, from_now=True)], [
            f"keep the trainer running: a relaunch does not fix {kind}; remove the cause while it runs, then watch "
            "on (--from-now judges only what comes after it)"]
    if move == FIX_FIRST:
        if kind == "disk":
            room = room_line(obs.volumes, th, obs.disk.bytes_per_save if obs.disk is not None else None)
            if obs.alive:
                return [f"no relaunch line: the trainer still runs: {room or _fix(verdict)}, then watch on with the "
                        "next line", watchdog_line(run_dir, flags=flags, from_now=True)], []
            return [f"no relaunch line until there is room: {room or _fix(verdict)}; then check in again for the "
                    f"relaunch line; {see}"], []
        why = ("the error is the script's own (not the machine's, the network's or a signal's), so the same "
               "command fails the same way: ") if kind in ("crash", "fatal") else ""
        return [f"no relaunch line: fix first: {why}{_fix(verdict)}; {see}"], []
    if move == STOP_ASK:
        live = next((p for p in obs.processes if p.alive and not p.child), None)
        mine = obs.launch if obs.launch and (live is None or live.pid == obs.launch.get("pid")) else None
        stop = stop_line(run_dir, mine, live.pid if live else None)
        fresh, new, why = fresh_plan(start, run_dir, window_s=(obs.launch or {}).get("window_s"))
        lines = [stop] if stop and (live or mine) else []
        notes = [f"stop and ask the user: a relaunch does not fix {kind} (the line above says what to check)"]
        if fresh:
            lines += [fresh, watchdog_line(new, flags=moved_flags(flags, run_dir, new), relaunch=True)]
            notes.append(f"{'the first line stops the trainer; ' if len(lines) == 3 else ''}the "
                         f"{'last two lines start' if len(lines) == 3 else 'lines start'} the same command over in "
                         f"{new}: run them only once the user approves")
        else:
            notes.append(why)
        return lines, notes
    bad = obs.records.hits.get("nan")
    line, note = relaunch_plan(start, verdict, run_dir,
                               checkpoint=str(obs.resume.path) if obs.resume is not None else None,
                               first_bad_step=bad.step if bad is not None else None,
                               window_s=(obs.launch or {}).get("window_s"),
                               engine=(obs.launch or {}).get("engine") or (obs.job.engine if obs.job else None),
                               options=(obs.launch or {}).get("options"), checkpoint_dirs=obs.checkpoint_dirs,
                               launched=obs.launch)
    if line is None:
        return [f"no relaunch line: {note}; {see}"], []
    said = [n for n in note.split("; ") if n and not n.startswith("resumes from ")]  # the resume line says that
    return [line, watchdog_line(run_dir, flags=flags, relaunch=True)], said


def _whole(run_dir: Path, lines: list) -> list:
    """Each next: line as it is, or, longer than check-in's whole budget, written to
    RUN_DIR/next-N.sh and shown as ``bash RUN_DIR/next-N.sh``: what the agent runs is exactly
    what was built. A folder that cannot be written keeps the line whole."""
    out = []
    for i, line in enumerate(lines, 1):
        if len(line) > LIMIT:
            path = run_dir.resolve() / f"next-{i}.sh"
            try:
                atomic_write_text(path, f"#!/bin/sh\n# check-in's next: line {i}\n{line}\n")
                line = f"bash {shlex.quote(str(path))}"
            except OSError:
                pass
        out.append(line)
    return out


def _resume(obs) -> list:
    """The checkpoint the relaunch line resumes from and the ones it skips (torn, poisoned:
    written at or after the first non-finite record), when the run's checkpoint folders are known."""
    if obs.disk is None:
        return []
    bad = obs.records.hits.get("nan")
    return resume_lines(obs.resume, obs.resume_skipped, bad.step if bad is not None else None)[:4]


def gather(run_dir: Path, k: int = 5, now: Optional[float] = None, gpu=None, look: Optional[tuple] = None) -> dict:
    """Every fact of the check-in as a dict (``--json`` prints it): the one Observation and the
    one Verdict of the watchdog's own observer and judge (``look``: (observer, observation,
    verdict) [judge.assess.assess]), rendered; nothing is read or probed here."""
    now = now or time.time()
    observer, obs, verdict = look or assess(run_dir, gpu=gpu)
    nxt, next_notes = _next(run_dir, obs, verdict, observer.th)
    wd, rec = obs.watchdog, obs.records
    start = dict(rec.start) or None
    steps, evals = list(rec.steps), list(rec.evals)
    proc = next((p for p in obs.processes if p.alive), obs.processes[0] if obs.processes else None)
    last = steps[-1] if steps else None
    limit = None
    if obs.time_limit is not None:
        limit = f"{_age(obs.time_limit)} from the run's start ({obs.time_limit_why}); {_age(obs.now - obs.started)} used"
    return {
        "run_dir": str(run_dir), "verdict": verdict.headline,
        "metrics_age_s": now - obs.metrics_mtime if obs.metrics_mtime is not None else None,
        "watchdog_message": verdict.line if verdict.state == ANOMALY else None,
        "fatal": (rec.fatal or {}).get("FATAL"),
        "notes": list(verdict.notes) + _unread(observer, wd),
        "unread_mb": observer.reader.unseen / 1e6 if observer.reader.unseen else None,
        "warnings": [a.message for a in verdict.warnings],
        "run_id": (start or {}).get("run_id"), "attempt": (start or {}).get("attempt"),
        "step": rec.last_step, "total_steps": (start or {}).get("total_steps"),
        "elapsed_s": (last or {}).get("t"), "eta_s": rec.eta_s if verdict.headline == "RUNNING healthy" else None,
        "time_limit": limit or f"none ({obs.time_limit_why})",
        "steps": [{f: r.get(f) for f in ("step", "loss", "lr", "grad_norm", "sps")} for r in steps[-k:]] if k else [],
        "loss_trend": [steps[0].get("loss"), last.get("loss")] if len(steps) > 1 else None,
        "eval": {kk: v for kk, v in evals[-1].items() if kk == "step" or kk.startswith("eval_")} if evals else None,
        "best_eval": dict(rec.best_eval) if rec.best_eval else None,
        "auroc_trend": [e.get("eval_auroc") for e in evals[-4:] if "eval_auroc" in e],
        "final": dict(obs.sentinel) if verdict.state == DONE and obs.sentinel else None,
        "watchdog": None if wd is None else {
            "pid": wd.pid, "alive": wd.alive, "state": wd.state, "ended_by": wd.ended_by or None,
            "verdict": (wd.headline or wd.state) if watchdog_ended(wd) else None,
            "last_poll_age_s": now - wd.last_poll if wd.last_poll is not None else None,
            "bad_lines": wd.bad_lines},
        "process": None if proc is None else {
            "pid": proc.pid, "state": proc.state, "why": proc.why, "cpu_percent": proc.cpu_percent,
            "rss_mb": proc.rss / 2**20 if proc.rss else None},
        "next": _whole(run_dir, nxt), "next_notes": next_notes,
        "launches": 1 + len((obs.launch or {}).get("earlier") or []) if obs.launch else None,
        "wakes": len((obs.launch or {}).get("on_exit") or []) if obs.launch else None,
        "ranks": rank_lines(obs.ranks, now, obs.rank_procs, where=obs.rank_where) if len(obs.ranks) > 1 else [],
        "job": None if obs.job is None else f"{obs.job.engine}: {obs.job.line()}",
        "gpu": list(obs.gpu_lines),
        "disk_free_gb": obs.volume_free[0] / 1e9 if obs.volume_free else None,
        "disk": obs.disk.line() if obs.disk is not None else None,
        "resume": _resume(obs),
        "last_error": obs.last_error,
        "stacks": _stacks(wd.stacks if wd is not None and verdict.state == ANOMALY else None),
    }


def _unread(observer, wd) -> list:
    """The note of a look that did not read the whole file (contract.TailReader's bounded read (``window``) of a
    big file no watchdog has followed and no scan covers): what was left out and what reads it."""
    reader = observer.reader
    if not reader.unseen:
        return []
    mb = f"{reader.unseen / 1e6:.0f} MB of {reader.offset / 1e6:.0f} MB"
    if wd is not None and wd.alive:
        return [f"this look read the head and tail of {METRICS} ({mb} left out): the live watchdog reads every "
                "record and judges them; the best eval shown is of what was read"]
    return [f"{METRICS} is long and no watchdog has read it whole: this look left {mb} out (between its head and its "
            f"last {WINDOW >> 20} MiB), so a NaN, FATAL or eval there is not shown and the best eval is of what was "
            "read; a watchdog (next: line) reads it all once and keeps the scan for the next check-ins"]


def _stacks(found) -> Optional[str]:
    """The watchdog's capture of the hang: how many files, where (the line names the frames)."""
    if not isinstance(found, dict) or not isinstance(found.get("folder"), str):
        return None
    files = [f for f in found.get("files") or [] if isinstance(f, str)]
    if not files:
        return f"stacks: none taken ({str(found.get('why_none') or '?')[:300]})"
    stamp = os.path.basename(files[0]).split("-", 1)[0]
    return (f"stacks: {len(files)} file{'s' if len(files) > 1 else ''} (one per process) in {found['folder']}/ "
            f"from {stamp}, the full stacks of the frames named above")


def render(f: dict, limit: int = LIMIT) -> str:
    """The facts as compact text, most important first, whole lines only, <= ``limit`` chars."""
    age = f"metrics {_age(f['metrics_age_s'])} old" if f["metrics_age_s"] is not None else "no metrics.jsonl"
    head = [f"{f['verdict']}  {f['run_dir']}  ({age})"]
    if f["watchdog_message"]:
        head.append(f["watchdog_message"][:700])
        if f.get("stacks"):
            head.append(f["stacks"])
    elif f["fatal"]:
        head.append(f"FATAL: {f['fatal'][:300]}")
    head += [f"note: {x}" for x in f.get("notes") or []]
    if f.get("next"):
        head += f.get("resume") or []
    head += [f"note: {x}" for x in f.get("next_notes") or []]
    head += [f"next: {x}" for x in f.get("next") or []]
    body = [f"warning: {x[len('ANOMALY '):][:300]}" for x in f.get("warnings") or []]
    if f["last_error"] and f["verdict"] != "DONE":
        body.append(f"last error: {f['last_error'][:300]}")
    if f["final"]:
        nums = [(k, v) for k, v in f["final"].items() if is_number(v)][:5]
        body.append("final: " + " ".join(f"{k}={_num(v)}" for k, v in nums))
    total = f["total_steps"]
    prog = (f"attempt {f['attempt']}, " if f.get("attempt") else "") + f"step {f['step']}" + (f"/{total} ({100 * f['step'] / total:.0f}%)" if is_number(total) and total else "")
    prog += f", elapsed {_age(f['elapsed_s'])}" if f["elapsed_s"] is not None else ""
    prog += f", ETA {_age(f['eta_s'])}" if f["eta_s"] is not None else ""
    if f.get("launches"):
        prog += f"; launch {f['launches']} of this folder" + (f", {f['wakes']} on-exit wakes sent" if f.get("wakes") else "")
    limit_line = [f"time limit: {f['time_limit']}"] if f.get("time_limit") else []
    if f["verdict"] == "ANOMALY timeout":   # the limit is what that verdict is about: never cut
        head[1:1], limit_line = limit_line, []
    body += [prog, *limit_line]
    body.append(_watchdog_line(f["watchdog"]))
    if f["steps"]:
        body.append(f"{'step':>7} {'loss':>8} {'lr':>9} {'grad':>8} {'sps':>8}")
        for r in f["steps"]:
            body.append(f"{_num(r['step']):>7} {_num(r['loss']):>8} {_num(r['lr'], 3):>9} {_num(r['grad_norm'], 3):>8} "
                        f"{_num(r['sps']):>8}")
    if f["loss_trend"]:
        body.append(f"loss trend (tail): {_num(f['loss_trend'][0])} -> {_num(f['loss_trend'][1])}")
    if f["eval"]:
        e, b = f["eval"], f["best_eval"] or {}
        metrics = " ".join(f"{kk[5:]}={_num(v)}" for kk, v in list(e.items()) if kk.startswith("eval_"))[:200]
        body.append(f"eval @{e.get('step')}: {metrics}"
                    + (f"; best auroc={_num(b.get('eval_auroc'))} @{b.get('step')}" if b else "")
                    + (" of what was read" if b and f.get("unread_mb") else "")
                    + ("; auroc trend " + " ".join(_num(x, 3) for x in f["auroc_trend"]) if f["auroc_trend"] else ""))
    body += f.get("ranks") or []
    if f.get("job"):
        body.append(f["job"][:200])
    p = f["process"]
    if p:
        cpu = f", cpu {p['cpu_percent']:.0f}%" if p["cpu_percent"] is not None else ""
        rss = f", rss {p['rss_mb']:.0f} MB" if p["rss_mb"] else ""
        body.append(f"process {p['pid']} ({p['why']}): {p['state']}{cpu}{rss}")
    body += [f"gpu: {g}" if g.startswith("no GPU") else g for g in f["gpu"][:8]]
    if not f.get("next"):
        body += f.get("resume") or []
    if f.get("disk"):
        body.append(f["disk"])
    elif f["disk_free_gb"] is not None:
        body.append(f"disk free: {f['disk_free_gb']:.1f} GB")
    out = list(head)   # the verdict, its line, the notes and the next: lines: never cut
    used = sum(len(line) + 1 for line in head)
    for line in body:
        if used + len(line) + 1 > limit:
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)


def _watchdog_line(w: Optional[dict]) -> str:
    """One line on the run's watchdog: none, alive, ended on a verdict, stopped, or gone."""
    if w is None:
        return "watchdog: none (start the next: watchdog line beside the run)"
    poll = f"last poll {_age(w['last_poll_age_s'])} ago"
    if w["alive"] and w["state"] in GOING_ON:
        bad = f", bad lines {w['bad_lines']}" if w["bad_lines"] else ""
        return f"watchdog: alive (pid {w['pid']}), {w['state']}, {poll}{bad}"
    if w["verdict"]:
        return f"watchdog: ended (pid {w['pid']}, {poll}) with {w['verdict']}"
    if w["ended_by"]:
        return f"watchdog: stopped by {w['ended_by']} (pid {w['pid']}, {poll})"
    return f"watchdog: gone (pid {w['pid']}, {poll}): nothing will wake you; start the next: watchdog line"


def summary(run_dir, k: int = 5) -> str:
    return render(gather(Path(run_dir), k))


def main(argv=None) -> int:
    p = Parser(prog="checkin.py", description="The state of a training run in one cheap read: the verdict "
               f"first ({', '.join(HEADLINES)}), then its notes and next: lines (never cut), progress, recent steps, "
               "evals, watchdog, process, GPU, disk and the last error, within 1,500 characters.")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="the run directory [the watchdog registry's newest run, else the newest metrics.jsonl below here]")
    p.add_argument("--json", action="store_true", help="the same facts as one JSON object")
    p.add_argument("--lines", type=count, default=5, metavar="K", help="step records shown (default: 5)")
    p.add_argument("--plot", action="store_true", help="also write RUN_DIR/metrics.png (needs matplotlib)")
    return front_door(p, _main, argv)


def _main(a) -> int:
    if a.run_dir == "" or (a.run_dir is not None and not a.run_dir.strip()):
        raise UsageError("an empty path is not a run directory; pass the folder holding metrics.jsonl, "
              "or nothing for the newest registered run")
    if a.run_dir:
        run_dir = Path(a.run_dir)
        if not run_dir.is_dir():
            raise UsageError(f"{run_dir} is not a run directory; pass the folder holding metrics.jsonl")
    else:
        run_dir = find_run(Path.cwd())
        if run_dir is None:
            raise UsageError("no run found (no watchdog registered one, no metrics.jsonl below "
                  f"{Path.cwd()}); pass RUN_DIR")
    look = assess(run_dir)   # one look: the text and the PNG render the same verdict
    facts = gather(run_dir, a.lines, look=look)
    if a.plot:
        from supervise.tools.plot import plot
        facts["plot"] = plot(run_dir, look)
    text = bounded_json(facts) if a.json else render(facts) + (f"\nplot: {facts['plot']}" if a.plot else "")
    print(text, flush=True)
    return EXIT_OK


def bounded_json(facts: dict, limit: int = LIMIT) -> str:
    """The facts as one JSON object of at most ``limit`` characters: long strings are cut,
    then the least important lists shortened, then fields dropped from the end; the verdict,
    its line, the next: lines and their notes, and a hang's stacks (the files that name its
    frames) are never dropped (they may pass the limit)."""
    facts = {k: (v[:300] if isinstance(v, str) else v) for k, v in facts.items()}
    text = json.dumps(facts, default=str)
    for name in ("steps", "ranks", "gpu", "auroc_trend", "warnings"):
        while len(text) > limit and isinstance(facts.get(name), list) and facts[name]:
            facts[name] = facts[name][1:]
            text = json.dumps(facts, default=str)
    for name in ("final", "best_eval", "eval", "last_error", "process", "watchdog", None, "time_limit",
                 "loss_trend", "job", "resume", "disk", "notes"):  # never the verdict's line, next:, stacks
        if len(text) <= limit:
            break
        if name is None:  # before the last words go, the empty fields do, and then each dropped one
            facts = {k: v for k, v in facts.items() if v not in (None, [], {}, "")}
        elif None in facts.values():
            facts[name] = None
        else:
            facts.pop(name, None)
        text = json.dumps(facts, default=str)
    return text

"""The Slurm engine: submit a job (sbatch), follow its state from the scheduler and what that
state means for the run, cancel it (scancel). Standard library only.

    job = query("123456")                       # SlurmJob; never raises
    if job.error: ...                           # Slurm unreachable / commands missing: one line
    found = slurm_anomaly(job, sentinel_present=False, step=120)
    facts = state("123456")                    # engines.Job, what the observer puts in the Observation

Sources, in order (each with a short timeout):
1. ``squeue --noheader --states=all --jobs ID --Format=JobID:|,State:|,Reason:|,NodeList:|,STDOUT:|,Name:|``
   (one ``|``-terminated line per job: ``123|RUNNING|None|node-a|/runs/a/train-%j.out|train|``);
   squeue keeps a finished job for the controller's MinJobAge (300 s by default).
2. for a finished job found by squeue: ``scontrol show job -o ID`` (``Key=Value`` words on one line)
   for its ExitCode (``3:0`` = exit 3, signal 0), Restarts, Command, WorkDir and the StdOut path
   with ``%j``/``%x`` expanded.
3. when squeue no longer knows the job: ``sacct -j ID -X --noheader --parsable2
   --format=JobID,JobName,State,ExitCode,Reason,NodeList,WorkDir`` (``123|train|CANCELLED by
   1000|0:15|None|node-a|/runs/a``); its stdout is then ``WorkDir/slurm-ID.out`` when that file exists.
A CANCELLED job's canceller comes from sacct's ``CANCELLED by UID`` when accounting is there.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from supervise.cli import UsageError
from supervise.observe.engines import ENDED, RUNNING as RUN, UNKNOWN, WAITING as WAIT, Cancelled, End, Job
from supervise.observe.logs import last_error, log_tail, oom_line, root_cause
from supervise.vocabulary import Anomaly, anomaly

TIMEOUT_S = 10.0
SQUEUE_FORMAT = "JobID:|,State:|,Reason:|,NodeList:|,STDOUT:|,Name:|"
SACCT_FORMAT = "JobID,JobName,State,ExitCode,Reason,NodeList,WorkDir"

OOM_FIX = ("The job exceeded its memory: ask for more (--mem / --mem-per-gpu) or halve the per-device "
           "batch size, then resubmit with --resume from the last checkpoint")
RUNNING = ("RUNNING", "COMPLETING", "STAGE_OUT")
WAITING = ("PENDING", "CONFIGURING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED",
           "RESIZING", "SIGNALING", "STOPPED")
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT")


@dataclass(frozen=True)
class SlurmJob:
    """What the scheduler says of one job. ``state`` is Slurm's base state in capitals
    (``RUNNING``, ``PENDING``, ``FAILED``, ...), None with ``error`` set when it could not be asked."""

    job_id: str
    state: Optional[str] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    reason: str = ""
    nodes: str = ""
    stdout: Optional[str] = None
    name: str = ""
    cancelled_by: str = ""
    restarts: Optional[int] = None
    command: str = ""
    workdir: str = ""
    source: str = ""                # "squeue" or "sacct"
    error: Optional[str] = None     # one line: why the state is unknown, and how to fix it

    @property
    def running(self) -> bool:
        """The job's processes run: the startup grace starts now, not at submission."""
        return self.state in RUNNING

    @property
    def waiting(self) -> bool:
        """Queued, held or suspended by the scheduler: not a stall."""
        return self.state in WAITING

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def sbatch_line(self) -> str:
        """The resubmission line when the batch script is known, else a hint."""
        if self.command and self.command != "(null)":
            return f"cd {self.workdir} && sbatch {self.command}" if self.workdir else f"sbatch {self.command}"
        return "sbatch <your batch script>"


def _run(runner, argv: list[str]) -> tuple[Optional[int], str, str]:
    """(returncode, stdout, stderr); returncode None with the reason in stderr when the command
    is missing or too slow. ``runner`` None: subprocess.run (imported here, off the start-up of a
    look at a run that is no Slurm job)."""
    import subprocess
    try:
        p = (runner or subprocess.run)(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except FileNotFoundError:
        return None, "", (f"{argv[0]} not found: Slurm's client commands are not on PATH "
                          "(load the slurm module or run this on a login node)")
    except subprocess.TimeoutExpired:
        return None, "", f"{argv[0]} did not answer within {TIMEOUT_S:g}s: the Slurm controller is slow or down"
    except OSError as e:
        return None, "", f"{argv[0]} could not run: {e}"
    return p.returncode, p.stdout or "", p.stderr or ""


def _base_state(text: str) -> tuple[str, str]:
    """('CANCELLED', '1000') from 'CANCELLED by 1000'; ('RUNNING', '') from 'RUNNING'."""
    text = (text or "").strip()
    m = re.match(r"([A-Z_]+)(?:\+)?(?:\s+by\s+(\S+))?", text)
    if not m:
        return text.upper(), ""
    return m.group(1), m.group(2) or ""


def _exit(text: str) -> tuple[Optional[int], Optional[int]]:
    m = re.match(r"\s*(-?\d+)(?::(\d+))?", text or "")
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None


def _user(uid: str) -> str:
    if uid.isdigit():
        import pwd
        try:
            return f"{pwd.getpwuid(int(uid)).pw_name} (uid {uid})"
        except KeyError:
            return f"uid {uid}"
    return uid


def _expand(pattern: str, job_id: str, name: str) -> str:
    """Expand the filename pattern letters sbatch documents that squeue leaves as they are."""
    out = pattern.replace("%%", "\0").replace("%j", job_id).replace("%A", job_id.split("_")[0])
    out = out.replace("%x", name).replace("%a", job_id.split("_")[1] if "_" in job_id else "")
    return out.replace("\0", "%")


def parse_squeue(text: str, job_id: str) -> Optional[dict]:
    """The fields of ``job_id``'s line in squeue's ``--Format=JobID:|,State:|,...`` output."""
    rows = [ln.split("|") for ln in text.splitlines() if ln.count("|") >= 5]
    row = next((r for r in rows if r[0] == job_id), rows[0] if rows else None)
    if row is None:
        return None
    jid, state, reason, nodes, stdout, name = (row + [""] * 6)[:6]
    return {"job_id": jid, "state": state.strip(), "reason": reason.strip(), "nodes": nodes.strip(),
            "stdout": _expand(stdout.strip(), jid, name.strip()) if stdout.strip() else None,
            "name": name.strip()}


def parse_scontrol(text: str) -> dict:
    """``scontrol show job -o`` words as a dict (values may not contain spaces; fine for ours)."""
    out = {}
    for word in text.split():
        key, eq, value = word.partition("=")
        if eq and key not in out:
            out[key] = value
    return out


def parse_sacct(text: str, job_id: str) -> Optional[dict]:
    """The allocation's line of ``sacct -X --noheader --parsable2 --format=SACCT_FORMAT``."""
    rows = [ln.split("|") for ln in text.splitlines() if ln.count("|") >= 6]
    row = next((r for r in rows if r[0] == job_id), rows[-1] if rows else None)
    if row is None:
        return None
    jid, name, state, code, reason, nodes, workdir = (row + [""] * 7)[:7]
    nodes = "" if nodes == "None assigned" else nodes   # cancelled before it ran
    return {"job_id": jid, "name": name, "state": state, "exit": code, "reason": reason,
            "nodes": nodes, "workdir": workdir}


def _sacct(job_id: str, runner) -> tuple[Optional[dict], str]:
    rc, out, err = _run(runner, ["sacct", "-j", job_id, "-X", "--noheader", "--parsable2",
                                 f"--format={SACCT_FORMAT}"])
    if rc != 0:
        return None, (err or out).strip().splitlines()[-1] if (err or out).strip() else f"sacct exit {rc}"
    row = parse_sacct(out, job_id)
    return row, "" if row else f"sacct knows no job {job_id}"


def query(job_id, runner=None) -> SlurmJob:
    """The scheduler's view of ``job_id``: squeue, then scontrol for a finished job's exit code
    and output file, then sacct once squeue forgot the job. Never raises: a missing command, a
    timeout or an unknown job gives ``SlurmJob(state=None, error=<one line>)``.
    ``runner`` has subprocess.run's signature (tests pass a replay of recorded outputs)."""
    job_id = str(job_id).strip()
    if not JOB_ID.fullmatch(job_id):
        return SlurmJob(job_id, error=f"bad Slurm job id {job_id!r}: expected digits like 123456 (or 123456_7)")
    rc, out, err = _run(runner, ["squeue", "--noheader", "--states=all", "--jobs", job_id,
                                 f"--Format={SQUEUE_FORMAT}"])
    row = parse_squeue(out, job_id) if rc == 0 else None
    if row is not None:
        state, by = _base_state(row["state"])
        fields = dict(row, state=state)
        code = sig = restarts = None
        command = workdir = ""
        if state in FINISHED or state in ("REQUEUE_HOLD", "REQUEUE_FED") or "%" in (row["stdout"] or ""):
            rc2, out2, _ = _run(runner, ["scontrol", "show", "job", "-o", job_id])
            info = parse_scontrol(out2) if rc2 == 0 else {}
            if info:
                code, sig = _exit(info.get("ExitCode", ""))
                restarts = int(info["Restarts"]) if info.get("Restarts", "").isdigit() else None
                command, workdir = info.get("Command", ""), info.get("WorkDir", "")
                if info.get("StdOut"):
                    fields["stdout"] = info["StdOut"]
        if state == "CANCELLED" and not by:
            acct, _ = _sacct(job_id, runner)
            by = _base_state(acct["state"])[1] if acct else ""
        return SlurmJob(job_id, state=state, exit_code=code, signal=sig, reason=fields["reason"],
                        nodes=fields["nodes"], stdout=fields["stdout"], name=fields["name"],
                        cancelled_by=_user(by) if by else "", restarts=restarts, command=command,
                        workdir=workdir, source="squeue")
    if rc is None:  # squeue missing or slow: sacct will not do better
        return SlurmJob(job_id, error=err)
    acct, why = _sacct(job_id, runner)
    if acct is None:
        said = (err or out).strip().splitlines()
        return SlurmJob(job_id, error=(f"job {job_id} unknown to squeue ({said[-1] if said else f'exit {rc}'}) "
                                       f"and to sacct ({why}): check the id with squeue --me / sacct -X"))
    state, by = _base_state(acct["state"])
    code, sig = _exit(acct["exit"])
    guess = os.path.join(acct["workdir"], f"slurm-{job_id}.out") if acct["workdir"] else None
    return SlurmJob(job_id, state=state, exit_code=code, signal=sig, reason=acct["reason"],
                    nodes=acct["nodes"], stdout=guess if guess and os.path.isfile(guess) else None,
                    name=acct["name"], cancelled_by=_user(by) if by else "", workdir=acct["workdir"],
                    source="sacct")


def slurm_anomaly(job: SlurmJob, sentinel_present: bool, step: int,
                  log_lines: Optional[Sequence[str]] = None) -> Optional[Anomaly]:
    """What the job's state means for the run at ``step``, or None (queued, running, done, or
    unknown: ``job.error`` says why; show it, it is not an anomaly of the run). With the sentinel
    present the run finished: None whatever the state. The mapping is ``ending``'s."""
    if sentinel_present or job.state is None or job.waiting and job.state not in ("REQUEUE_HOLD", "REQUEUE_FED"):
        return None
    end = ending(job, log_lines)
    return anomaly(end.kind, end.what, step, end.fix) if end is not None else None


def ending(job: SlurmJob, log_lines: Optional[Sequence[str]] = None) -> Optional[End]:
    """What a job's state means for a run that wrote no sentinel, or None (queued, running, or
    unknown). OUT_OF_MEMORY -> oom; NODE_FAIL/BOOT_FAIL -> node_fail; TIMEOUT/DEADLINE -> timeout;
    PREEMPTED/REQUEUE_* -> preempted with the requeue line; FAILED -> crash with the root cause
    from ``log_lines`` (default: the tail of the job's output file, read here); COMPLETED ->
    dead; CANCELLED -> dead naming who cancelled."""
    if job.state is None or job.state in RUNNING:
        return None
    if job.state in WAITING and job.state not in ("REQUEUE_HOLD", "REQUEUE_FED"):
        return None
    jid, st = job.job_id, job.state
    on = f" on {job.nodes}" if job.nodes else ""
    code = f" exit code {job.exit_code}" + (f" signal {job.signal}" if job.signal else "") if job.exit_code is not None else ""
    if st == "OUT_OF_MEMORY":
        return End("oom", f"slurm job {jid} state = OUT_OF_MEMORY{on}", OOM_FIX)
    if st in ("NODE_FAIL", "BOOT_FAIL"):
        return End("node_fail", f"slurm job {jid} state = {st}{on}",
                   f"A node failed, not the code: resubmit excluding it (sbatch --exclude={job.nodes or 'NODE'} "
                   f"...) or scontrol requeue {jid}, resuming from the last checkpoint")
    if st in ("TIMEOUT", "DEADLINE"):
        return End("timeout", f"slurm job {jid} state = {st} (time limit reached){on}",
                   f"The job outlived its --time: resubmit with --resume from the last checkpoint "
                   f"({job.sbatch_line()}), or ask for a longer --time")
    if st in ("PREEMPTED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        held = st == "REQUEUE_HOLD"
        return End("preempted", f"slurm job {jid} state = {st}{on}",
                   ("Slurm requeued it and holds it: scontrol release " + jid) if held else
                   (f"A higher-priority job took the nodes: requeue it with scontrol requeue {jid} "
                    f"(or {job.sbatch_line()}) and resume from the last checkpoint"))
    if st in ("FAILED", "SPECIAL_EXIT"):
        readable = bool(job.stdout) and os.path.isfile(job.stdout)   # a regular file: never block on a FIFO
        lines = list(log_lines) if log_lines is not None else (log_tail(job.stdout) if readable else [])
        cause = root_cause(lines)
        err = cause.summary() if cause else (oom_line(lines) or last_error(lines))
        kind = "oom" if (cause and cause.message and oom_line([cause.message])) or (not cause and oom_line(lines)) else "crash"
        where = f" in {job.stdout}" if job.stdout else ""
        what = f"slurm job {jid} state = FAILED{code}{on}"
        what += f": {err[:240]!r}{where}" if err else f" (no traceback{where})"
        if kind == "oom":
            fix = OOM_FIX
        elif err:
            fix = "Fix that error, then resubmit with --resume from the last checkpoint"
        else:
            fix = f"Read the job's output ({job.stdout or 'slurm-' + jid + '.out'}), fix the error, then resubmit"
        return End(kind, what, fix)
    if st == "COMPLETED":
        return End("dead", f"slurm job {jid} state = COMPLETED{code} without final_val_metrics.json",
                   "The batch script ended without the trainer writing its sentinel: read the job's "
                   f"output ({job.stdout or 'slurm-' + jid + '.out'}); a launch line missing srun/torchrun "
                   "or a script that exits early are the usual causes")
    if st == "CANCELLED":
        who = f" by {job.cancelled_by}" if job.cancelled_by else " (canceller unknown without accounting)"
        return End("dead", f"slurm job {jid} state = CANCELLED{who}",
                   "Someone or something (scancel, an admin, a dependency) cancelled the job: "
                   f"resubmit it ({job.sbatch_line()}) with --resume if that was not meant")
    return End("dead", f"slurm job {jid} state = {st}{code}{on}",
               f"Slurm ended the job: read scontrol show job {jid} / sacct -j {jid}, then resubmit")


# ----------------------------------------------------------------------------- the engine
NAME = "slurm"
LAUNCH_FLAG = "--slurm"
LAUNCH_HELP = ("submit the command as a Slurm job (sbatch --parsable, output appended to RUN_DIR/train.log) "
               "and record its job id in launch.json: the watchdog follows the newest job recorded there")
OPTION_FLAG = "--sbatch"
OPTION_HELP = "with --slurm: an sbatch option (repeatable, one word: --sbatch=--partition=debug)"
WATCH_FLAG = "--slurm-job"
WATCH_HELP = ("follow a Slurm job with squeue/sacct: PENDING is no stall, the scheduler's end states are "
              "verdicts (references/cluster.md)")
FRESH = "a Slurm job: submit its batch script again with a new output folder"
JOB_ID = re.compile(r"\d+(?:_\d+)?(?:\+\d+)?")
SUBMITTED = re.compile(r"^(\d+)(?:;\S+)?$")   # sbatch --parsable: ID or ID;CLUSTER


def job_id(text: str) -> str:
    """A Slurm job id as sbatch printed it (123456, 123456_7), or ValueError."""
    text = str(text).strip()
    if not JOB_ID.fullmatch(text):
        raise ValueError(f"{text!r} is not a Slurm job id; give the number sbatch printed (e.g. 4242)")
    return text


def state(job: str, runner=None) -> Job:
    """The scheduler's view of ``job`` (``query``) as engine-neutral facts; a finished job's end
    read here (its output file's root cause), so the judge reads no file."""
    j = query(job, runner=runner)
    if j.state is None:
        return Job(NAME, j.job_id, UNKNOWN, error=j.error)
    phase = RUN if j.running else WAIT if j.waiting else ENDED if j.finished else UNKNOWN
    return Job(NAME, j.job_id, phase, state=j.state, reason=j.reason if j.reason not in ("", "None") else "",
               nodes=j.nodes, exit_code=j.exit_code, logs=j.stdout, end=ending(j) if phase == ENDED else None,
               error=None if phase != UNKNOWN else f"job {j.job_id} is in a state this watchdog does not know: {j.state}")


def check(argv: list, cwd, env: dict) -> dict:
    """Nothing to find here but sbatch (the command runs where Slurm puts it)."""
    import shutil
    if shutil.which("sbatch", path=env.get("PATH", os.defpath)) is None:
        raise UsageError("sbatch is not on PATH: --slurm submits through Slurm; run it where sbatch works")
    return {}


def submit(run, argv: list, *, cwd, env: dict, variables: dict, log, options=(), runner=None) -> dict:
    """``sbatch --parsable`` of ``argv`` (``--wrap``, ``variables`` set with ``env``), output
    appended to ``log``, run in ``cwd``; the launch record's fields that name the job (and its
    sbatch options, kept for a resubmission)."""
    import shlex
    import subprocess
    runner = runner or subprocess.run
    words = " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())
    cmd = ["sbatch", "--parsable", f"--chdir={cwd}", f"--output={log}", "--open-mode=append", *options,
           f"--wrap=exec env {words} {shlex.join(argv)}"]
    try:
        p = runner(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=cwd)
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"sbatch did not run ({e}); nothing was submitted")
    m = SUBMITTED.match((p.stdout or "").strip())
    if p.returncode != 0 or not m:
        said = ((p.stderr or p.stdout or "").strip().splitlines() or ["no output"])[-1][:200]
        raise UsageError(f"sbatch refused the job (exit {p.returncode}: {said}); nothing was submitted")
    return {"pid": None, "host": None, "job_id": m[1], "options": list(options)}


def held(rec: dict) -> bool:
    """The recorded job is still queued or running (the scheduler holds it)."""
    return bool(rec.get("job_id")) and not query(rec["job_id"]).finished


def cancel(rec: dict, grace_s: float = 0.0, clock=None, runner=None) -> Cancelled:
    """``scancel`` of the recorded job; UsageError when scancel cannot run or refuses."""
    import subprocess
    job = rec["job_id"]
    try:
        p = (runner or subprocess.run)(["scancel", job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"scancel {job} did not run ({e}); cancel the job where Slurm runs")
    if p.returncode != 0:
        raise UsageError(f"scancel {job} failed: {(p.stderr or p.stdout).strip()[:200]}")
    return Cancelled(["scancel"], True, None, f"cancelled Slurm job {job} (scancel)")


def job_of(start) -> Optional[str]:
    """The Slurm job a start record's attempt ran in (its writer read SLURM_JOB_ID)."""
    jid = start.get("slurm_job_id") if isinstance(start, dict) else None
    return jid if isinstance(jid, str) and jid else None


RESOURCES = {"job_name": "--job-name", "partition": "--partition", "nodes": "--nodes",
             "ntasks_per_node": "--ntasks-per-node", "cpus_per_task": "--cpus-per-task", "account": "--account",
             "qos": "--qos"}


def resubmit(start: dict, recorded: Optional[list] = None) -> tuple[list, str]:
    """(launch.py's words that resubmit the attempt through Slurm, a note): the launcher's own
    sbatch options (``recorded``, launch.json's), else the resources the job's variables recorded."""
    jid = job_of(start)
    if recorded is not None:
        args = list(recorded)
        note = f"a resubmission of Slurm job {jid} through the launcher (the same sbatch options)"
    else:
        job = start.get("slurm") if isinstance(start.get("slurm"), dict) else {}
        args = [f"{flag}={job[k]}" for k, flag in RESOURCES.items() if isinstance(job.get(k), str) and job[k]]
        if isinstance(job.get("gpus_per_node"), str) and job["gpus_per_node"].isdigit() and job["gpus_per_node"] != "0":
            args.append(f"--gres=gpu:{job['gpus_per_node']}")
        if isinstance(job.get("mem_per_node"), str) and job["mem_per_node"].isdigit():
            args.append(f"--mem={job['mem_per_node']}M")
        note = (f"a resubmission of Slurm job {jid} through the launcher with the resources its variables "
                "recorded (check them against your batch script, which may also set up modules or an environment; "
                f"scontrol requeue {jid} re-runs that script unchanged)")
    return [LAUNCH_FLAG, *(f"{OPTION_FLAG}={a}" for a in args)], note

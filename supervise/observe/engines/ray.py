"""The Ray engine: submit a job (``ray job submit --no-wait``), follow it through the Ray
dashboard's REST API, stop it (``ray job stop``). Standard library only: the watchdog asks the
dashboard over HTTP and never imports ray, so it can follow a job from a laptop or another PID
namespace, where no worker process is visible.

    job = state("t-raise-1@http://10.0.0.1:8265")   # engines.Job; never raises

Sources, each with a short timeout:
1. ``GET /api/jobs/<id>`` (the id is a submission id or a Ray job id): the job's status PENDING,
   RUNNING, STOPPED, SUCCEEDED or FAILED, its message, error type, driver exit code and Ray job id;
2. ``GET /api/train/v2/runs/v1``: the Ray Train v2 run of that Ray job, when the driver runs with
   ``RAY_TRAIN_ENABLE_STATE_TRACKING=1`` (the launcher sets it): INITIALIZING, SCHEDULING,
   RUNNING, RESTARTING, RESIZING, FINISHED, ERRORED or ABORTED, its attempts with their workers'
   nodes and errors, and its ``FailureConfig(max_failures)``;
3. ``GET /api/v0/nodes?detail=1``, only when an error names a node: its address and why it died;
4. the driver's output for a failed job without a Train run: the file the launcher recorded in the
   job's metadata (``supervise_log``: RUN_DIR/train.log), else ``GET /api/jobs/<id>/logs``.

What the states mean for the run:
- PENDING, and a Train run INITIALIZING, SCHEDULING, RESTARTING or RESIZING: the job waits
  (for its driver, or for resources for its workers): no stall, no record expected;
- a Train run with more than one attempt that has not ended: Ray restarted its workers within
  the run's failure budget: a note with the restart count and the failed worker's node, no verdict;
- a Train run ABORTED while the job runs: its controller died before it said why (the dashboard
  infers ABORTED from a dead controller; under load the ERRORED it sent can come later): a note,
  and the verdict waits for the job's end, read from the driver's output;
- a Train run ERRORED, or the job FAILED: a verdict whose line carries the failing
  worker's error (the Train run's error snippet, not the driver's wrapper): ``node_fail`` naming
  the node's address when a worker's node died, ``oom`` when Ray's memory monitor killed it, else
  ``crash``;
- SUCCEEDED without the sentinel, STOPPED: ``dead``.
"""
from __future__ import annotations

import json
import os
import re
from typing import Optional

from supervise.cli import UsageError
from supervise.observe.engines import ENDED, RUNNING, UNKNOWN, WAITING, Cancelled, End, Job
from supervise.observe.logs import last_error, log_tail, oom_line

NAME = "ray"
LAUNCH_FLAG = "--ray"
LAUNCH_HELP = ("submit the command as a Ray job (ray job submit --no-wait, output appended to RUN_DIR/train.log, "
               "Ray Train's state tracking on) and record its id in launch.json: the watchdog follows it through "
               "the Ray dashboard")
OPTION_FLAG = "--ray-option"
OPTION_HELP = ("with --ray: a ray job submit option (repeatable, one word: --ray-option=--address=http://HEAD:8265, "
               "--ray-option=--entrypoint-num-cpus=1)")
WATCH_FLAG = "--ray-job"
WATCH_HELP = ("follow a Ray job (its submission id, Ray job id or Ray Train run id; ID@http://HEAD:8265 for a "
              "dashboard that is not RAY_ADDRESS's or 127.0.0.1:8265's) through the dashboard: a job waiting for "
              "resources is no stall, a Train restart within its budget is a note, its end is a verdict "
              "(references/cluster.md)")
FRESH = "a Ray job: submit it again with a new output folder"
WORKER_ARGV = True   # the writer runs in a Train worker: the relaunch resubmits launch.json's command
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
TIMEOUT_S = 5.0
TRACKING = "RAY_TRAIN_ENABLE_STATE_TRACKING"
WAITS = ("INITIALIZING", "SCHEDULING", "RESTARTING", "RESIZING")
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
SNIPPET = re.compile(r"^\[Rank ([\d,\s]+) Error Snippet\]:\s*$", re.M)
DIED_NODE = re.compile(r"its node has died\. Node Id: ([0-9a-f]{8,})", re.I)
UNREACHABLE = re.compile(r"health check failed\.(?:.*\n){1,14}?.*(?:failed to connect|unavailable)", re.I)
REFUSED = re.compile(r"remote host: (.+?)(?: rpc_code|\.|$)", re.M)
NODE_ID = re.compile(r"node_id='([0-9a-f]{8,})'")
NODE_IP = re.compile(r"node_ip='([^']+)'")
RAY_OOM = ("outofmemoryerror", "running low on memory", "memory monitor")


def job_id(text: str) -> str:
    """``ID`` or ``ID@http://HOST:PORT`` (a submission id, Ray job id or Train run id), or ValueError."""
    text = str(text).strip()
    ident, _, address = text.partition("@")
    if not ID.fullmatch(ident) or (address and not re.fullmatch(r"https?://[^\s/@]+/?", address)):
        raise ValueError(f"{text!r} is not a Ray job: give the submission id ray job submit printed "
                         "(raysubmit_...), optionally @http://HEAD:8265")
    return text


def address_of(key: str, env=None) -> tuple:
    """(the id, the dashboard's address) of a job key ``ID[@ADDRESS]``: without one, RAY_ADDRESS's
    when it is an http address, else 127.0.0.1:8265."""
    ident, _, address = str(key).partition("@")
    if not address:
        env = os.environ if env is None else env
        given = env.get("RAY_API_SERVER_ADDRESS") or env.get("RAY_ADDRESS") or ""
        address = given if given.startswith(("http://", "https://")) else DEFAULT_ADDRESS
    return ident, address.rstrip("/")


def _fetch(url: str, timeout: float = TIMEOUT_S) -> tuple:
    """(HTTP status, body) of a GET; (None, why) when the dashboard did not answer."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, str(getattr(e, "reason", e))


def _json(fetch, url: str) -> tuple:
    """(parsed JSON or None, HTTP status or None, the body or the reason)."""
    status, body = fetch(url)
    if status != 200:
        return None, status, body
    try:
        return json.loads(body), status, body
    except ValueError:
        return None, status, f"not JSON: {body[:80]!r}"


def _train_run(fetch, address: str, ray_job: str, ident: str) -> Optional[dict]:
    """The newest Train v2 run of Ray job ``ray_job`` (or whose id is ``ident``), None without
    state tracking or without a run."""
    data, _, _ = _json(fetch, f"{address}/api/train/v2/runs/v1")
    runs = [r for r in (data or {}).get("train_runs") or [] if isinstance(r, dict)
            and (r.get("job_id") == ray_job or r.get("id") == ident)]
    return max(runs, key=lambda r: r.get("start_time_ns") or 0) if runs else None


def _max_failures(run: dict) -> Optional[int]:
    cfg = ((run.get("run_settings") or {}).get("run_config") or {}).get("failure_config") or {}
    return cfg.get("max_failures") if isinstance(cfg.get("max_failures"), int) else None


def _nodes(fetch, address: str) -> dict:
    """node id -> the node's facts (state, node_ip, state_message), {} when it cannot be asked."""
    data, _, _ = _json(fetch, f"{address}/api/v0/nodes?detail=1")
    rows = (((data or {}).get("data") or {}).get("result") or {}).get("result") or []
    return {n["node_id"]: n for n in rows if isinstance(n, dict) and n.get("node_id")}


def _workers_nodes(attempt: dict) -> str:
    """``192.0.2.2 (25c53497)`` for each node an attempt's workers ran on."""
    seen = []
    for w in attempt.get("workers") or []:
        node = f"{w.get('node_ip') or '?'} ({(w.get('node_id') or '')[:8]})"
        if node not in seen:
            seen.append(node)
    return ", ".join(seen)


def _error(text: str) -> tuple:
    """(which ranks, the error) of a Train run's ``[Rank 0,1 Error Snippet]:`` text: the first
    rank block's own error (its last traceback line, or its first line), not the driver's wrapper."""
    blocks = SNIPPET.split(text or "")
    if len(blocks) < 3:
        lines = (text or "").splitlines()
        return "", last_error(lines) or next((ln.strip() for ln in lines if ln.strip()), "")
    ranks, body = blocks[1].replace(" ", ""), blocks[2].splitlines()
    said = last_error(body) if any(ln.startswith("Traceback") for ln in body) else None
    return ranks, said or next((ln.strip() for ln in body if ln.strip()), "")


def _died(text: str, nodes_of, ranks: str = "") -> Optional[str]:
    """``node 192.0.2.2 (25c53497) DEAD (received SIGTERM)`` when ``text`` says a worker's node
    died, or ``node 192.0.2.2 (3ffcbb7f) unreachable (...)`` when a worker's health check could not
    reach it (a node killed outright: Ray's own health check marks it DEAD only later); None
    otherwise. ``nodes_of()``: node id -> facts, asked only then."""
    dead = DIED_NODE.search(text or "")
    lost = None if dead else UNREACHABLE.search(text or "")
    if not (dead or lost):
        return None
    node_id = dead[1] if dead else (NODE_ID.search(text) or [None, ""])[1]
    nodes = nodes_of()
    node = nodes.get(node_id) or next((n for i, n in nodes.items() if node_id and i.startswith(node_id)), {})
    ip = node.get("node_ip") or (NODE_IP.search(text) or [None, "?"])[1]
    ray_says = node.get("state") or "unknown to Ray"
    why = (node.get("state_message") or "").replace("Expected termination: ", "")
    of = f" of rank {ranks}" if ranks else ""
    if dead:
        return f"node {ip} ({node_id[:8]}){of} {ray_says}" + (f" ({why})" if why else "")
    said = (REFUSED.search(text) or [None, "no answer"])[1]
    return (f"node {ip} ({node_id[:8]}){of} unreachable (a worker health check failed: {said}; Ray reports the "
            f"node {ray_says}{f': {why}' if why else ''})")


def _dead_worker_node(attempt: dict, nodes: dict) -> Optional[str]:
    """``node 192.0.2.2 (25c53497) of rank 1 DEAD (...)`` when Ray reports dead a node the failed
    attempt's workers ran on (their own error is then fallout: a closed connection, a collective
    torn down), else None."""
    for w in attempt.get("workers") or []:
        node = nodes.get(w.get("node_id") or "") or {}
        if node.get("state") == "DEAD":
            why = (node.get("state_message") or "").replace("Expected termination: ", "")
            return (f"node {node.get('node_ip') or w.get('node_ip') or '?'} ({w['node_id'][:8]}) of rank "
                    f"{w.get('world_rank', '?')} DEAD" + (f" ({why})" if why else ""))
    return None


def _restart_note(run: dict) -> str:
    """``Train run t1 restarted 1 time (max_failures 3): attempt 1 ERRORED on 192.0.2.2 (25c53497):
    ValueError: ...``, or '' while the run is on its first attempt."""
    attempts = [a for a in run.get("attempts") or [] if isinstance(a, dict)]
    failed = [a for a in attempts if a.get("status") in ("ERRORED", "ABORTED")]
    if len(attempts) < 2 or not failed:
        return ""
    last = failed[-1]
    ranks, said = _error(last.get("status_detail") or "")
    budget = _max_failures(run)
    of = f" (max_failures {'unlimited' if budget == -1 else budget})" if budget is not None else ""
    n = len(attempts) - 1
    return (f"Train run {run.get('name') or run.get('id')} restarted {n} time{'s' if n > 1 else ''}{of}, within its "
            f"failure budget: attempt {attempts.index(last) + 1} {last['status']} on {_workers_nodes(last) or '?'}"
            + (f" (rank {ranks})" if ranks else "") + (f": {said[:200]}" if said else ""))


def _ending(ident: str, details: dict, run: Optional[dict], fetch, address: str) -> End:
    """What a job's end means for a run that wrote no sentinel."""
    st = details.get("status") or ""
    code = details.get("driver_exit_code")
    jid = f"ray job {ident}"
    if st == "SUCCEEDED" and not (run and run.get("status") in ("ERRORED", "ABORTED")):
        return End("dead", f"{jid} state = SUCCEEDED without final_val_metrics.json",
                   "The Ray job ended without the trainer writing its sentinel: read its output "
                   f"(ray job logs {ident}); an entrypoint that exits early is the usual cause")
    if st == "STOPPED":
        return End("dead", f"{jid} state = STOPPED",
                   f"Someone stopped the job (ray job stop {ident}, the dashboard): resubmit it with --resume "
                   "if that was not meant")
    # ABORTED: the dashboard's word for a controller that died before it said why: the driver's output says
    aborted = (run or {}).get("status") == "ABORTED"
    detail = "" if aborted else (run or {}).get("status_detail") or ""
    state = f"{jid} state = {st or 'RUNNING'}" + (f", Train run {run.get('status')}" if run else "")
    if not detail:   # no Train run, or no word from it: the driver's own output
        lines = _driver_lines(ident, details, fetch, address)
        detail = "\n".join(lines)
        ranks, said = _error(detail) if SNIPPET.search(detail) else ("", oom_line(lines) or last_error(lines) or "")
    else:
        ranks, said = _error(detail)
    attempt = next((a for a in reversed((run or {}).get("attempts") or []) if a.get("status") != "RUNNING"), None)
    died = _died(detail, lambda: _nodes(fetch, address), ranks) or (_dead_worker_node(attempt, _nodes(fetch, address))
                                                                    if attempt else None)
    if attempt and _workers_nodes(attempt) and not died:
        state += f" on {_workers_nodes(attempt)}"
    who = f" (rank {ranks})" if ranks else ""
    if died:
        return End("node_fail", f"{state}: {died}",
                   "A node died, not the code: resubmit (the relaunch line) once Ray has a healthy node in its "
                   "place, resuming from the last checkpoint; FailureConfig(max_failures=N) lets Ray Train "
                   "restart on its own")
    if any(m in detail.lower() for m in RAY_OOM) or (said and oom_line([said])):
        return End("oom", f"{state}{who}: {said[:240]!r}",
                   "Ray's memory monitor or the device ran out of memory: give each worker more memory "
                   "(resources_per_worker, fewer workers per node) or halve the per-device batch size, then "
                   "resubmit with --resume from the last checkpoint")
    exit_ = f" exit code {code}" if isinstance(code, int) and not run else ""
    if said:
        return End("crash", f"{state}{exit_}{who}: {said[:240]!r}",
                   "Fix that error, then resubmit with --resume from the last checkpoint")
    return End("crash", f"{state}{exit_} ({details.get('error_type') or 'no traceback'})",
               f"Read the job's output (ray job logs {ident}), fix the error, then resubmit")


def _driver_lines(ident: str, details: dict, fetch, address: str) -> list:
    """The tail of the driver's output: the launcher's train.log (the job's metadata), else Ray's."""
    log = (details.get("metadata") or {}).get("supervise_log")
    if isinstance(log, str) and os.path.isfile(log):
        return log_tail(log)
    data, _, _ = _json(fetch, f"{address}/api/jobs/{ident}/logs")
    text = (data or {}).get("logs") if isinstance(data, dict) else None
    return (text or details.get("message") or "").splitlines()[-400:]


def state(key: str, runner=None) -> Job:
    """What the dashboard says of job ``key`` (``ID[@ADDRESS]``) as engine-neutral facts; its end
    read here (the Train run's worker errors, the dead node, the driver's output). ``runner``: a
    ``fetch(url) -> (status, body)`` (tests), else urllib. Never raises."""
    fetch = runner or _fetch
    ident, address = address_of(key)
    details, status, body = _json(fetch, f"{address}/api/jobs/{ident}")
    if details is None and status == 404:   # a Train run's id: its Ray job
        run = _train_run(fetch, address, "", ident)
        if run and run.get("job_id"):
            details, status, body = _json(fetch, f"{address}/api/jobs/{run['job_id']}")
    if not isinstance(details, dict):
        if status == 200:
            return Job(NAME, key, UNKNOWN, error=f"the Ray dashboard at {address} answered 200 for job {ident} "
                                                 f"with no job in it: {str(body).strip()[:160]}")
        if status is None:
            return Job(NAME, key, UNKNOWN, error=f"the Ray dashboard at {address} did not answer ({body}): is the "
                                                 "cluster up? give ID@http://HEAD:8265 or set RAY_ADDRESS")
        if status == 404:
            return Job(NAME, key, UNKNOWN, error=f"Ray at {address} knows no job {ident}: check the id with "
                                                 "ray job list")
        return Job(NAME, key, UNKNOWN, error=f"the Ray dashboard at {address} answered {status} for job {ident}: "
                                             f"{body.strip()[:160]}")
    st = details.get("status") or ""
    run = _train_run(fetch, address, details.get("job_id") or "", ident) if st in ("RUNNING", "FAILED") else None
    note = _restart_note(run) if run and st == "RUNNING" else ""
    train = (run or {}).get("status") or ""
    driver = details.get("driver_info") or {}
    nodes = _workers_nodes((run.get("attempts") or [{}])[-1]) if run and run.get("attempts") else \
        driver.get("node_ip_address") or ""
    if st == "PENDING":
        return Job(NAME, key, WAITING, state=st, reason=(details.get("message") or "")[:160])
    if st == "RUNNING" and train in WAITS:
        return Job(NAME, key, WAITING, state=f"RUNNING, Train run {train}",
                   reason=((run.get("status_detail") or "").splitlines() or [""])[0][:160], nodes=nodes, note=note)
    if st == "RUNNING" and train == "ABORTED":   # its controller died; why, the driver says when the job ends
        return Job(NAME, key, RUNNING, state="RUNNING, Train run ABORTED", nodes=nodes,
                   note=f"Train run {run.get('name') or run.get('id')} ABORTED (its controller died before it said "
                        "why): the verdict waits for the Ray job's end and its driver's output")
    if st == "RUNNING" and train != "ERRORED":
        return Job(NAME, key, RUNNING, state="RUNNING" + (f", Train run {train}" if train else ""), nodes=nodes,
                   note=note)
    if st in ("RUNNING", "FAILED", "SUCCEEDED", "STOPPED"):
        return Job(NAME, key, ENDED, state=st + (f", Train run {train}" if train else ""), nodes=nodes,
                   exit_code=details.get("driver_exit_code"), logs=(details.get("metadata") or {}).get("supervise_log"),
                   end=_ending(ident, details, run, fetch, address))
    return Job(NAME, key, UNKNOWN, state=st, error=f"Ray job {ident} is in a state this watchdog does not know: {st}")


def _option_address(options) -> Optional[str]:
    words = list(options)
    for i, w in enumerate(words):
        if w.startswith("--address="):
            return w.split("=", 1)[1]
        if w == "--address" and i + 1 < len(words):
            return words[i + 1]
    return None


def _ray_cli(env: dict) -> Optional[str]:
    """The ray command: on PATH, else beside this Python (a virtual environment not activated)."""
    import shutil
    import sys
    found = shutil.which("ray", path=env.get("PATH", os.defpath))
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    return found or (beside if os.access(beside, os.X_OK) else None)


def check(argv: list, cwd, env: dict) -> dict:
    """Nothing to find here but the ray command (the entrypoint runs where Ray puts it)."""
    cli = _ray_cli(env)
    if cli is None:
        raise UsageError("ray is not on PATH: --ray submits through the Ray Jobs CLI; pip install 'ray[default]'")
    return {"cli": cli}


def submit(run, argv: list, *, cwd, env: dict, variables: dict, log, options=(), runner=None,
           cli: str = "ray") -> dict:
    """``ray job submit --no-wait`` of ``argv`` (run in ``cwd`` with ``variables``, output appended
    to ``log``: the run folder is on a filesystem the cluster shares), Ray Train's state tracking on;
    the launch record's fields that name the job (``ID@ADDRESS``) and its options."""
    import shlex
    import subprocess
    import time
    runner = runner or subprocess.run
    address = _option_address(options) or address_of("x", env)[1]
    given = [w for w in options if w != "--address" and not w.startswith("--address=") and w != address]
    ident = re.sub(r"[^A-Za-z0-9_-]", "-", f"{os.path.basename(str(run))}-{int(time.time())}")[-100:]
    words = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**variables, TRACKING: "1"}.items())
    entry = f"cd {shlex.quote(str(cwd))} && exec env {words} {shlex.join(argv)} >> {shlex.quote(str(log))} 2>&1"
    cmd = [cli, "job", "submit", "--no-wait", f"--address={address}", f"--submission-id={ident}",
           f"--metadata-json={json.dumps({'supervise_log': str(log), 'supervise_run': str(run)})}",
           *given, "--", "sh", "-c", entry]
    try:
        p = runner(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"ray job submit did not run ({e}); nothing was submitted")
    if p.returncode != 0:
        said = [ln for ln in (p.stderr or p.stdout or "").strip().splitlines() if ln.strip()] or ["no output"]
        raise UsageError(f"ray job submit refused the job (exit {p.returncode}: {said[-1][:200]}); nothing was submitted")
    return {"pid": None, "host": None, "job_id": f"{ident}@{address}", "options": list(options)}


def held(rec: dict) -> bool:
    """The recorded job still waits or runs (or the dashboard cannot say)."""
    return bool(rec.get("job_id")) and not state(rec["job_id"]).ended


def cancel(rec: dict, grace_s: float = 0.0, clock=None, runner=None) -> Cancelled:
    """``ray job stop`` of the recorded job; UsageError when it cannot run or refuses."""
    import subprocess
    ident, address = address_of(rec["job_id"])
    try:
        p = (runner or subprocess.run)([_ray_cli(dict(os.environ)) or "ray", "job", "stop", f"--address={address}", ident],
                                       capture_output=True, text=True, timeout=max(60.0, grace_s + 30))
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"ray job stop {ident} did not run ({e}); stop the job where Ray runs")
    if p.returncode != 0:
        said = [ln for ln in (p.stderr or p.stdout or "").strip().splitlines() if ln.strip()] or ["no output"]
        raise UsageError(f"ray job stop {ident} failed: {said[-1][:200]}")
    return Cancelled(["ray job stop"], True, None, f"stopped Ray job {ident} (ray job stop)")


def job_of(start) -> Optional[str]:
    """The start record names no Ray job (its writer reads no Ray variable): the launcher's
    launch.json does."""
    return None


def resubmit(start: dict, recorded: Optional[list] = None) -> tuple:
    """(launch.py's words that resubmit through Ray with the same options, a note)."""
    return [LAUNCH_FLAG, *(f"{OPTION_FLAG}={a}" for a in (recorded or []))], \
        "a resubmission through the launcher to Ray (ray job submit, the same options)"

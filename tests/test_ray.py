"""Ray beyond one node: a real multi-node Ray on this machine (``ray.cluster_utils.Cluster``: a head,
and per case a worker node with its own raylet and a resource only that node has, so the Train
workers land there), a real Ray Train job (TorchTrainer, gloo) submitted with ``ray job submit`` or
through the launcher, and the watchdog in its own PID namespace (``unshare --pid --fork
--mount-proc``), where it cannot see one worker process: it knows the run only from the records on
the shared filesystem and from what the Ray dashboard says.

The cases: a worker that raises (the verdict carries the worker's error, not the driver's wrapper),
a worker node killed (node_fail, naming the node), a restart that Ray Train performs within its
failure budget (a note, no verdict, then done), a job that waits for resources that appear later
(no stall, no missing telemetry, then done). Plus the engine's mapping of a dashboard that is
down or does not know the job (one line, never a verdict).
"""
import json
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import (BOUND, LAUNCHER, ROOT, SCRIPTS, STOPPER, WATCHDOG, anomaly_line, missing, need,
                      wait_for, wait_for_lines, wait_for_polls, watchdog_state)
from test_namespace import OWN_NS, _why as NO_UNSHARE

need("ray")
if NO_UNSHARE:
    missing(NO_UNSHARE)

from ray.cluster_utils import Cluster  # noqa: E402

from supervise.cli import UsageError  # noqa: E402
from supervise.observe.engines import ray as ray_engine  # noqa: E402
from supervise.vocabulary import WATCHING  # noqa: E402

JOB = ROOT / "tests" / "ray_train_job.py"
RAY = str(Path(sys.executable).with_name("ray"))
LONG = 15 * BOUND   # s: a Ray Train start: 5 min seen on 2 cores with two busy loops beside (raylets, torch, gloo)
# Ray's own node health check (GCS -> raylet, 3 s x 5 by default) declares a CPU-starved node dead:
# tolerant here, so that only the kill a case makes ends a node (Ray Train's worker check is unchanged)
PATIENT = {"health_check_timeout_ms": 30_000, "health_check_period_ms": 5_000, "health_check_failure_threshold": 20}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"{address}/api/version", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _accepts(address: str) -> bool:
    """A trivial job was submitted and succeeded (the head's job agent is up: until then Ray answers
    'No available agent to submit job, please try again later')."""
    ident = f"ready-{_free_port()}"
    p = subprocess.run([RAY, "job", "submit", f"--address={address}", f"--submission-id={ident}", "--", "true"],
                       capture_output=True, text=True, timeout=BOUND)
    return p.returncode == 0


@pytest.fixture(scope="module")
def cluster():
    """A Ray head (1 CPU, the dashboard and its agent on free ports: another Ray on this machine holds
    the default ones); cases add their worker nodes."""
    port = _free_port()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True,
                                                      "dashboard_host": "127.0.0.1", "dashboard_port": port,
                                                      "dashboard_agent_listen_port": _free_port(),
                                                      "_system_config": PATIENT})
    address = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(address) or None, f"the Ray dashboard at {address}", LONG)
        wait_for(lambda: _accepts(address), f"the Ray head at {address} to take a job", LONG)
        yield c, address
    finally:
        c.shutdown()


@pytest.fixture
def node(cluster):
    """``node(resource)``: a worker node with 2 CPUs and 2 units of ``resource`` (the workers need one
    each), once Ray counts it alive; the case's nodes are removed after it, so that one case's node
    neither loads the next nor stands in for its own."""
    c, _ = cluster
    added = []

    def add(resource: str):
        n = c.add_node(num_cpus=2, resources={resource: 2})
        added.append(n)
        wait_for(lambda: n.node_id in c.global_state._live_node_ids(), f"Ray node {resource} ({n.node_id[:8]}) "
                 "to join", LONG, tick=0.5, why=lambda: f"alive: {sorted(c.global_state._live_node_ids())}")
        return n
    yield add
    for n in added:
        if n in c.worker_nodes:
            c.remove_node(n)


def _job_argv(run: Path, resource: str, *extra) -> list:
    return [sys.executable, str(JOB), "--out", str(run), "--resource", resource, *extra]


def _submit(address: str, run: Path, ident: str, argv: list) -> str:
    """``ray job submit --no-wait`` as a user types it (state tracking on, output to train.log)."""
    run.mkdir(parents=True, exist_ok=True)
    entry = (f"cd {ROOT} && exec env RAY_TRAIN_ENABLE_STATE_TRACKING=1 {' '.join(argv)} "
             f">> {run / 'train.log'} 2>&1")
    p = subprocess.run([RAY, "job", "submit", "--no-wait", f"--address={address}", f"--submission-id={ident}",
                        "--", "sh", "-c", entry], capture_output=True, text=True, timeout=BOUND)
    assert p.returncode == 0, p.stderr[-2000:]
    return f"{ident}@{address}"


def _watchdog(run: Path, *extra) -> subprocess.Popen:
    """The watchdog in its own PID namespace: no worker, driver or raylet process is visible."""
    return subprocess.Popen([*OWN_NS, sys.executable, str(WATCHDOG), str(run), "--poll", "1", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _ended(proc: subprocess.Popen, timeout: float = LONG) -> tuple:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the watchdog did not end within {timeout:g}s:\n{out[-3000:]}")
    return proc.returncode, out


def _checkin(run: Path) -> str:
    p = subprocess.run([sys.executable, str(SCRIPTS / "checkin.py"), str(run)], capture_output=True, text=True,
                       timeout=BOUND)
    return p.stdout + p.stderr


def test_a_worker_that_raises_is_a_crash_with_the_workers_error(cluster, node, tmp_path):
    _, address = cluster
    node("raises")
    run = tmp_path / "runs" / "raises"
    key = _submit(address, run, "raises-1", _job_argv(run, "raises", "--raise-at", "4"))
    rc, out = _ended(_watchdog(run, "--ray-job", key))
    line = anomaly_line(out.strip().splitlines()[-1])
    assert rc == 7 and line["kind"] == "crash", out
    # ERRORED, or ABORTED when the controller died before its ERRORED reached Ray (a starved machine)
    assert "ValueError: bad row 4 in shard 3" in line["what"] and re.search("Train run (ERRORED|ABORTED)",
                                                                             line["what"]), out
    assert "WorkerGroupError" not in out and "TrainingFailedError" not in out
    look = _checkin(run)
    assert f"ray: job {key} " in look and re.search(", Train run (ERRORED|ABORTED)", look), look
    assert "no relaunch line: fix first" in look, look   # the script's own error: the same command fails again


def test_a_killed_worker_node_is_named_with_its_address(cluster, node, tmp_path):
    c, address = cluster
    killed = node("killed")
    run = tmp_path / "runs" / "killed"
    p = subprocess.run([sys.executable, str(LAUNCHER), str(run), "--ray", f"--ray-option=--address={address}",
                        "--", *_job_argv(run, "killed", "--steps", "2000")],
                       capture_output=True, text=True, timeout=BOUND, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    rec = json.loads((run / "launch.json").read_text())
    assert rec["engine"] == "ray" and rec["job_id"].endswith(f"@{address}") and rec["pid"] is None, rec
    wait_for_lines(run / "metrics.jsonl", 4, timeout=LONG)
    dog = _watchdog(run)     # follows launch.json's job
    wait_for_polls(run, 2, watchdog=dog)
    c.remove_node(killed, allow_graceful=False)    # SIGKILL to the node's raylet and its workers
    rc, out = _ended(dog)
    line = anomaly_line(out.strip().splitlines()[-1])
    assert rc == 7 and line["kind"] == "node_fail", out
    assert f"node {killed.node_ip_address} ({killed.node_id[:8]}) of rank 0" in line["what"], out
    assert "DEAD" in line["what"] or "unreachable" in line["what"], out  # Ray's health check marks it DEAD later
    look = _checkin(run)
    assert f"--ray --ray-option=--address={address} -- {sys.executable} -u {JOB} --out {run}" in look, look
    # the relaunch resubmits launch.json's command through Ray, not the Train worker's argv
    stopped = subprocess.run([sys.executable, str(STOPPER), str(run)], capture_output=True, text=True,
                             timeout=BOUND)
    assert "ray job stop" not in stopped.stdout, stopped.stdout  # nothing left to stop


def test_a_restart_ray_performs_within_its_budget_is_a_note_then_done(cluster, node, tmp_path):
    _, address = cluster
    node("restarts")
    run = tmp_path / "runs" / "restarts"
    hold = run / "go"
    key = _submit(address, run, "restarts-1", _job_argv(run, "restarts", "--steps", "8", "--max-failures", "1",
                                                        "--raise-at", "3", "--raise-once", "--hold-file", str(hold)))
    dog = _watchdog(run, "--ray-job", key)
    look = wait_for(lambda: "restarted 1 time (max_failures 1)" in (t := _checkin(run)) and t,
                    "check-in to show Ray Train's restart", LONG, proc=dog)
    assert "ValueError: bad row 3 in shard 3" in look and "ANOMALY" not in look, look
    assert dog.poll() is None and watchdog_state(run)["state"] == WATCHING
    hold.touch()
    rc, out = _ended(dog)
    assert rc == 0 and "OK done" in out, out


def test_a_job_waiting_for_resources_is_no_stall(cluster, node, tmp_path):
    _, address = cluster
    run = tmp_path / "runs" / "waits"
    key = _submit(address, run, "waits-1", _job_argv(run, "later", "--steps", "5"))
    wait_for(lambda: "Train run SCHEDULING" in ray_engine.state(key).state, "the Train run to wait", LONG,
             tick=0.5)   # the driver's own start (imports, on a starved machine) is no part of the wait
    dog = _watchdog(run, "--ray-job", key, "--startup-grace", "30s")
    state = wait_for_polls(run, 35, watchdog=dog, timeout=LONG)   # 35 polls of 1 s: past the 30 s grace
    look = _checkin(run)
    assert state["state"] == WATCHING and dog.poll() is None, (state, look)
    assert "Train run SCHEDULING" in look and "waits" in look and "ANOMALY" not in look, look
    node("later")                        # the resources appear
    rc, out = _ended(dog)
    assert rc == 0 and "OK done" in out, out


def test_stop_ends_a_queued_ray_job_and_a_second_launch_is_refused_while_it_waits(cluster, tmp_path):
    _, address = cluster
    run = tmp_path / "runs" / "stopped"
    argv = [str(LAUNCHER), str(run), "--ray", f"--ray-option=--address={address}", "--",
            *_job_argv(run, "never", "--steps", "5")]
    p = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=BOUND, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    key = json.loads((run / "launch.json").read_text())["job_id"]
    wait_for(lambda: ray_engine.state(key).phase == "waiting", "the job to wait for its workers", LONG)
    again = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=BOUND, cwd=ROOT)
    assert again.returncode == 2 and "queued or running" in again.stderr, again.stderr
    stopped = subprocess.run([sys.executable, str(STOPPER), str(run)], capture_output=True, text=True,
                             timeout=LONG)
    assert stopped.returncode == 0 and "stopped Ray job" in stopped.stdout, stopped.stdout + stopped.stderr
    job = wait_for(lambda: (j := ray_engine.state(key)).ended and j, "the job to end", LONG)
    assert job.end.kind == "dead" and "STOPPED" in job.end.what, job


def test_a_job_followed_without_the_launcher_gets_no_worker_argv_relaunch(tmp_path):
    from supervise.act.recovery import relaunch_plan
    from supervise.observe.observation import Verdict
    worker = {"argv": ["/ray/_private/workers/default_worker.py", "--node-ip-address=10.0.0.2"], "cwd": "/tmp",
              "python": sys.executable, "world_size": 2}
    verdict = Verdict("anomaly", "ANOMALY node_fail: ...", None, "ANOMALY node_fail", change="same")
    line, note = relaunch_plan(worker, verdict, tmp_path, engine="ray")
    assert line is None and "no launch.json records the command" in note, note
    launched = {"argv": [sys.executable, "train.py", "--out", str(tmp_path)], "cwd": str(tmp_path)}
    line, _ = relaunch_plan(worker, verdict, tmp_path, engine="ray", options=["--address=http://h:8265"],
                            launched=launched)
    assert line.endswith(f"--ray --ray-option=--address=http://h:8265 -- {sys.executable} -u train.py --out {tmp_path}")
    assert "default_worker" not in line and "torch.distributed.run" not in line


SNIPPET = ("Training failed due to worker errors:\n[Rank 0 Error Snippet]:\nA worker health check failed.\n"
           "Worker info: Worker(\n  metadata=ActorMetadata(\n    node_id='25c53497e7d8b068',\n    node_ip='10.0.0.2',\n"
           "  ),\n)\nThe actor died unexpectedly before finishing this task.\n"
           "The actor died because its node has died. Node Id: 25c53497e7d8b068\n")
WORKERS = [{"world_rank": 0, "node_ip": "10.0.0.2", "node_id": "25c53497e7d8b068", "status": "DEAD"}]


def _run(status, attempts, detail="", max_failures=0):
    return {"train_runs": [{"id": "r1", "name": "t1", "job_id": "02000000", "status": status, "status_detail": detail,
                            "start_time_ns": 1, "attempts": attempts,
                            "run_settings": {"run_config": {"failure_config": {"max_failures": max_failures}}}}]}


@pytest.mark.parametrize("job, runs, phase, kind, words", [
    ({"status": "PENDING", "message": "Job has not started yet."}, None, "waiting", None, "PENDING"),
    ({"status": "RUNNING"}, _run("SCHEDULING", [{"status": "PENDING", "workers": []}],
                                 "Scheduling 2 workers, each requiring: {'CPU': 1}."), "waiting", None, "SCHEDULING"),
    ({"status": "RUNNING"}, _run("RUNNING", [{"status": "ERRORED", "status_detail": "[Rank 1 Error Snippet]:\n"
                                             "Traceback (most recent call last):\nValueError: bad row", "workers": WORKERS},
                                            {"status": "RUNNING", "workers": WORKERS}], max_failures=3),
     "running", None, "restarted 1 time (max_failures 3), within its failure budget: attempt 1 ERRORED on 10.0.0.2 "
                      "(25c53497) (rank 1): ValueError: bad row"),
    ({"status": "FAILED", "driver_exit_code": 1}, _run("ERRORED", [{"status": "ERRORED", "workers": WORKERS}], SNIPPET),
     "ended", "node_fail", "node 10.0.0.2 (25c53497) of rank 0 DEAD (received SIGTERM)"),
    ({"status": "RUNNING"}, _run("ERRORED", [{"status": "ERRORED", "workers": WORKERS}],
                                 "[Rank 0 Error Snippet]:\nTraceback (most recent call last):\nRuntimeError: [../third_party/"
                                 "gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:5001"),
     "ended", "node_fail", "node 10.0.0.2 (25c53497) of rank 0 DEAD"),   # the worker's error is the node's fallout
    ({"status": "FAILED", "driver_exit_code": 1, "message": "ray.exceptions.OutOfMemoryError: Task was killed due to "
      "the node running low on memory."}, None, "ended", "oom", "OutOfMemoryError"),
    ({"status": "SUCCEEDED"}, None, "ended", "dead", "SUCCEEDED without final_val_metrics.json"),
    ({"status": "STOPPED"}, None, "ended", "dead", "STOPPED"),
])
def test_what_each_dashboard_state_means(job, runs, phase, kind, words):
    nodes = {"data": {"result": {"result": [{"node_id": "25c53497e7d8b068", "node_ip": "10.0.0.2", "state": "DEAD",
                                              "state_message": "Expected termination: received SIGTERM"}]}}}
    answers = {"/api/jobs/j": {"job_id": "02000000", **job}, "/api/train/v2/runs/v1": runs or {"train_runs": []},
               "/api/v0/nodes?detail=1": nodes, "/api/jobs/j/logs": {"logs": ""}}

    def fetch(url):
        path = url.split("8265", 1)[1]
        return (200, json.dumps(answers[path])) if path in answers else (404, "not found")
    got = ray_engine.state("j@http://head:8265", runner=fetch)
    assert got.phase == phase and got.error is None, got
    assert (got.end.kind if got.end else None) == kind, got
    assert words in (got.end.what if got.end else f"{got.state} {got.note}"), got


DRIVER = ("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    trainer.fit()\n"
          "ray.train.TrainingFailedError: Training failed due to worker errors:\n[Rank 0 Error Snippet]:\n"
          "Traceback (most recent call last):\n  File \"train.py\", line 4, in loop\n"
          "ValueError: bad row 4 in shard 3\n")


@pytest.mark.parametrize("job, phase, words", [
    ({"status": "RUNNING"}, "running", "ABORTED (its controller died before it said why): the verdict waits"),
    ({"status": "FAILED", "driver_exit_code": 1}, "ended", "(rank 0): 'ValueError: bad row 4 in shard 3'"),
])
def test_an_aborted_train_run_waits_for_the_drivers_word(job, phase, words):
    """The dashboard calls a run ABORTED when its controller is dead and its last word was RUNNING:
    the driver's output, once the job ends, names the worker's error."""
    runs = _run("ABORTED", [{"status": "ABORTED", "workers": WORKERS}],
                "Terminated due to system errors or killed by the user.")
    answers = {"/api/jobs/j": {"job_id": "02000000", **job}, "/api/train/v2/runs/v1": runs,
               "/api/v0/nodes?detail=1": {"data": {"result": {"result": []}}}, "/api/jobs/j/logs": {"logs": DRIVER}}
    got = ray_engine.state("j@http://head:8265", runner=lambda url: (200, json.dumps(answers[url.split("8265", 1)[1]])))
    assert got.phase == phase and got.error is None, got
    assert words in (got.end.what if got.end else got.note), got
    assert got.end is None or (got.end.kind == "crash" and "TrainingFailedError" not in got.end.what), got


@pytest.mark.parametrize("answers, words", [
    ({}, "did not answer"),
    ({"/api/jobs/j": (404, "not found")}, "knows no job j"),
    ({"/api/jobs/j": (500, "boom")}, "answered 500 for job j"),
    ({"/api/jobs/j": (200, "<html>")}, "answered 200 for job j"),
])
def test_a_dashboard_that_cannot_say_is_one_line_not_a_verdict(answers, words):
    def fetch(url):
        path = url.split("8265", 1)[1]
        return answers.get(path, (None, "[Errno 111] Connection refused"))
    job = ray_engine.state("j@http://head:8265", runner=fetch)
    assert job.phase == "unknown" and job.end is None and words in job.error, job


@pytest.mark.parametrize("text, ok", [
    ("raysubmit_abc123", True), ("t-1@http://10.0.0.1:8265", True), ("02000000", True),
    ("", False), ("a b", False), ("x@ftp://h", False), ("x@http://h/p@q", False),
])
def test_the_watch_flag_takes_a_ray_job_id(text, ok):
    if ok:
        assert ray_engine.job_id(text) == text
    else:
        with pytest.raises(ValueError, match="is not a Ray job"):
            ray_engine.job_id(text)


def test_a_bad_ray_job_id_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, str(WATCHDOG), str(tmp_path), "--ray-job", "a b"], capture_output=True,
                       text=True, timeout=BOUND)
    assert p.returncode == 2 and "is not a Ray job" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_no_ray_command_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))   # no ray beside it either
    with pytest.raises(UsageError, match="ray is not on PATH"):
        ray_engine.check(["true"], tmp_path, {"PATH": str(tmp_path)})

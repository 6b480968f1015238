"""From a Ray worker node's death to the watchdog's verdict, measured on a real two-node Ray
(``ray.cluster_utils.Cluster``: a head and a worker node, each its own raylet) running a Ray
Train job (TorchTrainer, gloo, two workers on the worker node, one step record every 0.3 s).

    python benchmarks/ray_node_death.py [--reps 2] [--polls 1,5] [--baseline]

Per trial: the job is submitted with ``ray job submit --no-wait``, the watchdog follows it with
``--ray-job`` (in its own PID namespace when this runs as root, so it sees no worker process),
the node is killed once records flow (``kill``: SIGKILL to its raylet; ``term``: SIGTERM, the
node's own shutdown), and three times are taken from that moment: when Ray's Train state says
ERRORED (polled every 0.2 s beside the watchdog), when the watchdog exits 7, and its kind.
``--baseline`` adds the same kill with the watchdog judging by the records alone (no
``--ray-job``): the stall rule, the floor without the engine. Prints one table.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "ray_train_job.py"
WATCHDOG = ROOT / "scripts" / "watchdog.py"
RAY = str(Path(sys.executable).with_name("ray"))
OWN_NS = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"] \
    if os.geteuid() == 0 and shutil.which("unshare") else []


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, what: str, timeout: float = 300.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise SystemExit(f"benchmark: {what} did not happen within {timeout:g}s")


def _errored_at(address: str, ray_job: list, out: list, stop: threading.Event) -> None:
    """Poll Ray's Train state every 0.2 s; record when the job's run is ERRORED or ABORTED."""
    while not stop.is_set():
        try:
            runs = _get(f"{address}/api/train/v2/runs/v1")["train_runs"]
            if any(r["job_id"] == ray_job[0] and r["status"] in ("ERRORED", "ABORTED") for r in runs if ray_job):
                out.append(time.monotonic())
                return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.2)


def trial(cluster_cls, how: str, poll: float, engine: bool, work: Path) -> dict:
    port = _free_port()
    c = cluster_cls(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True,
                                                          "dashboard_host": "127.0.0.1", "dashboard_port": port,
                                                      "dashboard_agent_listen_port": _free_port()})
    address = f"http://127.0.0.1:{port}"
    dog = None
    try:
        node = c.add_node(num_cpus=2, resources={"bench": 2})
        c.wait_for_nodes()
        _wait(lambda: _get(f"{address}/api/version"), "the dashboard")
        _wait(lambda: subprocess.run([RAY, "job", "submit", f"--address={address}", "--", "true"],
                                     capture_output=True, timeout=120).returncode == 0, "the head's job agent")
        run = Path(tempfile.mkdtemp(dir=work))
        ident = f"bench-{int(time.time() * 1000)}"
        entry = (f"cd {ROOT} && exec env RAY_TRAIN_ENABLE_STATE_TRACKING=1 {sys.executable} {JOB} --out {run} "
                 f"--resource bench --steps 100000 >> {run}/train.log 2>&1")
        subprocess.run([RAY, "job", "submit", "--no-wait", f"--address={address}", f"--submission-id={ident}",
                        "--", "sh", "-c", entry], check=True, capture_output=True, timeout=120)
        metrics = run / "metrics.jsonl"
        _wait(lambda: metrics.exists() and metrics.read_text().count("\n") >= 5, "five records")
        follow = ["--ray-job", f"{ident}@{address}"] if engine else []
        dog = subprocess.Popen([*OWN_NS, sys.executable, str(WATCHDOG), str(run), "--poll", str(poll), *follow],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _wait(lambda: (run / "watchdog.json").exists() and json.loads((run / "watchdog.json").read_text())
              .get("polls", 0) >= 2, "two watchdog polls")
        ray_job = [_get(f"{address}/api/jobs/{ident}")["job_id"]]
        seen, stop = [], threading.Event()
        watcher = threading.Thread(target=_errored_at, args=(address, ray_job, seen, stop), daemon=True)
        watcher.start()
        t0 = time.monotonic()
        c.remove_node(node, allow_graceful=(how == "term"))
        out, _ = dog.communicate(timeout=900)
        t_verdict = time.monotonic() - t0
        stop.set()
        watcher.join(timeout=5)
        last = (out.strip().splitlines() or [""])[-1]
        kind = last.split(":")[0].replace("ANOMALY ", "") if last.startswith("ANOMALY") else last[:40]
        return {"how": how, "poll": poll, "engine": engine, "ray_s": (seen[0] - t0) if seen else None,
                "verdict_s": t_verdict, "rc": dog.returncode, "kind": kind, "line": last[:400]}
    finally:
        if dog is not None and dog.poll() is None:
            dog.kill()
        c.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--polls", default="1,5", help="the watchdog's --poll values, comma-separated")
    p.add_argument("--baseline", action="store_true", help="also the watchdog without --ray-job (records only)")
    a = p.parse_args()
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        print("benchmark: ray is not installed: pip install -e '.[ray]'", file=sys.stderr)
        return 2
    polls = [float(x) for x in a.polls.split(",") if x.strip()]
    plan = [(how, poll, True) for how in ("kill", "term") for poll in polls]
    if a.baseline:
        plan.append(("kill", max(polls), False))
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for how, poll, engine in plan:
            got = [trial(Cluster, how, poll, engine, Path(work)) for _ in range(a.reps)]
            for g in got:
                print(json.dumps(g), flush=True)
            rows.append((how, poll, engine, got))
    print(f"\nnode death -> verdict, {a.reps} trial(s) each; watchdog {'in its own PID namespace' if OWN_NS else 'beside the job'}")
    print("| node killed by | --poll | follows | Ray's Train state ERRORED after (median) | verdict after (median / max) | kinds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for how, poll, engine, got in rows:
        ray_s = [g["ray_s"] for g in got if g["ray_s"] is not None]
        v = [g["verdict_s"] for g in got]
        kinds = ", ".join(sorted({g["kind"] for g in got}))
        print(f"| {'SIGKILL to the raylet' if how == 'kill' else 'SIGTERM (node shutdown)'} | {poll:g}s | "
              f"{'--ray-job (the dashboard)' if engine else 'records only'} | "
              f"{f'{statistics.median(ray_s):.1f}s' if ray_s else '-'} | {statistics.median(v):.1f}s / {max(v):.1f}s | {kinds} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Kubernetes: the engine over recorded ``kubectl ... -o json`` of a Kubeflow PyTorchJob, a TrainJob
and a JobSet in each state (tests/data/k8s/, README.md there says where each came from), through a
``kubectl`` stand-in first on PATH (no cluster exists here): the state mapping; the real
watchdog.py on a run folder for each recorded state (a verdict, or still watching); a kubectl
that fails (refused, Unauthorized, NotFound, slow) as one line, never a verdict; check-in's
``k8s:`` line and relaunch line; launch.py --k8s records the job, stop.py deletes it."""
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, assert_checkin_agrees, kind_of, read_json, step_of, wait_for, watchdog_state
from supervise.observe.engines import ENDED, RUNNING, UNKNOWN, WAITING, engine

DATA = Path(__file__).parent / "data" / "k8s"
REFUSED = "The connection to the server localhost:8080 was refused - did you specify the right host or port?"

# kubectl as the tests' cluster: its answers are the fixture named in $KUBECTL_STANDIN's file (a
# recorded state, or a failure mode); each call is appended to $KUBECTL_STANDIN.calls.
STANDIN = r'''#!{python}
import json, os, sys
DATA = {data!r}
REFUSED = {refused!r}
state = os.environ["KUBECTL_STANDIN"]
args = sys.argv[1:]
with open(state + ".calls", "a") as f:
    f.write(json.dumps(args) + "\n")
mode = open(state).read().strip()
if mode == "refused":
    sys.stderr.write(REFUSED + "\n"); sys.exit(1)
if mode == "unauthorized":
    sys.stderr.write("error: You must be logged in to the server (Unauthorized)\n"); sys.exit(1)
fx = json.load(open(os.path.join(DATA, mode + ".json")))
ns = args[args.index("-n") + 1] if "-n" in args else "default"
verb = args[0]
if verb == "get" and args[1] == "pods":
    print(json.dumps(fx["pods"])); sys.exit(0)
if verb == "get":
    resource, name = args[1], args[2]
    obj = fx["objects"].get(resource.split(".")[0][:-1])
    if obj is None or obj["metadata"]["name"] != name or obj["metadata"]["namespace"] != ns:
        sys.stderr.write(f'Error from server (NotFound): {{resource}} "{{name}}" not found\n'); sys.exit(1)
    print(json.dumps(obj)); sys.exit(0)
if verb == "logs":
    text = fx["logs"].get(args[1])
    if text is None:
        sys.stderr.write(f'Error from server (BadRequest): container in pod "{{args[1]}}" is waiting to start\n'); sys.exit(1)
    sys.stdout.write(text); sys.exit(0)
if verb == "create":
    path = args[args.index("-f") + 1]
    text = sys.stdin.read() if path == "-" else open(path).read()
    obj = json.loads(text)   # the tests' manifests are JSON, which is YAML too
    if "--dry-run=client" not in args and os.path.exists(state + ".exists"):
        sys.stderr.write(f'Error from server (AlreadyExists): error when creating "{{path}}": '
                         f'{{obj["kind"].lower()}}s.kubeflow.org "{{obj["metadata"]["name"]}}" already exists\n')
        sys.exit(1)
    if "--dry-run=client" not in args:
        obj["metadata"].setdefault("namespace", "default")
        obj["metadata"]["uid"] = "00000000-0000-4000-8000-000000000001"
        with open(state + ".created", "w") as f:
            json.dump(obj, f)
    print(json.dumps(obj)); sys.exit(0)
if verb == "delete":
    if os.path.exists(state + ".exists"):
        os.remove(state + ".exists")
    print(f'{{args[1].split(".")[0][:-1]}}.{{args[1].split(".", 1)[1]}} "{{args[2]}}" deleted'); sys.exit(0)
sys.stderr.write(f"error: unknown command {{verb!r}} for kubectl\n"); sys.exit(1)
'''


@pytest.fixture
def kubectl(tmp_path, monkeypatch):
    """A kubectl stand-in first on PATH (here and for the scripts run with ``env``); ``set(NAME)``
    chooses what it answers: a fixture's name, 'refused' or 'unauthorized'."""
    bin_dir = tmp_path / "kube-bin"
    bin_dir.mkdir()
    exe = bin_dir / "kubectl"
    exe.write_text(STANDIN.format(python=sys.executable, data=str(DATA), refused=REFUSED))
    exe.chmod(0o755)
    state = tmp_path / "kubectl.state"
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv("KUBECTL_STANDIN", str(state))
    monkeypatch.setenv("SUPERVISE_STATE_DIR", str(tmp_path / "registry"))

    class K:
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PATH": path,
               "KUBECTL_STANDIN": str(state), "SUPERVISE_STATE_DIR": str(tmp_path / "registry")}

        @staticmethod
        def set(name):
            state.write_text(name)

        @staticmethod
        def calls():
            p = Path(f"{state}.calls")
            return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []

        created = Path(f"{state}.created")
        exists = Path(f"{state}.exists")   # while there, kubectl create says AlreadyExists
    return K


K8S = engine("k8s")
PJ, TJ, JS = "ml/pytorchjob/bert-ft", "ml/trainjob/llama-sft", "ml/jobset/llama-sft"

# fixture, job id, phase, state, the end's kind (None: no verdict), words the end or the note says
STATES = [
    ("pytorchjob_created", PJ, WAITING, "Created", None, ["Unschedulable: 0/6 nodes are available"]),
    ("pytorchjob_running", PJ, RUNNING, "Running", None, []),
    ("pytorchjob_restarting", PJ, WAITING, "Restarting", None,
     ["restart 1 of backoffLimit 3", "pod bert-ft-worker-0 on gpu-node-2 container pytorch Error exit code 1"]),
    ("pytorchjob_suspended", PJ, WAITING, "Suspended", None, []),
    ("pytorchjob_restart_limit", PJ, ENDED, "Restarting", "crash",
     ["state = Restarting (PyTorchJobRestarting: ", "after 3 restarts, its backoffLimit 3",
      "ValueError: row 18231 has no 'label' column"]),
    ("pytorchjob_backoff_limit", PJ, ENDED, "Failed", "crash",
     ["reached the specified backoff limit) after 3 restarts (limit 3)", "on gpu-node-2",
      "ValueError: row 18231 has no 'label' column"]),
    ("pytorchjob_backoff_reason", PJ, ENDED, "Failed", "crash",
     ["(BackoffLimitExceeded: Job has reached the specified backoff limit)", "ValueError: row 18231"]),
    ("pytorchjob_oom", PJ, ENDED, "Failed", "oom",
     ["pod bert-ft-master-0 on gpu-node-1 container pytorch OOMKilled exit code 137"]),
    ("pytorchjob_error", PJ, ENDED, "Failed", "crash",
     ["1 Worker replica(s) failed.)", "rank 9", "ValueError: row 18231 has no 'label' column"]),
    ("pytorchjob_node_lost", PJ, ENDED, "Failed", "node_fail",
     ["pod bert-ft-worker-0 on gpu-node-2 DeletionByTaintManager", "node.kubernetes.io/unreachable"]),
    ("pytorchjob_preempted", PJ, ENDED, "Failed", "preempted",
     ["pod bert-ft-worker-0 on gpu-node-2 PreemptionByScheduler: DefaultPreemption: preempting"]),
    ("pytorchjob_deadline", PJ, ENDED, "Failed", "timeout", ["active longer than specified deadline"]),
    ("pytorchjob_succeeded", PJ, ENDED, "Succeeded", "dead", ["state = Succeeded", "without final_val_metrics.json"]),
    ("trainjob_running", TJ, RUNNING, "Running", None, []),
    ("trainjob_restarting", TJ, WAITING, "Restarting", None, ["JobSet restarted it 1 time (maxRestarts 3)"]),
    ("trainjob_suspended", TJ, WAITING, "Suspended", None, []),
    ("trainjob_complete", TJ, ENDED, "Complete", "dead", ["TrainJob ml/llama-sft state = Complete (AllJobsCompleted"]),
    ("trainjob_failed", TJ, ENDED, "Failed", "crash",
     ["(ReachedMaxRestarts: jobset failed due to reaching max number of restarts) after 3 JobSet restarts (limit 3)",
      "on gpu-node-3", "ValueError: row 18231"]),
    ("jobset_restarting", JS, RUNNING, "Running", None, ["JobSet ml/llama-sft restarted 2 times (maxRestarts 3)"]),
    ("jobset_failed_oom", JS, ENDED, "Failed", "oom", ["(FailedJobs: ", "OOMKilled exit code 137"]),
]
IDS = [s[0] for s in STATES]


def test_every_recorded_state_has_a_row_and_a_source():
    files = sorted(p.stem for p in DATA.glob("*.json"))
    assert files == sorted(IDS)
    readme = (DATA / "README.md").read_text()
    for name in files:
        doc = json.loads((DATA / f"{name}.json").read_text())
        assert doc["source"] and f"{name}.json" in readme, name


@pytest.mark.parametrize("fixture, job, phase, state, kind, words", STATES, ids=IDS)
def test_state_mapping_on_recorded_kubectl_json(kubectl, fixture, job, phase, state, kind, words):
    kubectl.set(fixture)
    j = K8S.state(job)
    assert (j.engine, j.job_id, j.phase, j.state, j.error) == ("k8s", job, phase, state, None), j
    if kind is None:
        assert j.end is None
        said = j.note + " " + j.reason
    else:
        assert j.end is not None and j.end.kind == kind, j
        said = j.end.what
        assert "\n" not in said and j.end.fix
    for w in words:
        assert w in said, (w, said)
    if fixture == "pytorchjob_restarting":   # a restart within budget: a note, no verdict
        assert j.note.startswith("PyTorchJob ml/bert-ft is restarting (restart 1 of backoffLimit 3)"), j.note
    if kind == "crash":   # the failed pod's log was read in state(), never in the judge
        assert any(c[0] == "logs" for c in kubectl.calls()), kubectl.calls()


@pytest.mark.parametrize("text, want", [
    ("ml/pytorchjob/bert-ft", "ml/pytorchjob/bert-ft"),
    ("ml/PyTorchJobs.kubeflow.org/bert-ft", "ml/pytorchjob/bert-ft"),
    ("trainjob/llama-sft", "trainjob/llama-sft"),
    ("team-a/jobsets/x.y", "team-a/jobset/x.y"),
])
def test_job_ids(text, want):
    assert K8S.job_id(text) == want


@pytest.mark.parametrize("text", ["bert-ft", "ml/deployment/web", "a/b/c/d", "ML/pytorchjob/x", "ml/pytorchjob/Bad_Name"])
def test_bad_job_ids_say_the_shape(text):
    with pytest.raises(ValueError, match=r"give \[NAMESPACE/\]KIND/NAME, e.g. ml/pytorchjob/bert-ft"):
        K8S.job_id(text)


@pytest.mark.parametrize("mode, words", [
    ("refused", REFUSED),
    ("unauthorized", "error: You must be logged in to the server (Unauthorized)"),
    ("pytorchjob_running:other", 'Error from server (NotFound): pytorchjobs.kubeflow.org "other" not found'),
])
def test_a_failed_kubectl_is_one_line_never_a_verdict(kubectl, mode, words):
    fixture, _, name = mode.partition(":")
    kubectl.set(fixture)
    j = K8S.state(f"ml/pytorchjob/{name or 'bert-ft'}")
    assert j.phase == UNKNOWN and j.end is None and j.error and "\n" not in j.error, j
    assert words in j.error and j.line() == j.error, j.error
    if name:
        assert "kubectl get pytorchjobs -n ml" in j.error
        assert not K8S.held({"job_id": f"ml/pytorchjob/{name}"})   # a deleted job holds nothing
    else:
        assert K8S.held({"job_id": PJ})   # an unreachable cluster may still run it


def test_kubectl_missing_or_slow_is_one_line():
    def missing(argv, **kw):
        raise FileNotFoundError(argv[0])

    def slow(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw.get("timeout"))
    j = K8S.state(PJ, runner=missing)
    assert j.phase == UNKNOWN and "kubectl not found" in j.error, j
    j = K8S.state(PJ, runner=slow)
    assert j.phase == UNKNOWN and "did not answer within 10s" in j.error, j
    assert K8S.state("nonsense").error.startswith("'nonsense' is not a Kubernetes job")


# --- the real watchdog.py on a run folder, for each recorded state ---------------------------

def _run_dir(tmp_path: Path, steps: int = 40) -> Path:
    """A run folder on the volume the pods share: a start record from a pod (another host) and
    fresh step records."""
    run = tmp_path / "runs" / "bert-ft"
    run.mkdir(parents=True)
    now = time.time()
    recs = [{"event": "start", "t": 0, "run_id": "r1", "attempt": 1, "time": now - steps, "pid": 4242,
             "host": "bert-ft-master-0", "argv": ["train.py", "--out", str(run)], "cwd": "/workspace",
             "python": "/usr/bin/python3"}]
    recs += [{"step": n, "t": n, "loss": 0.5, "lr": 1e-4, "grad_norm": 1.0, "sps": 10.0} for n in range(10, steps + 1, 10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (run / "train.log").write_text("")
    return run


def _watchdog(run: Path, job: str, env: dict, *flags):
    return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(run), "--k8s-job", job,
                             "--poll", "0.2", *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=run)


def _polls(run: Path, n: int, wd) -> dict:
    try:
        return wait_for(lambda: (s := watchdog_state(run)) and s.get("polls", 0) >= n and s,
                        f"{n} polls", proc=wd)
    except AssertionError:
        if wd.poll() is not None:
            out, err = wd.communicate()
            raise AssertionError(f"the watchdog ended: {wd.returncode} {out} {err}")
        raise


def _checkin(run: Path, env: dict) -> str:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "checkin.py"), str(run)], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.parametrize("fixture, job, phase, state, kind, words", STATES, ids=IDS)
def test_the_watchdog_on_each_recorded_state(kubectl, tmp_path, fixture, job, phase, state, kind, words):
    """An end is the verdict at once (exit 7, ``ANOMALY <kind>: ... at step 40. <fix>.``); a wait or
    a run is watched on (five polls, no verdict), and check-in shows the ``k8s:`` line."""
    kubectl.set(fixture)
    run = _run_dir(tmp_path)
    wd = _watchdog(run, job, kubectl.env)
    try:
        if kind is not None:
            out, err = wd.communicate(timeout=60)
            assert wd.returncode == 7, out + err
            line = out.strip()
            assert kind_of(line) == kind and step_of(line) == 40, line
            assert line.startswith(f"ANOMALY {kind}: k8s "), line
            for w in words:
                assert w in line, (w, line)
            assert read_json(run / "watchdog.json")["job_state"] == state
            assert_checkin_agrees(run, line, env=kubectl.env)
        else:
            s = _polls(run, 5, wd)
            assert wd.poll() is None and (s["state"], s["job_state"], s["job_id"]) == ("watching", state, job), s
            if phase == WAITING:
                assert any(w.startswith(f"K8s job {job} is {state}") for w in s["warnings"]), s["warnings"]
            for w in words:
                assert any(w in x for x in s["warnings"]), (w, s["warnings"])
    finally:
        if wd.poll() is None:
            wd.kill()
            wd.communicate()
    if kind is None:
        said = _checkin(run, kubectl.env)
        assert f"k8s: job {job} {state}" in said, said


def test_a_succeeded_job_with_its_sentinel_is_done(kubectl, tmp_path):
    kubectl.set("pytorchjob_succeeded")
    run = _run_dir(tmp_path)
    (run / "final_val_metrics.json").write_text(json.dumps({"eval_auroc": 0.91, "step": 40}))
    wd = _watchdog(run, PJ, kubectl.env)
    out, err = wd.communicate(timeout=60)
    assert wd.returncode == 0 and out.startswith("OK done"), out + err


def test_a_lost_connection_while_watching_is_no_verdict(kubectl, tmp_path):
    """The cluster unreachable at the start: exit 2, kubectl's one line; lost later: watched on,
    check-in says the line; back and Failed: the verdict."""
    run = _run_dir(tmp_path)
    kubectl.set("refused")
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(run), "--k8s-job", PJ],
                       capture_output=True, text=True, timeout=60, env=kubectl.env)
    assert p.returncode == 2 and REFUSED in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr
    kubectl.set("pytorchjob_running")
    wd = _watchdog(run, PJ, kubectl.env)
    try:
        n = _polls(run, 2, wd)["polls"]
        kubectl.set("refused")
        s = _polls(run, n + 5, wd)
        assert wd.poll() is None and s["state"] == "watching", s
        said = _checkin(run, kubectl.env)
        assert f"k8s: kubectl get PyTorchJob ml/bert-ft failed: {REFUSED}" in said, said
        kubectl.set("pytorchjob_error")
        out, err = wd.communicate(timeout=60)
    finally:
        if wd.poll() is None:
            wd.kill()
    assert wd.returncode == 7 and kind_of(out) == "crash", out + err


# --- launch.py --k8s, check-in's relaunch line, stop.py --------------------------------------

def _manifest(tmp_path: Path) -> Path:
    obj = json.loads((DATA / "pytorchjob_running.json").read_text())["objects"]["pytorchjob"]
    obj = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": {"name": "bert-ft", "namespace": "ml"},
           "spec": obj["spec"]}
    path = tmp_path / "bert-ft.yaml"    # JSON is YAML: read through kubectl create --dry-run=client
    path.write_text(json.dumps(obj, indent=1))
    return path


def _script(name, env, *args, cwd=None):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / f"{name}.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=cwd)


def test_launch_records_the_job_checkin_relaunches_it_and_stop_deletes_it(kubectl, tmp_path):
    manifest = _manifest(tmp_path)
    run = tmp_path / "runs" / "bert-ft"
    kubectl.set("pytorchjob_created")
    p = _script("launch", kubectl.env, run, "--k8s", f"--manifest={manifest.name}", "--env", "SEED=3", "--",
                "torchrun", "--nproc_per_node=8", "train.py", "--out", run, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("submitted K8s job ml/pytorchjob/bert-ft, output >> "), \
        p.stdout + p.stderr
    rec = json.loads((run / "launch.json").read_text())
    assert (rec["engine"], rec["job_id"], rec["options"], rec["pid"]) == ("k8s", PJ, [str(manifest)], None)
    made = json.loads(kubectl.created.read_text())   # what kubectl create got on stdin
    for role in ("Master", "Worker"):
        c = made["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        assert c["command"] == ["torchrun", "--nproc_per_node=8", "train.py", "--out", str(run)] and "args" not in c
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["PYTHONUNBUFFERED"] == "1" and env["SEED"] == "3", env
    assert ["create", "-f", "-", "-o", "json"] in kubectl.calls()

    # its worker's node is lost: the watchdog follows launch.json's job; check-in names it and
    # offers a relaunch through kubectl (the launcher deletes the old job, creates the manifest anew)
    kubectl.set("pytorchjob_node_lost")
    _run_dir_records(run)
    wd = subprocess.run([sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(run), "--poll", "0.2"],
                        capture_output=True, text=True, timeout=60, env=kubectl.env)
    assert wd.returncode == 7 and kind_of(wd.stdout) == "node_fail", wd.stdout + wd.stderr
    assert kind_of(wd.stdout) == "node_fail" and step_of(wd.stdout) == 20, wd.stdout
    assert_checkin_agrees(run, wd.stdout.strip(), env=kubectl.env)
    from supervise.tools.checkin import gather   # all its facts (the printed ones are cut to 1500 characters)
    facts = gather(run)
    assert facts["job"] == f"k8s: job {PJ} Failed on gpu-node-1,gpu-node-2", facts["job"]
    said = _checkin(run, kubectl.env)
    assert "a resubmission through kubectl: --replace deletes the old job, then kubectl create -f" in said, said
    nxt = next(ln for ln in said.splitlines() if "launch.py" in ln and "--replace" in ln)
    words = shlex.split(nxt[nxt.index("&&") + 2:])
    assert words[words.index("--k8s") + 1] == f"--manifest={manifest}", nxt
    assert nxt.startswith(f"next: cd {shlex.quote(str(tmp_path))} && "), nxt   # launch.json's folder, not the pod's
    assert words[words.index("--") + 1:] == ["torchrun", "--nproc_per_node=8", "train.py", "--out", str(run)], nxt
    kubectl.exists.write_text("")   # the Failed job is still there: create says AlreadyExists, the launcher deletes it
    r = subprocess.run(["bash", "-c", nxt[len("next: "):]], capture_output=True, text=True, timeout=120, env=kubectl.env)
    assert r.returncode == 0 and r.stdout.startswith(f"submitted K8s job {PJ}"), r.stdout + r.stderr
    assert ["delete", "pytorchjobs.kubeflow.org", "bert-ft", "-n", "ml", "--wait=true", "--timeout=120s"] in kubectl.calls()
    c = json.loads(kubectl.created.read_text())["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["torchrun", "--nproc_per_node=8", "train.py", "--out", str(run)], c

    # a held job: a plain launch refuses, stop.py deletes it
    kubectl.set("pytorchjob_running")
    again = _script("launch", kubectl.env, run, "--k8s", "--", manifest, cwd=tmp_path)
    assert again.returncode == 2 and f"already has K8s job {PJ} queued or running" in again.stderr, again.stderr
    s = _script("stop", kubectl.env, run)
    assert s.returncode == 0 and s.stdout.strip() == "deleted PyTorchJob ml/bert-ft (kubectl delete)", s.stdout + s.stderr
    assert ["delete", "pytorchjobs.kubeflow.org", "bert-ft", "-n", "ml", "--wait=false"] in kubectl.calls()


def _run_dir_records(run: Path, **more):
    """The pods' trainer wrote its start record and steps into the shared run folder (its cwd is
    the container's)."""
    now = time.time()
    recs = [{"event": "start", "t": 0, "run_id": "r1", "attempt": 1, "time": now, "pid": 4242,
             "host": "bert-ft-master-0", "argv": ["train.py", "--out", str(run)], "cwd": "/workspace",
             "python": "/usr/bin/python3", "launcher": ["torchrun", "--nproc_per_node=8"], **more}]
    recs += [{"step": n, "t": n, "loss": 0.5, "lr": 1e-4, "grad_norm": 1.0, "sps": 10.0} for n in (10, 20)]
    with open(run / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)


def test_a_manifest_alone_is_submitted_as_it_is_and_again_with_resume_words(kubectl, tmp_path):
    """``launch.py RUN --k8s -- job.yaml``: kubectl create -f of the file as it is. After a lost
    node, ``launch.py RUN --replace --k8s -- job.yaml --resume auto`` submits it again with those
    words added to its container's command; the ended job of that name is deleted first (kubectl
    create said AlreadyExists)."""
    manifest = _manifest(tmp_path)
    run = tmp_path / "runs" / "a"
    kubectl.set("pytorchjob_created")
    p = _script("launch", kubectl.env, run, "--k8s", "--", manifest.name, cwd=tmp_path)
    assert p.returncode == 0 and "K8s job ml/pytorchjob/bert-ft" in p.stdout, p.stdout + p.stderr
    assert ["create", "-f", str(manifest), "-o", "json"] in kubectl.calls()
    assert json.loads(kubectl.created.read_text())["spec"] == json.loads(manifest.read_text())["spec"]
    assert json.loads((run / "launch.json").read_text())["options"] == []

    kubectl.set("pytorchjob_node_lost")
    _run_dir_records(run)
    wd = subprocess.run([sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(run), "--poll", "0.2"],
                        capture_output=True, text=True, timeout=60, env=kubectl.env)
    assert wd.returncode == 7 and kind_of(wd.stdout) == "node_fail", wd.stdout + wd.stderr
    kubectl.exists.write_text("")   # the Failed job is still there
    kubectl.created.unlink()
    # the relaunch of a manifest given alone, by hand (references/cluster.md): its words after it
    r = _script("launch", kubectl.env, run, "--replace", "--k8s", "--", manifest.name, "--resume", "auto", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("submitted K8s job ml/pytorchjob/bert-ft"), r.stdout + r.stderr
    made = json.loads(kubectl.created.read_text())
    c = made["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert c["command"][-2:] == ["--resume", "auto"] and c["command"][0] == "torchrun", c["command"]
    assert {e["name"] for e in c["env"]} >= {"PYTHONUNBUFFERED"}
    deletes = [c for c in kubectl.calls() if c[0] == "delete"]
    assert deletes == [["delete", "pytorchjobs.kubeflow.org", "bert-ft", "-n", "ml", "--wait=true", "--timeout=120s"]]


def test_a_job_of_that_name_still_running_is_not_replaced_by_create(kubectl, tmp_path):
    manifest = _manifest(tmp_path)
    kubectl.set("pytorchjob_running")
    kubectl.exists.write_text("")
    p = _script("launch", kubectl.env, tmp_path / "runs" / "b", "--k8s", "--", manifest, cwd=tmp_path)
    assert p.returncode == 2 and "PyTorchJob ml/bert-ft already exists (Running): stop it first" in p.stderr, p.stderr
    assert not [c for c in kubectl.calls() if c[0] == "delete"]


@pytest.mark.parametrize("args, words", [
    (["--k8s", "--", "python", "train.py"], "--k8s needs the manifest: --manifest=job.yaml -- CMD"),
    (["--k8s", "--manifest=nope.yaml", "--", "python", "train.py"], "nope.yaml: no such manifest"),
    (["--manifest=x.yaml", "--", "python", "train.py"], "--manifest needs --k8s"),
])
def test_launch_refuses_in_one_line(kubectl, tmp_path, args, words):
    kubectl.set("pytorchjob_created")
    p = _script("launch", kubectl.env, tmp_path / "runs" / "a", *args, cwd=tmp_path)
    assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


# --- a restart within budget on the watchdog's own clock --------------------------------------

class Clock:
    """The watchdog's clock, moved by the test: no real waiting."""

    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


def test_a_restart_within_budget_is_a_note_then_the_grace_counts_again(kubectl, tmp_path):
    """Restarting within backoffLimit: 500 s without a record is no stall and no verdict, the note
    names the restart and the failed pod's node; once Running again the start-up grace comes
    first, then the stall limit counts (as for a Slurm requeue)."""
    from supervise.thresholds import Thresholds
    from supervise.tools.watch import Watchdog
    run, clock = tmp_path / "run", Clock()
    run.mkdir()
    w = Watchdog(run, Thresholds(poll=0.01, startup_grace=60, max_stall=120), job=("k8s", PJ), clock=clock)

    def write(*recs):
        with open(run / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
        os.utime(run / "metrics.jsonl", (clock.now, clock.now))
    kubectl.set("pytorchjob_running")
    for n in (1, 2):
        clock.now += 10
        write(*([{"event": "start", "t": 0, "run_id": "r", "attempt": 1, "time": clock.now, "pid": 4242,
                  "host": "bert-ft-master-0"}] if n == 1 else []),
              {"step": 10 * n, "t": n, "loss": 0.5, "lr": 1e-4, "grad_norm": 1.0, "sps": 10.0})
        assert w.poll().state == "watching"
    kubectl.set("pytorchjob_restarting")
    for _ in range(5):
        clock.now += 100
        v = w.poll()
        assert (v.state, v.line) == ("watching", ""), v
        assert any(n.startswith("k8s: PyTorchJob ml/bert-ft is restarting (restart 1 of backoffLimit 3)")
                   and "on gpu-node-2" in n for n in v.notes), v.notes
    kubectl.set("pytorchjob_running")
    clock.now += 1
    assert w.poll().state == "watching"   # running again from here, its records 501 s old
    clock.now += 55
    assert w.poll().state == "watching", w.verdict   # within the 60 s start-up grace
    clock.now += 10
    v = w.poll()
    assert v.state == "anomaly" and kind_of(v.line) == "stall", v


def test_a_trainjob_manifest_gets_the_command_in_spec_trainer_and_a_jobset_must_come_alone(kubectl, tmp_path):
    from supervise.cli import UsageError
    kubectl.set("trainjob_running")
    doc = json.loads((DATA / "trainjob_running.json").read_text())["objects"]
    tj = {k: doc["trainjob"][k] for k in ("apiVersion", "kind", "spec")}
    tj["metadata"] = {"name": "llama-sft", "namespace": "ml"}
    tj["spec"]["trainer"]["args"] = ["--old"]
    (tmp_path / "tj.json").write_text(json.dumps(tj))
    rec = K8S.submit(tmp_path / "run", ["python", "-u", "sft.py"], cwd=tmp_path, env=dict(os.environ),
                     variables={"PYTHONUNBUFFERED": "1"}, log=tmp_path / "run" / "train.log", options=["tj.json"])
    assert rec["job_id"] == TJ and rec["options"] == [str(tmp_path / "tj.json")]
    trainer = json.loads(kubectl.created.read_text())["spec"]["trainer"]
    assert trainer["command"] == ["python", "-u", "sft.py"] and "args" not in trainer
    assert {"name": "PYTHONUNBUFFERED", "value": "1"} in trainer["env"]
    js = {k: doc["jobset"][k] for k in ("apiVersion", "kind", "spec")}
    js["metadata"] = {"name": "x"}
    (tmp_path / "js.json").write_text(json.dumps(js))
    with pytest.raises(UsageError, match="is a JobSet: give it as the one word after --"):
        K8S.submit(tmp_path / "run", ["python", "sft.py"], cwd=tmp_path, env=dict(os.environ), variables={},
                   log=tmp_path / "train.log", options=["js.json"])


def test_an_object_of_an_unexpected_shape_is_one_line():
    def odd(argv, **kw):
        out = '{"status": {"conditions": [{"type": "Failed", "status": "True", "reason": ["x"]}]}}' \
            if argv[1] != "pods" else '{"items": [{"spec": "nope", "status": {"containerStatuses": "nope"}}]}'
        return subprocess.CompletedProcess(argv, 0, out, "")
    j = K8S.state(PJ, runner=odd)
    assert j.phase in (UNKNOWN, ENDED) and (j.error is None or "\n" not in j.error), j

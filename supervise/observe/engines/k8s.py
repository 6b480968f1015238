"""The Kubernetes engine: follow a Kubeflow PyTorchJob (kubeflow.org/v1), a TrainJob
(trainer.kubeflow.org/v1alpha1) and its JobSet, or a JobSet (jobset.x-k8s.io/v1alpha2) by
namespace and name; submit one (kubectl create); delete it. Standard library only.

    job = state("ml/pytorchjob/bert-ft")       # engines.Job; never raises
    job.error                                   # kubectl missing, the API server unreachable, NotFound: one line

Submitting: ``launch.py RUN --k8s --manifest=job.yaml -- CMD`` (CMD becomes the training
container's command) or ``launch.py RUN --k8s -- job.yaml [WORDS]`` (the manifest as it is, WORDS
added to its container's args); a relaunch takes launch.json's command (``WORKER_ARGV``).

A job id is ``[NAMESPACE/]KIND/NAME`` (``ml/pytorchjob/bert-ft``, ``trainjob/llama-sft``: no
namespace is kubectl's current one). Sources, each with a short timeout:

1. ``kubectl get pytorchjobs.kubeflow.org NAME -n NS -o json`` (``trainjobs.trainer.kubeflow.org``,
   ``jobsets.jobset.x-k8s.io``): the conditions (PyTorchJob: Created, Running, Restarting,
   Succeeded, Failed, Suspended; TrainJob: Complete, Failed, Suspended, Created in older
   releases; JobSet: Completed, Failed, Suspended, StartupPolicyCompleted), replicaStatuses /
   jobsStatus / replicatedJobsStatus, runPolicy.backoffLimit;
2. for a TrainJob, its JobSet (same name): ``status.restarts`` and ``spec.failurePolicy.maxRestarts``;
3. ``kubectl get pods -n NS -l SELECTOR -o json`` (``training.kubeflow.org/job-name=NAME``,
   ``jobset.sigs.k8s.io/jobset-name=NAME``): the nodes, the containers' restart counts, why a pod
   waits (Unschedulable, ImagePullBackOff), how a container ended (OOMKilled, exit code), a
   pod's disruption (a lost node, preemption);
4. for a failed pod, ``kubectl logs POD -c CONTAINER --tail=200`` (``--previous`` for a restarted
   container): the failing rank's error (``logs.root_cause``).

What each state means for the run (``Job.phase`` and ``Job.end``): no condition yet, Created,
Suspended, pods Pending: waiting (no stall); Running: running; Restarting within backoffLimit
(a JobSet's restarts within maxRestarts): waiting with a note (restart N of M and the failed
pod's node and exit); Restarting at backoffLimit: crash; Failed: oom (a container OOMKilled),
node_fail (a pod lost with its node), preempted, timeout (activeDeadlineSeconds), else crash
with the failed pod's error; Succeeded / Complete / Completed without the sentinel: dead.
"""
from __future__ import annotations

import json
import os
import re
from typing import Optional

from supervise.cli import UsageError
from supervise.observe.engines import ENDED, RUNNING, UNKNOWN, WAITING, Cancelled, End, Job
from supervise.observe.logs import clean, last_error, oom_line, root_cause

NAME = "k8s"
LAUNCH_FLAG = "--k8s"
LAUNCH_HELP = ("submit to Kubernetes with kubectl create: the command after -- becomes the training container's "
               "command in the --manifest's PyTorchJob or TrainJob (or give the manifest itself after --: submitted "
               "as it is, words after it added to its container's args); its [NAMESPACE/]KIND/NAME is recorded in "
               "launch.json")
OPTION_FLAG = "--manifest"
OPTION_HELP = "with --k8s: the PyTorchJob or TrainJob manifest (YAML or JSON) whose container runs the command"
WATCH_FLAG = "--k8s-job"
WATCH_HELP = ("follow a Kubernetes job, [NAMESPACE/]KIND/NAME (ml/pytorchjob/bert-ft; KIND pytorchjob, trainjob or "
              "jobset) with kubectl get -o json: Pending/Created/Suspended is no stall, a restart within "
              "backoffLimit a note, Failed a verdict (references/cluster.md)")
WORKER_ARGV = True   # the start record is a pod's (its cwd is the container's): a relaunch resubmits launch.json's command
FRESH = ("a Kubernetes job: give the manifest a new metadata.name and the command a new run folder, then launch "
         "it again")
TIMEOUT_S = 10.0
SENTINEL = "final_val_metrics.json"

# kind -> (the resource kubectl gets, the Kind, the pods' label selector)
KINDS = {
    "pytorchjob": ("pytorchjobs.kubeflow.org", "PyTorchJob", "training.kubeflow.org/job-name={}"),
    "trainjob": ("trainjobs.trainer.kubeflow.org", "TrainJob", "jobset.sigs.k8s.io/jobset-name={}"),
    "jobset": ("jobsets.jobset.x-k8s.io", "JobSet", "jobset.sigs.k8s.io/jobset-name={}"),
}
DNS = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
OOM_FIX = ("The container exceeded its memory limit: raise resources.limits.memory in the manifest or halve the "
           "per-device batch size, then relaunch with --resume from the last checkpoint")
NODE_REASONS = ("DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet", "NodeLost", "NodeShutdown",
                "Terminated", "UnexpectedAdmissionError")
PREEMPT_REASONS = ("PreemptionByScheduler", "PreemptionByKubeScheduler", "Preempted", "Preemption")
WAIT_REASONS = ("ContainerCreating", "PodInitializing", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError",
                "CreateContainerError", "InvalidImageName", "CrashLoopBackOff")


# ----------------------------------------------------------------------------- job ids
def job_id(text: str) -> str:
    """``[NAMESPACE/]KIND/NAME`` in its one spelling (kind singular, lower case), or ValueError."""
    return "/".join(p for p in _parts(text) if p)


def _parts(text: str) -> tuple:
    """(namespace or '', kind, name) of a job id, or ValueError saying what is wrong."""
    words = str(text).strip().split("/")
    bad = ValueError(f"{str(text).strip()!r} is not a Kubernetes job: give [NAMESPACE/]KIND/NAME, e.g. "
                     "ml/pytorchjob/bert-ft (KIND: pytorchjob, trainjob or jobset)")
    if len(words) not in (2, 3):
        raise bad
    ns, kind, name = ([""] + words)[-3:]
    kind = kind.lower().split(".")[0]
    kind = kind[:-1] if kind.endswith("s") else kind
    if kind not in KINDS or not NAME_RE.fullmatch(name) or (ns and not DNS.fullmatch(ns)):
        raise bad
    return ns, kind, name


def _ns(ns: str) -> list:
    return ["-n", ns] if ns else []


def _label(kind: str, ns: str, name: str) -> str:
    """``PyTorchJob ml/bert-ft``."""
    return f"{KINDS[kind][1]} {ns + '/' if ns else ''}{name}"


# ----------------------------------------------------------------------------- kubectl
def _run(runner, argv: list, timeout: float = TIMEOUT_S, **kw) -> tuple:
    """(returncode, stdout, stderr); returncode None with the reason in stderr when kubectl is
    missing or too slow. ``runner``: subprocess.run's signature (None: subprocess.run)."""
    import subprocess
    try:
        p = (runner or subprocess.run)(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except FileNotFoundError:
        return None, "", "kubectl not found: the Kubernetes client is not on PATH (install kubectl or run this where it works)"
    except subprocess.TimeoutExpired:
        return None, "", f"kubectl did not answer within {timeout:g}s: the API server is slow or unreachable"
    except OSError as e:
        return None, "", f"kubectl could not run: {e}"
    return p.returncode, p.stdout or "", p.stderr or ""


def _said(rc, out: str, err: str) -> str:
    """kubectl's own one line of why it failed (its last line on stderr)."""
    lines = [ln.strip() for ln in (err or out or "").splitlines() if ln.strip()]
    return (lines[-1] if lines else f"exit {rc}")[:240]


def _get(resource: str, name: str, ns: str, runner) -> tuple:
    """(the object, None, False), or (None, one line, whether kubectl said NotFound)."""
    rc, out, err = _run(runner, ["kubectl", "get", resource, name, *_ns(ns), "-o", "json"])
    if rc is None:
        return None, err, False
    if rc != 0:
        said = _said(rc, out, err)
        return None, said, "(NotFound)" in said or " not found" in said
    try:
        obj = json.loads(out)
    except ValueError:
        return None, f"kubectl get {resource} {name} printed no JSON ({out.strip()[:80]!r})", False
    return (obj, None, False) if isinstance(obj, dict) else (None, "kubectl printed no object", False)


def _pods(kind: str, ns: str, name: str, runner) -> list:
    """The job's pods (best effort: [] when kubectl cannot say)."""
    rc, out, _ = _run(runner, ["kubectl", "get", "pods", *_ns(ns), "-l", KINDS[kind][2].format(name), "-o", "json"])
    if rc != 0:
        return []
    try:
        items = json.loads(out).get("items")
    except (ValueError, AttributeError):
        return []
    return [p for p in items or [] if isinstance(p, dict)]


def _logs(pod: dict, ns: str, runner) -> list:
    """The tail of a failed container's log (its previous run's when it restarted since)."""
    name = _d(pod.get("metadata")).get("name")
    if not isinstance(name, str) or not name:
        return []
    argv = ["kubectl", "logs", name, *_ns(ns), "--tail=200"]
    if pod.get("_container"):
        argv += ["-c", pod["_container"]]
    if pod.get("_previous"):
        argv.append("--previous")
    rc, out, _ = _run(runner, argv)
    return clean(out.splitlines())[-200:] if rc == 0 else []


# ----------------------------------------------------------------------------- reading the objects
def _d(x) -> dict:
    return x if isinstance(x, dict) else {}


def _int(x) -> Optional[int]:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _conditions(obj: dict) -> dict:
    """type -> condition of the ones whose status is True."""
    conds = _d(obj.get("status")).get("conditions") or []
    return {c.get("type"): c for c in conds if isinstance(c, dict) and str(c.get("status")) == "True"}


def _one_line(text) -> str:
    return " ".join(str(text or "").split())[:240]


class Pods:
    """What a job's pods say: their nodes, restarts, why one waits, how one failed."""

    def __init__(self, pods: list):
        self.pods = pods
        self.nodes = ",".join(sorted({n for p in pods if isinstance(n := _d(p.get("spec")).get("nodeName"), str) and n}))
        self.restarts = 0
        self.waiting = ""          # why a pod waits: 'Unschedulable: 0/6 nodes are available: ...'
        self.failed = []           # (finished at, pod (with _container, _previous), what, exit code, oom)
        self.disrupted = []        # (pod, node, reason, message)
        for p in pods:
            self._read(p)
        self.failed.sort(key=lambda f: f[0])

    def _read(self, p: dict):
        meta, spec, st = _d(p.get("metadata")), _d(p.get("spec")), _d(p.get("status"))
        pod, node = meta.get("name", "?"), spec.get("nodeName") or ""
        for c in st.get("conditions") or []:
            c = _d(c)
            if c.get("type") == "DisruptionTarget" and str(c.get("status")) == "True":
                self.disrupted.append((pod, node, c.get("reason", ""), _one_line(c.get("message"))))
            if c.get("type") == "PodScheduled" and str(c.get("status")) == "False" and not self.waiting:
                self.waiting = _one_line(f"{c.get('reason') or 'Unschedulable'}: {c.get('message', '')}")
        if st.get("phase") == "Failed" and st.get("reason") in ("NodeLost", "Evicted", "Shutdown", "Terminated"):
            self.disrupted.append((pod, node, st["reason"], _one_line(st.get("message"))))
        for cs in st.get("containerStatuses") or []:
            cs = _d(cs)
            self.restarts += _int(cs.get("restartCount")) or 0
            state, last = _d(cs.get("state")), _d(cs.get("lastState"))
            wait = _d(state.get("waiting"))
            if wait.get("reason") in WAIT_REASONS and wait.get("reason") != "CrashLoopBackOff" and not self.waiting:
                self.waiting = _one_line(f"{wait['reason']}: {wait.get('message', '')}".rstrip(": "))
            for term, previous in ((_d(state.get("terminated")), False), (_d(last.get("terminated")), True)):
                code = _int(term.get("exitCode"))
                if term and (code or term.get("reason") == "OOMKilled"):
                    what = f"pod {pod}" + (f" on {node}" if node else "") + \
                        f" container {cs.get('name', '?')} {term.get('reason') or 'Error'} exit code {code}"
                    self.failed.append((term.get("finishedAt") or "", {**p, "_container": cs.get("name"),
                                        "_previous": previous}, what, code, term.get("reason") == "OOMKilled"))
                    break

    @property
    def oom(self):
        return next((f for f in self.failed if f[4]), None)

    @property
    def first(self):
        return self.failed[0] if self.failed else None


def _cause(pods: Pods, ns: str, runner) -> tuple:
    """(what the first failed container said, in words, its pod's failure tuple, oom from its log)."""
    first = pods.first
    if first is None:
        return "", None, False
    lines = _logs(first[1], ns, runner)
    cause = root_cause(lines)
    err = cause.summary() if cause else (oom_line(lines) or last_error(lines))
    oom = bool((cause and cause.message and oom_line([cause.message])) or (not cause and oom_line(lines)))
    return (f"{first[2]}: {err[:240]!r}" if err else first[2]), first, oom


# ----------------------------------------------------------------------------- the engine
def state(job: str, runner=None) -> Job:
    """What the cluster says of ``job`` as engine-neutral facts (see the module's docstring); a
    failed job's cause (its pods, the failed container's log) is read here, never in the judge.
    Never raises: an object of an unexpected shape is an error line too."""
    try:
        return _state(job, runner)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as e:
        return Job(NAME, str(job), UNKNOWN, error=f"kubectl's answer for {job} has an unexpected shape "
                                                   f"({type(e).__name__}: {str(e)[:120]}); check kubectl get -o json")


def _state(job: str, runner) -> Job:
    try:
        ns, kind, name = _parts(job)
    except ValueError as e:
        return Job(NAME, str(job), UNKNOWN, error=str(e))
    jid = "/".join(p for p in (ns, kind, name) if p)
    obj, why, missing = _get(KINDS[kind][0], name, ns, runner)
    if obj is None:
        label = _label(kind, ns, name)
        hint = (f"check the name with kubectl get {kind}s{' -n ' + ns if ns else ''}" if missing else
                "check kubectl's context and credentials (kubectl cluster-info)")
        return Job(NAME, jid, UNKNOWN, error=f"kubectl get {label} failed: {why}; {hint}")
    ns = ns or _d(obj.get("metadata")).get("namespace", "")
    pods = Pods(_pods(kind, ns, name, runner))
    if kind == "pytorchjob":
        return _pytorchjob(jid, kind, ns, name, obj, pods, runner)
    jobset = obj if kind == "jobset" else (_get(KINDS["jobset"][0], name, ns, runner)[0] or {})
    return _jobset(jid, kind, ns, name, obj, jobset, pods, runner)


def _pytorchjob(jid, kind, ns, name, obj, pods: Pods, runner) -> Job:
    conds = _conditions(obj)
    label = _label(kind, ns, name)
    limit = _int(_d(_d(obj.get("spec")).get("runPolicy")).get("backoffLimit"))
    for word in ("Failed", "Succeeded"):
        if word in conds:
            c = conds[word]
            return _ended(jid, kind, ns, name, word, c, pods, runner, restarts=(pods.restarts, limit))
    if "Suspended" in conds:
        c = conds["Suspended"]
        return Job(NAME, jid, WAITING, state="Suspended", reason=_one_line(c.get("reason")), nodes=pods.nodes)
    if "Restarting" in conds:
        c = conds["Restarting"]
        if limit is not None and pods.restarts >= limit:   # the operator fails it at its next look
            return _ended(jid, kind, ns, name, "Restarting", c, pods, runner, restarts=(pods.restarts, limit))
        first = pods.first
        note = (f"{label} is restarting (restart {pods.restarts} of backoffLimit "
                f"{limit if limit is not None else 'unset'}): {_one_line(c.get('message'))}"
                + (f" Last failure: {first[2]}" if first else ""))
        return Job(NAME, jid, WAITING, state="Restarting", reason=_one_line(c.get("reason")), nodes=pods.nodes,
                   exit_code=first[3] if first else None, note=note)
    if "Running" in conds:
        return Job(NAME, jid, RUNNING, state="Running", nodes=pods.nodes)
    word = "Created" if "Created" in conds else "Pending"
    return Job(NAME, jid, WAITING, state=word, reason=pods.waiting, nodes=pods.nodes)


def _jobset(jid, kind, ns, name, obj, jobset: dict, pods: Pods, runner) -> Job:
    """A TrainJob (with its JobSet) or a JobSet."""
    conds = _conditions(obj)
    label = _label(kind, ns, name)
    st = _d(jobset.get("status"))
    restarts = _int(st.get("restarts")) or 0
    limit = _int(_d(_d(jobset.get("spec")).get("failurePolicy")).get("maxRestarts"))
    for word in ("Failed", "Complete", "Completed"):
        if word in conds:
            return _ended(jid, kind, ns, name, word, conds[word], pods, runner, restarts=(restarts, limit),
                          counts="JobSet restarts")
    if "Suspended" in conds:
        return Job(NAME, jid, WAITING, state="Suspended", reason=_one_line(conds["Suspended"].get("reason")),
                   nodes=pods.nodes)
    jobs = _d(obj.get("status")).get("jobsStatus" if kind == "trainjob" else "replicatedJobsStatus") or []
    jobs = [_d(j) for j in jobs]
    trainers = [j for j in jobs if not str(j.get("name", "")).endswith("initializer")] or jobs
    ready = sum(_int(j.get("ready")) or 0 for j in trainers)
    note = ""
    if restarts:
        who = f"{label} restarted" if kind == "jobset" else f"{label}'s JobSet restarted it"
        note = (f"{who} {restarts} time{'s' if restarts != 1 else ''} "
                f"(maxRestarts {limit if limit is not None else 0})"
                + (f"; last failure: {pods.first[2]}" if pods.first else ""))
    if ready:
        return Job(NAME, jid, RUNNING, state="Running", nodes=pods.nodes, note=note)
    word = "Restarting" if restarts else "Created" if "Created" in conds or jobs else "Pending"
    return Job(NAME, jid, WAITING, state=word, reason=pods.waiting, nodes=pods.nodes, note=note)


def _ended(jid, kind, ns, name, word, cond: dict, pods: Pods, runner, restarts=(0, None),
           counts="restarts") -> Job:
    """An ended job: its End from the condition, its pods and the failed container's log."""
    label = _label(kind, ns, name)
    reason, message = _one_line(cond.get("reason")), _one_line(cond.get("message"))
    said = f" ({reason}: {message})" if reason and message else f" ({reason or message})" if reason or message else ""
    on = f" on {pods.nodes}" if pods.nodes else ""
    relaunch = "relaunch it (check-in's relaunch line) with --resume from the last checkpoint"
    n, limit = restarts
    first = pods.first
    code = first[3] if first else None
    if word in ("Succeeded", "Complete", "Completed"):
        end = End("dead", f"k8s {label} state = {word}{said} without {SENTINEL}",
                  f"The job's pods ended without the trainer writing its sentinel: read kubectl logs -l "
                  f"{KINDS[kind][2].format(name)}{' -n ' + ns if ns else ''}; a container command that exits early "
                  "or a run folder the pods do not share with the watchdog are the usual causes")
        return Job(NAME, jid, ENDED, state=word, reason=reason, nodes=pods.nodes, exit_code=code, end=end)
    text = f"{reason} {message}".lower()
    what = f"k8s {label} state = {word}{said}"
    for pod, node, why, msg in pods.disrupted:
        if why in PREEMPT_REASONS or "preempt" in msg.lower():
            end = End("preempted", f"{what}: pod {pod}{' on ' + node if node else ''} {why}: {msg}",
                      f"A higher-priority workload took the nodes: {relaunch}")
            break
        if why in NODE_REASONS or "unreachable" in msg.lower() or "not-ready" in msg.lower():
            end = End("node_fail", f"{what}: pod {pod}{' on ' + node if node else ''} {why}: {msg}",
                      f"A node failed, not the code: check it (kubectl describe node {node or 'NODE'}; kubectl cordon "
                      f"{node or 'NODE'} keeps new pods off it), then {relaunch}")
            break
        if why == "Evicted":
            kind_ = "oom" if "memory" in msg.lower() else "node_fail"
            end = End(kind_, f"{what}: pod {pod}{' on ' + node if node else ''} Evicted: {msg}",
                      OOM_FIX if kind_ == "oom" else f"The node ran out of a resource: {relaunch}")
            break
    else:
        end = None
    if end is None and pods.oom is not None:
        end = End("oom", f"{what}: {pods.oom[2]}", OOM_FIX)
    if end is None and ("deadline" in text or "activedeadlineseconds" in text):
        end = End("timeout", f"{what}", "The job outlived its activeDeadlineSeconds: raise it in the manifest or "
                  f"{relaunch}")
    if end is None:
        cause, first, oom = _cause(pods, ns, runner)
        code = first[3] if first else code
        limit_hit = "backoff" in text or "maxrestarts" in text or "max number of restarts" in text or word == "Restarting"
        if word == "Restarting":
            what = f"k8s {label} state = Restarting{said} after {n} restarts, its backoffLimit {limit}"
        elif limit_hit and (n or limit is not None):
            what += f" after {n} {counts} (limit {limit if limit is not None else 'unset'})"
        what += f": {cause}" if cause else f" (no failed container found{on})"
        if oom:
            fix = OOM_FIX
        elif cause and "'" in cause:
            fix = f"Fix that error (retries repeat it), then {relaunch}"
        else:
            pod = (first[1].get("metadata") or {}).get("name") if first else None
            fix = (f"Read the failed pod's log (kubectl logs {pod or '-l ' + KINDS[kind][2].format(name)}"
                   f"{' -n ' + ns if ns else ''}{' --previous' if first and first[1].get('_previous') else ''}), "
                   f"fix the error, then {relaunch}")
        end = End("oom" if oom else "crash", what, fix)
    return Job(NAME, jid, ENDED, state=word, reason=reason, nodes=pods.nodes, exit_code=code, end=end)


# ----------------------------------------------------------------------------- submitting
def _manifest(path: str, runner) -> dict:
    """The manifest as a JSON object: a .json file read here, YAML through kubectl's client-side
    dry run (kubectl create --dry-run=client -o json); UsageError when neither gives one object."""
    if path.endswith(".json"):
        try:
            with open(path) as f:
                obj = json.load(f)
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot read the manifest {path} ({getattr(e, 'strerror', None) or e}); nothing was submitted")
    else:
        rc, out, err = _run(runner, ["kubectl", "create", "--dry-run=client", "-f", path, "-o", "json"], timeout=60)
        if rc != 0:
            raise UsageError(f"kubectl could not read the manifest {path} ({_said(rc, out, err) if rc else err}); "
                             "nothing was submitted")
        try:
            obj = json.loads(out)
        except ValueError:
            raise UsageError(f"kubectl printed no JSON for the manifest {path}; nothing was submitted")
    if not isinstance(obj, dict) or str(obj.get("kind", "")).lower() not in KINDS:
        raise UsageError(f"the manifest {path} is not one PyTorchJob, TrainJob or JobSet (kind "
                         f"{obj.get('kind') if isinstance(obj, dict) else '?'!r}); nothing was submitted")
    return obj


def _with_command(obj: dict, argv: list, variables: dict, path: str, *, extra: bool = False) -> dict:
    """``obj`` with ``argv`` as the training container's command and ``variables`` in its env:
    the ``pytorch`` container (else the first) of every PyTorchJob replica, a TrainJob's
    spec.trainer. ``extra``: ``argv`` are words added to the container's own args (its command
    when it has no args) instead. UsageError for a JobSet (its containers are the user's to set)."""
    obj = json.loads(json.dumps(obj))
    kind = str(obj.get("kind", "")).lower()

    def env_of(current) -> list:
        kept = [e for e in current or [] if isinstance(e, dict) and e.get("name") not in variables]
        return kept + [{"name": k, "value": str(v)} for k, v in variables.items()]

    def put(c: dict):
        if not extra:
            c["command"] = list(argv)
            c.pop("args", None)
        elif c.get("args") or not c.get("command"):
            c["args"] = list(c.get("args") or []) + list(argv)
        else:
            c["command"] = list(c["command"]) + list(argv)
        c["env"] = env_of(c.get("env"))

    if kind == "pytorchjob":
        specs = _d(_d(obj.get("spec")).get("pytorchReplicaSpecs"))
        done = 0
        for spec in specs.values():
            containers = _d(_d(_d(spec).get("template")).get("spec")).get("containers") or []
            c = next((c for c in containers if _d(c).get("name") == "pytorch"), containers[0] if containers else None)
            if isinstance(c, dict):
                put(c)
                done += 1
        if not done:
            raise UsageError(f"the manifest {path} has no container in spec.pytorchReplicaSpecs; nothing was submitted")
    elif kind == "trainjob":
        if not isinstance(obj.get("spec"), dict):
            obj["spec"] = {}
        if not isinstance(obj["spec"].get("trainer"), dict):
            obj["spec"]["trainer"] = {}
        put(obj["spec"]["trainer"])
    else:
        raise UsageError(f"the manifest {path} is a {obj.get('kind')}: give it as the one word after -- (submitted as it "
                         "is), since its containers are yours to set; nothing was submitted")
    return obj


def check(argv: list, cwd, env: dict) -> dict:
    """kubectl on PATH; the command is either a manifest file (the one word after --) or any
    command, with the manifest given by --manifest (read at submission)."""
    import shutil
    if shutil.which("kubectl", path=env.get("PATH", os.defpath)) is None:
        raise UsageError("kubectl is not on PATH: --k8s submits through kubectl; run it where kubectl reaches the cluster")
    return {}


def _alone(argv: list, cwd) -> Optional[str]:
    """The manifest when the command's first word is a manifest file (.yaml, .yml, .json), else None."""
    if argv and argv[0].endswith((".yaml", ".yml", ".json")):
        path = argv[0] if os.path.isabs(argv[0]) else os.path.join(str(cwd), argv[0])
        if not os.path.isfile(path):
            raise UsageError(f"{argv[0]}: no such manifest (from {cwd}); nothing was submitted")
        return path
    return None


def submit(run, argv: list, *, cwd, env: dict, variables: dict, log, options=(), runner=None) -> dict:
    """``kubectl create -f MANIFEST -o json``: the manifest as it is when it is the whole command
    (words after it, a relaunch's resume recipe, go to its training container's args); else the
    ``--manifest`` with ``argv`` as its training container's command; ``variables`` in its env
    whenever it is rewritten (then sent on stdin). The launch record's fields: the job id
    (``NAMESPACE/KIND/NAME``, from kubectl's answer) and the ``--manifest``'s absolute path as its
    one option (a relaunch gives it again, with the relaunch's command)."""
    import subprocess
    options = list(options)
    alone = _alone(argv, cwd)
    if alone and options:
        raise UsageError("give the manifest once: either as the command's first word or with --manifest")
    if not alone and len(options) != 1:
        raise UsageError("--k8s needs the manifest: --manifest=job.yaml -- CMD (the command runs in its training "
                         "container), or the manifest alone after --")
    path = alone or (options[0] if os.path.isabs(options[0]) else os.path.join(str(cwd), options[0]))
    if not os.path.isfile(path):
        raise UsageError(f"{options[0]}: no such manifest (from {cwd}); nothing was submitted")
    runner = runner or subprocess.run
    obj = _manifest(path, runner)
    if alone and len(argv) == 1:
        cmd, stdin = ["kubectl", "create", "-f", path, "-o", "json"], None
    else:
        words = argv[1:] if alone else argv
        obj = _with_command(obj, words, variables, path, extra=bool(alone))
        cmd, stdin = ["kubectl", "create", "-f", "-", "-o", "json"], json.dumps(obj)
    meta = _d(obj.get("metadata"))
    named = job_id(f"{meta.get('namespace') + '/' if meta.get('namespace') else ''}{obj['kind']}/{meta['name']}") \
        if NAME_RE.fullmatch(str(meta.get("name", ""))) else None

    def create():
        return _run(runner, cmd, timeout=60, env=env, cwd=str(cwd), **({"input": stdin} if stdin else {}))
    rc, out, err = create()
    if rc and "(AlreadyExists)" in _said(rc, out, err) and named:
        _replace_ended(named, runner)   # a relaunch: the ended job of that name goes first
        rc, out, err = create()
    if rc != 0:
        raise UsageError(f"kubectl create refused the job ({_said(rc, out, err) if rc else err}); nothing was submitted")
    try:
        made = json.loads(out)
        meta = made["metadata"]
        jid = job_id(f"{meta.get('namespace') or 'default'}/{made['kind']}/{meta['name']}")
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"kubectl create printed no job it made ({e}); check kubectl get pytorchjobs,trainjobs,jobsets")
    return {"pid": None, "host": None, "job_id": jid, "options": [] if alone else [os.path.abspath(path)]}


def _replace_ended(job: str, runner) -> None:
    """Delete the ended job ``job`` (waiting until it is gone) so that its manifest can be created
    again; UsageError when it is still queued or running, or will not go."""
    ns, kind, name = _parts(job)
    j = state(job, runner=runner)
    if not j.ended:
        raise UsageError(f"{_label(kind, ns, name)} already exists ({j.error or j.state}): stop it first (stop.py RUN, "
                         f"or launch with --replace), or give the manifest another metadata.name; nothing was submitted")
    rc, out, err = _run(runner, ["kubectl", "delete", KINDS[kind][0], name, *_ns(ns), "--wait=true", "--timeout=120s"],
                        timeout=150)
    if rc != 0 and "(NotFound)" not in _said(rc, out, err):
        raise UsageError(f"the ended {_label(kind, ns, name)} would not go (kubectl delete: "
                         f"{_said(rc, out, err) if rc else err}); nothing was submitted")


def held(rec: dict) -> bool:
    """The recorded job is still there and not ended (one kubectl cannot reach counts as there;
    one the API server says is NotFound does not)."""
    if not rec.get("job_id"):
        return False
    job = state(rec["job_id"])
    if job.error:
        return "NotFound" not in job.error and " not found" not in job.error
    return not job.ended


def cancel(rec: dict, grace_s: float = 0.0, clock=None, runner=None) -> Cancelled:
    """``kubectl delete KIND NAME -n NS --wait=false`` (its pods get their terminationGracePeriod);
    UsageError when kubectl cannot run or refuses."""
    ns, kind, name = _parts(rec["job_id"])
    label = _label(kind, ns, name)
    rc, out, err = _run(runner, ["kubectl", "delete", KINDS[kind][0], name, *_ns(ns), "--wait=false"], timeout=30)
    if rc != 0:
        said = _said(rc, out, err) if rc else err
        if "(NotFound)" in said:
            return Cancelled(["kubectl delete"], True, None, f"{label} is already deleted ({said})")
        raise UsageError(f"kubectl delete {label} failed: {said}")
    return Cancelled(["kubectl delete"], True, None, f"deleted {label} (kubectl delete)")


def job_of(start) -> Optional[str]:
    """None: a start record does not name its Kubernetes job (no variable says it cheaply and
    reliably; the launch record does)."""
    return None


def resubmit(start: dict, recorded: Optional[list] = None) -> tuple:
    """(launch.py's words that submit the attempt again through kubectl, a note). The relaunch
    line's command is launch.json's (``WORKER_ARGV``): with the launch's ``--manifest`` it becomes
    the training container's command again; a manifest given as the command is submitted again
    with the resume recipe's words added to its container's args. ``--replace`` in the line
    deletes the old job first (kubectl delete)."""
    manifest = (recorded or [None])[0]
    if manifest:
        return [LAUNCH_FLAG, f"{OPTION_FLAG}={manifest}"], (
            "a resubmission through kubectl: --replace deletes the old job, then kubectl create -f of the manifest "
            "with this command in its training container")
    return [LAUNCH_FLAG], ("a resubmission through kubectl: --replace deletes the old job, then kubectl create -f of "
                           "the manifest with the words after it added to its training container's args")

"""Where a hung run sits: every process's Python stack, taken when the verdict is a hang, one file
per process per capture under ``RUN_DIR/stacks/``, and one phrase that names the frames.

    found = capture(run_dir, targets(obs))   # bounded (BUDGET s): RUN_DIR/stacks/<stamp>-rank1-pid4242.txt, ...
    found.where()   # 'rank 0 waits in all_reduce (train.py:41); rank 1 is in load_shard (train.py:33), never reached it'

Two ways, chosen per process, automatically:
- in-process: the integrations' ``Telemetry`` registered ``faulthandler`` (all threads) on
  SUPERVISE_STACK_SIGNAL (default SIGRTMIN+6, references/hangs.md) into
  ``RUN_DIR/stacks/.live/pid-<PID>.txt``; the capture checks that the process really handles that
  signal (``/proc/PID/status`` SigCgt: an unhandled real-time signal would end it), sends it, and
  cuts the new bytes into the capture's file. No ptrace; it works while the interpreter is
  deadlocked; the process pauses only while faulthandler writes.
- from outside: ``py-spy dump`` (``--subprocesses`` for a process's workers, ``--native`` when
  asked) for a process without the integration. When py-spy is missing or may not attach
  (ptrace_scope, a container without SYS_PTRACE, another user's process), ``why_refused`` says
  exactly that and how to allow it, and the phrase carries it.

Standard library only: the watchdog runs this.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from supervise.observe.probes import born_after, parent_pid, process
from supervise.vocabulary import GONE, PACKAGE, ranks_text

STACKS = "stacks"                 # RUN_DIR/stacks/: one file per process per capture
LIVE = ".live"                    # RUN_DIR/stacks/.live/pid-<PID>.txt: the in-process handlers' files
NCCL = "nccl"                     # RUN_DIR/stacks/nccl/: NCCL's flight recorder dumps (a GPU run)
SIGNAL_ENV = "SUPERVISE_STACK_SIGNAL"
PY_SPY_ENV = "SUPERVISE_PY_SPY"   # a py-spy to use instead of the one on PATH / beside this Python; "off": none
BUDGET = 4.0                      # s: the whole capture, so that the line comes within 5 s of the verdict
IN_PROCESS_WAIT = 1.5             # s: a faulthandler dump not written by then is taken by py-spy instead
MAX_WHERE = 320                   # characters of the phrase in the anomaly line (the files hold the rest)
MAX_BYTES = 256 << 10             # bytes of one process's dump kept in its file

# NCCL's flight recorder (a GPU run's last collectives per rank, dumped on NCCL's own timeout):
# set for GPU runs by the templates and the launcher, never over a value the user set.
FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
FLIGHT_RECORDER_FILE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
ALIASES = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE", FLIGHT_RECORDER_FILE: "TORCH_FR_DUMP_TEMP_FILE"}

COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
    "barrier", "monitored_barrier", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
    "send", "recv", "batch_isend_irecv", "init_process_group", "new_group", "_store_based_barrier"}
DATALOADER_WAITS = {"_next_data", "__next__", "_get_data", "_try_get_data"}
SAVES = {"save", "_save", "save_file", "save_pretrained", "save_checkpoint", "_save_checkpoint", "save_model",
         "save_state", "_save_to_state_dict"}   # torch.save, safetensors, transformers, accelerate, Lightning
LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d+(\.\d+)*t?[/\\]|^<")
OURS = str(PACKAGE) + os.sep


# ---------------------------------------------------------------------------- what was found
@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: Optional[int] = None

    @property
    def short(self) -> str:
        """``train.py:33``"""
        name = os.path.basename(self.file) or self.file
        return f"{name}:{self.line}" if self.line is not None else name

    @property
    def user(self) -> bool:
        """The user's code: not the standard library, not an installed package, not this bundle."""
        return not LIBRARY.search(self.file) and not self.file.startswith(OURS)

    @property
    def name(self) -> str:
        return self.func.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class ProcStack:
    """One process's capture: its main thread's frames (innermost first) and the others'."""

    pid: int
    rank: Optional[int] = None
    role: str = "process"            # rank | worker | process
    parent: Optional[int] = None
    how: str = ""                    # faulthandler | py-spy
    path: str = ""                   # its file in RUN_DIR/stacks/
    frames: tuple = ()               # Frame, the main thread's, innermost first (a worker's own part only)
    threads: int = 0
    error: str = ""                  # why there is no stack

    def state(self, ranks: int = 1) -> tuple:
        """(kind, phrase): 'collective' waits in all_reduce (train.py:41), 'dataloader' waits on its
        DataLoader (train.py:20), 'user' is in load_shard (train.py:33), 'library' is in
        wait (threading.py:327), 'none' has no stack (why). ``ranks``: the run's rank count (a
        rank of several that sits in backward waits in DDP's gradient all-reduce)."""
        if not self.frames:
            return "none", f"has no stack ({self.error or 'nothing was written'})"
        user = next((f for f in self.frames if f.user), None)
        coll = next((f for f in self.frames if not f.user and f.name in COLLECTIVES and "distributed" in f.file), None)
        if coll is None and ranks > 1:
            coll = next((f for f in self.frames if not f.user and f.name in ("_engine_run_backward", "backward")
                         and "torch" in f.file), None)
        at = user or (coll if coll is not None else self.frames[0])
        if coll is not None:
            return "collective", f"waits in {coll.name} ({at.short})"
        if any(not f.user and f.name in SAVES for f in self.frames):
            return "save", f"is saving a checkpoint in {at.func} ({at.short})"
        if any(not f.user and f.name in DATALOADER_WAITS and "dataloader" in f.file for f in self.frames):
            return "dataloader", f"waits on its DataLoader ({at.short})"
        if user is not None:
            return "user", f"is in {user.func} ({user.short})"
        return "library", f"is in {at.func} ({at.short})"


@dataclass(frozen=True)
class Capture:
    """One capture of a hung run: when, where its files are, what each process showed."""

    when: float                      # the wall clock it began (the verdict's poll)
    folder: str
    procs: tuple = ()                # ProcStack
    took: float = 0.0                # s
    note: str = ""                   # why nothing was captured (no process to look at), '' otherwise

    @property
    def files(self) -> tuple:
        return tuple(p.path for p in self.procs if p.path)

    @property
    def named(self) -> bool:
        return any(p.frames for p in self.procs)

    @property
    def saving(self) -> bool:
        """A checkpoint save is under way and nothing else holds the run: a rank (or process) is
        in a save and every other one is in a save too or waits in a collective (for it)."""
        heads = [p for p in self.procs if p.role == "rank" and p.frames] or [p for p in self.procs if p.frames]
        n = sum(p.role == "rank" for p in self.procs)
        kinds = [p.state(n)[0] for p in heads]
        return "save" in kinds and all(k in ("save", "collective") for k in kinds)

    def where(self, limit: int = MAX_WHERE) -> str:
        """Where every rank sits, in one phrase: which ranks wait in a collective and which never
        reached it, the user's frame of each (function, file:line), the DataLoader workers that
        are in the user's code; a process without a stack says why. At most ``limit`` characters."""
        ranks = sorted((p for p in self.procs if p.role == "rank"), key=lambda p: (p.rank or 0, p.pid))
        heads = ranks or [p for p in self.procs if p.role == "process"] or list(self.procs)
        n = len(ranks)
        states = {p.pid: p.state(n) for p in self.procs}
        waiting = any(states[p.pid][0] == "collective" for p in heads)
        groups: dict = {}
        for p in heads:
            kind, text = states[p.pid]
            if waiting and kind in ("user", "library", "dataloader", "save"):
                text += ", never reached it"
            groups.setdefault((kind != "collective", text), []).append(p)
        parts = []
        for (_, text), members in sorted(groups.items(), key=lambda kv: (kv[0][0], min(p.rank or 0 for p in kv[1]))):
            parts.append(f"{_label(members, n > 1)} {_plural(text) if len(members) > 1 else text}")
            for p in members:
                parts += _workers(p, self.procs, states, mine=len(members) == 1)
        out = ""
        for i, part in enumerate(parts):
            more = "; ..." if i + 1 < len(parts) else ""
            if out and len(out) + 2 + len(part) + len(more) > limit:
                return out + "; ..."
            out = f"{out}; {part}" if out else part[:limit]
        return out

    def why_none(self) -> str:
        """Why no stack was taken: the first process's reason (they share it, mostly)."""
        if self.note:
            return self.note
        p = next((p for p in self.procs if p.error), None)
        return f"pid {p.pid}: {p.error}" if p else "no process of the run to look at"

    def to_json(self) -> dict:
        return {"folder": self.folder, "files": list(self.files), "when": round(self.when, 3),
                "took": round(self.took, 3), "where": self.where() if self.named else "",
                "why_none": "" if self.named else self.why_none()}


def _label(members, several: bool) -> str:
    if not several:
        return f"pid {members[0].pid}"
    nums = sorted(p.rank for p in members if p.rank is not None)
    return f"rank {nums[0]}" if len(nums) == 1 else f"ranks {ranks_text(nums)}"


def _plural(text: str) -> str:
    for one, many in (("waits ", "wait "), ("is in ", "are in "), ("has no ", "have no ")):
        if text.startswith(one):
            return many + text[len(one):]
    return text


def _workers(head: ProcStack, procs, states, mine: bool) -> list:
    """The phrases of ``head``'s workers that sit in the user's code (idle ones say nothing)."""
    kids: dict = {}
    for p in procs:
        if p.parent == head.pid and p.role == "worker" and states[p.pid][0] == "user":
            kids.setdefault(states[p.pid][1], []).append(p.pid)
    whose = "its" if mine else f"pid {head.pid}'s"
    return [f"{whose} DataLoader worker{'s' if len(pids) > 1 else ''} pid{'s' if len(pids) > 1 else ''} "
            f"{','.join(map(str, sorted(pids)))} {_plural(text) if len(pids) > 1 else text}"
            for text, pids in kids.items()]


# ---------------------------------------------------------------------------- the processes
@dataclass(frozen=True)
class Target:
    pid: int
    rank: Optional[int] = None
    role: str = "process"            # rank | worker | process
    parent: Optional[int] = None


def targets(obs, me: Optional[int] = None) -> list:
    """Every live process of the run on this host: the processes the observation follows, the
    local ranks of the heartbeats, and all their descendants (DataLoader workers), found afresh
    in /proc. The watchdog itself and what it started are left out, and so are processes that
    are not Python (no Python stack to take)."""
    me = os.getpid() if me is None else me
    rank_of = {s.pid: r for r, s in obs.ranks.items() if s.pid and r not in obs.rank_where
               and obs.rank_procs.get(s.pid) not in (None, *GONE)}
    base = [p.pid for p in obs.processes if p.alive and p.state != "stopped"] + list(rank_of)
    children = _children()
    seen, order, parent = set(), [], {}
    stack = [pid for pid in dict.fromkeys(base)]
    while stack:
        pid = stack.pop(0)
        if pid in seen or pid == me:
            continue
        seen.add(pid)
        order.append(pid)
        for kid in children.get(pid, ()):
            parent.setdefault(kid, pid)
            stack.append(kid)
    out = []
    for pid in order:
        if not _is_python(pid) or not process(pid).alive:
            continue
        up = parent.get(pid)
        rank = rank_of.get(pid)
        if rank is not None:
            out.append(Target(pid, rank, "rank", up))
            continue
        owner = up
        while owner is not None and owner not in rank_of:
            owner = parent.get(owner)
        if up is not None and (owner is not None or up in base):
            out.append(Target(pid, rank_of.get(owner), "worker", up))
        else:
            out.append(Target(pid, None, "process", up))
    return out


def _children() -> dict:
    """ppid -> [pid] over /proc."""
    out: dict = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return out
    for pid in pids:
        ppid = parent_pid(pid)
        if ppid:
            out.setdefault(ppid, []).append(pid)
    return out


PYTHON = re.compile(r"^(.*/)?(python(\d+(\.\d+)*)?t?|pt_main_thread)$")


def _is_python(pid: int) -> bool:
    """A Python process (by its command line's interpreter, else its executable or name)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    if PYTHON.match(argv0):
        return True
    try:
        if PYTHON.match(os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")):
            return True
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/comm") as f:
            return bool(PYTHON.match(f.read().strip()))
    except OSError:
        return False


def _status(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


def handles(pid: int, sig: int) -> bool:
    """``pid`` has a handler for ``sig`` now (SigCgt): only then may the signal be sent."""
    try:
        return bool(int(_status(pid).get("SigCgt", "0").split()[0], 16) >> (sig - 1) & 1)
    except (ValueError, IndexError):
        return False


def registration(live: Path, pid: int) -> tuple:
    """(the header of pid's in-process file, its path), or (None, why not): the file the
    integration wrote when it registered faulthandler, written by this very process (not an
    earlier one with the same pid)."""
    path = live / f"pid-{pid}.txt"
    try:
        with open(path, "rb") as f:
            heads = [json.loads(ln) for ln in f.read(8192).splitlines()[:2] if ln.startswith(b"{")]
    except (OSError, ValueError):
        return None, "no in-process handler (the integration's Telemetry registers faulthandler)"
    head = heads[-1] if heads else {}
    if not isinstance(head, dict) or head.get("pid") != pid:
        return None, "no in-process handler"
    if isinstance(head.get("time"), (int, float)) and born_after(process(pid).create_time, head["time"]):
        return None, "no in-process handler (its file is an earlier process's)"
    if not head.get("registered"):
        return None, str(head.get("why") or "its in-process handler was not registered")
    sig = head.get("signal")
    if not isinstance(sig, int) or not handles(pid, sig):
        return None, f"signal {sig} is not handled by pid {pid} now"
    return head, str(path)


# ---------------------------------------------------------------------------- py-spy
def find_py_spy() -> Optional[str]:
    """SUPERVISE_PY_SPY ("off": none), else py-spy on PATH, else beside this Python (a venv's bin)."""
    given = os.environ.get(PY_SPY_ENV)
    if given is not None:
        return None if given.strip().lower() in ("", "off", "0", "none") else (shutil.which(given) or None)
    found = shutil.which("py-spy")
    if found:
        return found
    near = Path(sys.executable).with_name("py-spy")
    return str(near) if near.exists() and os.access(near, os.X_OK) else None


NO_PY_SPY = ("py-spy is not installed and the process registered no in-process handler: pip install "
             "'supervising-training-runs[hang]' (or pip install py-spy), or use the integration (Telemetry "
             "registers faulthandler, which needs no ptrace)")


def _cap_sys_ptrace() -> bool:
    try:
        return bool(int(_status(os.getpid()).get("CapEff", "0"), 16) >> 19 & 1)
    except ValueError:
        return False


def _in_container() -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    try:
        with open("/proc/1/cgroup") as f:
            return bool(re.search(r"docker|kubepods|containerd|lxc|podman", f.read()))
    except OSError:
        return False


def why_refused(pid: int, scope: Optional[str] = None, euid: Optional[int] = None,
                owner: Optional[int] = None, cap: Optional[bool] = None, container: Optional[bool] = None) -> str:
    """Why ptrace (py-spy) may not attach to ``pid``, and how to allow it (each fact read from
    this machine unless given)."""
    if scope is None:
        try:
            scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
        except OSError:
            scope = ""
    euid = os.geteuid() if euid is None else euid
    if owner is None:
        try:
            owner = int(_status(pid).get("Uid", "").split()[1])
        except (ValueError, IndexError):
            owner = None
    cap = _cap_sys_ptrace() if cap is None else cap
    container = _in_container() if container is None else container
    also = "; or let the trainer use the integration (Telemetry's faulthandler needs no ptrace)"
    if scope == "3":
        return ("py-spy may not attach: kernel.yama.ptrace_scope = 3 forbids every ptrace attach until a reboot"
                + also)
    if owner is not None and owner != euid and not cap:
        return (f"py-spy may not attach: pid {pid} belongs to uid {owner} and the watchdog runs as uid {euid}: "
                f"run the watchdog as that user (or as root)" + also)
    if scope == "2" and not cap:
        return ("py-spy may not attach: kernel.yama.ptrace_scope = 2 lets only CAP_SYS_PTRACE attach: run the "
                "watchdog with sudo, or sudo sysctl kernel.yama.ptrace_scope=0" + also)
    if scope == "1" and not cap:
        return ("py-spy may not attach: kernel.yama.ptrace_scope = 1 lets only a parent attach: sudo sysctl "
                "kernel.yama.ptrace_scope=0, or run the watchdog with sudo" + also)
    if not cap and container:
        return ("py-spy may not attach: this container lacks SYS_PTRACE: docker run --cap-add SYS_PTRACE "
                "(Kubernetes: securityContext.capabilities.add: [SYS_PTRACE])" + also)
    if not cap:
        return ("py-spy may not attach: ptrace was refused and the watchdog lacks CAP_SYS_PTRACE: run it as "
                "the trainer's user or with sudo (a container: --cap-add SYS_PTRACE)" + also)
    return f"py-spy may not attach to pid {pid}: ptrace was refused (a seccomp filter, or a non-dumpable process)" + also


def _py_spy_error(pid: int, rc: int, err: str) -> str:
    text = err.strip()
    if re.search(r"permission denied|operation not permitted|os error (1|13)\b", text, re.I):
        return why_refused(pid)
    if re.search(r"no such process|os error 3\b", text, re.I):
        return "it ended during the capture"
    first = next((ln for ln in text.splitlines() if ln.strip()), f"exit {rc}")
    return f"py-spy failed: {first[:200]}"


# ---------------------------------------------------------------------------- parsing
FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+|\S+)")
FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?+) in (?P<func>.*)$')
SPY_PROCESS = re.compile(r"^Process (?P<pid>\d+): ")
SPY_THREAD = re.compile(r'^Thread (?P<tid>\S+) \((?P<state>[^)]*)\)(: "(?P<name>.*)")?')
SPY_FRAME = re.compile(r"^\s{2,}(?P<func>\S.*?) \((?P<file>[^()]+?)(:(?P<line>\d+))?\)$")


def parse_faulthandler(text: str) -> list:
    """[(thread name, [Frame innermost first])] of one faulthandler dump."""
    threads = []
    for line in text.splitlines():
        m = FH_THREAD.match(line)
        if m:
            threads.append(("current" if m.group(1).startswith("Current") else m.group(2), []))
            continue
        m = FH_FRAME.match(line)
        if m and threads:
            threads[-1][1].append(Frame(m["func"], m["file"], int(m["line"]) if m["line"].isdigit() else None))
    return threads


def parse_py_spy(text: str) -> dict:
    """pid -> (its section of the text, [(thread name, [Frame innermost first])]) of one
    ``py-spy dump`` (several processes with --subprocesses)."""
    out: dict = {}
    pid, lines, threads = None, [], []
    for line in text.splitlines() + ["Process 0: end"]:
        m = SPY_PROCESS.match(line)
        if m:
            if pid is not None:
                out[pid] = ("\n".join(lines).strip() + "\n", threads)
            pid, lines, threads = int(m["pid"]), [], []
        lines.append(line)
        m = SPY_THREAD.match(line)
        if m:
            threads.append((m["name"] or m["tid"], []))
            continue
        m = SPY_FRAME.match(line)
        if m and threads:
            threads[-1][1].append(Frame(m["func"], m["file"], int(m["line"]) if m["line"] else None))
    out.pop(0, None)
    return out


def main_frames(threads: list) -> tuple:
    """(the main thread's frames, innermost first, a forked worker's own part only; threads):
    the thread named MainThread, else the one that began at ``<module>``, else the first."""
    if not threads:
        return (), 0
    main = next((fr for name, fr in threads if name == "MainThread"), None)
    if main is None:
        main = next((fr for _, fr in threads if fr and fr[-1].func == "<module>"), threads[0][1])
    own = []
    for f in main:   # a forked child's stack goes on into its parent's frames: stop where it began
        own.append(f)
        if f.name in ("_worker_loop", "_bootstrap") and not f.user:
            break
    return tuple(own), len(threads)


# ---------------------------------------------------------------------------- the capture
def _stamp(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def _file_name(stamp: str, t: Target) -> str:
    if t.role == "rank":
        return f"{stamp}-rank{t.rank}-pid{t.pid}.txt"
    if t.role == "worker":
        return f"{stamp}-{f'rank{t.rank}-' if t.rank is not None else ''}worker-pid{t.pid}.txt"
    return f"{stamp}-pid{t.pid}.txt"


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def capture(run_dir, found: list, *, native: bool = False, budget: float = BUDGET,
            py_spy: Optional[str] = "find", clock=time.time) -> Capture:
    """Take the stacks of the ``found`` targets (``targets(obs)``) into RUN_DIR/stacks/, one file
    per process, within ``budget`` seconds: the in-process handler where the process registered
    one (a signal; the dump is cut from its live file), py-spy for the others and for a process
    whose in-process dump did not come within IN_PROCESS_WAIT. ``py_spy``: its path, None for
    none, "find" for ``find_py_spy()``. Never raises on a process that ends meanwhile."""
    t0, start = clock(), time.monotonic()
    folder = Path(run_dir) / STACKS
    try:
        folder.mkdir(exist_ok=True)
    except OSError as e:
        return Capture(t0, str(folder), (), 0.0, f"cannot write {folder}: {e.strerror or e}")
    if not found:
        return Capture(t0, str(folder), (), 0.0, "no live Python process of the run is visible from here")
    stamp = _stamp(t0)
    spy = find_py_spy() if py_spy == "find" else py_spy
    results, errors = _collect(folder / LIVE, found, native, budget, spy)
    procs = []
    for t in found:
        how, text, threads = results.get(t.pid, ("", "", None))
        if not how and errors.get(t.pid) == "it ended during the capture":
            continue
        frames, n, err = _frames_of(t, how, text, threads, errors, spy)
        path = folder / _file_name(stamp, t)
        what = {"rank": f"rank {t.rank}", "worker": f"worker of pid {t.parent}"}.get(t.role, "process")
        if t.role == "worker" and t.rank is not None:
            what += f" (rank {t.rank})"
        head = f"# pid {t.pid}, {what}, {how or 'no stack'}, {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t0))}\n"
        try:
            path.write_text(head + (text[-MAX_BYTES:] if how else f"# {err}\n"))
            saved = str(path)
        except OSError:
            saved = ""
        procs.append(ProcStack(t.pid, t.rank, t.role, t.parent, how, saved, frames, n, err))
    return Capture(t0, str(folder), tuple(procs), time.monotonic() - start)


def sample(run_dir, found: list, *, native: bool = False, budget: float = BUDGET,
           py_spy: Optional[str] = "find") -> dict:
    """The stacks of the ``found`` targets the way ``capture`` takes them, but kept in memory, no
    file written (the hang evidence sampled every poll of a silence: ``FrameWatch``): pid ->
    ProcStack (``error`` says why one has no frames). A process that ended meanwhile is left out."""
    spy = find_py_spy() if py_spy == "find" else py_spy
    if not found:
        return {}
    results, errors = _collect(Path(run_dir) / STACKS / LIVE, found, native, budget, spy)
    out = {}
    for t in found:
        how, text, threads = results.get(t.pid, ("", "", None))
        if not how and errors.get(t.pid) == "it ended during the capture":
            continue
        frames, n, err = _frames_of(t, how, text, threads, errors, spy)
        out[t.pid] = ProcStack(t.pid, t.rank, t.role, t.parent, how, "", frames, n, err)
    return out


def _frames_of(t: Target, how: str, text: str, threads, errors: dict, spy) -> tuple:
    """(main-thread frames, thread count, why there are none) of one process's dump."""
    if how == "faulthandler":
        threads = parse_faulthandler(text)
    frames, n = main_frames(threads or [])
    err = ""
    if not frames:
        err = errors.get(t.pid) or ("its dump held no Python frame" if how else "no stack")
        if not how and spy is None:
            err = NO_PY_SPY if err.startswith("no in-process handler") else f"{err}; {NO_PY_SPY}"
    return frames, n, err


def _collect(live: Path, found: list, native: bool, budget: float, spy: Optional[str]) -> tuple:
    """(pid -> (how, text, threads or None), pid -> why there is none): every target's dump within
    ``budget`` s, in-process where it registered a handler, else (or late) by py-spy."""
    start = time.monotonic()
    end = start + budget
    by_pid = {t.pid: t for t in found}
    waiting: dict = {}     # pid -> (live path, offset)
    errors: dict = {}      # pid -> why there is no stack
    outside: list = []
    for t in found:
        head, where = registration(live, t.pid)
        if head is None:
            errors[t.pid] = where
            outside.append(t.pid)
            continue
        offset = _size(where)
        try:
            os.kill(t.pid, head["signal"])
            waiting[t.pid] = (where, offset)
        except ProcessLookupError:
            errors[t.pid] = "it ended during the capture"
        except PermissionError:
            errors[t.pid] = f"the watchdog (uid {os.geteuid()}) may not signal it: run the watchdog as the trainer's user"
            outside.append(t.pid)
    running = _start_py_spy(spy, outside, by_pid, native, errors)
    results: dict = {}     # pid -> (how, text, threads)
    last: dict = {}
    while waiting and time.monotonic() < min(end, start + IN_PROCESS_WAIT):
        time.sleep(0.02)
        for pid, (path, offset) in list(waiting.items()):
            size = _size(path)
            if size > offset and last.get(pid, (None, 0))[0] == size and time.monotonic() - last[pid][1] >= 0.1:
                results[pid] = ("faulthandler", _read_from(path, offset), None)
                del waiting[pid]
            elif last.get(pid, (None,))[0] != size:
                last[pid] = (size, time.monotonic())
    for pid, (path, offset) in waiting.items():   # late or never: take what came, else py-spy
        text = _read_from(path, offset) if _size(path) > offset else ""
        if text.strip():
            results[pid] = ("faulthandler", text, None)
        else:
            errors[pid] = f"its faulthandler dump did not come within {IN_PROCESS_WAIT:g}s"
            running.update(_start_py_spy(spy, [pid], by_pid, native, errors))
    for pid, proc in running.items():
        try:
            out, err = proc.communicate(timeout=max(0.05, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            errors[pid] = f"py-spy did not finish within {budget:g}s"
            continue
        if proc.returncode != 0:
            errors[pid] = _py_spy_error(pid, proc.returncode, err)
            continue
        for p, (section, threads) in parse_py_spy(out).items():
            if p in by_pid and p not in results:
                results[p] = ("py-spy", section, threads)
    return results, errors


def _start_py_spy(spy: Optional[str], pids: list, by_pid: dict, native: bool, errors: dict) -> dict:
    """One ``py-spy dump`` per topmost pid, with --subprocesses when all its descendants are in
    ``pids`` (its workers ride along), else one per pid; pid -> Popen. Nothing without py-spy."""
    if spy is None or not pids:
        return {}
    wanted, whole, out = set(pids), set(), {}

    def covered(pid):
        up = by_pid[pid].parent
        while up is not None and up in by_pid:
            if up in whole:
                return True
            up = by_pid[up].parent
        return False

    for pid in sorted(pids, key=lambda p: _depth(p, by_pid)):
        if covered(pid):
            continue
        kids = _descendants(pid, by_pid)
        sub = bool(kids) and kids <= wanted
        argv = [spy, "dump", "--pid", str(pid), "--full-filenames"] + (["--subprocesses"] if sub else []) + (
            ["--native"] if native else [])
        try:
            out[pid] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, errors="replace")
        except OSError as e:
            errors[pid] = f"py-spy could not run: {e.strerror or e}"
            continue
        if sub:
            whole.add(pid)
    return out


def _depth(pid: int, by_pid: dict) -> int:
    n, up = 0, by_pid[pid].parent
    while up is not None and up in by_pid and n < 64:
        n, up = n + 1, by_pid[up].parent
    return n


def _descendants(pid: int, by_pid: dict) -> set:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for t in by_pid.values():
            if t.parent == p and t.pid not in out:
                out.add(t.pid)
                todo.append(t.pid)
    return out


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(offset, 0))
            return f.read(MAX_BYTES).decode(errors="replace")
    except OSError:
        return ""


# ---------------------------------------------------------------------------- the hang evidence
# A silent run is sampled (``sample``: no file written) every poll, at most SAMPLE_EVERY apart, once
# its silence passes StallClock.sample_after() (max(the median step gap, 10 s)). It is hung when every
# process's main-thread frames stayed the same across samples spanning --hang-window (20 s) while it
# stayed idle (under BUSY of a core between samples; a rank waiting in a torch.distributed collective
# may spin), and every rank's (or process's) innermost frame is a wait: a WAITS function of the
# standard library, a collective, a DataLoader fetch, or a main thread asleep (under IDLE of a core:
# a lock, a sleep, a read, a C call that blocks). Frames that change push the clock's limit out.
SAMPLE_EVERY = 5.0                # s: at most between two samples of a silence (the poll, when shorter; >= 1 s)
BUSY = 0.25                       # of one core between two samples: the process works (another thread, a C call)
IDLE = 0.05                       # of one core over the span: the main thread is asleep in a blocking call
WAITS = {"wait", "wait_for", "_wait_for_tstate_lock", "join", "acquire", "get", "select", "poll", "_poll",
         "recv", "recv_into", "recvfrom", "recv_bytes", "_recv", "_recv_bytes", "accept", "readinto", "readline",
         "_try_wait", "communicate", "result", "sleep", "_worker", "_get_data", "_try_get_data", "_next_data",
         "__next__", "_store_based_barrier", "wait_for_workers", "_bootstrap_inner"}
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int, tid: Optional[int] = None) -> Optional[float]:
    """CPU seconds (user + system) of process ``pid`` (all threads), or of its thread ``tid``."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def in_wait(frames: tuple, ranks: int = 1) -> bool:
    """The innermost frame is a blocking wait of a library (WAITS), a torch.distributed
    collective, or a DataLoader fetch (the frames alone; a C call's sleep is read from the CPU)."""
    if not frames:
        return False
    f = frames[0]
    return (not f.user and (f.name in WAITS or f.name in DATALOADER_WAITS)) or collective(frames)


def collective(frames: tuple) -> bool:
    """One of the innermost three frames is a torch.distributed collective (its wait may spin)."""
    return any(not f.user and f.name in COLLECTIVES and "distributed" in f.file for f in frames[:3])


@dataclass(frozen=True)
class FrameFacts:
    """The hang evidence of one poll, frozen (``Observation.frames``): what the samples of the
    current silence showed. Wall-clock times; the judge compares them, it reads nothing."""

    every: float                     # s between samples
    first: Optional[float] = None    # the silence's first sample
    last: Optional[float] = None     # the latest sample
    samples: int = 0
    complete: bool = False           # every process of the run visible here was sampled, and no rank runs elsewhere
    why_not: str = ""                # why the evidence is incomplete
    still_since: Optional[float] = None   # every process's frames the same, and it idle, since this sample
    waiting: bool = False            # every rank's (process's) innermost frame is a wait, or its main thread sleeps
    saving: bool = False             # a rank (process) is inside a checkpoint save
    moved_at: Optional[float] = None # the latest sample at which a process's frames changed (after the first)
    where: str = ""                  # the innermost frames, one phrase ('pid 4242 in get (queue.py:171)')

    @property
    def still_for(self) -> float:
        """s the frames have stayed the same (sample to sample), 0 when they have not."""
        return self.last - self.still_since if self.still_since is not None and self.last is not None else 0.0

    def to_json(self) -> dict:
        return {"first": self.first, "last": self.last, "samples": self.samples, "complete": self.complete,
                "why_not": self.why_not, "still_for": round(self.still_for, 3), "waiting": self.waiting,
                "saving": self.saving, "moved_at": self.moved_at, "where": self.where}


class FrameWatch:
    """The observer's sampler of a silence (observe, then judge): ``look(obs, after)`` samples
    every process of the run (``targets``) once the silence passes ``after`` s, at most every
    ``every`` s, and folds what the samples showed into ``FrameFacts``. A new record (another
    ``quiet_since``) starts afresh. Standard library only; one ``py-spy dump`` or one
    faulthandler signal per process and sample."""

    def __init__(self, run_dir, every: float = SAMPLE_EVERY, native: bool = False, py_spy: Optional[str] = "find",
                 clock=time.time, window: float = 20.0):
        self.run_dir, self.every, self.native, self.clock = Path(run_dir), max(1.0, min(every, SAMPLE_EVERY)), native, clock
        self.window = window             # s: --hang-window (a sample is taken when it ends, whatever the interval)
        self.py_spy = find_py_spy() if py_spy == "find" else py_spy
        self.reset(None)

    def reset(self, quiet) -> None:
        self.quiet = quiet
        self.procs: dict = {}            # pid -> [key, since, cpu at since, main cpu at since, last t, last cpu, stack]
        self.facts: Optional[FrameFacts] = None
        self.first: Optional[float] = None
        self.moved_at: Optional[float] = None
        self.samples = 0

    def look(self, obs, after: float) -> Optional[FrameFacts]:
        """The facts of this poll, or None while the run is not silent past ``after`` s (or
        nothing of it lives here)."""
        if obs.quiet_since is None or not obs.alive or obs.relaunch is not None or obs.job_waiting:
            self.reset(None)
            return None
        if obs.quiet_since != self.quiet:
            self.reset(obs.quiet_since)
        if obs.now - obs.quiet_since < after:
            return None
        f = self.facts
        if f is not None and obs.now - f.last < 0.8 * self.every and not (
                f.still_since is not None and obs.now >= f.still_since + self.window):
            return f
        now = obs.now
        self.first = self.first if self.first is not None else now
        self.samples += 1
        if obs.rank_where:
            self.facts = FrameFacts(self.every, self.first, now, self.samples, False,
                                    f"rank {ranks_text(sorted(obs.rank_where))} runs where it cannot be sampled")
            return self.facts
        found = targets(obs)
        ranked = any(t.role == "rank" for t in found)
        found = [t for t in found if t.role != "process" or not ranked]   # torchrun's agent: not a rank's evidence
        stacks = sample(self.run_dir, found, native=self.native, budget=2.0, py_spy=self.py_spy)
        t_now = self.clock()
        missing = [p for p in stacks.values() if not p.frames]
        if not stacks or missing:
            why = f"pid {missing[0].pid}: {missing[0].error}" if missing else "no live Python process of the run is visible from here"
            self.facts = FrameFacts(self.every, self.first, now, self.samples, False, why)
            return self.facts
        n = sum(p.role == "rank" for p in stacks.values())
        for pid in list(self.procs):
            if pid not in stacks:
                del self.procs[pid]
        for pid, ps in stacks.items():
            key = tuple((f.func, f.file, f.line) for f in ps.frames)
            cpu, main = cpu_seconds(pid), cpu_seconds(pid, pid)
            was = self.procs.get(pid)
            if was is None or was[0] != key:
                if was is not None:
                    self.moved_at = now
                self.procs[pid] = [key, now, cpu, main, t_now, cpu, ps]
                continue
            span = t_now - was[4]
            busy = cpu is not None and was[5] is not None and span > 0 and (cpu - was[5]) / span >= BUSY
            if busy and not collective(ps.frames):
                was[1:4] = [now, cpu, main]   # it works: its stillness begins again
            was[4:7] = [t_now, cpu, ps]
        heads = [v for v in self.procs.values() if v[6].role in ("rank", "process")] or list(self.procs.values())
        waiting = all(in_wait(v[6].frames, n) or _asleep(v, self.every) for v in heads)
        saving = any(v[6].state(n)[0] == "save" for v in heads)
        still = max(v[1] for v in self.procs.values())
        where = "; ".join(f"{_label([v[6]], n > 1)} in {v[6].frames[0].name} ({v[6].frames[0].short})"
                          for v in sorted(heads, key=lambda v: (v[6].rank or 0, v[6].pid)))
        self.facts = FrameFacts(self.every, self.first, now, self.samples, True, "", still, waiting, saving,
                                self.moved_at, where[:MAX_WHERE])
        return self.facts


def _asleep(v: list, every: float) -> bool:
    """The main thread used under IDLE of a core since its frames last changed (a span of at
    least one sample interval)."""
    key, since, cpu0, main0, last, cpu, ps = v
    main = cpu_seconds(ps.pid, ps.pid)
    span = last - since
    return main is not None and main0 is not None and span >= min(every, 1.0) and (main - main0) / span < IDLE


# ---------------------------------------------------------------------------- the line
def hang_fix(found: Optional[Capture], fallback: str, then: str = "") -> str:
    """The fix of a hang's anomaly line: where every process sits and the stacks folder when a
    capture named frames, why none could be taken when it did not, else ``fallback``."""
    if found is None:
        return fallback
    if found.named and found.saving:
        return (f"Stacks: {found.where()}; every stack is in {found.folder}/: a save slower than the learned limit is "
                "no hang if check-in shows the steps moving again: announce long saves (Telemetry.expect(seconds, "
                "'save') before them) and start the watchdog again; if the steps stay still, kill the run and relaunch")
    if found.named:
        return (f"Stacks: {found.where()}; every stack is in {found.folder}/: "
                + (then or "fix that frame (references/recovery.md, hangs), then kill the run and relaunch"))
    return f"No stack: {found.why_none()}; {fallback[0].lower() + fallback[1:] if fallback else ''}".rstrip("; ")


def flight_recorder_env(env: dict, run_dir) -> dict:
    """The NCCL flight recorder's variables a GPU run should get, less any the user set (or its
    TORCH_FR_* alias): the dump goes to RUN_DIR/stacks/nccl/nccl_trace_rank_<N> (``torchfrtrace
    RUN_DIR/stacks/nccl --prefix nccl_trace_rank_`` reads them)."""
    want = dict(FLIGHT_RECORDER, **{FLIGHT_RECORDER_FILE: str(Path(run_dir).resolve() / STACKS / NCCL / "nccl_trace_rank_")})
    return {k: v for k, v in want.items() if k not in env and ALIASES.get(k, k) not in env}


def cuda_machine(env: Optional[dict] = None) -> bool:
    """An NVIDIA driver with a GPU is here and CUDA_VISIBLE_DEVICES does not hide them all."""
    env = os.environ if env is None else env
    if env.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return False
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


__all__ = ["Capture", "Frame", "FrameFacts", "FrameWatch", "ProcStack", "Target", "capture", "sample", "targets", "hang_fix", "why_refused",
           "find_py_spy", "parse_faulthandler", "parse_py_spy", "registration", "flight_recorder_env",
           "cuda_machine", "STACKS", "BUDGET"]

"""Process and GPU readings. On Linux the process probe reads /proc itself (what psutil reads
there: the same state, start time and RSS, without psutil's import, a third of a check-in's
start-up); elsewhere psutil when it is installed, else ``kill -0``. NVML (nvidia-ml-py) when
present, and "no GPU" is a value, not an error. Thin on purpose: everything above it is tested
without a GPU."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Optional

from supervise.vocabulary import GONE

PROC = os.path.isdir("/proc/self")
try:
    if PROC:
        psutil = None  # /proc is read directly (below)
    else:
        import psutil
except ImportError:  # a plain checkout run by a bare Python
    psutil = None

_PSUTIL_STATES = {"running": "running", "sleeping": "sleeping", "disk-sleep": "sleeping",
                  "idle": "sleeping", "stopped": "stopped", "tracing-stop": "stopped",
                  "zombie": "zombie", "dead": "dead", "waking": "running", "parked": "sleeping"}
_PROC_STATES = {"R": "running", "S": "sleeping", "D": "sleeping", "I": "sleeping", "P": "sleeping", "W": "running",
                "T": "stopped", "t": "stopped", "Z": "zombie", "X": "dead"}


@dataclass
class ProcInfo:
    pid: int
    state: str                      # running|sleeping|stopped|zombie|dead|gone|alive
    cpu_percent: Optional[float] = None
    rss: Optional[int] = None       # bytes
    create_time: Optional[float] = None
    name: str = ""

    @property
    def alive(self) -> bool:
        return self.state not in GONE


def proc_stat(pid: int) -> tuple:
    """(name, fields) of ``/proc/PID/stat``, the one parser of it: ``fields`` are the words after
    the name, so ``fields[0]`` is the state letter, ``[1]`` the parent pid, ``[2]`` the process
    group, ``[11]``/``[12]`` user/system ticks, ``[19]`` the start in ticks after boot, ``[21]``
    the resident pages. OSError when it cannot be read (FileNotFoundError: the pid is gone)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.find("(") + 1: stat.rfind(")")], stat[stat.rfind(")") + 2:].split()


def _proc_stat(pid: int) -> Optional[ProcInfo]:
    try:
        name, rest = proc_stat(pid)
    except FileNotFoundError:
        return ProcInfo(pid, "gone")
    except OSError:
        return None
    try:
        create = _boot_time() + int(rest[19]) / _TICKS
    except (OSError, StopIteration, IndexError, ValueError):
        create = None
    return ProcInfo(pid, _PROC_STATES.get(rest[0], "running"), rss=int(rest[21]) * _PAGE,
                    create_time=create, name=name)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_BOOT: list = []


def _boot_time() -> float:
    """The kernel's boot time (/proc/stat btime), read once: psutil's BOOT_TIME."""
    if not _BOOT:
        with open("/proc/stat") as f:
            _BOOT.append(next(float(ln.split()[1]) for ln in f if ln.startswith("btime")))
    return _BOOT[0]


def process(pid: int, cpu_interval: Optional[float] = None) -> ProcInfo:
    """One reading of ``pid``. ``cpu_interval`` (s) samples CPU % (psutil only)."""
    if psutil is not None:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                state = _PSUTIL_STATES.get(p.status(), "running")
                info = ProcInfo(pid, state, rss=p.memory_info().rss, create_time=p.create_time(),
                                name=p.name())
            if cpu_interval is not None and info.alive:
                info.cpu_percent = p.cpu_percent(interval=cpu_interval)
            return info
        except psutil.NoSuchProcess:
            return ProcInfo(pid, "gone")
        except psutil.Error:
            pass
    if os.path.isdir("/proc"):
        info = _proc_stat(pid)
        if info is not None:
            return info
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return ProcInfo(pid, "gone")
    except PermissionError:
        pass
    return ProcInfo(pid, "alive")


def cpu_seconds(pid: int) -> Optional[float]:
    """CPU time (user + system, s) ``pid`` has used so far; None when it cannot be read. No
    sampling sleep: a CPU % is two of these apart (scan.Scan.cpu_percent)."""
    if psutil is not None:
        try:
            t = psutil.Process(pid).cpu_times()
            return t.user + t.system
        except psutil.Error:
            return None
    try:
        rest = proc_stat(pid)[1]
        return (int(rest[11]) + int(rest[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


# A process's start time is known to about a second (the kernel's boot time is whole seconds, and
# two readings may straddle one): start times this close are the same process.
SAME_PROCESS_S = 1.5


def same_start(a: Optional[float], b: Optional[float]) -> bool:
    """Two readings of a start time are one process's (either unknown: nothing says otherwise)."""
    return a is None or b is None or abs(a - b) <= SAME_PROCESS_S


def born_after(create_time: Optional[float], t: Optional[float]) -> bool:
    """A process that started after ``t`` (a start record's time): it cannot have written it."""
    return create_time is not None and t is not None and create_time > t + SAME_PROCESS_S


def same_process(pid: int, create_time: Optional[float] = None) -> bool:
    """The one liveness test: ``pid`` runs (not a zombie, not gone) and is the process that
    started at ``create_time`` (a recycled pid is another process); with no start time, the
    pid alone."""
    info = process(pid)
    return info.alive and same_start(info.create_time, create_time)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``: from /proc, else by signal 0."""
    if os.path.isdir("/proc"):
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                rest = proc_stat(int(d))[1]
            except OSError:
                continue
            if len(rest) > 2 and rest[2] == str(pgid) and _PROC_STATES.get(rest[0], "running") not in GONE:
                out.append(int(d))
        return out
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [pgid]


def log_writers(log_path, exclude=()) -> dict[int, int]:
    """Every process whose stdout or stderr is ``log_path`` -> its parent pid. The README's
    launch line makes the trainer such a process, and torchrun's workers inherit it. Reads
    /proc/PID/fd/{1,2} links: no file is opened, a few hundred readlinks per call."""
    try:
        target = os.path.realpath(log_path)
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return {}
    out = {}
    for pid in pids:
        if pid in exclude:
            continue
        for fd in (1, 2):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link == target or link == target + " (deleted)":
                out[pid] = parent_pid(pid)
                break
    return out


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` (/proc), 0 when it cannot be read."""
    try:
        return int(proc_stat(pid)[1][1])
    except (OSError, ValueError, IndexError):
        return 0


class ProcessWatch:
    """Remembers each pid's start time at first sight, so a recycled pid reads as gone."""

    def __init__(self):
        self.birth: dict[int, float] = {}

    def read(self, pid: int) -> ProcInfo:
        info = process(pid)
        if info.create_time is not None:
            first = self.birth.setdefault(pid, info.create_time)
            if not same_start(first, info.create_time):
                return ProcInfo(pid, "gone")
        return info


@dataclass(frozen=True)
class Here:
    """Where this process's probes look: its host name, its PID namespace (the inode of
    /proc/self/ns/pid, as ``ls -l`` shows it: ``pid:[4026531836]``) and the kernel's boot
    (/proc/sys/kernel/random/boot_id). A pid means this machine's process only where all three
    are the recorder's: a sidecar container or ``unshare --pid`` shares the host name but not the
    pids, and a host that rebooted (or another machine with the same name) shares neither.
    ``pid_ns`` and ``boot_id`` are None where /proc does not have them (macOS). ``proc_own``:
    this process's /proc is its own namespace's (/proc/self names its pid); after ``unshare
    --pid`` without ``--mount-proc`` it is the parent namespace's, and no pid of this namespace
    can be read there."""

    host: str
    pid_ns: Optional[int] = None
    boot_id: Optional[str] = None
    proc_own: bool = True


_HERE: list = []


def here() -> Here:
    """This process's ``Here``, read once (none of it changes while a process lives)."""
    if not _HERE:
        import socket
        pid_ns = boot_id = None
        proc_own = True
        try:
            pid_ns = os.stat("/proc/self/ns/pid").st_ino
            proc_own = os.readlink("/proc/self") == str(os.getpid())
        except OSError:
            pass
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot_id = f.read(100).strip() or None
        except OSError:
            pass
        _HERE.append(Here(socket.gethostname(), pid_ns, boot_id, proc_own))
    return _HERE[0]


def here_fields(me: Optional[Here] = None) -> dict:
    """``{"pid_ns", "boot_id"}`` of ``me`` (default ``here()``) for a record naming this process's
    pid (launch.json), each left out where unknown: what ``locality`` compares."""
    me = me or here()
    return {k: v for k, v in (("pid_ns", me.pid_ns), ("boot_id", me.boot_id)) if v is not None}


ANOTHER_HOST, ANOTHER_BOOT, ANOTHER_PID_NS = "host", "boot", "pid_ns"   # what ``locality`` finds differs


def locality(host: Optional[str], pid_ns: Optional[int], boot_id: Optional[str], me: Here) -> str:
    """'' when a pid recorded with ``host``/``pid_ns``/``boot_id`` (a start record's, a heartbeat's,
    a launch record's) is a process this watchdog can probe; otherwise what differs:
    ``ANOTHER_HOST``, ``ANOTHER_BOOT`` (same name, another boot: a reboot, or another machine) or
    ``ANOTHER_PID_NS`` (same machine, another PID namespace, or a /proc that is not this
    namespace's: its pids are not the ones probed here). Each identity the record carries must be
    ours; one it lacks is not compared, so a record of an older writer (a host, no namespace) is
    judged as before. The values are input, not trusted: a recorded value of the wrong type is not
    ours. Pure."""
    if isinstance(host, str) and host and host != me.host:
        return ANOTHER_HOST
    if boot_id is not None and boot_id != me.boot_id:
        return ANOTHER_BOOT
    if pid_ns is not None and (isinstance(pid_ns, bool) or pid_ns != me.pid_ns or not me.proc_own):
        return ANOTHER_PID_NS
    return ""


def where_text(code: str, host: Optional[str], pid_ns: Optional[int], boot_id: Optional[str], me: Here) -> str:
    """``locality``'s ``code`` in words: ``in another PID namespace on vm (pid:[4026532410], here
    pid:[4026531836])``; '' for a local one."""
    if code == ANOTHER_HOST:
        return f"on host {host}, this is {me.host}"
    if code == ANOTHER_BOOT:
        return (f"on another boot of {host or me.host} (boot_id {str(boot_id)[:8]}, this is "
                f"{(me.boot_id or '?')[:8]}): a reboot, or another machine with the same name")
    if code == ANOTHER_PID_NS:
        if pid_ns == me.pid_ns and not me.proc_own:
            return (f"in PID namespace pid:[{pid_ns}] on {host or me.host}, whose pids the /proc here does not "
                    "show (it is another namespace's: unshare --mount-proc gives this one its own)")
        return (f"in another PID namespace on {host or me.host} (pid:[{pid_ns}], here "
                f"pid:[{me.pid_ns if me.pid_ns is not None else '?'}])")
    return ""


def runs_where(rec, me: Optional[Here] = None) -> str:
    """'' when the pid of ``rec`` (a start record, launch.json: anything with ``host``, ``pid_ns``,
    ``boot_id``) is this process's to probe (``locality`` against ``me``, default ``here()``);
    otherwise where it runs, in words (``where_text``)."""
    me = me or here()
    host, ns, boot = rec.get("host"), rec.get("pid_ns"), rec.get("boot_id")
    code = locality(host, ns, boot, me)
    return where_text(code, host, ns, boot, me) if code else ""


@dataclass
class GpuReading:
    index: int
    name: str
    util: float            # %
    mem_used: int          # bytes
    mem_total: int
    temp: Optional[float]  # C
    power: Optional[float] # W
    pids: tuple = ()

    def line(self) -> str:
        t = f" {self.temp:.0f}C" if self.temp is not None else ""
        p = f" {self.power:.0f}W" if self.power is not None else ""
        return (f"gpu{self.index} {self.name}: {self.util:.0f}% util, "
                f"{self.mem_used / 2**30:.1f}/{self.mem_total / 2**30:.1f} GiB{t}{p}")


@dataclass
class GpuReport:
    gpus: list = field(default_factory=list)
    note: str = ""          # why there is no reading, e.g. "no GPU: NVML not installed"

    @property
    def available(self) -> bool:
        return bool(self.gpus)

    def for_pids(self, pids) -> list:
        """The GPUs the run uses: those holding one of ``pids``, else all of them."""
        mine = [g for g in self.gpus if set(g.pids) & set(pids)]
        return mine or list(self.gpus)


NVIDIA_DRIVER = ("/dev/nvidiactl", "/proc/driver/nvidia")   # present wherever the driver is, containers included


class Nvml:
    """NVML through nvidia-ml-py. ``read()`` never raises: no GPU is a report with a note."""

    def __init__(self):
        self._nv = None
        self._note = ""
        if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in NVIDIA_DRIVER):
            self._note = "no GPU: no NVIDIA driver here (/dev/nvidiactl and /proc/driver/nvidia absent)"
            return   # nothing NVML could find: skip its import (a tenth of a check-in's start-up)
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nv = pynvml
        except ImportError:
            self._note = "no GPU: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self._note = f"no GPU: NVML unavailable ({type(e).__name__})"

    def read(self) -> GpuReport:
        nv = self._nv
        if nv is None:
            return GpuReport(note=self._note)
        try:
            out = []
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                name = nv.nvmlDeviceGetName(h)
                out.append(GpuReading(
                    i, name.decode() if isinstance(name, bytes) else name,
                    float(nv.nvmlDeviceGetUtilizationRates(h).gpu), int(mem.used), int(mem.total),
                    _optional(lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
                    _optional(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    tuple(_optional(lambda: [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]) or ())))
            return GpuReport(out, "" if out else "no GPU: NVML found no device")
        except Exception as e:
            return GpuReport(note=f"no GPU: NVML read failed ({type(e).__name__})")


def _optional(fn):
    try:
        return fn()
    except Exception:
        return None


class DiskUsage(tuple):
    """(total, used, free) bytes, as shutil.disk_usage gives them."""
    total = property(lambda self: self[0])
    used = property(lambda self: self[1])
    free = property(lambda self: self[2])


def disk_usage(path) -> DiskUsage:
    """shutil.disk_usage on POSIX (statvfs), without importing shutil (bz2, lzma: start-up
    cost); OSError as it raises."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    total = st.f_blocks * st.f_frsize
    return DiskUsage((total, (st.f_blocks - st.f_bfree) * st.f_frsize, free))


def disk_free(path: str) -> Optional[tuple[int, int]]:
    """(free, total) bytes of the file system holding ``path`` (or its nearest parent)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        u = disk_usage(p)
        return u.free, u.total
    except OSError:
        return None

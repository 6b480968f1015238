"""Telemetry for any training loop: the contract v0.2 writer (see references/contract.md).

Standard library only. Everything between the two marker lines below is self-contained: copy
it next to your script (the templates embed it verbatim) and it runs without this package.

    from supervise.telemetry import Telemetry
    with Telemetry("runs/a", task="lm", vocab_size=50304, total_steps=5000, batch_size=32) as tm:
        for step in range(1, 5001):
            loss = train_step()
            tm.step(step, loss, lr=sched.get_last_lr()[0], grad_norm=gn)   # raises on NaN
            if step % 250 == 0:
                tm.eval(step, loss=val_loss())                               # -> eval_loss
        tm.done(eval_loss=val_loss())
"""

# --- telemetry: begin ---
import faulthandler
import json
import math
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
import uuid

# The signal a watchdog sends for the stacks of a hung run (references/hangs.md): free in
# Lightning (SIGUSR1 requeue, SIGTERM), torchrun (SIGTERM, SIGINT, SIGHUP, SIGQUIT, and SIGUSR1/2
# when asked), Slurm's --signal habits and submitit (SIGUSR1/2), the HF Trainer (SIGTERM).
# SUPERVISE_STACK_SIGNAL overrides it: a name (SIGRTMIN+6, SIGUSR2), a number, or "off".
STACK_SIGNAL = "SIGRTMIN+6"
_STACKS = {}   # this process's registration: pid, signal, file, run_dir, rank


def stack_signal(text=None):
    """The signal number of SUPERVISE_STACK_SIGNAL (``text`` when given), else of SIGRTMIN+6;
    None when it is "off"/"0" or not a signal here (no real-time signals: not Linux)."""
    text = str((os.environ.get("SUPERVISE_STACK_SIGNAL") if text is None else text) or STACK_SIGNAL)
    text = text.strip().upper().replace(" ", "")
    if text in ("OFF", "0", "NONE", "NO", "FALSE"):
        return None
    name, _, plus = text.partition("+")
    try:
        num = int(name) if name.isdigit() else int(getattr(signal, name if name.startswith("SIG") else "SIG" + name))
        num += int(plus or 0)
    except (AttributeError, TypeError, ValueError):
        return None
    return num if 0 < num < getattr(signal, "NSIG", 65) and num not in (signal.SIGKILL, signal.SIGSTOP) else None


def _handled(sig):
    """Whether this process already handles ``sig``: a Python handler, SIG_IGN, or a handler
    installed from C (Python reports None for those; /proc/self/status shows them all)."""
    try:
        if signal.getsignal(sig) not in (signal.SIG_DFL,):
            return True
    except (ValueError, OSError):
        return True
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("SigCgt:", "SigIgn:")) and int(line.split()[1], 16) >> (sig - 1) & 1:
                    return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def register_stacks(run_dir, rank=None, role="rank"):
    """faulthandler, all threads, on ``stack_signal()``, into RUN_DIR/stacks/.live/pid-<PID>.txt
    (a JSON header line, then every dump): on a hang the watchdog sends the signal and cuts one
    file per capture out of it. faulthandler is written in C: it needs no ptrace and dumps while
    the interpreter is deadlocked, pausing the process only while it writes. A handler already
    installed for that signal is never replaced (the file says so, and the watchdog falls back
    to py-spy); chain=False, since the signal's default action would end the process. A process
    forked from here (a DataLoader worker) registers its own file. The path, or None."""
    sig = stack_signal()
    if sig is None or not hasattr(faulthandler, "register"):
        return None
    pid = os.getpid()
    ours = bool(_STACKS)   # our own handler: this process's, or inherited across fork
    live = os.path.join(str(run_dir), "stacks", ".live")
    try:
        os.makedirs(live, exist_ok=True)
        if not ours:
            _prune(live)
        path = os.path.join(live, f"pid-{pid}.txt")
        f = open(path, "a", buffering=1)
    except OSError:
        return None
    head = {"pid": pid, "rank": rank, "role": role, "parent": os.getppid(), "signal": sig,
            "time": round(time.time(), 3), "registered": False}
    why = None
    if not ours and _handled(sig):
        why = (f"signal {sig} already has a handler in this process, left alone: set SUPERVISE_STACK_SIGNAL "
               "to a free one (references/hangs.md)")
    else:
        try:
            f.write(json.dumps(dict(head, registered=True)) + "\n")
            f.flush()
            faulthandler.register(sig, file=f, all_threads=True, chain=False)
        except (OSError, RuntimeError, ValueError) as e:
            why = f"faulthandler.register failed: {e}"
    if why is not None:
        f.write(json.dumps(dict(head, registered=False, why=why)) + "\n")
        f.close()
        return None
    old = _STACKS.get("file")
    _STACKS.update(pid=pid, signal=sig, file=f, run_dir=str(run_dir), rank=rank)
    if old is not None and old is not f:
        old.close()   # faulthandler holds the new file now
    if not _STACKS.get("at_fork") and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_stacks_in_child)
        _STACKS["at_fork"] = True
    return path


def _stacks_in_child():
    """After a fork (a DataLoader worker): dump into a file of its own, not the parent's."""
    if _STACKS.get("pid") and _STACKS["pid"] != os.getpid():
        try:
            register_stacks(_STACKS["run_dir"], _STACKS.get("rank"), role="worker")
        except Exception:
            pass


def _prune(live):
    """Drop the files of processes that are gone (the workers of earlier epochs, an old launch)."""
    for name in os.listdir(live):
        if name.startswith("pid-") and name.endswith(".txt") and name[4:-4].isdigit():
            try:
                os.kill(int(name[4:-4]), 0)
            except ProcessLookupError:
                try:
                    os.remove(os.path.join(live, name))
                except OSError:
                    pass
            except OSError:
                pass


class Telemetry:
    """Writes RUN_DIR/metrics.jsonl (rank 0), RUN_DIR/ranks/rank-<N>.jsonl (every rank) and the
    completion sentinel RUN_DIR/final_val_metrics.json, one os.write per line (O_APPEND).

    task: "classification" | "lm" | "regression" | ... ; chance loss is ln(num_labels) for
    classification and ln(vocab_size) for lm. batch_size: samples per optimizer step on one rank
    (per-device batch x gradient accumulation); when given, sps (all ranks) is measured.
    rank / world_size default to torchrun's RANK / WORLD_SIZE variables.

    How this script continues (the start record's ``resume``, which the relaunch line uses):
    resume=["--init_from=resume"] (argv words; "{checkpoint}" stands for the checkpoint path, as
    in ["--resume_from_checkpoint", "{checkpoint}"]); resume_env={"VAR": "{checkpoint}"} for a
    recipe given through the environment; checkpoint_dir: where the checkpoints go (a folder or
    a list). resumed: this launch continues an earlier attempt [True when resume=True, or when
    the recipe's words are on this command line / its variables are set]; attempt: 1, or when
    resumed one more than the start records already in metrics.jsonl (never truncated).
    flags: {"--learning_rate": 3e-4, ...}, flags the script takes and their values now.
    Values may be anything float() accepts (tensors, numpy scalars).
    """

    def __init__(self, run_dir, *, task="classification", num_labels=None, vocab_size=None,
                 total_steps=None, batch_size=None, world_size=None, rank=None, attempt=None,
                 resume=False, resumed=None, resume_env=None, checkpoint_dir=None, flags=None):
        env = os.environ
        self.run_dir = str(run_dir)
        self.rank = int(rank if rank is not None else env.get("RANK", env.get("LOCAL_RANK", 0)))
        self.local_rank = int(env.get("LOCAL_RANK", self.rank))
        self.world_size = int(world_size or env.get("WORLD_SIZE", 1))
        self.stacks_file = register_stacks(self.run_dir, self.rank)  # where a hang's stacks go (None: off)
        self.batch_size = batch_size
        self.run_id = uuid.uuid4().hex
        self.ns = self._namespace()  # {"pid_ns", "boot_id"}: whether a watchdog may probe this pid
        self.t0 = time.time()
        self.last_step = None
        self._mark = None  # (step, time) the next sps is measured from
        self._fatal = False
        self.metrics_path = os.path.join(self.run_dir, "metrics.jsonl")
        self.sentinel_path = os.path.join(self.run_dir, "final_val_metrics.json")
        os.makedirs(os.path.join(self.run_dir, "ranks"), exist_ok=True)
        self._rank_fd = self._open(os.path.join(self.run_dir, "ranks", f"rank-{self.rank}.jsonl"))
        self._fd = None
        resume = resume.split() if isinstance(resume, str) else resume
        recipe = [str(w) for w in resume] if isinstance(resume, (list, tuple)) else None
        resume_env = {str(k): str(v) for k, v in resume_env.items()} if resume_env else None
        if resumed is None:
            resumed = resume is True or self._recipe_used(recipe, resume_env)
        if attempt is None:
            attempt = 1 + self._count_starts() if resumed and self.rank == 0 else 1
        self.attempt = int(attempt)
        if self.rank != 0:
            return
        chance = {"classification": num_labels, "lm": vocab_size}.get(task)
        self._fd = self._open(self.metrics_path)
        self._write({"event": "start", "t": 0, "pid": os.getpid(), "run_id": self.run_id,
                     "attempt": self.attempt, "task": task, "num_labels": num_labels,
                     "vocab_size": vocab_size,
                     "chance_loss": round(math.log(chance), 6) if chance and chance > 1 else None,
                     "total_steps": total_steps, "batch_size": batch_size,
                     "world_size": self.world_size, "rank": self.rank, "argv": list(sys.argv),
                     "cwd": os.getcwd(), "python": sys.executable, "launcher": self._launcher(),
                     "resume": recipe, "resume_env": resume_env, "checkpoint_dir": self._dirs(checkpoint_dir),
                     "flags": {str(k): self._num(v) for k, v in flags.items()} if flags else None,
                     "slurm_job_id": env.get("SLURM_JOB_ID"), "slurm": self._slurm(),
                     "host": socket.gethostname(), **self.ns, "time": self.t0})

    # -- the calls a training loop makes
    def step(self, step, loss, *, lr=None, grad_norm=None, sps=None, **extra):
        """One step record (rank 0) and one heartbeat (every rank); returns the step record.
        Only ``step`` and ``loss`` are required: lr, grad_norm, sps and any extra field left out
        (or None) are left out of the record, never written as null ("not measured" is not NaN).
        A non-finite loss, lr or grad norm writes FATAL and raises FloatingPointError: never train
        on after a NaN. sps, unless given: samples per second across all ranks (batch_size x
        world_size) since the last step record or mark(); absent without batch_size."""
        step, now = int(step), time.time()
        loss, lr, grad_norm = self._num(loss), self._num(lr), self._num(grad_norm)
        for name, value in (("loss", loss), ("lr", lr), ("grad_norm", grad_norm)):
            if isinstance(value, float) and not math.isfinite(value):
                reason = f"non-finite {name} {value} at step {step}"
                self.fatal(step, reason)
                raise FloatingPointError(reason + ": lower the learning rate or check the inputs")
        rank_sps = None
        if self.batch_size and self._mark and step > self._mark[0] and now > self._mark[1]:
            rank_sps = round((step - self._mark[0]) * self.batch_size / (now - self._mark[1]), 3)
        if sps is None and rank_sps is not None:
            sps = round(rank_sps * self.world_size, 3)
        self._mark, self.last_step = (step, now), step
        t = round(now - self.t0, 3)
        beat = {"rank": self.rank, "local_rank": self.local_rank, "host": socket.gethostname(), **self.ns,
                "pid": os.getpid(), "step": step, "t": t, "time": round(now, 3)}
        self._append(self._rank_fd, self._given(beat, sps=rank_sps))
        rec = self._given({"step": step, "t": t, "loss": loss}, lr=lr, grad_norm=grad_norm, sps=sps, **extra)
        self._write(rec)
        return rec

    def mark(self, step):
        """Training runs from ``step`` now: the next sps is measured from here. Call it where
        training starts or resumes, and after a checkpoint save; eval() calls it."""
        self._mark = (int(step), time.time())

    def eval(self, step, **metrics):
        """Any eval metrics: keys get an "eval_" prefix when they lack it (loss -> eval_loss); a
        metric given as None is left out. A non-finite eval loss writes FATAL and raises
        FloatingPointError, as a non-finite training loss does."""
        step = int(step)
        rec = self._given({"step": step, "t": round(time.time() - self.t0, 3)},
                          **{k if k.startswith("eval_") else "eval_" + k: v for k, v in metrics.items()})
        loss = rec.get("eval_loss")
        if isinstance(loss, float) and not math.isfinite(loss):
            reason = f"non-finite eval_loss {loss} at step {step}"
            self.fatal(step, reason)
            raise FloatingPointError(reason + ": lower the learning rate or check the inputs")
        self._write(rec)
        self.mark(step)  # eval time is not training throughput

    def expect(self, seconds, why):
        """Announce a long silence (an eval, a checkpoint save) so that it is not a stall."""
        self._write({"event": "expect", "t": round(time.time() - self.t0, 3),
                     "seconds": float(seconds), "why": str(why)})

    def fatal(self, step, reason):
        """Write a FATAL record (rank 0: metrics.jsonl; other ranks: their rank file)."""
        rec = {"step": int(step) if step is not None else self.last_step,
               "t": round(time.time() - self.t0, 3), "FATAL": str(reason)}
        if self.rank == 0:
            self._write(rec)
        else:
            self._append(self._rank_fd, dict(rec, rank=self.rank, pid=os.getpid()))
        self._fatal = True

    def done(self, **final):
        """Write the completion sentinel atomically (rank 0), carrying this run's run_id."""
        if self.rank == 0:
            data = self._given({"run_id": self.run_id, "attempt": self.attempt, "step": self.last_step}, **final)
            fd, tmp = tempfile.mkstemp(prefix=".final.", dir=self.run_dir)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, self.sentinel_path)
        self.close()

    def close(self):
        for fd in (self._fd, self._rank_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._rank_fd = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and not self._fatal and self._rank_fd is not None:
            last = traceback.format_exception_only(exc_type, exc)[-1].strip()
            self.fatal(self.last_step, last)
        self.close()
        return False  # re-raise

    # -- plumbing
    @staticmethod
    def _open(path):
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _write(self, rec):
        if self._fd is not None:
            self._append(self._fd, rec)

    @staticmethod
    def _recipe_used(recipe, env_recipe):
        """True when this command line holds the recipe's words ("{checkpoint}": any path), or
        the environment sets its variables: this launch is a resume."""
        if env_recipe:
            return all(os.environ.get(k) for k in env_recipe)
        if not recipe:
            return False
        args = sys.argv[1:]
        for word in recipe:
            head = word.split("{checkpoint}")[0]
            if "{checkpoint}" in word:
                if head and not any(a.startswith(head) for a in args):
                    return False
            elif word not in args:
                return False
        return True

    @staticmethod
    def _dirs(checkpoint_dir):
        if not checkpoint_dir:
            return None
        if isinstance(checkpoint_dir, (list, tuple)):
            return [os.path.abspath(str(d)) for d in checkpoint_dir] or None
        return os.path.abspath(str(checkpoint_dir))

    @staticmethod
    def _launcher():
        """The words that launched this script under torchrun, to launch it again the same way:
        the parent's command line up to the script (torchrun -> python -m torch.distributed.run),
        else rebuilt from torchrun's variables; None when no launcher ran it."""
        env, argv = os.environ, list(sys.argv)
        if not env.get("TORCHELASTIC_RUN_ID"):
            return None
        try:
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                parent = [w.decode("utf-8", "replace") for w in f.read().split(b"\0")[:-1]]
        except OSError:
            parent = []
        head = parent[:-len(argv)] if argv and len(parent) > len(argv) and parent[-len(argv):] == argv else None
        if head:
            at = next((i for i, w in enumerate(head[:2]) if os.path.basename(w) == "torchrun"), None)
            return head if at is None else [sys.executable, "-m", "torch.distributed.run", *head[at + 1:]]
        local = int(env.get("LOCAL_WORLD_SIZE") or 1)
        nodes = int(env.get("GROUP_WORLD_SIZE") or max(1, int(env.get("WORLD_SIZE") or local) // max(local, 1)))
        head = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={local}"]
        if nodes == 1:
            return head + ["--standalone"]
        return head + [f"--rdzv_id={env['TORCHELASTIC_RUN_ID']}", "--rdzv_backend=c10d",
                       f"--rdzv_endpoint={env.get('MASTER_ADDR', 'localhost')}:{env.get('MASTER_PORT', '29500')}"]

    @staticmethod
    def _namespace():
        """This process's PID namespace (the inode of /proc/self/ns/pid) and the kernel's boot
        (boot_id), read once: a watchdog with the same host name probes this pid only where both
        are its own too (a sidecar container or ``unshare --pid`` shares the name, not the pids).
        Each is left out where /proc does not have it (macOS)."""
        out = {}
        try:
            out["pid_ns"] = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            pass
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read(100).strip()
            if boot:
                out["boot_id"] = boot
        except OSError:
            pass
        return out

    @staticmethod
    def _slurm():
        """The Slurm job's resources, from its variables (to resubmit it alike); None outside a job."""
        env = os.environ
        if not env.get("SLURM_JOB_ID"):
            return None
        names = {"job_name": "SLURM_JOB_NAME", "partition": "SLURM_JOB_PARTITION", "nodes": "SLURM_JOB_NUM_NODES",
                 "ntasks_per_node": "SLURM_NTASKS_PER_NODE", "cpus_per_task": "SLURM_CPUS_PER_TASK",
                 "gpus_per_node": "SLURM_GPUS_ON_NODE", "mem_per_node": "SLURM_MEM_PER_NODE",
                 "account": "SLURM_JOB_ACCOUNT", "qos": "SLURM_JOB_QOS", "submit_dir": "SLURM_SUBMIT_DIR"}
        return {k: env[v] for k, v in names.items() if env.get(v)}

    def _count_starts(self):
        n = 0
        try:
            with open(self.metrics_path, "rb") as f:
                for line in f:
                    if b'"start"' in line:
                        try:
                            n += json.loads(line).get("event") == "start"
                        except (ValueError, AttributeError):
                            pass
        except FileNotFoundError:
            pass
        return n

    @classmethod
    def _given(cls, rec, **fields):
        """``rec`` with each field that has a value (None: not measured, so left out)."""
        rec.update((k, cls._num(v)) for k, v in fields.items() if v is not None)
        return rec

    @staticmethod
    def _num(v):
        """A plain float for anything float() accepts (tensors, numpy); other values unchanged."""
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        try:
            return float(v)
        except (TypeError, ValueError, RuntimeError):
            return v

    @staticmethod
    def _append(fd, rec):
        if fd is not None:
            os.write(fd, (json.dumps(rec, default=str) + "\n").encode())  # one write per line
# --- telemetry: end ---


# What the framework callbacks (supervise.hf, supervise.lightning) let a user override.
OVERRIDES = {"task", "num_labels", "vocab_size", "total_steps", "batch_size", "world_size", "rank", "attempt",
             "resume", "resumed", "resume_env", "checkpoint_dir", "flags"}


def check_overrides(overrides: dict) -> dict:
    """``overrides`` when every key is a ``Telemetry`` argument a callback may set; TypeError
    naming the unknown ones otherwise (a misspelt argument fails at once, not hours later)."""
    unknown = set(overrides) - OVERRIDES
    if unknown:
        raise TypeError(f"TelemetryCallback got unknown arguments {sorted(unknown)}; it takes {sorted(OVERRIDES)}")
    return overrides

"""A real torchrun --nproc_per_node 2 (gloo, CPU) of tests/ddp_loop.py, launched through the
README's shell line with output appended to RUN_DIR/train.log, and the ``job`` fixture that starts
them and ends them (tests/test_torchrun.py, tests/test_namespace.py import both)."""
import os
import re
import signal
import sys
from pathlib import Path

import psutil
import pytest

from conftest import end_group, launch_line, missing, need, shell, wait_for
from supervise.observe.ranks import RankFiles

LOOP = Path(__file__).parent / "ddp_loop.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


class Job:
    """torchrun --nproc_per_node 2 tests/ddp_loop.py ARGS into ``run_dir``."""

    def __init__(self, run_dir: Path, *args):
        self.run_dir, self.log = run_dir, run_dir / "train.log"
        self.proc = shell(launch_line([TORCHRUN, "--nproc_per_node", 2, LOOP, "--out", run_dir, *args], run_dir))
        self.files = RankFiles(run_dir)

    def ranks(self):
        return self.files.poll()

    def worker_pids(self) -> list[int]:
        found = re.findall(r"^rank \d+/\d+ pid (\d+) started", self.log.read_text() if self.log.exists() else "", re.M)
        return sorted({int(p) for p in found} | {s.pid for s in self.ranks().values() if s.pid})

    def wait_for_steps(self, n=2, timeout=180):
        return wait_for(lambda: (ranks := self.ranks()) and len(ranks) == 2 and
                        all(s.records >= n for s in ranks.values()) and ranks,
                        f"the two ranks' heartbeats of {n} steps", timeout, tick=0.2, proc=self.proc,
                        why=lambda: self.log.read_text()[-3000:])

    def signal_workers(self, sig) -> None:
        """``sig`` to each worker (torchrun starts each in a session of its own)."""
        for pid in self.worker_pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill_all(self) -> None:
        """SIGKILL of the whole trainer: the launch line's shell and torchrun (their process group),
        then the workers, so that nothing reports the death."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.signal_workers(signal.SIGKILL)
        self.proc.wait()

    def freeze_at_one_step(self, timeout=60) -> dict:
        """Stop both workers where their heartbeats show the same step (a kill of the whole job
        between two ranks' writes of one step would leave one a step behind: that is rank_hang's
        case, not a whole-job stall): the frozen ranks."""
        def frozen():
            self.signal_workers(signal.SIGSTOP)
            wait_for(lambda: all(_stopped(p) for p in self.worker_pids()), "the workers to stop", 30)
            ranks = self.ranks()
            if len({s.step for s in ranks.values()}) == 1:
                return ranks
            self.signal_workers(signal.SIGCONT)
            return None
        return wait_for(frozen, "both ranks stopped at the same step", timeout, tick=0.3)

    def close(self):
        self.signal_workers(signal.SIGCONT)
        self.signal_workers(signal.SIGKILL)
        end_group(self.proc)


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


@pytest.fixture
def job(tmp_path):
    """job(*args): a started Job in tmp_path/runN; every one ended after the test."""
    need("torch")
    if not TORCHRUN.exists():
        missing(f"torchrun is not installed next to this Python ({TORCHRUN}): torch's install puts it there")
    made = []

    def start(*args):
        j = Job(tmp_path / f"run{len(made)}", *args)
        made.append(j)
        return j

    yield start
    for j in made:
        j.close()

"""One look at a run, as check-in, smoke and plot take it: the watchdog's observer once, then the
judge. The only module of the judge layer that reads files (watchdog.json, through the observer)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from supervise.judge.table import RECORD_RULES, judge
from supervise.observe.observer import Observer
from supervise.observe.probes import same_process
from supervise.observe.state import WatchState
from supervise.contract import read_json
from supervise.thresholds import Thresholds
from supervise.vocabulary import GOING_ON, WATCHDOG_STATE

def assess(run_dir, thresholds: Optional[Thresholds] = None, gpu=None, pids=(),
           job: Optional[tuple] = None) -> tuple:
    """One look at the run as it is now, judged by the watchdog's rules: (observer, observation,
    verdict). It reads the run's watchdog.json first: the thresholds, the job followed (``job``:
    (engine, job id)) and checkpoint
    folders of its watchdog (unless given), whether it lives (a live watchdog has seen the middle
    of the file: the look reads its head and tail only) and the verdict it ended on, which is
    the verdict while it is about the same attempt (it saw every record; one look may not)."""
    wd = WatchState.from_json(read_json(Path(run_dir) / WATCHDOG_STATE))
    th = thresholds or Thresholds.from_dict(wd.thresholds if wd else None)
    th = dataclasses.replace(th, orphan_grace=0.0, rank_grace=0.0)
    ckpt_dirs = tuple(wd.checkpoint_dirs) if wd else ()
    watched = bool(wd and wd.watchdog_pid and wd.state in GOING_ON
                   and same_process(wd.watchdog_pid, wd.watchdog_create_time))
    observer = Observer(run_dir, th, RECORD_RULES, pids=pids, gpu=gpu, one_shot=True,
                        job=job or ((wd.engine, wd.job_id) if wd and wd.engine and wd.job_id else None),
                        notable=not watched, checkpoint_dirs=ckpt_dirs, watchdog_state=wd)
    obs = observer.observe()
    return observer, obs, judge(obs, th)


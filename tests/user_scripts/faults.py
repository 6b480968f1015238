"""Faults for the user scripts, from the environment (never from the command line, so that a
relaunch line built from the start record's argv runs without them):

    FAULT_NAN_AT=N   the model's weights turn NaN after optimizer step N (first attempt only:
                     a relaunch of the same run directory is a later attempt)
    FAULT_SLEEP=S    seconds of sleep per step, to keep a run alive for a signal
"""
import os
import time


def step_done(step: int, params) -> None:
    """Call after optimizer step ``step`` with the model's parameters."""
    time.sleep(float(os.environ.get("FAULT_SLEEP") or 0))
    at = os.environ.get("FAULT_NAN_AT")
    if at and step == int(at):
        import torch
        with torch.no_grad():
            for p in params:
                p.fill_(float("nan"))

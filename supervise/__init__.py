"""supervising-training-runs: telemetry contract, anomaly rules and the tools around them.

The hot paths (watchdog, check-in, hooks) use only the standard library, plus psutil and
nvidia-ml-py when they are installed."""
__version__ = "0.1.0"

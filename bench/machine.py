"""What a benchmark ran on, for the line every bench script prints."""

from __future__ import annotations


def cpu_model(default: str) -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else ``default``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default

"""``torch_spyre.profiler``: the public name of :mod:`torch_spyre.runtime.profiler` (as ``torch.profiler``).

    with torch_spyre.profiler.profile() as prof:
        ...
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=10))
"""

from .runtime.profiler import (  # noqa: F401 - re-exported
    ENGINE_ORDER,
    EngineInterval,
    EventAverage,
    KeyAverages,
    chrome_trace,
    kernel_intervals,
    profile,
    render_timeline,
)

__all__ = ["ENGINE_ORDER", "EngineInterval", "EventAverage", "KeyAverages", "chrome_trace", "kernel_intervals",
           "profile", "render_timeline"]

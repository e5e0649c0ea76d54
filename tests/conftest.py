"""Suite-wide test ordering.

Slow (tier 2) tests run first: with pytest-xdist (`-n auto --dist worksteal`, the README's command) the
longest tests then start while the many short ones fill the other workers, and an idle worker steals
queued tests, instead of one long test running alone at the end of the run. The sort
is stable, so each tier keeps its collection order (the same on every worker, as xdist requires).
"""

from __future__ import annotations


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)

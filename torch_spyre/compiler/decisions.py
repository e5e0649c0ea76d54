"""What the compiler decided for one kernel, in a form a person can read.

Every program generator fills a :class:`KernelDecisions` next to the program it emits and stores it in
``program.metadata["decisions"]`` (as :meth:`KernelDecisions.to_dict`). ``TORCH_SPYRE_DEBUG=1`` writes
both the program and :meth:`KernelDecisions.format` for each kernel; the ``spyre run`` report and the
profiler read the same record. Provenance points back to the ATen ops and source lines the kernel
came from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class BufferDecision:
    name: str
    role: str  # "input", "output", "intermediate", "weight"
    layout: str  # StickLayout.describe()
    relayout_from: str | None = None  # the producer's layout, when a relayout was inserted


@dataclass
class KernelDecisions:
    kernel: str
    kind: str  # "pointwise", "reduction", "matmul", "attention", "gather", "relayout", ...
    source_ops: list[str] = field(default_factory=list)  # ATen ops, e.g. "aten.add.Tensor"
    source_lines: list[str] = field(default_factory=list)  # "file.py:123 in forward: x = a + b"
    buffers: list[BufferDecision] = field(default_factory=list)
    work_division: dict[str, Any] = field(default_factory=dict)  # e.g. {"cores": 32, "split": {"M": 8, "N": 4}}
    # How many cores the work is worth (compiler/core_count.py's CoreCount.to_dict(): cores, work_cycles,
    # min_cycles_per_core, available, why).
    core_count: dict[str, Any] = field(default_factory=dict)
    tiling: dict[str, Any] = field(default_factory=dict)  # e.g. {"tile": [64, 128], "steps": 16}
    scratchpad: dict[str, Any] = field(default_factory=dict)  # {"peak_bytes": ..., "capacity": ..., "buffers": {...}}
    overlap: dict[str, Any] = field(default_factory=dict)  # e.g. {"double_buffered": ["a", "b"]}
    alternatives: list[dict[str, Any]] = field(default_factory=list)  # candidates considered, with estimates
    # Ops of the graph folded into this kernel, e.g. {"epilogue": ["bias", "gelu", "residual"], ...}
    fusion: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelDecisions":
        d = dict(d)
        d["buffers"] = [BufferDecision(**b) for b in d.get("buffers", [])]
        return cls(**d)

    def format(self) -> str:
        lines = [f"kernel {self.kernel} ({self.kind})"]
        if self.source_ops:
            lines.append("  from ops: " + ", ".join(self.source_ops))
        for s in self.source_lines:
            lines.append(f"    at {s}")
        for b in self.buffers:
            extra = f"  (relayout from {b.relayout_from})" if b.relayout_from else ""
            lines.append(f"  {b.role:<12} {b.name}: {b.layout}{extra}")
        if self.core_count:
            lines.append(f"  cores: {self.core_count['cores']} ({self.core_count['why']})")
        for title, d in (("work division", self.work_division), ("tiling", self.tiling),
                         ("scratchpad", self.scratchpad), ("overlap", self.overlap), ("fusion", self.fusion)):
            if d:
                lines.append(f"  {title}: " + ", ".join(f"{k}={v}" for k, v in d.items()))
        for a in self.alternatives:
            lines.append(f"  considered: {a}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)

"""The card's cost formulas, in one place: the timing model (``card/timing/``) charges them and every
generator's plan estimate uses them, so an estimate cannot drift from the model that judges it.

All take the card configuration and plain sizes (no instructions), so a generator can price a plan
before it has written any program.
"""

from __future__ import annotations

from .config import CardConfig


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pe_simd(cfg: CardConfig, dtype: str) -> int:
    """MACs per PE per cycle for the operand type (fp32 at half the fp16 rate, int8 at twice)."""
    simd = cfg.pe_simd_fp16
    if dtype == "float32":
        return max(1, simd // 2)
    if dtype in ("int8", "uint8"):
        return simd * 2
    return simd


def pe_fill_cycles(cfg: CardConfig) -> int:
    """The systolic fill and drain every weight tile pays on top of the rows it streams."""
    return cfg.pe_rows + cfg.pe_cols + cfg.mac_latency_cycles


def pe_matmul_cycles(cfg: CardConfig, m: int, k: int, n: int, dtype: str = "dlfloat16", batch: int = 1) -> int:
    """PE-array cycles of ``batch`` [m, k] @ [k, n] products, weight stationary: the ``pe_rows x
    (pe_cols * simd)`` weight tiles are split across the corelets; each streams the m rows plus fill and
    drain. The first weight tile is loaded (one row per cycle) before streaming; later ones load behind."""
    tiles = batch * ceil_div(k, cfg.pe_rows) * ceil_div(n, cfg.pe_cols * pe_simd(cfg, dtype))
    return ceil_div(tiles, cfg.corelets_in_use) * (m + pe_fill_cycles(cfg)) + cfg.pe_rows


def vector_cycles(cfg: CardConfig, elements: int, itemsize: int, transcendental: bool = False) -> int:
    """Vector-unit cycles: one 128-byte stick per cycle per corelet for 2-byte types (time scales with the
    bytes processed), times ``1 + vector_transcendental_cycles`` for transcendental ops."""
    cycles = ceil_div(elements * itemsize, 2 * cfg.vector_fp16_per_cycle * cfg.corelets_in_use)
    return cycles * (1 + cfg.vector_transcendental_cycles) if transcendental else cycles


def ring_path(src: int, dst: int, n: int) -> list[tuple[str, int]]:
    """Ring links crossed from stop ``src`` to stop ``dst`` of an ``n``-stop ring, the short way round
    (clockwise on a tie): ``[(direction, stop the link leaves), ...]``."""
    cw, ccw = (dst - src) % n, (src - dst) % n
    if cw == 0:
        return []
    if cw <= ccw:
        return [("cw", (src + k) % n) for k in range(cw)]
    return [("ccw", (src - k) % n) for k in range(ccw)]


def ring_hop_seconds(cfg: CardConfig, hops: int) -> float:
    return hops * cfg.ring_hop_latency_cycles / cfg.clock_hz


"""Numbers for people: byte sizes and SI-prefixed quantities, the one formatter every report uses.

Reports (``ProfileReport.__str__``), the CLI tables, the Jupyter HTML and the agent summaries all
print through these two functions, so a latency or a size reads the same everywhere.
"""

from __future__ import annotations

_SI = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units; whole bytes below 1 KiB).

    Example::

        >>> human_bytes(3 * 1024 ** 2)
        '3.0 MiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_number(value: float | str | None, unit: str = "") -> str:
    """Three significant digits with an SI prefix: ``2.5e9, "FLOP/s"`` -> ``"2.5 GFLOP/s"``.

    ``None`` is ``"-"`` (not measured) and a string is returned as is (a reason in place of a value).

    Example::

        >>> human_number(0.000123), human_number(12_300, "B/s"), human_number(None)
        ('0.000123', '12.3 kB/s', '-')
    """
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    for prefix, scale in _SI:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()

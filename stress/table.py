"""Rows of the stress table and their rendering."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    name: str
    tried: int = 0
    survived: int = 0
    lost: int = 0
    wrong: int = 0
    executed: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def record(self, problem: str | None) -> None:
        """One attempt: it survived (``None``), or it went wrong and ``problem`` says how (a note)."""
        self.tried += 1
        if problem is None:
            self.survived += 1
        else:
            self.wrong += 1
            self.notes.append(problem[:300])

    @property
    def clean(self) -> bool:
        return self.survived == self.tried and not (self.lost or self.wrong or self.executed)


HEADER = "| row | tried | survived | lost | wrong | executed | seconds | notes |"


def render(rows: list[Row]) -> str:
    lines = [HEADER, "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        notes = "; ".join(r.notes[:3]).replace("|", "/").replace("\n", " ")
        lines.append(f"| {r.name} | {r.tried} | {r.survived} | {r.lost} | {r.wrong} | {r.executed} | "
                     f"{r.seconds:.0f} | {notes[:300]} |")
    return "\n".join(lines)

"""Options shared by the commands, declared once so every command spells them the same way.

Values are parsed where they are used (:mod:`modulelens.interfaces.session`): a bad ``--dtype``
or a ``--device`` this machine lacks is a :class:`~modulelens.errors.UsageError` (exit 2) that
``--json`` reports as a JSON error.
"""

from __future__ import annotations

from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (docs/cli-json.md) instead of tables.")]
RepoOpt = Annotated[str | None, typer.Option(
    "--repo", help="Repo directory or URL such as s3://bucket/prefix (default: $MODULELENS_REPO or ~/.cache/modulelens/repo).")]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="Run on this device (cpu, cuda, cuda:1).")]
DtypeOpt = Annotated[str | None, typer.Option(
    "--dtype", help="Cast floating weights and inputs (float32, bfloat16, ...).")]
RtolOpt = Annotated[float | None, typer.Option("--rtol", help="Relative tolerance (default: by dtype).")]
AtolOpt = Annotated[float | None, typer.Option("--atol", help="Absolute tolerance (default: by dtype).")]
StoreOpt = Annotated[bool, typer.Option("--store/--no-store", help="Keep the report with the capture's version.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
TrustOpt = Annotated[bool | None, typer.Option(
    "--trust-source/--no-trust-source",
    help="Run source code stored with the capture for classes not importable here (default: the repo's "
         "`modulelens trust` setting, off). Only for captures you trust: see docs/security.md.")]

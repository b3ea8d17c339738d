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
UlpsOpt = Annotated[str | None, typer.Option(
    "--ulps", help="Floating outputs within N ULPs of the expected ones, elementwise: one number, or "
                   "bfloat16=2,float32=64 per dtype (instead of --rtol/--atol).")]
OracleFactorOpt = Annotated[float | None, typer.Option(
    "--oracle-factor", help="k of the oracle rule: the candidate's error against a float64 run within k times the "
                            "reference's own (default: 4 for float32, 3 for 16- and 8-bit floats).")]
StoreOpt = Annotated[bool, typer.Option("--store/--no-store", help="Keep the report with the capture's version.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
TrustOpt = Annotated[bool | None, typer.Option(
    "--trust-source/--no-trust-source",
    help="Run source code stored with the capture for classes not importable here (default: the repo's "
         "`modulelens trust` setting, off). Only for captures you trust: see docs/security.md.")]

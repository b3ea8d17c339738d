"""A real notebook executed by nbclient on a real ipykernel: load the extension, a capture, replay."""

from __future__ import annotations

from pathlib import Path

import agents_support as support
import pytest

from modulelens.interfaces.html import FAIL_COLOR, PASS_COLOR

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")


def outputs_of(cell: dict) -> tuple[str, list[dict]]:
    """(all stream text, rich outputs) of an executed cell; fails on error outputs."""
    errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{cell['source']!r}: {errors[0]['ename']}: {errors[0]['evalue']}"
    text = "".join(o["text"] for o in cell["outputs"] if o["output_type"] == "stream")
    rich = [o for o in cell["outputs"] if o["output_type"] in ("execute_result", "display_data")]
    return text, rich


CANDIDATES = """
from agents_support import Gate


class OffByOne(Gate):
    def forward(self, x, mask=None):
        out, gate = super().forward(x, mask)
        return out + 1, gate
"""


def test_notebook_loads_and_replays_a_capture(tmp_path: Path) -> None:
    from nbformat.v4 import new_code_cell, new_notebook

    repo = support.make_repo(tmp_path / "repo")
    cells = [
        "import modulelens, sys\nprint(modulelens.__file__)",
        "%load_ext modulelens",
        f"%ml_ls --repo {repo}",
        f"%ml_load toy/gate --repo {repo}",
        "capture",
        "module(*args, **kwargs)[0].shape",
        "%ml_replay capture",
        "module.down.bias.data += 1\n%ml_replay capture --current-weights",
        "%ml_replay no/such --repo " + str(repo),
        # a plain kernel: HTML without %load_ext (formatters registered by `import modulelens`)
        f"%unload_ext modulelens\ncap = modulelens.load('toy/head', repo={str(repo)!r})\ncap",
        "%load_ext modulelens\n"
        f"open('cands.py', 'w').write({CANDIDATES!r})\n"
        f"%ml_verify toy/gate --candidate cands.py:OffByOne --no-timing --repo {repo}",
        f"%ml_profile toy/head --iters 3 --warmup 1 --batch-sizes 1,4 --repo {repo}",
    ]
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120, allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=support.subprocess_env(tmp_path))

    text, _ = outputs_of(nb.cells[0])
    assert text.strip() == str(support.WORKTREE / "modulelens" / "__init__.py")  # the kernel runs this worktree
    outputs_of(nb.cells[1])
    _, rich = outputs_of(nb.cells[2])
    assert "toy/gate:v1" in rich[0]["data"]["text/html"]
    text, _ = outputs_of(nb.cells[3])
    assert "loaded toy/gate:v1" in text and all(f"  {n} " in text for n in ("capture", "module", "args", "kwargs"))
    _, rich = outputs_of(nb.cells[4])
    html = rich[0]["data"]["text/html"]
    assert '<div class="modulelens"' in html and ">output[1]</td>" in html and ">std</th>" in html
    assert rich[0]["data"]["text/plain"] == "<Capture toy/gate:v1 Gate: 2 call(s), 1 state(s)>"
    _, rich = outputs_of(nb.cells[5])
    assert rich[0]["data"]["text/plain"] == "torch.Size([3, 8])"
    _, rich = outputs_of(nb.cells[6])
    html = rich[0]["data"]["text/html"]
    assert PASS_COLOR in html and ">PASS<" in html and "bit-exact" in html
    assert rich[0]["data"]["text/plain"].startswith("replay toy/gate:v1 on cpu (bit-exact, recorded weights): PASS")
    _, rich = outputs_of(nb.cells[7])
    html = rich[0]["data"]["text/html"]
    assert FAIL_COLOR in html and ">FAIL<" in html
    # IPython shows a UsageError as one line on stderr, without a traceback
    [stream] = nb.cells[8]["outputs"]
    assert stream["name"] == "stderr" and stream["text"].startswith("UsageError: no capture named 'no/such'")
    assert "Traceback" not in stream["text"] and stream["text"].count("\n") == 1
    _, rich = outputs_of(nb.cells[9])
    assert '<div class="modulelens"' in rich[0]["data"]["text/html"]  # no extension loaded in this cell
    _, rich = outputs_of(nb.cells[10])
    html = rich[0]["data"]["text/html"]
    assert html.index(">FAIL<") < html.index("output[0]") < html.index("<table")  # verdict, failures, table
    assert rich[0]["data"]["text/plain"].startswith("verify ")
    _, rich = outputs_of(nb.cells[11])
    html = rich[0]["data"]["text/html"]
    assert html.index("median") < html.index("<table") and "data:image/png;base64," in html

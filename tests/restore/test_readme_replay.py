"""The README's "Restore and replay anywhere" block, run as written (issue 22, defect 6), in a fresh
process, on captures whose direct call used to go wrong: a transformers attention whose
``DynamicCache`` input the call appends to (the stored inputs grew, and a later replay failed), an
``nn.TransformerEncoder`` recorded under ``no_grad`` (another fast path with grad), dropout in
training mode (RNG) and CPU autocast. ``out`` must equal ``call.output`` bit for bit and the
replay after it must pass."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from child_process import PYTHON, REPO_ROOT, subprocess_env
from torch import nn

import modulelens

CHECK = '''
import json
from modulelens.restore.compare import compare
leaves = compare(call.output, out, exact=True)
print(json.dumps({"out_equals_output": all(leaf.passed and leaf.compared for leaf in leaves),
                  "replay": report.status, "calls": len(cap.calls), "report": str(report)}))
'''


def readme_block() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("### Restore and replay anywhere"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _llama_attention() -> tuple[nn.Module, str, Any]:
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config)

    def drive(m: nn.Module) -> None:
        out = m(torch.randint(0, 64, (1, 6)))  # caches on, by default
        m(torch.randint(0, 64, (1, 1)), past_key_values=out.past_key_values)
    return model, "model.layers.0.self_attn", drive


def _encoder_no_grad() -> tuple[nn.Module, str, Any]:
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2)).eval()

    def drive(m: nn.Module) -> None:
        with torch.no_grad():
            m(torch.randn(2, 5, 16))
    return model, "0", drive


def _dropout_train() -> tuple[nn.Module, str, Any]:
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.GELU(), nn.Linear(16, 4)))
    return model, "0", lambda m: m(torch.randn(3, 8)).sum().backward()


def _autocast() -> tuple[nn.Module, str, Any]:
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))

    def drive(m: nn.Module) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(torch.randn(3, 8))
    return model, "0", drive


CASES = {"llama_attention_cache": _llama_attention, "transformer_encoder_no_grad": _encoder_no_grad,
         "dropout_train": _dropout_train, "cpu_autocast": _autocast}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_readme_block_runs_as_written_and_out_equals_the_recorded_output(tmp_path: Path, case: str) -> None:
    torch.manual_seed(0)
    model, target, drive = CASES[case]()
    repo = modulelens.Repo(tmp_path / "repo")
    with modulelens.capture(model, targets=[target], repo=repo, name="ranker", strict=True) as cap:
        drive(model)
    [saved] = cap.saved
    # as written, with this capture's name for the README's "ranker/top_mlp" (the README imports
    # modulelens in its first block)
    block = readme_block()
    assert 'modulelens.load("ranker/top_mlp")' in block
    script = "import modulelens\n" + block.replace('"ranker/top_mlp"', json.dumps(saved.name)) + CHECK
    result = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env=subprocess_env(MODULELENS_REPO=str(repo.root)))
    assert result.returncode == 0, result.stderr[-3000:]
    checked = json.loads(result.stdout.strip().splitlines()[-1])
    assert checked["out_equals_output"], checked["report"]
    assert checked["replay"] == "PASS", checked["report"]


def test_a_direct_call_cannot_change_the_stored_inputs(repo: modulelens.Repo) -> None:
    model, target, drive = _llama_attention()
    with modulelens.capture(model, targets=[target], repo=repo, name="attn", strict=True,
                            record=modulelens.Recording(max_calls=2)) as cap:
        drive(model)
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    call = loaded.calls[1]  # the decode step: its cache holds the prefill's keys
    [name] = [k for k, v in call.kwargs.items() if type(v).__name__.endswith("Cache")]
    before = call.kwargs[name].get_seq_length()
    assert before == 6  # the prefill's entries
    for _ in range(2):
        with call.context():
            loaded.module(*call.args, **call.kwargs)  # appends to the cache it is given
    assert call.kwargs[name].get_seq_length() == before
    assert call.kwargs["hidden_states"] is not call.kwargs["hidden_states"]  # a new copy each time
    assert loaded.payload_of(call.kwargs["hidden_states"]) is not None  # copies still name their payload
    assert loaded.replay().passed

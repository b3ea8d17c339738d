"""A call input that required grad in the job is given to the replay requiring grad too.

Some kernels choose their path by ``requires_grad``: CPU attention with a bias that requires grad
rounds differently (found by the census as a wrong value on transformers' udop, whose T5-style
position bias is computed from a parameter). Captured and replayed in fresh processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import sys, torch, torch.nn.functional as F, modulelens

    class Attention(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(width, width) for _ in range(3))

        def forward(self, x, bias):
            b, t, d = x.shape
            q, k, v = (m(x).view(b, t, 4, d // 4).transpose(1, 2) for m in (self.q, self.k, self.v))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(b, t, d)

    class Net(torch.nn.Module):
        def __init__(self, width=64, tokens=33):
            super().__init__()
            self.relative = torch.nn.Parameter(torch.randn(1, 4, tokens, tokens))
            self.attn = Attention(width)

        def forward(self, x):
            return self.attn(x, self.relative * 1.0)  # an activation that requires grad, as a position bias

    torch.manual_seed(0)
    with modulelens.track_init():
        net = Net().eval()  # eval, grad mode on: the bias still requires grad
    with modulelens.capture(net, targets=["attn"], repo=sys.argv[1], name="bias"):
        net(torch.randn(3, 33, 64))
''')

REPLAY = textwrap.dedent('''
    import json, sys, torch, modulelens
    cap = modulelens.load("bias/attn", repo=sys.argv[1])
    report = cap.replay()
    call = cap.calls[0]
    args = call.args
    with call.context():
        direct = cap.module(*args)
        without = cap.module(args[0], args[1].detach())
    print(json.dumps({"passed": report.passed, "exact": report.status == "PASS" and report.mode == "bit-exact",
                      "direct": torch.equal(direct, call.output), "bias_requires_grad": args[1].requires_grad,
                      "bias_is_leaf": args[1].is_leaf, "without_flag_differs": not torch.equal(without, call.output)}))
''')


def test_an_input_that_required_grad_replays_bit_exact(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    (tmp_path / "job.py").write_text(SCRIPT)
    subprocess.run([sys.executable, "job.py", repo], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    meta = json.loads(next((tmp_path / "repo" / "names").glob("*/versions/1/capture.json")).read_text())
    inputs = json.dumps(meta["calls"][0]["inputs"])
    flagged = [tid for tid, entry in meta["tensors"].items() if entry.get("requires_grad") and f'"{tid}"' in inputs]
    assert len(flagged) == 1  # the bias, not x
    done = subprocess.run([sys.executable, "-c", REPLAY, repo], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["passed"] and result["exact"] and result["direct"], result
    assert result["bias_requires_grad"] and not result["bias_is_leaf"]  # an activation, as in the job
    # the point of recording it: without the flag this kernel gives other values on this machine
    # (if a torch build ever rounds both the same, the replay above still had to be bit-exact)
    print("without the flag the output differs:", result["without_flag_differs"])

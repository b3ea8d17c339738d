import shutil
import sys

import torch
from torch import nn

import modulelens

out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True)
modulelens.track_init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(approximate="tanh"), nn.Dropout(0.25), nn.Linear(8, 3, bias=False))
model.train()
with modulelens.capture(model, targets=["Sequential"], name="golden", repo=out, record=modulelens.Recording(max_calls=2)) as cap:
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4) / 7
    model(x)
    model.eval()
    with torch.no_grad():
        model(x[:1] * -1)
print([v.ref for v in cap.saved])

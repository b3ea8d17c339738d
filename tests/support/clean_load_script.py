"""A training script with a neural ODE (torchdiffeq's ``dopri5``), as its users write one: the
classes live in the script, so a load rebuilds them from the source stored with the capture, and
that source imports torchdiffeq (tests/restore/test_clean_load.py).

``python clean_load_script.py REPO`` trains two steps under capture and prints the capture's ref.
"""

import sys

import torch
import torchdiffeq
from torch import nn

import modulelens


class ODEFunc(nn.Module):
    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 16), nn.Tanh(), nn.Linear(16, dim))

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(y)


class NeuralODE(nn.Module):
    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        self.func = ODEFunc(dim)
        self.register_buffer("times", torch.tensor([0.0, 0.5, 1.0]))

    def forward(self, y0: torch.Tensor) -> torch.Tensor:
        return torchdiffeq.odeint(self.func, y0, self.times, method="dopri5")[-1]


if __name__ == "__main__":
    modulelens.track_init()
    torch.manual_seed(0)
    model = NeuralODE()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with modulelens.capture(model, targets="", repo=sys.argv[1], name="clean/ode",
                            record=modulelens.Recording(max_calls=2)) as cap:
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(3, 4)).pow(2).mean().backward()
            optimizer.step()
    print(cap.saved[0].ref)

# A training script as people write them: classes, helpers and the loop all at top level, no
# `if __name__ == "__main__":` guard. The zoo runs it unmodified under `modulelens run`.
import torch
from torch import nn

HIDDEN = 16
torch.manual_seed(0)


def make_norm(width):
    return nn.LayerNorm(width)


class Block(nn.Module):
    def __init__(self, width, expansion=2):
        super().__init__()
        self.norm = make_norm(width)
        self.up = nn.Linear(width, expansion * width)
        self.down = nn.Linear(expansion * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.down(self.drop(torch.relu(self.up(self.norm(x)))))


class Net(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


model = Net(HIDDEN, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(32, HIDDEN)
target = data.sum(-1, keepdim=True)
for _step in range(3):
    loss = nn.functional.mse_loss(model(data), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.4f}")

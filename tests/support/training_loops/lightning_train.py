# A Lightning training job as its users write it: a LightningModule that logs with self.log
# (metrics go through Lightning's ResultMetric modules), no main guard.
import lightning as L  # noqa: N812 - as Lightning's own examples write it
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self, dim: int = 8, hidden: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 2))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x):
        return self.body(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", (self(x).argmax(-1) == y).float().mean(), on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Classifier(), DataLoader(data, batch_size=16))
print("TRAINED", float(trainer.callback_metrics["train_loss"]), flush=True)

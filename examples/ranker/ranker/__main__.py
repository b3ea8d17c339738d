"""``python -m ranker [--config prod.yaml] [--steps N]``: the training job (also under torchrun)."""

from ranker.training import main

main()

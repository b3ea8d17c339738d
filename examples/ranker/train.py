"""The training script: ``python train.py [--config prod.yaml] [--steps N]`` (also under torchrun)."""

from ranker.training import main

main()

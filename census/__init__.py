"""The fidelity census (issue 22): whole registries captured and replayed, not a hand-picked list.

``python -m census`` sweeps every family (transformers architectures from shrunk configs, timm,
torch_geometric.nn layers, diffusers models, peft adapters, torch.nn modules, torchrec's jagged
tensors; and, issue 34, the module classes of kornia, MONAI, e3nn, neuraloperator, normflows,
vector-quantize-pytorch, x-transformers and einops, sentence-transformers, TorchRL and TensorDict,
torchaudio, and a neural ODE block per torchdiffeq solver): each target is built, run the way its
users run it (library defaults, train and eval, caches on) under ``modulelens.capture``, and each
capture is reloaded and replayed in a fresh process. Every target ends bit-exact or with a named failure category (``census/outcomes.py``).

Layout: ``targets.py`` (what a family yields), ``families/`` (one module per registry),
``construct.py`` (construction by signature, the classes a package exports), ``shims/`` (how
torchrec and torchaudio import with this torch), ``worker.py`` (the capturing process, one per
family), ``run.py`` (the driver: capture worker, then one fresh replay process per family, both
resumed past a crash), ``outcomes.py`` (categories, the table), ``known.py`` (documented
limitations and open defects).
"""

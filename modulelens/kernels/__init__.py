"""Kernels for captured modules: KernelBench/KernelAgent export and the kernel verifier (docs/kernels.md).

One job per module:

- :mod:`.problems`: which recorded calls make a problem, bound to ``forward``'s parameters;
- :mod:`.render`: recorded values as Python source; :mod:`.inline`: the class-source inliner;
- :mod:`.template`: the ``problem.py`` / ``test_modulelens.py`` texts; :mod:`.export`: the exporter;
- :mod:`.static_check`: the AST check of candidates (the aten-op counter of its run-time twin is
  :mod:`modulelens.format.op_watch`);
- :mod:`.options`: the verifier's option groups (:class:`KernelChecks`, :class:`CandidatePolicy`);
- :mod:`.verify`: the verifier, which runs :mod:`.worker_reference` and :mod:`.worker_candidate`
  through :mod:`.process` and passes data with :mod:`.exchange`.
"""

from modulelens.kernels.export import ExportResult, export_kernelbench
from modulelens.kernels.options import CandidatePolicy, KernelChecks
from modulelens.kernels.static_check import ReferenceInfo, StaticReport, check_source
from modulelens.kernels.verify import KernelReport, read_candidate, verify_kernel

__all__ = [
           "CandidatePolicy",
           "ExportResult",
           "KernelChecks",
           "KernelReport",
           "ReferenceInfo",
           "StaticReport",
           "check_source",
           "export_kernelbench",
           "read_candidate",
           "verify_kernel",
]

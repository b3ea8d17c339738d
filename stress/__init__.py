"""The stress suite: crashes, races, damaged and hostile files, full disks (``python -m stress``).

Each row of its table says how many times something was tried and how it ended: ``survived``
(no error outside modulelens's own, no hang, the job finished), ``lost`` (a version a save reported
as saved is gone, or captures vanished without a warning saying where they are), ``wrong`` (data
that loads but is not what was stored, a write or delete outside the repo, an unrelated crash) and
``executed`` (code named by or stored in a capture ran without trust). Results: docs/reliability.md.
"""

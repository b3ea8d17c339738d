"""``modulelens ui``: a local web app over any repo, and ``modulelens report``: one capture as a
self-contained HTML file (docs/ui.md).

The web stack (Starlette, uvicorn, Jinja2) is the optional extra ``modulelens[ui]`` and is imported
only by :mod:`.server` and :mod:`.render`; :mod:`.discovery` (which ``modulelens show`` uses to
print a running UI's link) imports neither, and neither does this package.
"""

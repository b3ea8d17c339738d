"""One capture as a self-contained HTML file: ``modulelens report NAME -o x.html`` and the capture
page's "save as one HTML file" link.

The file is the capture page (its first page of calls, parameters and leaves, as the server shows
it, each list counted) with the call tensors' histograms drawn in (there is no server to ask when
one is clicked; the first 200) and the version's newest reports below it, plots included as
``data:`` images; its
stylesheet is inline and allowed by hash, it has no script, and its own Content-Security-Policy
forbids fetching anything (:func:`.render.standalone_csp`), so it can be attached to a review and
opened anywhere, offline.
"""

from __future__ import annotations

from modulelens.interfaces.ui import pages, render, report_pages
from modulelens.interfaces.ui.repo_view import RepoView, StoredCapture


def standalone_html(view: RepoView, capture: StoredCapture) -> str:
    """The self-contained HTML of ``capture`` and its reports.

    Example::

        view = RepoView(Repo("/data/captures"), scan_jobs=False)
        html = standalone_html(view, view.capture("demo/top_mlp", 1))
    """
    found = view.reports(capture.name, capture.version)
    return render.standalone_page(pages.capture_page(view, capture, histograms=True, reports=found),
                                  report_pages.reports_page(view, capture, found=found))

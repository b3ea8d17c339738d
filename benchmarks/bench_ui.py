"""Server-side render time of the web UI's pages, against the obvious alternatives in the same run.

    python benchmarks/bench_ui.py [--rounds 7] [--versions 2000[,100000...]] [--names 200] [--gib 1.0] [--repo-only]

* The repo page of --versions versions under --names names (the whole request through the app:
  routing, the guard, the listing, the template; Starlette's in-process test client, no socket), its
  first page (500 rows), its first byte and whole first page through a socket from a real server
  (``modulelens ui``, once its background read of the jobs is done: the page is streamed, and the
  test client hands a body over only when it is whole), all rows on one page (2,000), against what
  ``modulelens ls --json`` does in-process (the listing as JSON) and, up to 10,000 versions, against
  reading every version's ``capture.json``, what a page that did not use the listing summaries would
  have to do. Several sizes (``--versions 1000,10000,100000``) show cost against size. Up to 10,000
  versions the repo is made by saving each version; above, by committing copies of one capture's
  metadata in batches (``Repo.commit_versions``, as a push does: the same index, summaries and
  capture files, payloads stored once): 100,000 versions in 100 s idle, 10 minutes at load 15,
  22 minutes at load 8-13 (keep it with --work).
  Targets (issue 37): first byte under 50 ms and the 500-row page under 150 ms at 100,000 versions,
  the page's cost flat in the number of versions.
* The capture page of a --gib GiB capture (``Big``: 16 x Linear(4096, 4096) at 1 GiB, one recorded
  call), cold (a new view: nothing cached; files in the page cache, as right after the capture or
  on a second look) and warm, against ``modulelens show --json`` (metadata only, no statistics)
  and against exact statistics over every element of every weight (what a page that did not sample
  would do). Target (issue 37): under 300 ms cold for a 4 GiB capture (``--gib 4``: 64 x
  Linear(4096, 4096)). Also the peak memory the cold page added, in a fresh process: it reads
  samples of the memory-mapped payloads, never a whole weight, so neither should grow with --gib.

Rounds are interleaved with a rotating order (_common.interleaved); medians and best are reported,
and the ratios in results/ui.json.

``--huge`` (issue 35) times instead every page of captures far bigger than a page, at two sizes
each, cost against size: 5,000 and 50,000 recorded calls, a call of 100,000 and of 1,000,000
leaves, 300 and 3,000 stored reports (stress/huge_captures.py). Each page once the capture is
open (its ``capture.json`` read once per server), against ``show --json`` in-process (the
metadata summary, no statistics); the page's bytes; the cold first view (the metadata read
included); and, at the full size, each page as the first request of a fresh ``modulelens ui``
process (``fresh_s``: what a user who starts the UI and opens the page waits; the server's
start-up work shares its interpreter). Targets: at most 2 s and 5 MiB a page, the first view
included, and a page's cost flat in the capture's size.
Results in results/ui_huge.json.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# As `modulelens ui` does before importing torch (interfaces/cli/ui.py): one intra-op thread, in the
# app's worker threads too.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # stress/huge_captures.py makes the huge captures
from _common import Big, interleaved, many_versions_repo, median, report
from starlette.testclient import TestClient

import modulelens
from modulelens.format.shape_only import tensor_stats
from modulelens.interfaces import session
from modulelens.interfaces.ui.repo_view import RepoView
from modulelens.interfaces.ui.server import UiSettings, create_app
from modulelens.restore.summary import describe

BASE = "http://127.0.0.1:8765"

# Run in a fresh process: how much memory the cold capture page adds (its high-water mark over the
# resident size before; file pages of the memory-mapped payloads that it reads count too).
_PEAK = """
import json, sys
from starlette.testclient import TestClient
import modulelens
from modulelens.interfaces.ui.repo_view import RepoView
from modulelens.interfaces.ui.server import UiSettings, create_app
web = TestClient(create_app(RepoView(modulelens.Repo(sys.argv[1]), scan_jobs=False), UiSettings()),
                 base_url="http://127.0.0.1:8765")
web.get("/static/ui.css")  # the app and the templates' machinery loaded
def rss_kib():
    with open("/proc/self/status") as status:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in status) if k in ("VmRSS", "VmHWM")}
before = rss_kib()
page = web.get("/capture/" + sys.argv[2])
after = rss_kib()
print(json.dumps({"status": page.status_code, "added_kib": after["VmHWM"] - before["VmRSS"], "before_kib": before["VmRSS"]}))
"""


def _client(view: RepoView) -> TestClient:
    return TestClient(create_app(view, UiSettings()), base_url=BASE)


def _get(web: TestClient, path: str) -> None:
    response = web.get(path)
    assert response.status_code == 200, (path, response.status_code, response.text[-400:])


def committed_versions_repo(root: Path, versions: int, names: int) -> modulelens.Repo:
    """A repo of ``versions`` versions of a small Linear under ``names`` names, made by committing
    copies of one capture's metadata in one batch per name (what a push of many versions does)."""
    repo = modulelens.Repo(root)
    module = torch.nn.Linear(4, 4)
    with modulelens.capture(module, targets="Linear", repo=repo, name="team/model0/block"):
        module(torch.randn(2, 4))
    seed = repo.read_metadata("team/model0/block", 1)
    seed.pop("provenance", None)
    with repo.writing():
        for n in range(names):
            count = versions // names + (1 if n < versions % names else 0) - (1 if n == 0 else 0)
            metas = []
            for k in range(count):
                meta = copy.deepcopy(seed)
                meta["tags"] = [f"run{n + k * names}"]
                metas.append(meta)
            repo.commit_versions(f"team/model{n}/block", metas)
    return repo


def first_byte(url: str, path: str) -> tuple[float, float]:
    """Seconds to the first byte of the body, and to the last, of a page of a real server
    (``modulelens ui``; Starlette's test client hands a streamed body over only once it is whole)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=120)
    try:
        began = time.perf_counter()
        connection.request("GET", path)
        response = connection.getresponse()
        response.read1(1)
        first = time.perf_counter() - began
        response.read()
        last = time.perf_counter() - began
    finally:
        connection.close()
    assert response.status == 200, (path, response.status)
    return first, last


def _served_page(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/", timeout=120) as response:
        return str(response.read().decode())


def repo_page(root: Path, versions: int, names: int, rounds: int) -> tuple[list[dict], dict]:
    start = time.perf_counter()
    if (root / "made").exists():  # --work: made by an earlier run (the same builder and sizes)
        repo = modulelens.Repo(root)
    else:
        repo = many_versions_repo(root, versions, names) if versions <= 10_000 else \
            committed_versions_repo(root, versions, names)
        (root / "made").touch()
    print(f"made {versions} versions in {time.perf_counter() - start:.1f} s")
    time.sleep(1.1)  # then a writer stores every name's summary with its key: the listing of a repo at rest
    repo.gc()
    view = RepoView(repo)
    start = time.perf_counter()
    view.wait_for_jobs()
    scan_s = time.perf_counter() - start
    web = _client(view)
    _get(web, "/")

    def ls_json() -> None:
        json.dumps([info.to_dict() for info in session.list_versions(repo)])

    def every_capture_file() -> None:
        for info in repo.list():
            repo.read_metadata(info.name, info.version)

    from stress.browser import ui_server

    server = contextlib.ExitStack()
    url = server.enter_context(ui_server(str(root), env={**os.environ, "XDG_RUNTIME_DIR": str(root.parent)})).url
    # as the app's above: its listing read, and its background read of each version's job done (for
    # the first page's rows: the poller is gone), which would otherwise share the server's interpreter
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and 'id="job-poller"' in _served_page(url):
        time.sleep(2)
    first_bytes: list[float] = []
    whole: list[float] = []

    def served() -> None:
        first, last = first_byte(url, "/")
        first_bytes.append(first)
        whole.append(last)

    contenders = {
        "ui: repo page (first 500 rows)": lambda: _get(web, "/"),
        "ui server: repo page, first byte (and whole page)": served,
        "ui: repo page, all rows (2,000)": lambda: _get(web, "/?per_page=all"),
        "ui: repo page, search 'model1' + sort by size": lambda: _get(web, "/?q=model1&sort=size"),
        "ls --json, in-process (listing as JSON)": ls_json,
    }
    if versions <= 10_000:  # 100,000 files a round, rounds of minutes
        contenders["read every capture.json"] = every_capture_file
    with server:
        times = interleaved(contenders, rounds)
    times["ui server: repo page, first byte (and whole page)"] = first_bytes  # to the first byte, not the whole
    times["ui server: repo page (first 500 rows), whole, through a socket"] = whole
    rows = [{"case": f"repo page, {versions:,} versions", "contender": k, "median_s": median(v), "best_s": min(v)}
            for k, v in times.items()]
    cli = []
    for _ in range(3):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "modulelens", "ls", "--json", "--repo", str(root)], check=True,
                       capture_output=True)
        cli.append(time.perf_counter() - began)
    rows.append({"case": f"repo page, {versions:,} versions", "contender": "modulelens ls --json (fresh process)",
                 "median_s": median(cli), "best_s": min(cli)})
    page = median(times["ui: repo page (first 500 rows)"])
    ratios = {"repo_page_vs_ls_json": page / median(times["ls --json, in-process (listing as JSON)"]),
              "repo_page_all_rows_vs_ls_json": median(times["ui: repo page, all rows (2,000)"])
              / median(times["ls --json, in-process (listing as JSON)"])}
    if "read every capture.json" in times:
        ratios["repo_page_vs_every_capture_file"] = page / median(times["read every capture.json"])
    return rows, {"ratios": ratios, "job_scan_s": scan_s, "repo_page_s": page,
                  "repo_page_first_byte_s": median(first_bytes),
                  "repo_page_all_rows_s": median(times["ui: repo page, all rows (2,000)"])}


def capture_page(root: Path, gib: float, rounds: int) -> tuple[list[dict], dict]:
    width = 4096
    modulelens.track_init()
    model = Big(width, Big.depth_for(gib, width))
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    repo = modulelens.Repo(root)
    with torch.no_grad(), modulelens.capture(model, targets=".", repo=repo, name="big") as cap:
        model(torch.randn(8, width))
    ref = cap.saved[0].ref
    del model, cap
    name, version = repo.resolve(ref)
    path = f"/capture/{ref}"
    warm = _client(RepoView(repo, scan_jobs=False))
    _get(warm, path)
    loaded = modulelens.load(ref, repo=repo)

    def cold() -> None:
        _get(_client(RepoView(modulelens.Repo(root), scan_jobs=False)), path)

    def exact_stats() -> None:
        for tensor in loaded.state_dict().values():
            tensor_stats(tensor, quantiles=False)

    times = interleaved({
        "ui: capture page, cold (nothing cached)": cold,
        "ui: capture page, warm": lambda: _get(warm, path),
        "show --json, in-process (metadata, no statistics)": lambda: describe(repo, ref),
        "exact statistics of every weight (all elements)": exact_stats,
    }, rounds)
    label = f"capture page, {nbytes / 2**30:.2f} GiB of weights"
    rows = [{"case": label, "contender": k, "median_s": median(v), "best_s": min(v)} for k, v in times.items()]
    peak = json.loads(subprocess.run([sys.executable, "-c", _PEAK, str(root), ref], check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1])
    page = median(times["ui: capture page, cold (nothing cached)"])
    return rows, {"ratios": {"capture_page_vs_show_json": page / median(times["show --json, in-process (metadata, no statistics)"]),
                             "capture_page_vs_exact_stats": page / median(times["exact statistics of every weight (all elements)"])},
                  "capture_page_cold_s": page, "capture_page_warm_s": median(times["ui: capture page, warm"]),
                  "capture_payload_bytes": nbytes, "capture_page_peak_added_mib": peak["added_kib"] / 1024,
                  "version": f"{name}:v{version}"}


def fresh_first_views(root: Path, paths: dict[str, str], rounds: int) -> dict[str, list[float]]:
    """Seconds to each page as the first request of a fresh ``modulelens ui`` process (its start-up
    work included: the background read of the jobs, the warm-up), ``rounds`` servers per page."""
    import http.client
    from urllib.parse import urlsplit

    from stress.browser import ui_server

    found: dict[str, list[float]] = {case: [] for case in paths}
    for _ in range(rounds):
        for case, path in paths.items():
            with ui_server(str(root), env={**os.environ, "XDG_RUNTIME_DIR": str(root.parent)}) as server:
                where = urlsplit(server.url)
                connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=300)
                began = time.perf_counter()
                connection.request("GET", path)
                response = connection.getresponse()
                response.read()
                found[case].append(time.perf_counter() - began)
                connection.close()
                assert response.status == 200, (path, response.status)
    return found


def huge_pages(root: Path, rounds: int) -> tuple[list[dict], dict]:
    """Pages of captures bigger than a page, at two sizes: time once open, bytes, the cold first view."""
    from stress.huge_captures import huge_repo

    rows: list[dict] = []
    sizes: dict[str, dict[str, float]] = {}
    for scale, label in ((10, "small"), (1, "full")):
        start = time.perf_counter()
        refs = huge_repo(root / label, calls=50_000 // scale, leaves=1_000_000 // scale, reports=3_000 // scale)
        print(f"made the {label} captures in {time.perf_counter() - start:.0f} s")
        repo = modulelens.Repo(root / label)
        paths = {"capture page of N calls": f"/capture/{refs['calls']}",
                 "its last page of calls": f"/capture/{refs['calls']}?calls={50_000 // scale // 20}",
                 "its last call": f"/capture/{refs['calls']}/call/{50_000 // scale - 1}",
                 "its saved file": f"/capture/{refs['calls']}/export",
                 "diff of it and the many-leaf one": f"/diff?a={refs['calls']}&b={refs['leaves']}",
                 "capture page of a call of N leaves": f"/capture/{refs['leaves']}",
                 "that call's last page of leaves": f"/capture/{refs['leaves']}/call/0?output={1_000_000 // scale // 500}",
                 "capture page with N reports": f"/capture/{refs['reports']}",
                 "its reports page": f"/capture/{refs['reports']}/reports",
                 "its saved file (capture and reports)": f"/capture/{refs['reports']}/export",
                 "reports with deep mathtext titles": f"/capture/{refs['mathtext']}/reports"}
        web = _client(RepoView(repo, scan_jobs=False))
        cold = {}
        for case, path in paths.items():
            began = time.perf_counter()
            _get(web, path)
            cold[case] = time.perf_counter() - began
        contenders = {case: functools.partial(_get, web, path) for case, path in paths.items()}
        contenders["show --json of the N-call capture, in-process"] = functools.partial(describe, repo, refs["calls"])
        times = interleaved(contenders, rounds)
        case_label = {"small": "5,000 calls / 100,000 leaves / 300 reports",
                      "full": "50,000 calls / 1,000,000 leaves / 3,000 reports"}[label]
        for case, samples in times.items():
            size = len(web.get(paths[case]).content) if case in paths else None
            rows.append({"case": case_label, "contender": case, "median_s": median(samples), "best_s": min(samples),
                         "cold_s": cold.get(case), "fresh_s": None, "html_mib": None if size is None else size / 2**20})
        sizes[label] = {case: median(samples) for case, samples in times.items()}
        if label == "full":
            fresh = fresh_first_views(root / label, paths, min(rounds, 3))
            for row in rows:
                if row["case"] == case_label and row["contender"] in fresh:
                    row["fresh_s"] = median(fresh[row["contender"]])
    pages = [r for r in rows if r["html_mib"] is not None]
    slowest = max(pages, key=lambda r: r["median_s"])
    first_views = [r for r in pages if r["fresh_s"] is not None]
    slowest_fresh = max(first_views, key=lambda r: r["fresh_s"])
    largest = max(pages, key=lambda r: r["html_mib"])
    growth = {case: sizes["full"][case] / sizes["small"][case] for case in sizes["full"] if case in sizes["small"]}
    return rows, {"slowest_page_s": slowest["median_s"], "slowest_page": slowest["contender"],
                  "slowest_first_view_s": slowest_fresh["fresh_s"], "slowest_first_view": slowest_fresh["contender"],
                  "largest_page_mib": largest["html_mib"], "largest_page": largest["contender"],
                  "full_vs_tenth_size": growth, "targets": {"page_s": 2.0, "page_mib": 5.0}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--versions", default="2000", help="versions of the repo page, or several: 1000,100000")
    parser.add_argument("--repo-only", action="store_true", help="the repo page only (no capture page)")
    parser.add_argument("--work", type=Path, help="make the repos here and keep them: a later run with the same "
                                                  "--names reuses them (100,000 versions take minutes to make)")
    parser.add_argument("--names", type=int, default=200)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--huge", action="store_true", help="time the pages of captures bigger than a page (issue 35)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="ml-bench-ui-"))
    if args.huge:
        try:
            rows, extra = huge_pages(work, args.rounds)
        finally:
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)
        report("ui_huge", f"UI pages of huge captures, server side (median of {args.rounds} interleaved rounds)",
               rows, ["case", "contender", "median_s", "best_s", "cold_s", "fresh_s", "html_mib"],
               {**extra, "load_average": os.getloadavg()})
        print(f"slowest first view in a fresh server {extra['slowest_first_view_s']:.2f} s ({extra['slowest_first_view']})")
        print(f"slowest page {extra['slowest_page_s']:.2f} s ({extra['slowest_page']}), largest "
              f"{extra['largest_page_mib']:.2f} MiB ({extra['largest_page']}); targets 2 s, 5 MiB")
        return
    sizes = [int(v) for v in args.versions.split(",")]
    listing_rows: list[dict] = []
    by_size: dict[int, dict] = {}
    capture_rows: list[dict] = []
    big: dict = {"ratios": {}}
    try:
        for versions in sizes:
            rows, by_size[versions] = repo_page(work / f"many-{versions}-{args.names}", versions, args.names,
                                                args.rounds)
            listing_rows += rows
            if not args.work:
                shutil.rmtree(work / f"many-{versions}-{args.names}", ignore_errors=True)
        if not args.repo_only:
            capture_rows, big = capture_page(work / "big", args.gib, args.rounds)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        else:
            shutil.rmtree(work / "big", ignore_errors=True)
    listing = by_size[sizes[-1]]  # the largest size is the headline; each size's figures under "sizes"
    extra = {**listing, **big, "ratios": {**listing["ratios"], **big["ratios"]}, "load_average": os.getloadavg(),
             "sizes": {str(v): {k: f for k, f in by_size[v].items() if k != "ratios"} for v in sizes},
             "targets": {"repo_page_s": 0.15, "repo_page_first_byte_s": 0.05, "capture_page_cold_s": 0.3}}
    report("ui", f"UI pages, server side (median of {args.rounds} interleaved rounds)", listing_rows + capture_rows,
           ["case", "contender", "median_s", "best_s"], extra)
    for versions in sizes:
        print(f"repo page at {versions:,} versions: {by_size[versions]['repo_page_s'] * 1e3:.1f} ms (target 150 ms), "
              f"first byte {by_size[versions]['repo_page_first_byte_s'] * 1e3:.1f} ms (target 50 ms)")
    if capture_rows:
        print(f"capture page cold {big['capture_page_cold_s'] * 1e3:.0f} ms (target 300 ms at 4 GiB), peak memory added "
              f"{big['capture_page_peak_added_mib']:.0f} MiB for {big['capture_payload_bytes'] / 2**30:.2f} GiB of weights")


if __name__ == "__main__":
    main()

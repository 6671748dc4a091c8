"""``twinkle report --html``: one self-contained page, opened in a real headless browser
(Debian's ``chromium``, driven by playwright): it loads with no console error and no
network request, its plots are drawn, and every figure it shows is the summary's. The
run's own text (its workers', threads', phases', spans' names) reaches the plots as
written, never as the HTML plotly.js draws."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from test_report import SIGTERM_ERROR, ended_in_error
from twinkle.cli import main
from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import run_demo
from twinkle.perf import ClockAnchor, ManualClock, Span, WorkerReport
from twinkle.perf.stats import MemoryReading
from twinkle.report import load_report
from twinkle.report._timeline import Timeline, timeline
from twinkle.run import RunSession

go = pytest.importorskip("plotly.graph_objects", reason="needs plotly: pip install twinkle[report]")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (make test installs it)"
)
CFG = DemoConfig(iterations=5, prompts_per_iteration=4, completions_per_prompt=4, micro_batch=8)
#: names a run may give that plotly.js would draw as HTML: a live link, bold, a new line
WORKER, PHASE, ENGINE, SPAN = (
    "<a href='https://evil.example/x'>rank1</a>",
    "<b>gen</b>",
    "<B>eng</B>",
    '<br>odd & "end"',
)
#: the one text with a tag in the figures: the timeline's hover, twinkle's own
HOVER = "%{hovertext}: %{x:.4f} s<extra></extra>"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("html")
    run_demo(CFG, out_dir=out, run_id="a", autoload=False)
    run_demo(dataclasses.replace(CFG, iterations=6), out_dir=out, run_id="b", autoload=False)
    return out / "a", out / "b"


@pytest.fixture(scope="module")
def named_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose worker (a second process, on host ``<br>host``), its engine, a phase
    and a span are named with HTML tags."""
    config = {
        "phases": {PHASE: ["generate"], "train": ["train.step"]},
        "window": {"samples": "rollout", "devices": 1},
        "streaming": {"generation": PHASE, "training": "train"},
    }
    out, clock = tmp_path_factory.mktemp("named"), ManualClock(0)
    anchor = ClockAnchor(monotonic_ns=0, wall_ns=10**18, pid=7, hostname="<br>host")
    with RunSession(out_dir=out, run_id="r", config=config, clock=clock, autoload=False,
                    wall_clock=lambda: 10**18 + clock()) as run:  # fmt: skip
        for it in range(3):
            run.bus.iteration_started(it)
            t = clock()
            clock.advance(10**8)
            spans = (
                Span("generate", t, t + 5 * 10**7, 1, 7, {"engine": ENGINE}, None),
                Span("train.step", t + 5 * 10**7, t + 9 * 10**7, 2, 7, {}, None),
                Span(SPAN, t, t + 10**7, 3, 7, {}, None),
            )
            reading = MemoryReading(WORKER, 0, 7, "<br>host", "cpu", 2**20, 2**20, 0, 0, 0, 0)
            run.receive(WorkerReport(WORKER, anchor, spans, (reading,)), iteration=it)
            run.bus.samples(iteration=it, phase="rollout", lengths=[5, 7])
            with run.recorder.span("train.step", iteration=it):
                clock.advance(10**8)
    return out / "r"


def _figures(page: str) -> dict[str, dict[str, Any]]:
    """The plotly figures the page embeds (its data and layout), by their div's id."""
    decoder, found = json.JSONDecoder(), {}
    for call in page.split("Plotly.newPlot(")[1:]:
        div_id, end = decoder.raw_decode(call.lstrip())
        rest = call.lstrip()[end:].lstrip().removeprefix(",").lstrip()
        data, end = decoder.raw_decode(rest)
        layout, _ = decoder.raw_decode(rest[end:].lstrip().removeprefix(",").lstrip())
        found[div_id] = {"data": data, "layout": layout}
    return found


def _texts(value: Any) -> list[str]:
    """Every string in a figure's JSON."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def test_the_runs_names_reach_the_plots_escaped(named_run: Path, tmp_path: Path) -> None:
    page = tmp_path / "named.html"
    assert main(["report", str(named_run), "--html", str(page)]) == 0
    text = page.read_text()
    assert not [n for n in (WORKER, PHASE, ENGINE, SPAN) if n in text]  # (nor outside them)
    figures = _figures(text)
    assert "plot-peak-memory-per-worker" in figures and len(figures) >= 5
    tagged = {t for t in _texts(figures) if "<" in t or ">" in t}
    assert tagged <= {HOVER}  # (a figure's text is the run's, escaped, but for its hover)
    memory = figures["plot-peak-memory-per-worker"]["data"]
    assert memory[0]["x"] == ["&lt;a href=&#39;https://evil.example/x&#39;&gt;rank1&lt;/a&gt;"]
    time_ = {t["name"] for t in figures["plot-each-iteration-s-window"]["data"]}
    assert "&lt;b&gt;gen&lt;/b&gt; and train at once" in time_
    (timeline,) = (f for k, f in figures.items() if k.startswith("plot-each-worker-s-spans"))
    assert "&lt;b&gt;gen&lt;/b&gt;" in {t["name"] for t in timeline["data"]}
    assert "&lt;B&gt;eng&lt;/B&gt;" in {y for t in timeline["data"] for y in t["y"]}
    hovers = {h for t in timeline["data"] for h in t["hovertext"]}
    assert "&lt;br&gt;odd &amp; &#34;end&#34;" in hovers


@needs_chromium
def test_the_runs_names_are_shown_as_written(named_run: Path, tmp_path: Path) -> None:
    page = tmp_path / "named.html"
    assert main(["report", str(named_run), "--html", str(page)]) == 0
    seen = _open(page)
    assert seen["errors"] == [] and seen["requests"] == []
    assert seen["links"] == 0  # (the worker's name was a live link)
    assert WORKER in seen["ticks"] and ENGINE in seen["ticks"]
    assert PHASE in seen["legend"]


def _open(page_path: Path, screenshot: Path | None = None) -> dict[str, Any]:
    """The page in headless Chromium: its console errors, the requests it made other
    than for itself, the figures it shows (data-key -> data-value) and its plots."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    requests: list[str] = []
    url = page_path.resolve().as_uri()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url) if r.url != url else None)
            page.goto(url, wait_until="load")
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length > 0")
            shown = page.eval_on_selector_all(
                "[data-key]",
                "els => els.map(e => [e.dataset.key, e.dataset.value ?? e.textContent])",
            )
            plots = page.eval_on_selector_all(
                ".js-plotly-plot", "els => els.map(e => [e.id, e.data.length])"
            )
            rows = page.eval_on_selector_all(
                "table.iterations tr[data-iteration]", "els => els.map(e => e.dataset.iteration)"
            )
            labels = {
                part: page.eval_on_selector_all(
                    f".js-plotly-plot {part}", "els => els.map(e => e.textContent)"
                )
                for part in (".xtick text, .ytick text", ".legendtext")
            }
            links = page.eval_on_selector_all(".js-plotly-plot svg a", "els => els.length")
            width = page.evaluate("document.documentElement.scrollWidth")
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=False)
        finally:
            browser.close()
    return {"errors": errors, "requests": requests, "shown": shown, "plots": plots, "rows": rows,
            "ticks": labels[".xtick text, .ytick text"], "legend": labels[".legendtext"],
            "links": links, "width": width}  # fmt: skip


def _summary_value(summary: dict[str, Any], report: dict[str, Any], key: str) -> Any:
    group, _, name = key.partition(".")
    if key == "status":
        return summary["status"]
    if key == "limits.verdict":
        return summary["limits"]["verdict"]
    if group == "window":
        return summary["window"][name]
    return report["seconds"][name]  # (the report's seconds are the summary's, renamed)


@needs_chromium
def test_the_page_loads_offline_and_shows_the_summarys_figures(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "a.html"
    assert main(["report", str(runs[0]), "--html", str(page), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    summary = json.loads((runs[0] / "summary.json").read_text())
    html = page.read_text()
    assert "<script src" not in html and "<link" not in html  # every asset inlined
    seen = _open(page, screenshot=tmp_path / "page.png")
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert seen["errors"] == [] and seen["requests"] == []
    assert seen["shown"], "no figure on the page"
    for key, value in seen["shown"]:
        want = _summary_value(summary, report, key)
        shown = value if key in ("status", "limits.verdict") else ast.literal_eval(value)
        assert shown == want, key
    assert summary["seconds"]["wall_seconds"] == report["seconds"]["wall"]
    drawn = dict(seen["plots"])
    assert {"plot-throughput", "plot-each-iteration-s-window", "plot-peak-memory-per-worker",
            "plot-each-worker-s-spans--the-last-iterations"} <= set(drawn)  # fmt: skip
    assert all(n > 0 for n in drawn.values()), drawn
    assert seen["rows"] == [str(r["iteration"]) for r in report["iterations"]]
    assert seen["width"] <= 1400  # (the window's: its long lines wrap, its table scrolls)


@needs_chromium
def test_two_runs_are_overlaid(runs: tuple[Path, Path], tmp_path: Path) -> None:
    page = tmp_path / "ab.html"
    assert main(["report", str(runs[0]), str(runs[1]), "--html", str(page)]) == 0
    seen = _open(page)
    assert seen["errors"] == [] and seen["requests"] == []
    statuses = [v for k, v in seen["shown"] if k == "status"]
    assert statuses == ["ok", "ok"]  # both runs' figures
    assert len(seen["rows"]) == 5 + 6  # both runs' tables
    drawn = dict(seen["plots"])
    assert drawn["plot-throughput"] >= 2  # A's and B's lines, on one plot
    assert {"plot-a--each-worker-s-spans--the-last-iterations",
            "plot-b--each-worker-s-spans--the-last-iterations"} <= set(drawn)  # fmt: skip


def _timeline_of(
    run_dir: Path, processes: dict[int, str], threads: dict[tuple[int, int], str], **kw: Any
) -> Timeline:
    """The timeline of a hand-made trace: the processes and threads named, each thread
    with one training span."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
        for pid, name in processes.items()
    ]
    for k, ((pid, tid), name) in enumerate(threads.items()):
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": name}})  # fmt: skip
        events.append({"name": "train.step", "ph": "X", "pid": pid, "tid": tid,
                       "ts": 1000.0 * k, "dur": 500.0, "args": {}})  # fmt: skip
    (run_dir / "trace.json").write_bytes(json.dumps(events).encode())
    report = {"run_dir": str(run_dir), "phase_patterns": {"train": ["train.*"]}}
    drawn = timeline(go, report, **kw)
    assert drawn is not None
    return drawn


def _rows(drawn: Timeline) -> list[str]:
    """The timeline's rows, top to bottom (each with a span on it)."""
    rows: list[str] = drawn.figure.layout.yaxis.categoryarray
    assert {y for bar in drawn.figure.data for y in bar.y} == set(rows)
    return list(rows)


def test_the_timeline_tells_two_processes_trainers_apart(tmp_path: Path) -> None:
    drawn = _timeline_of(
        tmp_path,
        {100: "run (vm)", 200: "rank1 (vm, pid 200)"},
        {(100, 1): "trainer (thread 11)", (100, 2): "engine0 (thread 12)",
         (200, 1): "trainer (thread 21)"},
    )  # fmt: skip
    assert _rows(drawn) == ["run/trainer", "engine0", "rank1/trainer"]
    assert drawn.left_out == ""


def test_one_workers_name_on_two_hosts_is_told_apart_by_the_whole_process(
    tmp_path: Path,
) -> None:
    drawn = _timeline_of(
        tmp_path,
        {100: "rank1 (a, pid 1)", 200: "rank1 (b, pid 1)"},
        {(100, 1): "trainer (thread 1)", (200, 1): "trainer (thread 1)"},
    )
    assert _rows(drawn) == ["rank1 (a, pid 1)/trainer", "rank1 (b, pid 1)/trainer"]


def test_a_timeline_of_many_workers_draws_its_first_rows_and_says_which_are_left_out(
    tmp_path: Path,
) -> None:
    ranks = range(1, 6)
    drawn = _timeline_of(
        tmp_path,
        {100: "run (vm)"} | {200 + k: f"rank{k} (vm, pid {200 + k})" for k in ranks},
        {(100, 1): "trainer (thread 1)"} | {(200 + k, 1): "trainer (thread 1)" for k in ranks},
        max_rows=3,
    )
    assert _rows(drawn) == ["run/trainer", "rank1/trainer", "rank2/trainer"]
    assert drawn.left_out == (
        "6 threads' rows, the first 3 drawn; 3 left out (rank3/trainer … rank5/trainer): "
        "trace.json has them all"
    )


def test_the_page_replaces_an_earlier_page_only(
    named_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--html given the run's own events.jsonl (or any file that is no HTML page) is
    refused, the file as it was; an earlier page is replaced."""
    log = named_run / "events.jsonl"
    before = log.read_bytes()
    assert main(["report", str(named_run), "--html", str(log)]) == 2
    err = capsys.readouterr().err
    assert f"--html {str(log)!r} holds something other than what --html writes" in err
    assert "give a new path, or remove it first" in err
    assert log.read_bytes() == before
    page = tmp_path / "page.html"
    page.write_text("<!DOCTYPE html><p>an older page</p>")
    assert main(["report", str(named_run), "--html", str(page)]) == 0
    assert "an older page" not in page.read_text() and page.read_text().startswith("<!DOCTYPE")
    (tmp_path / "dir").mkdir()
    assert main(["report", str(named_run), "--html", str(tmp_path / "dir")]) == 2
    assert "is a symbolic link, a directory or not a regular file" in capsys.readouterr().err


def test_a_run_that_ended_in_error_shows_its_error(tmp_path: Path) -> None:
    page = tmp_path / "failed.html"
    assert main(["report", str(ended_in_error(tmp_path)), "--html", str(page)]) == 0
    assert f"<p>error <b data-key='error'>{SIGTERM_ERROR}</b></p>" in page.read_text()


def test_the_peak_memory_plot_draws_the_highest_peaks_and_says_what_it_left_out(
    tmp_path: Path,
) -> None:
    """50 workers, worker ``wK`` peaking at K + 1 MiB: the plot draws the 48 highest (all
    but w0 and w1, in the report's order) and says the other 2 are left out."""
    clock = ManualClock(0)
    readings = [
        MemoryReading(f"w{k}", k, 100 + k, "vm", "cpu", 2**20, (k + 1) * 2**20, 0, 0, 0, 0)
        for k in range(50)
    ]
    with RunSession(out_dir=tmp_path, run_id="m", config={}, clock=clock, autoload=False,
                    wall_clock=lambda: 10**18 + clock()) as run:  # fmt: skip
        run.bus.iteration_started(0)
        clock.advance(10**8)
        run.bus.memory(readings, iteration=0)
    page_path = tmp_path / "m.html"
    assert main(["report", str(tmp_path / "m"), "--html", str(page_path)]) == 0
    page = page_path.read_text()
    bars = [
        trace
        for figure in _figures(page).values()
        for trace in figure["data"]
        if trace.get("type") == "bar" and "w49" in trace.get("x", [])
    ]
    kept = [w for w in load_report(tmp_path / "m")["memory_peak_bytes"] if w not in ("w0", "w1")]
    assert len(kept) == 48 and bars and all(t["x"] == kept for t in bars)
    assert "2 of 50 workers with lower peaks are left out (report --json has every one)." in page


def test_control_characters_in_the_runs_text_are_escaped_as_the_text_report_does(
    runs: tuple[Path, Path],
) -> None:
    """An error (or a name) holding a bidi override, which would show the text after it
    reversed: the page shows it escaped (\\u202e), as the text report does, never raw."""
    from twinkle.report._html import html_report

    report = {**load_report(runs[0]), "status": "error", "error": "Boom red\u202ecba"}
    page = html_report(report)
    assert "\u202e" not in page and "Boom red\\u202ecba" in page

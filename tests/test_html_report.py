"""``twinkle report --html``: one self-contained page, opened in a real headless browser
(Debian's ``chromium``, driven by playwright): it loads with no console error and no
network request, its plots are drawn, and every figure it shows is the summary's."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from twinkle.cli import main
from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import run_demo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (make test installs it)"
)
CFG = DemoConfig(iterations=5, prompts_per_iteration=4, completions_per_prompt=4, micro_batch=8)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("html")
    run_demo(CFG, out_dir=out, run_id="a", autoload=False)
    run_demo(dataclasses.replace(CFG, iterations=6), out_dir=out, run_id="b", autoload=False)
    return out / "a", out / "b"


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
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=False)
        finally:
            browser.close()
    return {"errors": errors, "requests": requests, "shown": shown, "plots": plots, "rows": rows}


def _summary_value(summary: dict[str, Any], report: dict[str, Any], key: str) -> Any:
    group, _, name = key.partition(".")
    if key == "status":
        return summary["status"]
    if key == "limits.verdict":
        return summary["limits"]["verdict"]
    if group == "window":
        return summary["window"][name]
    return report["seconds"][name]  # (the report's seconds are the summary's, renamed)


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

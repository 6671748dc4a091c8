"""``python -m bench [--smoke] [--only NAME]``: run the benchmarks and print one ratio table.

The real-vLLM benchmarks (``bench_vllm_startup``, ``bench_vllm_demo``: minutes each) run
only when ``--only`` names them (``--only vllm`` both).

Every module measures twinkle side by side with its baseline and with the tools people
use today (codetiming, torch.profiler, Lightning, stdlib json/logging, blinker) in this
one process, so machine noise cancels in the ratios. ``--smoke`` runs a few iterations
of everything (CI keeps the scripts from rotting); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import time
import warnings
from pathlib import Path

from bench._harness import Row, format_table, load_average, machine_lines

# Each module exposes ``run(smoke: bool) -> list[Row]``.
MODULES = [
    "bench.bench_perf",
    "bench.bench_metric",
    "bench.bench_reporting",
    "bench.bench_events",
    "bench.bench_demo",
    "bench.bench_engines",
    "bench.bench_trl",
    "bench.bench_remote",
    "bench.bench_sinks",
    "bench.bench_scale",
    "bench.bench_whatif",
]
# Run only when an --only names them: real vLLM servers cost minutes (make bench-vllm).
ON_REQUEST = ["bench.bench_vllm_startup", "bench.bench_vllm_demo"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--smoke", action="store_true", help="few iterations (CI)")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="module name substring (the bench_vllm_* modules run only when named: --only vllm)",
    )
    parser.add_argument(
        "--doc",
        type=Path,
        help="also write the machine, the table and the targets into this Markdown file "
        "(between its <!-- machine/table/summary:start/end --> markers)",
    )
    args = parser.parse_args(argv)
    # torch without numpy warns on import; it says nothing about what is measured.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    started = time.perf_counter()
    load_before = load_average()
    rows: list[Row] = []
    for mod_name in MODULES + ON_REQUEST:
        if (args.only or mod_name in ON_REQUEST) and not any(o in mod_name for o in args.only):
            continue
        mod = importlib.import_module(mod_name)
        t0 = time.perf_counter()
        rows.extend(mod.run(smoke=args.smoke))
        print(f"{mod_name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    mode = "smoke (figures meaningless)" if args.smoke else "full"
    machine = [
        *machine_lines(),
        f"before: {load_before}; after: {load_average()}",
        f"mode: {mode}, {elapsed:.0f} s",
    ]
    table = format_table(rows)
    print("\n".join(machine))
    print()
    print(table)
    failed = [r for r in rows if r.met is False]
    if failed and not args.smoke:
        print()
        print(f"{len(failed)} target(s) not met:")
        for r in failed:
            print(f"- {r.benchmark}: {r.subject} ({r.target})")
    if args.doc is not None:
        update_doc(args.doc, machine, rows)
    return 0


def _targets(rows: list[Row]) -> str:
    lines = ["| benchmark | subject | ratio | target | met |", "|---|---|---:|---|---|"]
    for r in rows:
        if r.met is None:
            continue
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        if not ratio:
            ratio = f"{r.value:.3g} {r.unit}"
        met = "yes" if r.met else "**NO** (reason in the table's note)"
        lines.append(f"| {r.benchmark} | {r.subject} | {ratio} | {r.target} | {met} |")
    return "\n".join(lines)


#: sections of the doc of their own (``<!-- NAME:start -->``): the machine and table of
#: the benchmarks whose name starts with the prefix (``--only scale --doc`` writes it alone)
OWN_SECTIONS = {"scale": "scale.", "whatif": "whatif."}


def update_doc(path: Path, machine: list[str], rows: list[Row]) -> None:
    """Replace the generated sections of ``path`` (figures stay verbatim, never retyped):
    the machine, table and targets of the rows, and each section of its own
    (:data:`OWN_SECTIONS`) that has rows; the main ones only when some rows are theirs."""
    text = path.read_text(encoding="utf-8")
    block = "```text\n" + "\n".join(machine) + "\n```"
    sections: dict[str, str] = {}
    for name, prefix in OWN_SECTIONS.items():
        own = [r for r in rows if r.benchmark.startswith(prefix)]
        rows = [r for r in rows if not r.benchmark.startswith(prefix)]
        if own:
            sections[name] = block + "\n\n" + format_table(own)
    if rows:
        sections |= {"machine": block, "table": format_table(rows), "summary": _targets(rows)}
    for name, body in sections.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no <!-- {name}:start --> ... <!-- {name}:end --> markers")

        def between_markers(m: re.Match[str], body: str = body) -> str:
            return m.group(1) + body + "\n" + m.group(2)

        text = pattern.sub(between_markers, text)
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())

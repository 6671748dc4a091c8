"""``python -m bench [--smoke] [--only NAME]``: run the benchmarks and print one ratio table."""

from __future__ import annotations

import argparse
import importlib
import platform
import sys

from bench._harness import Row, format_table

# Each module exposes ``run(smoke: bool) -> list[Row]``.
MODULES = ["bench.bench_perf", "bench.bench_reporting", "bench.bench_metric", "bench.bench_engines"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--smoke", action="store_true", help="few iterations (CI)")
    parser.add_argument("--only", action="append", default=[], help="module name substring")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for mod_name in MODULES:
        if args.only and not any(o in mod_name for o in args.only):
            continue
        mod = importlib.import_module(mod_name)
        rows.extend(mod.run(smoke=args.smoke))
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} "
        f"python {platform.python_version()} {platform.system()}"
    )
    print(format_table(rows))
    failed = [r for r in rows if r.met is False]
    if failed and not args.smoke:
        print(f"{len(failed)} target(s) not met", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

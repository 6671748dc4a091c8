"""Modules stay small and functions short (issue 34): a module past 500 lines or a
function past 60 fails this test, except the ones listed here as they are today. The
lists may only shrink: a listed one that grew fails, and one back under its bound must
be taken off the list (so the bound holds for it from then on)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MODULE_LINES, FUNCTION_LINES = 500, 60

#: modules over the bound today, with their length: split them along their seams
LONG_MODULES: dict[str, int] = {}
#: functions over the bound today (module, qualified name), with their length
LONG_FUNCTIONS = {
    ("twinkle/demo/cli.py", "add_demo_arguments"): 69,
    ("twinkle/demo/cli.py", "run_demo_command"): 75,
    ("twinkle/demo/runner.py", "run_demo"): 168,
    ("twinkle/demo/trainer.py", "GRPOTrainer._train_iteration"): 77,
    ("twinkle/demo/vllm.py", "vllm_rig"): 82,
    ("twinkle/engines/vllm_client.py", "VllmClient.complete"): 73,
    ("twinkle/observers/_config.py", "ObserverConfig.parse"): 81,
    ("twinkle/perf/stats.py", "memory_stats"): 67,
    ("twinkle/report/_limits_text.py", "limits_lines"): 75,
    ("twinkle/run/_session.py", "RunSession.__init__"): 71,
}


def _lengths(src: Path = SRC) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    modules: dict[str, int] = {}
    functions: dict[tuple[str, str], int] = {}
    for path in sorted((src / "twinkle").rglob("*.py")):
        name = path.relative_to(src).as_posix()
        text = path.read_text()
        modules[name] = len(text.splitlines())

        def walk(node: ast.AST, prefix: str, name: str = name) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert child.end_lineno is not None
                    functions[(name, prefix + child.name)] = child.end_lineno - child.lineno + 1
                    walk(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")

        walk(ast.parse(text), "")
    return modules, functions


def _check(found: dict, listed: dict, bound: int, what: str) -> list[str]:  # type: ignore[type-arg]
    wrong = []
    for key, length in found.items():
        allowed = listed.get(key)
        if allowed is None and length > bound:
            wrong.append(f"{what} {key} has {length} lines (> {bound}): split it along its seams")
        elif allowed is not None and length > allowed:
            wrong.append(f"{what} {key} grew to {length} lines (listed at {allowed}): shrink it")
        elif allowed is not None and length <= bound:
            wrong.append(f"{what} {key} is back to {length} lines: take it off the list")
    wrong += [
        f"{what} {key} is listed but gone: take it off the list"
        for key in listed.keys() - found.keys()
    ]
    return wrong


def test_modules_and_functions_only_shrink() -> None:
    modules, functions = _lengths()
    wrong = _check(modules, LONG_MODULES, MODULE_LINES, "module")
    wrong += _check(functions, LONG_FUNCTIONS, FUNCTION_LINES, "function")
    assert not wrong, "\n".join(wrong)


def _counts(src: Path) -> str:
    """The sizes the issue counts, of the source tree under ``src``."""
    modules, functions = _lengths(src)
    total = sum(modules.values())
    big = sum(n for n in modules.values() if n > 400)
    over = sum(n > FUNCTION_LINES for n in functions.values())
    return (
        f"modules: {len(modules)}; over {MODULE_LINES} lines: "
        f"{sum(n > MODULE_LINES for n in modules.values())}; over 400: "
        f"{sum(n > 400 for n in modules.values())}; functions over {FUNCTION_LINES} lines: "
        f"{over}; lines in modules over 400: {big} of {total} ({100 * big / total:.0f} %)"
    )


if __name__ == "__main__":  # python tests/test_module_size.py [SRC]: the counts
    import sys

    print(_counts(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC))

"""``twinkle whatif RUN [changes]``: the prediction side by side with the recorded run,
as a table, JSON or a plot."""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
from typing import Any

from twinkle.errors import InvalidArgumentError
from twinkle.whatif import ASSUMPTIONS, Changes, Prediction, predict
from twinkle.whatif._predict import not_predicted, speed_shared_note
from twinkle.whatif._reproduce import replay_off, reproduction

__all__ = ["whatif_command"]

#: the figures the table shows, in order (every figure is in --json)
SHOWN = (
    "steady_tokens_per_s_per_device",
    "tokens_per_s_per_device",
    "loop_wall_seconds",
    "idle_seconds",
    "generation_hidden_share",
)


def changes_from(args: argparse.Namespace, recorded_lag: int) -> Changes:
    lag = args.lag
    if args.no_overlap:
        if lag not in (None, 0):
            raise InvalidArgumentError(f"--no-overlap is lag 0; drop --lag {lag}")
        lag = 0
    elif args.overlap:
        if lag == 0:
            raise InvalidArgumentError("--overlap needs lag >= 1; drop --lag 0")
        lag = lag if lag is not None else max(1, recorded_lag)
    return Changes(
        engines=args.engines, ranks=args.ranks, lag=lag, buffer=args.buffer, speed=dict(args.speed)
    )


def whatif_command(args: argparse.Namespace) -> int:
    from twinkle.whatif._recorded import read_recorded

    recorded = read_recorded(args.run)
    changes = changes_from(args, recorded.lag)
    prediction = check = predict(recorded, changes, args.out)
    try:
        if not changes.none:
            check = predict(recorded, Changes())
        if args.plot is not None:
            _plot(prediction, args.plot)
        if args.json:
            out = prediction.to_dict()
            if args.out is None:  # (its files are gone once this command ends)
                out["predicted_run"] = None
            out["reproduction"] = reproduction(check)
            out["not_predicted"] = not_predicted(prediction.settings) or replay_off(check)
            print(json.dumps(out, indent=1))
        else:
            print(format_prediction(prediction, check))
    finally:
        for p in {id(prediction): prediction, id(check): check}.values():
            if args.out is None or p is not prediction:
                shutil.rmtree(p.out_dir, ignore_errors=True)
    return 0


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def format_prediction(p: Prediction, check: Prediction) -> str:
    rows = {row["figure"]: row for row in p.rows()}
    s = p.settings
    lines = [
        f"what if: engines {s['engines']}, trainer ranks {s['ranks']}, lag {s['lag']}, "
        f"buffer {_fmt(s['buffer'])}"
        + "".join(f", {k} x{v:g} speed" for k, v in p.changes.speed.items()),
        "",
        f"{'figure':<36}{'recorded':>14}{'predicted':>14}{'ratio':>9}",
    ]
    status = p.recorded.get("status")
    if status != "ok":  # (stopped, still being written, or failed)
        lines[1:1] = [
            f"the recorded run is {status}, not finished ok: this predicts its iterations "
            "so far, and its end as it is",
            "",
        ]
    for name in SHOWN:
        row = rows.get(name)
        if row is not None:
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
            lines.append(f"{name:<36}{_fmt(row['a']):>14}{_fmt(row['b']):>14}{ratio:>9}")
    data = p.to_dict()
    verdicts, paths = data["verdict"], data["critical_path_shares"]
    lines += ["", f"limited by: recorded {verdicts['recorded']}; predicted {verdicts['predicted']}"]
    for which in ("recorded", "predicted"):
        shares = paths[which] or {}
        parts = ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if v and v >= 0.005)
        lines.append(f"  critical path, {which}: {parts or '-'}")
    why = not_predicted(s) or replay_off(check)
    if why is not None:
        lines.append(f"not a prediction: {why}")
    elif s["speed_shared"]:
        lines.append(f"read with care: {speed_shared_note(s['speed_shared'])}")
    error = reproduction(check)["steady_tokens_per_s_per_device"]
    if error is not None:
        bound = (
            "that error does not bound this change (above)"
            if why is not None or s["speed_shared"]
            else "read the prediction with that error"
        )
        lines.append(
            f"the model replays the recorded configuration within {abs(error):.1%} "
            f"(steady tokens/s/device): {bound}"
        )
    lines += ["", "assumes:", *(f"  - {a}" for a in ASSUMPTIONS)]
    return "\n".join(lines)


def _plot(p: Prediction, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from twinkle.report import write_png

    if not path.lower().endswith(".png"):
        raise InvalidArgumentError(f"--plot {path!r}: give the path of a .png file to write")
    rows = p.to_dict()["iterations"]
    fig = Figure(figsize=(8, 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    its = [r["iteration"] for r in rows]
    for key, label in (("recorded_seconds", "recorded"), ("predicted_seconds", "predicted")):
        ax.plot(its, [r[key] for r in rows], marker="o", label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("seconds")
    ax.set_title("each iteration's wall seconds")
    ax.legend()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100, bbox_inches="tight")
    print(f"wrote {write_png(path, png.getvalue(), flag='--plot')}", file=sys.stderr)

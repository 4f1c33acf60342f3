"""``hpctrain report RUN_DIR|SWEEP_DIR [--out DIR]``: PNG pictures of a run's or a sweep's metrics.jsonl.

A run (a directory with config.yaml, metrics.jsonl or job.json):

    loss.png        train loss and val_loss against the step (val_acc on a right axis, when logged)
    throughput.png  tokens/s or samples/s against the step (and MFU below it, when logged)
    eval.png        every metric of eval.jsonl (hpctrain eval, trainer.eval_job) against the evaluated
                    checkpoint's step, a panel each (when there are evaluations)
    goodput.png     one bar: the wall time since the first submission, stacked by where it went (queue,
                    start-up, rendezvous, load, compile, data, saves, logging, lost steps, gaps, productive
                    steps: hpctrain.observe.goodput), when the run recorded its attempts

A sweep (its sweep.json, from a Slurm job array or a sweep run here, grid or Optuna; for a sweep run here by
an earlier version, its multirun.yaml or numbered member directories):

    loss.png        every member's train loss (and, in a second panel, val_loss): one line per member,
                    labelled by its own overrides
    throughput.png  every member's throughput against the step
    final.png       bars: each member's final loss and final val_loss
    scaling.png     when members differ in world size: speedup against ranks beside the ideal line, and
                    parallel efficiency

The pictures go to TARGET/report/ unless --out says where; the paths written are printed. A sweep member that
failed (its Slurm state, or an error a rank recorded) or has no metrics is listed as such and left out.
Exit status: 0 written; 1 nothing to plot or a file that cannot be written; 2 bad arguments or a directory
that is neither a run nor a sweep.

Runs on login nodes: no torch here, and matplotlib is imported only when there is something to draw (Agg,
never a display). The ``*_pictures`` functions return what they drew, read back from the figures.

Over 400 lines: every picture of a run and a sweep is drawn here, on the same figure helpers and the same
read-back of what was drawn; split by picture, each part would need them all.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.observe.results import (
    Member,
    Picture,
    ReportError,
    ScalingPoint,
    Series,
    SweepReport,
    error_text,
    last_value,
    load_sweep,
    scaling_points,
    throughput_key,
    values,
    world_size,
)
from hpctrain.rundir import METRICS_FILE, RunDir, eval_metrics
from hpctrain.rundir.records import first_error

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGURE_SIZE = (8.0, 4.5)  # inches; at DPI, 800 × 450 pixels a panel
DPI = 100
CHARS_PER_INCH = 15  # of small text: how many characters a line of a subtitle or legend may hold
IDEAL_COLOR = "#7f7f7f"
LEGEND_WIDTH = 36  # characters of a member's label a line, in a legend
TICK_WIDTH = 30  # ... beside a bar
BAR_LINE_IN = 0.19  # inches a line of a bar's label takes
MAX_LABEL_LINES = 4  # of a member's label, and of a subtitle
LEGEND_LINE_IN = 0.17  # inches a line of small text takes in a legend


def _figure(panels: int, stacked: bool = False) -> tuple[Figure, list[Axes]]:
    """A figure of ``panels`` side by side (``stacked``: one above the other, sharing the x axis)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = FIGURE_SIZE
    if stacked:
        size = (width, height * (1 + 0.45 * (panels - 1)))
    else:
        size = (width * (1 + 0.6 * (panels - 1)), height)
    # A Figure with its own Agg canvas, not pyplot: no global state and no display, whatever MPLBACKEND says.
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    grid = (
        fig.subplots(panels, 1, sharex=True, squeeze=False)
        if stacked
        else fig.subplots(1, panels, squeeze=False)
    )
    axes = [ax for row in grid for ax in row]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, axes


def _integer_steps(*axes: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _panel(ax: Axes, name: str, title: str, xlabel: str, ylabel: str) -> Axes:
    # The Axes' own label (never drawn) names the panel, so that series read back know where they are.
    ax.set_label(name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return ax


def _twin(ax: Axes, name: str, ylabel: str, color: str) -> Axes:
    twin = ax.twinx()
    twin.set_label(name)
    twin.set_ylabel(ylabel, color=color)
    twin.tick_params(axis="y", colors=color)
    return twin


def _legend(*axes: Axes) -> None:
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:
        axes[-1].legend(handles, labels, fontsize="small", loc="best")


def _wrap(label: str, width: int) -> str:
    """A member's label on a few lines, cut after ``MAX_LABEL_LINES`` (overrides are never split inside)."""
    lines = textwrap.wrap(label, width, break_long_words=False) or [label]
    if len(lines) > MAX_LABEL_LINES:
        lines = [*lines[: MAX_LABEL_LINES - 1], lines[MAX_LABEL_LINES - 1] + " …"]
    return "\n".join(lines)


def _member_legend(fig: Figure, ax: Axes) -> None:
    """One legend of the members for the whole figure, below the panels: the labels are overrides, often wider
    than a panel, and every panel shows the same members in the same colours. The figure grows by its height
    rather than squeezing the panels."""
    handles, labels = ax.get_legend_handles_labels()
    width, height = fig.get_size_inches()
    wrapped = [_wrap(label, LEGEND_WIDTH) for label in labels]
    columns = max(1, min(len(handles), int(width * CHARS_PER_INCH) // (LEGEND_WIDTH + 6)))
    rows = -(-len(handles) // columns)
    lines = max((label.count("\n") + 1 for label in wrapped), default=1)
    fig.legend(handles, wrapped, loc="outside lower center", fontsize="small", ncols=columns)
    fig.set_size_inches(width, height + rows * lines * LEGEND_LINE_IN + 0.2)


def _subtitle(fig: Figure, text: str) -> None:
    """The common overrides above the panels, on as many lines as the figure's width needs."""
    fig.suptitle(_wrap(text, int(fig.get_size_inches()[0] * CHARS_PER_INCH)), fontsize="small")


def _colors(n: int) -> list[tuple[str, str]]:
    """(colour, line style) for n members: the colour cycle, then the same colours dashed, dotted, ..."""
    from matplotlib import rcParams

    cycle = rcParams["axes.prop_cycle"].by_key().get("color") or ["#1f77b4"]
    styles = ["-", "--", ":", "-."]
    return [(cycle[i % len(cycle)], styles[(i // len(cycle)) % len(styles)]) for i in range(n)]


def _series_of(fig: Figure) -> list[Series]:
    """What the figure shows, read back from its artists: every labelled line and every set of bars."""
    import numpy as np
    from matplotlib.colors import to_hex
    from matplotlib.container import BarContainer

    found = []
    for ax in fig.axes:
        panel = str(ax.get_label())
        for line in ax.get_lines():
            label = str(line.get_label())
            if label.startswith("_"):  # matplotlib's own unnamed artists
                continue
            xs = tuple(np.asarray(line.get_xdata(), dtype=float).tolist())
            ys = tuple(np.asarray(line.get_ydata(), dtype=float).tolist())
            found.append(Series(panel, label, xs, ys, to_hex(line.get_color())))
        for container in ax.containers:
            if not isinstance(container, BarContainer) or not container.patches:
                continue
            # A bar's category is the tick label nearest its centre, across the bars' direction.
            horizontal = container.orientation == "horizontal"
            axis = ax.yaxis if horizontal else ax.xaxis
            ticks = list(axis.get_ticklocs())
            names = [" ".join(t.get_text().split()) for t in axis.get_ticklabels()]  # as labelled, unwrapped
            xs_bar: list[float | str] = []
            for patch in container.patches:
                if horizontal:
                    centre = patch.get_y() + patch.get_height() / 2
                else:
                    centre = patch.get_x() + patch.get_width() / 2
                xs_bar.append(names[min(range(len(ticks)), key=lambda i: abs(ticks[i] - centre))])
            heights = tuple(float(p.get_width() if horizontal else p.get_height()) for p in container.patches)
            color = to_hex(container.patches[0].get_facecolor())
            found.append(Series(panel, str(container.get_label()), tuple(xs_bar), heights, color))
    return found


def _save(fig: Figure, path: Path) -> Picture:
    series = _series_of(fig)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        # Written aside and renamed: an image viewer or a web page watching the file never reads half a PNG.
        fig.savefig(tmp, format="png", dpi=DPI)
        tmp.replace(path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"cannot write {path}: {err.strerror or err}") from None
    return Picture(path, series)


def _out_dir(target: Path, out: Path | None) -> Path:
    path = out if out is not None else RunDir(target).report
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReportError(f"cannot create {path}: {err.strerror or err}") from None
    return path


def _name(run_dir: Path) -> str:
    """The last two parts of a run's path (outputs/<date>/<time>, <sweep>/<member>): enough to tell it."""
    return "/".join(run_dir.absolute().parts[-2:])


def run_pictures(run_dir: Path, out: Path | None = None) -> list[Picture]:
    """loss.png and (when throughput is logged) throughput.png of one run."""
    records = RunDir(run_dir).read_metrics()
    if not any(r.get("loss") is not None for r in records):
        error = first_error(run_dir)
        if error is not None:
            raise ReportError(f"{run_dir}: failed before logging a step: {error_text(error)}")
        raise ReportError(f"{run_dir}: no metrics yet (no loss in {METRICS_FILE})")
    out_dir = _out_dir(run_dir, out)
    size = world_size(run_dir)
    subtitle = _name(run_dir) + (f" · {size} rank{'s' * (size != 1)}" if size else "")
    pictures = []

    fig, (ax,) = _figure(1)
    _panel(ax, "loss", f"loss — {subtitle}", "step", "loss")
    steps, losses = values(records, "loss")
    ax.plot(steps, losses, color="C0", linewidth=2, label="train loss")
    val_steps, vals = values(records, "val_loss")
    if vals:
        ax.plot(val_steps, vals, "o-", color="C1", linewidth=2, markersize=5, label="val_loss")
    acc_steps, accs = values(records, "val_acc")
    if accs:
        twin = _twin(ax, "val_acc", "val_acc", "C2")
        twin.plot(acc_steps, accs, "s--", color="C2", markersize=5, label="val_acc")
        twin.set_ylim(-0.02, 1.02)  # an accuracy: its whole range, so that a flat 0.0 does not look central
        _legend(ax, twin)
    else:
        _legend(ax)
    _integer_steps(ax)
    pictures.append(_save(fig, out_dir / "loss.png"))

    key = throughput_key(records)
    if key is not None:
        unit = unit_of(key)
        mfu_steps, mfus = values(records, "mfu")
        # MFU gets its own panel: it is throughput × a constant within one run, so on a twin axis of the
        # same plot the two lines would lie exactly on top of each other.
        fig, axes = _figure(2 if mfus else 1, stacked=True)
        ax = _panel(axes[0], "throughput", f"throughput — {subtitle}", "" if mfus else "step", unit)
        steps, rates = values(records, key)
        ax.plot(steps, rates, "o-", color="C0", linewidth=2, markersize=4, label=unit)
        ax.set_ylim(bottom=0)
        _legend(ax)
        if mfus:
            below = _panel(axes[1], "mfu", "model FLOPs utilisation", "step", "MFU (%)")
            below.plot(
                mfu_steps, [100 * v for v in mfus], "s-", color="C3", linewidth=2, markersize=4, label="MFU"
            )
            below.set_ylim(bottom=0)
            _legend(below)
        _integer_steps(*axes)
        pictures.append(_save(fig, out_dir / "throughput.png"))
    evaluated = _evaluations(run_dir)
    if evaluated:
        fig, axes = _figure(len(evaluated), stacked=True)
        for i, (ax, (name, points)) in enumerate(zip(axes, evaluated.items(), strict=True)):
            last = i == len(evaluated) - 1
            title = f"evaluations — {subtitle}" if i == 0 else ""
            _panel(ax, f"eval:{name}", title, "checkpoint step" if last else "", name)
            ax.plot(list(points), list(points.values()), "o-", color=f"C{i}", linewidth=2, label=name)
            _legend(ax)
        _integer_steps(*axes)
        pictures.append(_save(fig, out_dir / "eval.png"))
    book = _ledger(run_dir)
    if book is not None and book.get("wall_s", 0) > 0:
        pictures.append(_goodput_bar(book, subtitle, out_dir / "goodput.png"))
    return pictures


def _ledger(run_dir: Path) -> dict[str, Any] | None:
    """The run's goodput ledger: goodput.json as its last attempt wrote it, else its attempts' records."""
    from hpctrain.observe.goodput import run_ledger
    from hpctrain.rundir.files import read_json

    written = read_json(RunDir(run_dir).goodput)
    if isinstance(written, dict) and isinstance(written.get("buckets_s"), dict):
        return written
    book = run_ledger(run_dir, ask_slurm=False)
    return book.as_dict() if book is not None else None


def _goodput_bar(book: dict[str, Any], subtitle: str, path: Path) -> Picture:
    """One bar of the run's wall time since its first submission, stacked by where it went."""
    fig, (ax,) = _figure(1)
    wall = float(book["wall_s"])
    unit, scale = ("h", 3600.0) if wall >= 7200 else ("min", 60.0) if wall >= 120 else ("s", 1.0)
    title = f"goodput — ETTR {float(book.get('ettr', 0)):.2f} of {wall / scale:.1f} {unit} — {subtitle}"
    _panel(ax, "goodput", title, f"wall time since the first submission ({unit})", "")
    left = 0.0
    for i, (bucket, seconds) in enumerate(book["buckets_s"].items()):
        if seconds > 0:
            ax.barh(
                ["run"],
                [seconds / scale],
                left=left,
                color=f"C{i % 10}",
                label=f"{bucket} {seconds / wall:.0%}",
            )
            left += seconds / scale
    fig.legend(fontsize="small", loc="outside lower center", ncol=3)
    return _save(fig, path)


def _evaluations(run_dir: Path, most: int = 4) -> dict[str, dict[int, float]]:
    """eval.jsonl as metric → {step: value}, steps in order, a step evaluated again by its latest result;
    the first ``most`` metrics (a panel each)."""
    found: dict[str, dict[int, float]] = {}
    for record in sorted(RunDir(run_dir).read_evals(), key=lambda r: r.get("time", 0)):
        for name, value in eval_metrics(record).items():
            if math.isfinite(value) and (name in found or len(found) < most):
                found.setdefault(name, {})[int(record["step"])] = value
    return {name: dict(sorted(points.items())) for name, points in found.items()}


def sweep_pictures(
    members: list[Member], common: list[str], out_dir: Path, scaling: list[ScalingPoint]
) -> list[Picture]:
    """loss.png, throughput.png, final.png and (for a scaling sweep) scaling.png of a sweep's plotted
    members; each member keeps one colour in all of them."""
    plotted = [m for m in members if m.skipped is None]
    if not plotted:
        raise ReportError("nothing to plot: no member of the sweep has metrics")
    styles = dict(zip((m.index for m in plotted), _colors(len(plotted)), strict=True))
    subtitle = f"common: {' '.join(common)}" if common else f"{len(members)} members"
    pictures = []

    with_val = [m for m in plotted if any(r.get("val_loss") is not None for r in m.records)]
    fig, axes = _figure(2 if with_val else 1)
    _subtitle(fig, subtitle)
    _panel(axes[0], "loss", "train loss", "step", "loss")
    for m in plotted:
        color, style = styles[m.index]
        axes[0].plot(*values(m.records, "loss"), linestyle=style, color=color, linewidth=2, label=m.label)
    _member_legend(fig, axes[0])
    if with_val:
        _panel(axes[1], "val_loss", "val_loss", "step", "val_loss")
        for m in with_val:
            color, style = styles[m.index]
            axes[1].plot(
                *values(m.records, "val_loss"), marker="o", linestyle=style, color=color, label=m.label
            )
    _integer_steps(*axes)
    pictures.append(_save(fig, out_dir / "loss.png"))

    key = throughput_key([r for m in plotted for r in m.records])
    if key is not None:
        unit = unit_of(key)
        fig, (ax,) = _figure(1)
        _subtitle(fig, subtitle)
        _panel(ax, "throughput", "throughput", "step", unit)
        for m in plotted:
            steps, rates = values(m.records, key)
            if rates:
                color, style = styles[m.index]
                ax.plot(steps, rates, marker="o", markersize=4, linestyle=style, color=color, label=m.label)
        ax.set_ylim(bottom=0)
        _member_legend(fig, ax)
        _integer_steps(ax)
        pictures.append(_save(fig, out_dir / "throughput.png"))

    pictures.append(_final_bars(plotted, subtitle, out_dir / "final.png"))
    if scaling:
        pictures.append(_scaling(scaling, subtitle, unit_of(key), out_dir / "scaling.png"))
    return pictures


def unit_of(key: str | None) -> str:
    return "samples/s" if key == "samples_per_s" else "tokens/s"


def _final_bars(plotted: list[Member], subtitle: str, path: Path) -> Picture:
    """Horizontal bars, members top to bottom: their labels (overrides) get a line of their own, however many
    members there are."""
    labels = [_wrap(m.label, TICK_WIDTH) for m in plotted]
    fig, (ax,) = _figure(1)
    lines = sum(max(2, label.count("\n") + 1) for label in labels)
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, max(height, 1.6 + lines * BAR_LINE_IN))
    _subtitle(fig, subtitle)
    _panel(ax, "final", "final loss per member", "loss", "")
    finals = {
        "final loss": [last_value(m.records, "loss") for m in plotted],
        "final val_loss": [last_value(m.records, "val_loss") for m in plotted],
    }
    shown = {name: v for name, v in finals.items() if any(x is not None and math.isfinite(x) for x in v)}
    thickness = 0.8 / max(1, len(shown))
    for offset, ((name, lengths), color) in enumerate(zip(shown.items(), ("C0", "C1"), strict=False)):
        # A member without that value (no evaluation yet, or a diverged loss) gets no bar, not a zero.
        kept = [(i, v) for i, v in enumerate(lengths) if v is not None and math.isfinite(v)]
        ys = [i + (offset - (len(shown) - 1) / 2) * thickness for i, _ in kept]
        bars = ax.barh(ys, [v for _, v in kept], height=thickness, color=color, label=name)
        ax.bar_label(bars, fmt="%.3f", fontsize="x-small", padding=2)
    ax.set_yticks(range(len(plotted)), labels, fontsize="small")
    ax.invert_yaxis()  # the first member on top, as in the listing
    ax.margins(x=0.15)  # room for the numbers after the bars
    fig.legend(loc="outside lower center", ncols=len(shown), fontsize="small")
    return _save(fig, path)


def _scaling(points: list[ScalingPoint], subtitle: str, unit: str, path: Path) -> Picture:
    fig, (left, right) = _figure(2)
    base = f"{points[0].ranks} rank{'s' * (points[0].ranks != 1)}"
    _subtitle(fig, f"scaling of {unit}, relative to {base} · {subtitle}")
    ranks = [p.ranks for p in points]
    _panel(left, "speedup", "speedup", "ranks", "speedup")
    left.plot(ranks, [p.ideal for p in points], "--", color=IDEAL_COLOR, label="ideal")
    left.plot(ranks, [p.speedup for p in points], "o-", color="C0", linewidth=2, label="measured")
    left.set_ylim(bottom=0)
    _legend(left)
    _panel(right, "efficiency", "parallel efficiency", "ranks", "efficiency (%)")
    right.plot(ranks, [100.0] * len(points), "--", color=IDEAL_COLOR, label="ideal")
    right.plot(ranks, [100 * p.efficiency for p in points], "o-", color="C0", linewidth=2, label="measured")
    right.set_ylim(0, max(110.0, 100 * max(p.efficiency for p in points) + 10))
    _legend(right)
    for ax in (left, right):
        ax.set_xticks(ranks, [str(r) for r in ranks])
    return _save(fig, path)


def report_sweep(sweep_dir: Path, out: Path | None = None, ask_slurm: bool = True) -> SweepReport:
    common, members = load_sweep(sweep_dir, ask_slurm)
    if not members:
        raise ReportError(f"{sweep_dir}: the sweep has no member runs")
    scaling = scaling_points(members)
    plotted = [m for m in members if m.skipped is None]
    pictures = sweep_pictures(members, common, _out_dir(sweep_dir, out), scaling) if plotted else []
    return SweepReport(members, common, scaling, pictures)


# ---------------------------------------------------------------------------------------------- CLI

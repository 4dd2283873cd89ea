"""PNG plots of the report, drawn with matplotlib's Agg canvas.

Figures are built with the object API (``Figure`` + ``FigureCanvasAgg``), never ``pyplot``: no
global backend switch, no GUI, nothing left open in a user's session.
"""

from __future__ import annotations

import io

import numpy as np

from alignctl.eval.curves import ALARM_PANEL, PANELS, Panel, Series

POLICY_COLOR = "#2563eb"
REFERENCE_COLOR = "#f59e0b"


def _png(fig: object) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # type: ignore[arg-type]
    buf = io.BytesIO()
    canvas.print_png(buf)
    return buf.getvalue()


def _figure(width: float, height: float) -> object:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def reward_histogram(policy: np.ndarray, reference: np.ndarray | None) -> bytes:
    """Overlaid reward histograms on shared bins, with each mean marked."""
    fig = _figure(5.0, 3.2)
    ax = fig.subplots()  # type: ignore[attr-defined]
    both = np.concatenate([policy.ravel(), reference.ravel()]) if reference is not None else policy.ravel()
    low, high = float(both.min()), float(both.max())
    bins = np.linspace(low, high, 31) if high > low else np.linspace(low - 0.5, high + 0.5, 3)
    series = [("policy", policy, POLICY_COLOR)]
    if reference is not None:
        series.append(("reference", reference, REFERENCE_COLOR))
    for name, values, color in series:
        ax.hist(values.ravel(), bins=bins, alpha=0.55, color=color, label=f"{name} (mean {values.mean():.3f})")
        ax.axvline(float(values.mean()), color=color, linestyle="--", linewidth=1.2)
    ax.set_xlabel("reward-model score")
    ax.set_ylabel("responses")
    ax.set_title("Reward distribution")
    ax.legend(fontsize=8, framealpha=0.85)
    return _png(fig)


def length_vs_reward(policy_len: np.ndarray, policy_reward: np.ndarray, reference_len: np.ndarray | None,
                     reference_reward: np.ndarray | None) -> bytes:
    """Reward against response length for each model: a visible slope is a length bias."""
    fig = _figure(5.0, 3.2)
    ax = fig.subplots()  # type: ignore[attr-defined]
    ax.scatter(policy_len.ravel(), policy_reward.ravel(), s=10, alpha=0.6, color=POLICY_COLOR, label="policy")
    if reference_len is not None and reference_reward is not None:
        ax.scatter(reference_len.ravel(), reference_reward.ravel(), s=10, alpha=0.6, color=REFERENCE_COLOR,
                   label="reference")
    ax.set_xlabel("response length (characters)")
    ax.set_ylabel("reward-model score")
    ax.set_title("Reward vs length")
    ax.legend(fontsize=8, framealpha=0.85)
    return _png(fig)


def _informative_band(low: Series, high: Series) -> bool:
    """A p10-p90 band says something unless the quantiles only ever sit on two values (a right/wrong
    reward: p10 and p90 are then its two values at almost every step, a band from 0 to 1)."""
    return len({v for _, v in low} | {v for _, v in high}) > 2


def _draw_panel(ax: object, panel: Panel, group: dict[str, Series]) -> None:
    """Lines per key, labelled for a reader; the reward quantiles p10..p90 as a shaded band behind
    the lines when the band is informative (else p10/p90 are left out)."""
    low, high = group.get("reward/p10"), group.get("reward/p90")
    quantiles = bool(low and high and [s for s, _ in low] == [s for s, _ in high])
    if quantiles and _informative_band(low, high):  # type: ignore[arg-type]
        ax.fill_between([s for s, _ in low], [v for _, v in low], [v for _, v in high],  # type: ignore[attr-defined,union-attr]
                        color=POLICY_COLOR, alpha=0.15, label="p10-p90 of the rewards")
    for key, points in group.items():
        if quantiles and key in ("reward/p10", "reward/p90"):
            continue
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o" if len(points) < 20 else None, markersize=3,  # type: ignore[attr-defined]
                linewidth=1.4, label=panel.label(key), linestyle="--" if key == "reward/p50" else "-")


def _mark_alarms(ax: object, alarms: dict[str, Series]) -> None:
    """A dotted vertical line at every step where the training monitor raised an alarm."""
    for i, (key, points) in enumerate(sorted(alarms.items())):
        for j, (step, _) in enumerate(points):
            ax.axvline(step, color="#c0392b", linestyle=":", linewidth=1.2,  # type: ignore[attr-defined]
                       label=f"alarm: {key.rsplit('/', 1)[-1]}" if j == 0 else None, alpha=0.6 + 0.1 * (i % 4))


def training_curves(panels: list[tuple[str, dict[str, Series]]]) -> bytes:
    """One small panel per group of run metrics (titles from :data:`~alignctl.eval.curves.PANELS`),
    two columns, each with its y-axis label, whole-number steps and readable legend entries;
    monitor alarms mark every panel."""
    from matplotlib.ticker import MaxNLocator

    by_title = {panel.title: panel for panel in PANELS}
    alarms = {k: v for title, group in panels if title == ALARM_PANEL for k, v in group.items()}
    panels = [(title, group) for title, group in panels if title != ALARM_PANEL]
    cols = 2 if len(panels) > 1 else 1
    rows = -(-len(panels) // cols)
    fig = _figure(6.4 * cols / 1.4, 2.6 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())  # type: ignore[attr-defined]
    for ax, (title, group) in zip(axes, panels):
        panel = by_title.get(title, Panel(title))
        _draw_panel(ax, panel, group)
        _mark_alarms(ax, alarms)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step", fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7, frameon=False)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return _png(fig)

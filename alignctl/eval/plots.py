"""PNG plots of the report, drawn with matplotlib's Agg canvas.

Figures are built with the object API (``Figure`` + ``FigureCanvasAgg``), never ``pyplot``: no
global backend switch, no GUI, nothing left open in a user's session.
"""

from __future__ import annotations

import io

import numpy as np

from alignctl.eval.curves import ALARM_PANEL, Series

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


def _draw_panel(ax: object, group: dict[str, Series]) -> None:
    """Lines per key; the reward quantiles p10..p90 are drawn as a shaded band behind the lines."""
    low, high = group.get("reward/p10"), group.get("reward/p90")
    if low and high and [s for s, _ in low] == [s for s, _ in high]:
        ax.fill_between([s for s, _ in low], [v for _, v in low], [v for _, v in high],  # type: ignore[attr-defined]
                        color=POLICY_COLOR, alpha=0.15, label="reward p10-p90")
    for key, points in group.items():
        if low and high and key in ("reward/p10", "reward/p90"):
            continue
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o" if len(points) < 20 else None, markersize=3,  # type: ignore[attr-defined]
                linewidth=1.4, label=key, linestyle="--" if key == "reward/p50" else "-")


def _mark_alarms(ax: object, alarms: dict[str, Series]) -> None:
    """A dotted vertical line at every step where the training monitor raised an alarm."""
    for i, (key, points) in enumerate(sorted(alarms.items())):
        for j, (step, _) in enumerate(points):
            ax.axvline(step, color="#c0392b", linestyle=":", linewidth=1.2,  # type: ignore[attr-defined]
                       label=f"alarm: {key.rsplit('/', 1)[-1]}" if j == 0 else None, alpha=0.6 + 0.1 * (i % 4))


def training_curves(panels: list[tuple[str, dict[str, Series]]]) -> bytes:
    """One small panel per group of run metrics, two columns; monitor alarms mark every panel."""
    alarms = {k: v for title, group in panels if title == ALARM_PANEL for k, v in group.items()}
    panels = [(title, group) for title, group in panels if title != ALARM_PANEL]
    cols = 2 if len(panels) > 1 else 1
    rows = -(-len(panels) // cols)
    fig = _figure(6.4 * cols / 1.4, 2.6 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())  # type: ignore[attr-defined]
    for ax, (title, group) in zip(axes, panels):
        _draw_panel(ax, group)
        _mark_alarms(ax, alarms)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7, frameon=False)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return _png(fig)

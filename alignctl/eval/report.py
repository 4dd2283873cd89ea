"""The eval report: ``results.json``, ``report.md``, a self-contained ``report.html`` and PNG plots.

Templates are jinja2 files shipped inside the package (``report.html.j2``, ``report.md.j2``, read
through :mod:`alignctl.templating`). The HTML environment autoescapes everything, so model responses
(which may hold ``<script>`` or any markup) are shown as text; images are embedded as base64
``data:`` URIs and the CSS is inline, so the file opens anywhere, offline, without the plots folder.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
from pathlib import Path
from typing import Any

import numpy as np

from alignctl.eval import plots
from alignctl.eval.curves import PANELS, panel_keys
from alignctl.eval.report_summary import accuracy_change, choose_samples, verdict
from alignctl.eval.results import EvalResults
from alignctl.templating import template_environment

HTML_TEMPLATE = "report.html.j2"
MD_TEMPLATE = "report.md.j2"


# ----------------------------------------------------------------------------------- plots


def _rewards(results: EvalResults, role: str, key: str) -> np.ndarray | None:
    values = [s[key] for sample in results.samples for s in sample.get(role, [])]
    if not values or any(v is None for v in values):
        return None
    return np.array(values, dtype=np.float64)


def make_plots(results: EvalResults) -> dict[str, bytes]:
    """name -> PNG bytes for every plot the results support."""
    out: dict[str, bytes] = {}
    policy_r, reference_r = _rewards(results, "policy", "reward"), _rewards(results, "reference", "reward")
    if policy_r is not None:
        out["reward_histogram"] = plots.reward_histogram(policy_r, reference_r)
        out["reward_vs_length"] = plots.length_vs_reward(
            _rewards(results, "policy", "length"), policy_r,  # type: ignore[arg-type]
            _rewards(results, "reference", "length"), reference_r)
    if results.curves:
        panels = []
        for panel in PANELS:
            if keys := panel_keys(panel, results.curves):
                panels.append((panel.title, {k: [tuple(p) for p in results.curves[k]] for k in keys}))
        out["training_curves"] = plots.training_curves(panels)  # type: ignore[arg-type]
    return out


# --------------------------------------------------------------------------------- context


def build_context(results: EvalResults, images: dict[str, bytes]) -> dict[str, Any]:
    cfg = results.config
    change = accuracy_change(results.samples, num_bootstrap=int(cfg.get("num_bootstrap", 1000)),
                             seed=int(cfg.get("seed", 0)))
    choice = choose_samples(results, int(cfg.get("max_samples_in_report", 20)))
    sampling = (f"sampled, temperature {cfg.get('temperature')}, top-p {cfg.get('top_p')}, seed {cfg.get('seed')}"
                if cfg.get("do_sample") else "greedy")
    reward_rows = []
    for role, prefix in (("policy", ""), ("reference", "reference_")):
        mean = getattr(results, f"{prefix}mean_reward")
        if mean is not None:
            reward_rows.append({"model": role, "mean": mean, "std": getattr(results, f"{prefix}reward_std"),
                                "quantiles": getattr(results, f"{prefix}reward_quantiles")})
    return {
        "r": results,
        "cfg": cfg,
        "sampling": sampling,
        "created": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "reward_rows": reward_rows,
        "quantile_names": list(reward_rows[0]["quantiles"]) if reward_rows else [],
        "accuracy_metrics": sorted({m for t in results.accuracy.values() for m in t if m != "num_prompts"},
                                   key=lambda m: (m.split("@")[0] != "pass", int(m.split("@")[1]))),
        "images": {name: base64.b64encode(png).decode("ascii") for name, png in images.items()},
        "curve_labels": {key: panel.label(key) for panel in PANELS for key in panel_keys(panel, results.curve_summary)},
        "samples": choice.samples,
        "samples_how": choice.how,
        "change": change,
        "verdict": verdict(results, change),
    }


def write_report(results: EvalResults, folder: str | Path) -> None:
    """Write results.json, plots/*.png, report.md and report.html into ``folder``."""
    folder = Path(folder)
    images = make_plots(results)
    if images:
        (folder / "plots").mkdir(parents=True, exist_ok=True)
        for name, png in images.items():
            (folder / "plots" / f"{name}.png").write_bytes(png)
    (folder / "results.json").write_text(json.dumps(results.to_dict(), indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
    context = build_context(results, images)
    (folder / "report.md").write_text(template_environment(False).get_template(MD_TEMPLATE).render(**context), encoding="utf-8")
    (folder / "report.html").write_text(template_environment(True).get_template(HTML_TEMPLATE).render(**context), encoding="utf-8")

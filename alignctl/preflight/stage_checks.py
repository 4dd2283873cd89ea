"""Per-stage preflight: every file, folder and output of one resolved stage config."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from alignctl.config.eval import EvalConfig
from alignctl.config.import_model import ImportModelConfig
from alignctl.config.init_model import InitModelConfig
from alignctl.config.preprocess import PreprocessConfig
from alignctl.config.train_rm import RewardModelConfig
from alignctl.config.sft import SFTConfig
from alignctl.errors import UserError
from alignctl.pipeline.ownership import check_output_dir
from alignctl.preflight.context import Context
from alignctl.preflight.data_checks import PREFERENCE_COLUMNS, check_columns, check_file, refuse_preference_file
from alignctl.preflight.models import check_layer_count, check_model


def check_python_function(spec_path: str | None, name: str | None, key: str, ctx: Context) -> None:
    """A user's Python file exists, parses, and defines ``name`` at top level. Read, not run: the
    file runs only when the stage itself starts (see docs/security.md)."""
    if not spec_path or ctx.later(spec_path):
        return
    path = check_file(spec_path, key, ctx)
    assert path is not None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        raise UserError(f"{key} {spec_path}: syntax error line {exc.lineno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{key} {spec_path}: not a readable Python file ({type(exc).__name__})") from None
    if name is None:
        return
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                     ast.ClassDef))}
    defined |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    defined |= {(a.asname or a.name).split(".")[0] for node in tree.body
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    if name not in defined:
        raise UserError(f"{key} {spec_path}: has no function {name!r} (top-level names: "
                        f"{', '.join(sorted(defined)) or 'none'})")


def _output(dest: str, key: str, ctx: Context, inputs: list[Any]) -> None:
    if ctx.outputs:
        check_output_dir(dest, key=key, overwrite=ctx.overwrite, inputs=[i for i in inputs if i])


def check_preprocess(cfg: PreprocessConfig, ctx: Context) -> None:
    inputs: list[Any] = []
    if cfg.input and (cfg.dataset != "gsm8k" or Path(cfg.input).expanduser().exists()):
        if not ctx.later(cfg.input) and not Path(cfg.input).expanduser().exists():
            raise UserError(f"--input {cfg.input}: input not found; expected a file or a folder")
        inputs.append(cfg.input)
    if cfg.map_fn:
        file, _, func = cfg.map_fn.rpartition(":")
        if not file:
            raise UserError(f"--map-fn {cfg.map_fn}: expected 'path/to/file.py:function'")
        check_python_function(file, func, "key 'map_fn'", ctx)
        inputs.append(file)
    _output(cfg.out, "--out", ctx, inputs)


def check_init_model(cfg: InitModelConfig, ctx: Context) -> None:
    from alignctl.models.tiny import check_init_args

    check_init_args(cfg.arch, cfg.hidden, cfg.layers, cfg.heads, None, cfg.intermediate, cfg.vocab_size,
                    cfg.tokenizer_kind, cfg.max_position_embeddings)
    for name in cfg.tokenizer_from:
        if not ctx.later(name) and not Path(name).expanduser().exists():
            raise UserError(f"--tokenizer-from: tokenizer data path '{name}' does not exist; expected a "
                            f"parquet/jsonl file or folder")
    _output(cfg.out, "--out", ctx, list(cfg.tokenizer_from))


def check_import_model(cfg: ImportModelConfig, ctx: Context) -> None:
    from alignctl.models.gguf_import import inspect_gguf, resolve_source

    if cfg.gguf is not None and ctx.later(cfg.gguf):
        _output(cfg.out, "--out", ctx, [cfg.gguf])
        return
    # The header only (architecture, tensor types): the file itself is read when the stage runs.
    path, key = resolve_source(cfg.gguf, cfg.from_package)
    inspect_gguf(path, key)
    _output(cfg.out, "--out", ctx, [path])


def check_sft(cfg: SFTConfig, ctx: Context) -> None:
    check_model(cfg.model.path, "model.path", ctx, "causal", needs_tokenizer=True)
    check_layer_count(cfg.model.path, cfg.model.freeze_layers, "model.freeze_layers", ctx)
    needed = [cfg.data.prompt_key, cfg.data.response_key]
    check_columns(cfg.data.train_files, "data.train_files", ctx, needed, "SFT rows (prompt and response)")
    check_columns(cfg.data.val_files, "data.val_files", ctx, needed, "SFT rows (prompt and response)")
    _output(cfg.output_dir, "output_dir", ctx, [cfg.model.path, *cfg.data.train_files, *cfg.data.val_files])


def check_reward_model(cfg: RewardModelConfig, ctx: Context) -> None:
    check_model(cfg.model.path, "model.path", ctx, "critic", needs_tokenizer=True)  # a causal LM or a reward model
    check_layer_count(cfg.model.path, cfg.model.freeze_layers, "model.freeze_layers", ctx)
    needed = ["prompt", *PREFERENCE_COLUMNS]
    check_columns(cfg.data.train_files, "data.train_files", ctx, needed, "preference pairs")
    check_columns(cfg.data.val_files, "data.val_files", ctx, needed, "preference pairs")
    _output(cfg.output_dir, "output_dir", ctx, [cfg.model.path, *cfg.data.train_files, *cfg.data.val_files])


def check_eval(cfg: EvalConfig, ctx: Context) -> None:
    check_model(cfg.policy, "policy", ctx, "causal", needs_tokenizer=True)
    check_model(cfg.reference, "reference", ctx, "causal", needs_tokenizer=True)
    check_model(cfg.reward_model, "reward_model", ctx, "reward", needs_tokenizer=True)
    check_model(cfg.judge_model, "judge_model", ctx, "reward", needs_tokenizer=True)
    check_model(cfg.likelihood_model, "likelihood_model", ctx, "causal", needs_tokenizer=True)
    if cfg.prompts:
        check_columns([cfg.prompts], "prompts", ctx, [cfg.prompt_key], "RL prompt rows")
        refuse_preference_file(cfg.prompts, "prompts", ctx)
    if cfg.preference_data:
        check_columns([cfg.preference_data], "preference_data", ctx, ["prompt", *PREFERENCE_COLUMNS],
                      "preference pairs")
    if cfg.run and not ctx.later(cfg.run) and not (Path(cfg.run) / "metrics.jsonl").is_file():
        raise UserError(f"run {cfg.run}: no metrics.jsonl there; expected an RL run folder")
    for i, source in enumerate(cfg.reuse_generations):
        if not ctx.later(source) and not Path(source).expanduser().is_dir():
            raise UserError(f"reuse_generations[{i}] {source}: no such folder; expected an earlier eval output "
                            f"(its generations.json)")
    _output(cfg.out, "--out", ctx, [cfg.policy, cfg.reference, cfg.reward_model, cfg.judge_model, cfg.likelihood_model,
                                    cfg.prompts, cfg.preference_data, cfg.run])

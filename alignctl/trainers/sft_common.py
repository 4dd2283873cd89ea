"""Plumbing shared by the ``sft`` and ``train-rm`` stages around TRL's trainers.

Reading parquet into ``datasets.Dataset`` with one-line errors, turning alignctl's config sections
into TRL/transformers ``TrainingArguments`` keywords, a rich progress bar callback, quieting
library chatter, and writing the trained model as an atomic artifact (multi-process safe).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alignctl.cpu_heap import keep_freed_memory
from alignctl.device import bf16_if_native, cuda_available, native_bf16, resolve_device
from alignctl.errors import UserError
from alignctl.models.compat import training_checkpointing_key
from alignctl.quiet import filter_deepspeed_cpu_notice, no_transformers_bars

if TYPE_CHECKING:  # keep heavy imports out of module import time
    import datasets

# Scratch folder the HF Trainer may write into (never checkpoints: save_strategy="no"); a sibling of
# the destination so the final move stays on one filesystem.
_STAGING_SUFFIX = ".staging"


# ------------------------------------------------------------------------------------ data


def read_parquet_files(files: Sequence[str], what: str, expected: str = "rows") -> datasets.Dataset:
    """Concatenate parquet ``files`` into an in-memory ``datasets.Dataset`` (no cache files).

    ``what`` names the config key in errors (e.g. ``data.train_files``), ``expected`` the rows the
    stage needs; each file is read by :func:`alignctl.data.readers.read_parquet`."""
    import datasets
    import pyarrow as pa

    from alignctl.data.readers import read_parquet

    tables = [read_parquet(name, expected, key=what, allow_empty=False) for name in files]
    if len(tables) > 1:
        try:
            table = pa.concat_tables(tables, promote_options="default")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise UserError(f"{', '.join(files)}: {what} files have incompatible columns ({exc})") from None
    return datasets.Dataset(datasets.table.InMemoryTable(tables[0] if len(tables) == 1 else table))


def as_dataset(data: Any, what: str) -> datasets.Dataset:
    """A parquet path, a list of them, a pandas DataFrame, a ``datasets.Dataset`` or a list of row
    dicts -> Dataset."""
    import datasets

    if isinstance(data, datasets.Dataset):
        if len(data) == 0:
            raise UserError(f"{what}: the dataset has no rows; expected at least one")
        return data
    if isinstance(data, (str, os.PathLike)):
        return read_parquet_files([os.fspath(data)], what)
    if isinstance(data, (list, tuple)) and all(isinstance(d, (str, os.PathLike)) for d in data):
        return read_parquet_files([os.fspath(d) for d in data], what)
    if type(data).__name__ == "DataFrame":
        return as_dataset(datasets.Dataset.from_pandas(data, preserve_index=False), what)
    if isinstance(data, (list, tuple)) and data and all(isinstance(d, dict) for d in data):
        return datasets.Dataset.from_list([dict(d) for d in data])
    raise UserError(f"{what}: expected a parquet path, a datasets.Dataset, a pandas DataFrame or a non-empty "
                    f"list of row dicts, got {type(data).__name__}")


def take(ds: datasets.Dataset, n: int | None) -> datasets.Dataset:
    return ds if n is None or n >= len(ds) else ds.select(range(n))


# ------------------------------------------------------------------------------ arguments


def resolve_precision(precision: str) -> dict[str, bool]:
    """``trainer.precision`` -> bf16/fp16 flags. bf16 autocast on a CPU pays only with bf16 matmul
    instructions (avx512_bf16 / AMX: 2.5x on SmolLM2, docs/models.md) and costs elsewhere (11x on an
    AVX2-only CPU) and on tiny models, so 'auto' only turns it on for a GPU that supports it; CPU users ask
    for it with 'bf16', or with 'bf16_if_native' where the same file must also run well on other CPUs."""
    device = resolve_device("auto")
    if precision == "auto":
        precision = "bf16" if device == "cuda" and native_bf16(device) else "fp32"
    precision = bf16_if_native(precision, device)
    if precision == "bf16" and device == "cpu" and not native_bf16(device):
        from alignctl.console import console

        console.print("note: trainer.precision=bf16 on a CPU without bf16 matmul instructions runs slower than fp32 "
                      "(11x per train-rm step measured on AVX2 cores); bf16_if_native picks fp32 on such a CPU",
                      soft_wrap=True)
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def model_init_kwargs(model: Any, attn_implementation: str) -> dict[str, Any]:
    """``from_pretrained`` keywords TRL uses when it loads ``model.path`` (offline for local paths)."""
    from alignctl.models.loading import looks_local

    return {"dtype": model.dtype, "attn_implementation": attn_implementation,
            "trust_remote_code": model.trust_remote_code, "local_files_only": looks_local(model.path)}


def training_kwargs(cfg: Any, scratch: Path, *, has_eval: bool, max_length: int | None,
                    attn_implementation: str) -> dict[str, Any]:
    """Keyword arguments common to ``trl.SFTConfig`` and ``trl.RewardConfig`` from a stage config
    with ``model``/``optim``/``trainer`` sections (the SFT and RM schemas share them)."""
    t, o = cfg.trainer, cfg.optim
    return {
        "output_dir": str(scratch),
        "per_device_train_batch_size": t.micro_batch_size,
        "per_device_eval_batch_size": t.micro_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "num_train_epochs": t.total_epochs,
        "max_steps": t.max_steps if t.max_steps is not None else -1,
        "learning_rate": o.lr,
        "warmup_steps": o.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps
        "lr_scheduler_type": o.lr_scheduler,
        "weight_decay": o.weight_decay,
        "max_grad_norm": o.clip_grad,
        "seed": t.seed,
        "data_seed": t.seed,
        "logging_steps": t.logging_steps,
        "logging_first_step": True,  # the first logged loss is the "before" number of the manifest
        "eval_strategy": "steps" if (has_eval and t.eval_steps) else "no",
        "eval_steps": t.eval_steps,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,  # our own progress bar (ProgressBarCallback)
        training_checkpointing_key(): t.gradient_checkpointing,
        "deepspeed": t.deepspeed,
        "fsdp": t.fsdp or "",
        "max_length": max_length,
        "model_init_kwargs": model_init_kwargs(cfg.model, attn_implementation),
        "trust_remote_code": cfg.model.trust_remote_code,
        "dataset_num_proc": None,
        "dataloader_pin_memory": cuda_available(),  # pinning without a GPU only warns
        # Without use_cpu, accelerate ignores a torchrun/accelerate launch on a CPU-only machine and
        # every process trains alone; with it, the processes form one gloo DDP group.
        "use_cpu": not cuda_available(),
        **resolve_precision(t.precision),
    }


def make_trainer(build: Callable[[], Any], what: str) -> Any:
    """Construct a TRL trainer (it loads the model); the ValueErrors TRL raises for bad input (pad
    token missing from the vocabulary, wrong num_labels, ...) and OSErrors of unreadable weights
    become one-line UserErrors naming the stage. On a CPU-only machine the process keeps freed heap
    memory first (:mod:`alignctl.cpu_heap`: the training steps stop paging their buffers in again)."""
    if not cuda_available():
        keep_freed_memory()
    try:
        return build()
    except (ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{what}: {first}") from exc


def check_model_folder(path: str, what: str = "model.path") -> None:
    """A local-looking ``model.path`` must be a HF folder; a bare ``org/name`` may be a hub id."""
    from alignctl.models.loading import looks_local

    if not looks_local(path):
        return
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UserError(f"{what} '{path}' does not exist; expected a Hugging Face model folder with config.json")
    if not (folder / "config.json").is_file():
        raise UserError(f"{what} '{path}' has no config.json; expected a Hugging Face model folder")


def load_tokenizer_for_training(path: str, trust_remote_code: bool) -> Any:
    """Right-padded tokenizer with a pad token (training batches are right-padded)."""
    from alignctl.models.loading import load_tokenizer

    return load_tokenizer(path, padding_side="right", trust_remote_code=trust_remote_code)


def manifest_inputs(cfg: Any) -> dict[str, str]:
    """What the artifact was built from: the start model and every data file, by config key."""
    inputs = {"model.path": str(cfg.model.path)}
    for key in ("train_files", "val_files"):
        inputs.update({f"data.{key}[{i}]": str(f) for i, f in enumerate(getattr(cfg.data, key))})
    return inputs


# ------------------------------------------------------------------------------- history


def logged_series(log_history: list[dict[str, Any]], key: str) -> list[float]:
    """Values of ``key`` in the HF Trainer's ``state.log_history``, in order."""
    return [float(entry[key]) for entry in log_history if key in entry]


# ------------------------------------------------------------------------------ progress


def progress_callback(enabled: bool, description: str) -> Any:
    """A ``TrainerCallback`` drawing one rich progress bar over optimizer steps (loss in the
    description). Disabled outside a terminal (CI logs), like :func:`alignctl.console.track`."""
    from transformers import TrainerCallback

    from alignctl.console import progress_bar, progress_enabled

    class ProgressBarCallback(TrainerCallback):
        def __init__(self) -> None:
            self.bar: Any = None
            self.task: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not (enabled and progress_enabled() and state.is_world_process_zero):
                return
            self.bar = progress_bar()
            self.bar.start()
            self.task = self.bar.add_task(description, total=state.max_steps)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.bar is not None:
                self.bar.update(self.task, completed=state.global_step)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if self.bar is not None and logs and "loss" in logs:
                self.bar.update(self.task, description=f"{description} loss={float(logs['loss']):.4f}")

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.bar is not None:
                self.bar.stop()
                self.bar = None

    return ProgressBarCallback()


def drop_printer_callback(trainer: Any) -> None:
    """With tqdm disabled the HF Trainer prints every log dict to stdout; our bar and summary
    table replace that."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


# ------------------------------------------------------------------------------ quieting


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Silence transformers/TRL/datasets info chatter and per-map progress bars during a stage
    (their warnings about choices alignctl made on the user's behalf only confuse); restores the
    previous verbosity afterwards. Errors still raise."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    filter_deepspeed_cpu_notice()
    import datasets
    import transformers

    old_tf = transformers.logging.get_verbosity()
    old_ds = datasets.logging.get_verbosity()
    bars_were_on = datasets.is_progress_bar_enabled()
    loggers = [logging.getLogger(name) for name in ("trl", "accelerate", "torch.distributed")]
    old_levels = [lg.level for lg in loggers]
    transformers.logging.set_verbosity_error()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), no_transformers_bars():  # "Loading weights" / "Writing model shards"
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", category=UserWarning, module=r"(transformers|trl|accelerate|torch)\.")
            yield
    finally:
        transformers.logging.set_verbosity(old_tf)
        datasets.logging.set_verbosity(old_ds)
        if bars_were_on:
            datasets.enable_progress_bars()
        for lg, level in zip(loggers, old_levels):
            lg.setLevel(level)


# ------------------------------------------------------------------------------ artifacts


def staging_dir(dest: str | os.PathLike[str]) -> Path:
    """Deterministic scratch sibling of ``dest``: every rank of a multi-process run computes the
    same path without talking to the others."""
    dest = Path(dest).absolute()
    return dest.with_name(f".{dest.name}{_STAGING_SUFFIX}")


def save_artifact(trainer: Any, dest: str | os.PathLike[str], finish: Callable[[Path], None]) -> Path:
    """Save the trained model + tokenizer, then on the main process move them into ``dest``
    atomically, calling ``finish(folder)`` (extra files, then the manifest) before the rename.

    All ranks must call this: ``save_model`` gathers sharded (ZeRO-3 / FSDP) weights."""
    from alignctl.pipeline.atomic import atomic_output_dir

    staging = staging_dir(dest) / "model"
    trainer.save_model(str(staging))
    trainer.accelerator.wait_for_everyone()
    dest = Path(dest).absolute()
    if trainer.accelerator.is_main_process:
        (staging / "training_args.bin").unlink(missing_ok=True)  # a pickle; the manifest holds the config
        with atomic_output_dir(dest) as tmp:
            for item in staging.iterdir():
                shutil.move(str(item), tmp / item.name)
            finish(tmp)
        shutil.rmtree(staging_dir(dest), ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    return dest


def remove_staging(dest: str | os.PathLike[str]) -> None:
    shutil.rmtree(staging_dir(dest), ignore_errors=True)

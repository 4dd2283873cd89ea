"""Keeping third-party chatter off the user's console (a leaf: imports nothing from alignctl).

Two sources reach every stage and every Ray worker: transformers' tqdm bars ("Loading weights",
"Writing model shards"), drawn on each ``from_pretrained`` / ``save_pretrained``, and DeepSpeed's
"Setting accelerator to CPU" warning, logged on every import on a machine without a GPU, where it
is expected. Stages that drive TRL quiet more (``trainers/sft_common.quiet_libraries``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

DEEPSPEED_LOGGER = "DeepSpeed"


def not_cpu_accelerator_notice(record: logging.LogRecord) -> bool:
    """Logging filter: drop DeepSpeed's notice that it "was unable to detect" a GPU."""
    return "Setting accelerator to CPU" not in record.getMessage()


def filter_deepspeed_cpu_notice() -> None:
    """Attach :func:`not_cpu_accelerator_notice` to DeepSpeed's logger, once per process (DeepSpeed
    re-creates its logger on import but keeps the filters already attached to it)."""
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    if not_cpu_accelerator_notice not in logger.filters:
        logger.addFilter(not_cpu_accelerator_notice)


@contextlib.contextmanager
def no_transformers_bars() -> Iterator[None]:
    """transformers' progress bars off inside, restored to what they were afterwards."""
    import transformers

    bars_were_on = transformers.logging.is_progress_bar_enabled()
    transformers.logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars_were_on:
            transformers.logging.enable_progress_bar()

"""Asking the Hugging Face hub, once and quickly, whether a repository can be used.

The hub clients retry for half a minute or more before they give up on an unreachable hub;
a stage that is about to load a hub model or data set asks here first, with a short timeout,
and turns the answer into a one-line error of its own. Below every other alignctl module
(it imports none of them): preflight checks models with it, ``preprocess gsm8k`` its data set.
"""

from __future__ import annotations

import os
from typing import Literal

RepoType = Literal["model", "dataset"]
HUB_TIMEOUT_S = 5.0


def hub_offline(repo_type: RepoType = "model") -> bool:
    """``HF_HUB_OFFLINE`` is set (for models also ``TRANSFORMERS_OFFLINE``)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    return repo_type == "model" and os.environ.get("TRANSFORMERS_OFFLINE") in ("1", "true", "True")


def hub_problem(repo_id: str, repo_type: RepoType = "model", *, cached_file: str | None = None,
                timeout: float = HUB_TIMEOUT_S) -> str | None:
    """None when ``repo_id`` can be used: ``cached_file`` of it is in the local hub cache, or the
    hub (``HF_ENDPOINT`` as it is now) answers that the repository exists. Otherwise why not, as
    a clause such as "the hub answered ConnectError" (see :func:`is_network_problem`)."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    if cached_file is not None and isinstance(try_to_load_from_cache(repo_id, cached_file, repo_type=repo_type),
                                               str):
        return None
    if hub_offline(repo_type):
        return "offline mode is set and it is not in the hub cache"
    try:
        HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).repo_info(repo_id, repo_type=repo_type,
                                                                        timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - network, 404, auth: each means "cannot use it"
        return f"the hub answered {type(exc).__name__}"
    return None


def is_network_problem(why: str) -> bool:
    """``why`` (from :func:`hub_problem`) says the hub could not be asked, not that it said no."""
    return any(word in why for word in ("Connect", "Timeout", "Network", "offline"))

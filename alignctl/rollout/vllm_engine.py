"""``vllm`` rollout engine (optional extra ``alignctl[vllm]``, CUDA only).

Written against the public vLLM 0.8-0.11 API (``vllm.LLM`` with ``enable_sleep_mode``,
``LLM.sleep`` / ``LLM.wake_up``, ``LLM.collective_rpc``); UNTESTED HERE: this machine has no CUDA
and vLLM wheels pin a different torch. Its tests skip with a reason when vllm or CUDA is absent.

Lifecycle in the hybrid worker (one GPU shared by training and generation):

    engine.wake()                  # weights + KV cache back on the GPU
    engine.sync_weights(actor)     # after every actor update: push the new weights
    out = engine.generate(...)
    engine.sleep()                 # level 1: weights to CPU, KV cache dropped -> memory for training

Weight sync goes through ``LLM.collective_rpc`` with a function executed on every vLLM worker that
calls the model runner's ``model.load_weights`` (the loader vLLM uses for checkpoints, so HF
parameter names and tensor-parallel sharding are handled by vLLM). With vLLM's V1 engine in
multiprocess mode the tensors are pickled to the worker; set ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
for the colocated single-GPU case so they are passed in-process.

Log-probs: vLLM is asked for ``logprobs_mode="processed_logprobs"`` where supported (>= 0.10.2):
with top-k / top-p disabled (the usual RL rollout setting) that is ``log softmax(logits / T)``, the
alignctl convention. With top-k / top-p on, vLLM renormalises over the kept tokens, so its values
differ from the ``hf`` engine's pre-filter log-probs; alignctl recomputes old log-probs with the
actor anyway.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from alignctl.device import cuda_available
from alignctl.errors import UserError
from alignctl.rollout.base import RolloutEngine, RolloutOutput, SamplingParams, validate_prompts


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside each vLLM worker (via ``collective_rpc``): load HF-named tensors into its model."""
    model = worker.model_runner.model
    model.load_weights(weights=weights)
    return len(weights)


def _full_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Materialise FSDP2 / DTensor shards as full tensors, detached."""
    for name, tensor in named:
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield name, full.detach()


class VLLMRolloutEngine(RolloutEngine):
    """Generation with a ``vllm.LLM`` that lives in the rollout worker process."""

    name = "vllm"

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer_path: str | None = None,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        sleep_level: int = 1,
        seed: int = 0,
        pad_token_id: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _import_vllm()
        if not cuda_available():
            raise UserError("rollout engine 'vllm' needs a CUDA GPU; use rollout.name=hf on CPU")
        kwargs: dict[str, Any] = dict(
            model=model_path, tokenizer=tokenizer_path or model_path, dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager, enable_sleep_mode=True, seed=seed, **llm_kwargs,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if "logprobs_mode" in {f.name for f in dataclasses.fields(vllm.EngineArgs)}:
            kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self._vllm = vllm
        self.llm = vllm.LLM(**kwargs)
        self.sleep_level = sleep_level
        self.asleep = False
        if pad_token_id is None:  # (with skip_tokenizer_init=True the caller must pass pad_token_id)
            tokenizer = self.llm.get_tokenizer()
            pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad_token_id)

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sleep(self) -> None:
        if not self.asleep:
            self.llm.reset_prefix_cache()  # cached blocks were computed with the old weights
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def sync_weights(self, weights: nn.Module | Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Push the training module's parameters (or explicit (name, tensor) pairs) into vLLM."""
        if weights is None:
            raise UserError("vllm rollout: sync_weights needs the training module or (name, tensor) pairs")
        named = weights.state_dict().items() if isinstance(weights, nn.Module) else weights
        self.wake()
        batch = list(_full_tensors(named))
        self.llm.collective_rpc(_load_weights_on_worker, args=(batch,))
        self.llm.reset_prefix_cache()

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        prompts = validate_prompts(prompt_ids)
        self.wake()
        start = time.perf_counter()
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], self._sampling_params(params),
                                    use_tqdm=False)
        responses, logps, reasons = [], [], []
        for request in outputs:
            for completion in sorted(request.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                responses.append(ids)
                logps.append(_chosen_logprobs(ids, completion.logprobs) if params.logprobs else [])
                reasons.append("stop" if completion.finish_reason == "stop" else "length")
        elapsed = time.perf_counter() - start
        n_tokens = float(sum(len(r) for r in responses))
        metrics = {"rollout/total_s": elapsed, "rollout/tokens": n_tokens,
                   "rollout/tokens_per_s": n_tokens / max(elapsed, 1e-9)}
        return RolloutOutput.from_ragged(responses, logps if params.logprobs else None, reasons, params.n,
                                         self.pad_token_id, metrics)

    def _sampling_params(self, params: SamplingParams) -> Any:
        """alignctl SamplingParams -> vllm.SamplingParams (greedy = temperature 0 in vLLM)."""
        explicit_stops = params.stop_token_ids is not None
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=0.0 if params.is_greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
            # explicit stop ids replace the EOS default exactly (ignore_eos), as in the hf engine
            stop_token_ids=list(params.stop_token_ids or ()),
            ignore_eos=explicit_stops,
            logprobs=0 if params.logprobs else None,
            detokenize=False,
        )


def _chosen_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """vLLM returns per position a {token_id: Logprob} dict that always contains the sampled token."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no logprobs although SamplingParams.logprobs was set")
    return [float(step[tok].logprob) for tok, step in zip(token_ids, logprobs)]


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise UserError("rollout engine 'vllm' needs the optional extra: pip install 'alignctl[vllm]'") from exc
    return vllm

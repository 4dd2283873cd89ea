"""KV cache for the ``hf`` rollout engine.

transformers' ``DynamicLayer`` grows by ``torch.cat`` at every decode step, which re-copies the
whole cache each token (O(L^2) memory traffic over a rollout). Here every layer preallocates
``capacity = prompt_len + max_new_tokens`` slots once, writes new keys/values in place and hands
attention a view of the filled prefix, so a decode step only reads the cache.

The layer subclasses ``DynamicLayer`` so transformers' mask and model code treat it as a plain
full-attention layer (``get_mask_sizes`` = seen + query length, offset 0). It is used only when
every layer of the model is full attention; other models fall back to ``DynamicCache``.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's keys/values in fixed buffers [b, heads, capacity, head_dim]."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, dk = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k = key_states.new_empty((b, h, self.capacity, dk))
        self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self._k is not None and self._v is not None
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: {end} tokens > capacity {self.capacity}")
        self._k[:, :, self.length : end].copy_(key_states)
        self._v[:, :, self.length : end].copy_(value_states)
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def reset(self) -> None:
        self._k = self._v = self.keys = self.values = None
        self.length = 0
        self.is_initialized = False

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._k is None or self._v is None:
            return
        # Only the filled prefix is copied; the empty tail is allocated, not copied.
        self._k = _take_rows(self._k, self.length, torch.arange(self._k.shape[0], device=self._k.device)
                             .repeat_interleave(repeats))
        self._v = _take_rows(self._v, self.length, torch.arange(self._v.shape[0], device=self._v.device)
                             .repeat_interleave(repeats))
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._k is None or self._v is None:
            return
        self._k = _take_rows(self._k, self.length, indices)
        self._v = _take_rows(self._v, self.length, indices)
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("PreallocatedLayer does not support crop (not needed by the rollout engine)")


def _take_rows(buf: torch.Tensor, length: int, rows: torch.Tensor) -> torch.Tensor:
    """New buffer holding ``buf[rows]`` for the first ``length`` slots (same capacity)."""
    out = buf.new_empty((rows.shape[0], *buf.shape[1:]))
    out[:, :, :length] = buf[:, :, :length].index_select(0, rows)
    return out


def all_full_attention(config: PretrainedConfig) -> bool:
    """True when every decoder layer is plain full attention (no sliding window / linear layers)."""
    text = config.get_text_config(decoder=True)
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        return all(t == "full_attention" for t in layer_types)
    return getattr(text, "sliding_window", None) is None or not getattr(text, "use_sliding_window", True)


def make_cache(config: PretrainedConfig, capacity: int, preallocate: bool) -> Cache:
    """A preallocated full-attention cache, or transformers' ``DynamicCache`` as the generic path."""
    if not preallocate:
        return DynamicCache(config=config)
    n_layers = config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[PreallocatedLayer(capacity) for _ in range(n_layers)])

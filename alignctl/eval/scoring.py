"""Reward-model scores of (prompt, response) pairs, tokenized the way ``train-rm`` saw its pairs.

With a chat template the conversation ``prompt + [assistant response]`` is rendered by the reward
model's own tokenizer (TRL's RewardTrainer does the same for conversational pairs); without one
the message contents are joined and the eos token appended (TRL's plain-text rule). The score is
read at the last real token, in float32 or under bf16 autocast (``precision``; a reward model trained
with ``trainer.precision=bf16`` saw bf16 forwards). The sequences of one prompt are packed together
and their common start is computed once (:func:`alignctl.models.reward_forward.score_shared_prompts`;
the same scores to float rounding); on a GPU without flash-attn, right-padded batches instead
(:func:`~alignctl.models.reward_forward.score_padded`, faster there: ``resolve_packing``).

A likelihood reward model (``train-rm`` with ``score_from: likelihood``, a causal LM) scores a reply by
``beta`` x its summed log-probability (:mod:`alignctl.models.reply_likelihood`): each distinct prompt
computed once in packed rows where the score heads' are packed, right-padded batches elsewhere.

Identical token sequences are scored once: it saves work when two models agree, and it makes a
tie a tie (the same sequence in two differently padded batches could differ in the last bit).
Rewards are standardised with the ``alignctl_reward_mean`` / ``alignctl_reward_std`` train-rm
stored in the model config, when present and asked for; a monotone map, so win rates are the same.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import numpy as np

from alignctl.console import track
from alignctl.models.compat import chat_token_ids
from alignctl.models.reward_forward import group_prompt_lengths

# The keys alignctl.trainers.rm_trainer writes into the saved config (tests check they agree).
REWARD_MEAN_KEY = "alignctl_reward_mean"
REWARD_STD_KEY = "alignctl_reward_std"

Messages = list[dict[str, str]]


class RewardScorer:
    """A loaded reward model + tokenizer; ``score(conversations) -> np.ndarray``."""

    def __init__(self, path: str, *, device: str, dtype: str, batch_size: int, max_length: int | None,
                 normalize: bool, progress: bool, precision: str = "float32") -> None:
        from alignctl.models.attention import AUTO, resolve_attn_implementation, resolve_packing
        from alignctl.models.loading import load_causal_lm, load_reward_model, load_tokenizer
        from alignctl.models.reward_kind import is_likelihood_reward_folder, likelihood_settings

        self.tokenizer = load_tokenizer(path, padding_side="right")
        # Packed rows (shared prompts): the segment kernel on CPU, flash attention where installed;
        # right-padded batches on a GPU without flash-attn (faster there, resolve_packing).
        self.packed = resolve_packing(AUTO, device=device)
        attn = resolve_attn_implementation("auto", device=device, packing=self.packed)
        if is_likelihood_reward_folder(path):  # a causal LM scoring replies by their likelihood
            self.model = load_causal_lm(path, dtype=dtype, attn_implementation=attn).to(device).eval()
        else:
            self.model = load_reward_model(path, dtype=dtype, attn_implementation=attn).to(device).eval()
        self.likelihood = likelihood_settings(self.model.config)  # (reply marker, beta) or None
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device = device
        self.precision = precision  # "bf16": forwards under bf16 autocast (alignctl.device.autocast)
        self.batch_size = batch_size
        context = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = max_length or context
        self.progress = progress
        self.truncated = 0
        mean, std = getattr(self.model.config, REWARD_MEAN_KEY, None), getattr(self.model.config, REWARD_STD_KEY, None)
        self.normalization = (float(mean), float(std)) if normalize and mean is not None and std else None

    def encode(self, prompt: Messages, reply: Messages) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = chat_token_ids(tok, prompt + reply)
        else:
            text = "".join(m["content"] for m in prompt) + "".join(m["content"] for m in reply)
            ids = [int(t) for t in tok(text + (tok.eos_token or ""))["input_ids"]]
        if self.max_length is not None and len(ids) > self.max_length:
            self.truncated += 1
            ids = ids[-self.max_length:]  # the end holds the response the score is about
        return ids

    def score(self, conversations: Sequence[tuple[Messages, Messages]], description: str) -> np.ndarray:
        """Rewards [len(conversations)] for (prompt messages, reply messages) pairs."""
        encoded = [tuple(self.encode(p, r)) for p, r in conversations]
        # Distinct sequences, grouped by prompt text (first appearance order): a group's common
        # start is computed once. The grouping only decides what may share; what is shared is the
        # groups' common tokens (alignctl.models.reward_forward), so a loose key cannot change a score.
        groups: dict[tuple[tuple[str, str], ...], dict[tuple[int, ...], None]] = {}
        for (prompt, _), seq in zip(conversations, encoded):
            key = tuple((str(m.get("role")), str(m.get("content"))) for m in prompt)
            groups.setdefault(key, {})[seq] = None
        members = [list(group) for group in groups.values()]
        unique = [seq for group in members for seq in group]
        scores = self._score_unique([list(u) for u in unique], group_prompt_lengths(members), description)
        lookup = dict(zip(unique, scores))
        rewards = np.array([lookup[e] for e in encoded], dtype=np.float64)
        if self.normalization is not None:
            mean, std = self.normalization
            rewards = (rewards - mean) / std
        return rewards

    def score_pairs(self, pairs: Sequence[tuple[Messages, Messages, Messages]],
                    description: str) -> tuple[np.ndarray, np.ndarray]:
        """Rewards of (prompt, chosen, rejected) triples' chosen and rejected replies [len(pairs)] each.
        Both sides go to one ``score`` call, so a pair's prompt is computed once for its two replies."""
        chosen = [(prompt, good) for prompt, good, _ in pairs]
        rejected = [(prompt, bad) for prompt, _, bad in pairs]
        scores = self.score(chosen + rejected, description)
        return scores[:len(pairs)], scores[len(pairs):]

    def _score_unique(self, sequences: list[list[int]], prompt_lengths: list[int], description: str) -> list[float]:
        import torch

        from alignctl.device import autocast
        from alignctl.models.reward_forward import score_padded, score_shared_prompts

        pad = int(self.tokenizer.pad_token_id)
        out: list[float] = []
        starts = range(0, len(sequences), self.batch_size)
        with torch.inference_mode(), autocast(self.device, self.precision):
            for start in track(starts, description, enabled=None if self.progress else False):
                end = start + self.batch_size
                if self.likelihood is not None:
                    scores = self._likelihood_batch(sequences[start:end], pad)
                elif self.packed:
                    scores = score_shared_prompts(self.model, sequences[start:end], prompt_lengths[start:end], pad)
                else:
                    scores = score_padded(self.model, sequences[start:end], pad)
                out.extend(float(v) for v in scores.cpu())
        return out

    def _likelihood_batch(self, sequences: list[list[int]], pad: int) -> Any:
        from alignctl.models.reply_likelihood import likelihood_scores, shared_prompt_likelihood_scores
        from alignctl.models.reward_forward import reply_layout

        assert self.likelihood is not None
        marker, beta = self.likelihood
        if self.packed:  # each distinct prompt once, its replies packed after it
            return shared_prompt_likelihood_scores(self.model, sequences, marker, beta, pad)
        ids, mask, _ = reply_layout(sequences, [0] * len(sequences), pad)  # right-padded rows
        return likelihood_scores(self.model, ids.to(self.device), mask.to(self.device), marker, beta)

    def close(self) -> None:
        import torch

        del self.model
        if self.device.startswith("cuda"):  # hand the memory back (on CPU refcounting frees it)
            gc.collect()
            torch.cuda.empty_cache()


def response_conversations(prompts: Sequence[Messages], texts: Sequence[Sequence[str]]) -> list[tuple[Messages, Messages]]:
    """(prompt, [assistant response]) for every sample, prompt-major."""
    return [(p, [{"role": "assistant", "content": t}]) for p, row in zip(prompts, texts) for t in row]

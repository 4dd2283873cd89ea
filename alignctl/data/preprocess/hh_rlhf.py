"""Anthropic HH-RLHF -> preference rows, and the same prompts as RL prompt rows.

``{split}.parquet`` holds the preference pairs (reward-model training, audit, eval's
``preference_data``); ``rl_{split}.parquet`` holds each distinct prompt of that split once, as an
RL row scored by a reward model (``reward_model.style`` ``"model"``, no ground truth), so PPO/GRPO
can optimize against an RM trained on the same split without a second preprocess.

Each source pair holds two full transcripts (``\\n\\nHuman: ...\\n\\nAssistant: ...``) that share
the dialogue up to the last ``\\n\\nAssistant:`` and differ in the final reply. The shared part
becomes ``prompt`` (user/assistant messages), the two final replies ``chosen`` / ``rejected``.
Pairs that do not fit that shape are dropped and counted by reason, never silently:

- ``no_assistant_turn``: a transcript has no ``\\n\\nAssistant:`` at all;
- ``ends_with_human_turn``: a transcript ends in a human turn, so there is no final reply;
- ``prefix_mismatch``: the dialogues before the final replies differ;
- ``empty_reply`` / ``identical_replies``: nothing to prefer (identical replies only while they
  are at most 5% of a file; above that the file is broken and they are bad rows, see
  :func:`_check_identical_share`);
- ``text_before_first_turn`` / ``empty_turn`` / ``prompt_not_ending_in_user``: the shared
  dialogue does not parse into turns that end with the user speaking.

Consecutive turns of the same speaker (a handful of transcripts have two ``Assistant:`` turns in
a row) are merged into one message joined by a blank line: chat templates require alternation,
and no text is lost.
"""

from __future__ import annotations

import re
from typing import Any

from alignctl.data.preprocess.common import Context, prompt_key
from alignctl.data.readers import Record, read_records, split_files
from alignctl.data.schema import IDENTICAL_PAIR, Message, assistant

DATA_SOURCE = "Anthropic/hh-rlhf"
HUMAN = "\n\nHuman:"
ASSISTANT = "\n\nAssistant:"
FIELDS = {"chosen": str, "rejected": str}
_TURN = re.compile(r"\n\n(Human|Assistant):")
# Identical pairs tolerated (dropped and counted) per file; more means the input is broken.
MAX_IDENTICAL_SHARE = 0.05


class Unsplittable(ValueError):
    """A pair that cannot become (prompt, chosen, rejected); ``reason`` is the count key."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_turns(dialogue: str) -> list[Message]:
    """``\\n\\nHuman: a\\n\\nAssistant: b...`` -> [{user, a}, {assistant, b}, ...]."""
    parts = _TURN.split(dialogue)
    if parts[0].strip():
        raise Unsplittable("text_before_first_turn")
    turns: list[Message] = []
    for speaker, text in zip(parts[1::2], parts[2::2]):
        role = "user" if speaker == "Human" else "assistant"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] = (turns[-1]["content"] + "\n\n" + text.strip()).strip()
        else:
            turns.append({"role": role, "content": text.strip()})
    if any(not turn["content"] for turn in turns):
        raise Unsplittable("empty_turn")
    return turns


def _final_reply(transcript: str) -> tuple[str, str]:
    """(dialogue before the last Assistant marker, the final reply)."""
    cut = transcript.rfind(ASSISTANT)
    if cut < 0:
        raise Unsplittable("no_assistant_turn")
    reply = transcript[cut + len(ASSISTANT):]
    if HUMAN in reply:
        raise Unsplittable("ends_with_human_turn")
    return transcript[:cut], reply.strip()


def split_pair(chosen: str, rejected: str) -> tuple[list[Message], str, str]:
    """(prompt messages, chosen reply, rejected reply) of one HH pair, or :class:`Unsplittable`."""
    chosen_dialogue, chosen_reply = _final_reply(chosen)
    rejected_dialogue, rejected_reply = _final_reply(rejected)
    if chosen_dialogue != rejected_dialogue:
        raise Unsplittable("prefix_mismatch")
    if not chosen_reply or not rejected_reply:
        raise Unsplittable("empty_reply")
    if chosen_reply == rejected_reply:
        raise Unsplittable("identical_replies")
    prompt = parse_turns(chosen_dialogue)
    if not prompt or prompt[-1]["role"] != "user":
        raise Unsplittable("prompt_not_ending_in_user")
    return prompt, chosen_reply, rejected_reply


def make_row(prompt: list[Message], chosen: str, rejected: str) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": prompt,
        "chosen": [assistant(chosen)],
        "rejected": [assistant(rejected)],
        "extra_info": {},
    }


def rl_row(prompt: list[Message]) -> dict[str, Any]:
    """An RL prompt row for a reward-model-scored prompt (nothing to check against)."""
    return {"data_source": DATA_SOURCE, "prompt": prompt, "ability": "alignment",
            "reward_model": {"style": "model", "ground_truth": ""}, "extra_info": {}}


def _rl_pool(ctx: Context, split: str, rows: list[Record]) -> list[Record]:
    """The distinct prompts of one split's pairs (first occurrence kept), as RL rows."""
    seen: set[str] = set()
    pool: list[Record] = []
    for record in rows:
        key = prompt_key(record.data)
        if key not in seen:
            seen.add(key)
            ctx.emit("rl", record.where, rl_row(record.data["prompt"]), pool, split)
    return pool


def _check_identical_share(ctx: Context, path: str, identical: list[str], total: int) -> None:
    """Identical pairs are a known quirk of the public HH files, so a small minority is dropped
    and counted (``identical_replies``) without failing the run. Above
    :data:`MAX_IDENTICAL_SHARE` of a file they are not a quirk but a broken input (the same
    column twice, a bad export): each one is then a bad row, an error naming the first unless
    ``--skip-bad-rows``."""
    if len(identical) <= MAX_IDENTICAL_SHARE * total:
        for _ in identical:
            ctx.drop("identical_replies")
        return
    share = f"{len(identical)} of {total} pairs in {path}"
    for where in identical:
        ctx.bad.bad(where, IDENTICAL_PAIR,
                    f"chosen and rejected have the same final reply ({share}, more than the "
                    f"{MAX_IDENTICAL_SHARE:.0%} tolerated); expected two different replies "
                    f"(--skip-bad-rows skips such pairs)")


def _read_split(ctx: Context, path: str, split: str, pool: list[Record]) -> None:
    identical: list[str] = []
    total = 0
    for record in ctx.track(read_records(path, ctx.bad, FIELDS), f"hh-rlhf {split}"):
        total += 1
        try:
            prompt, chosen, rejected = split_pair(record.data["chosen"], record.data["rejected"])
        except Unsplittable as exc:
            if exc.reason == "identical_replies":
                identical.append(record.where)  # dropped or refused once the file's share is known
            else:
                ctx.drop(exc.reason)
            continue
        ctx.emit("preference", record.where, make_row(prompt, chosen, rejected), pool, split)
    _check_identical_share(ctx, path, identical, total)


def build(ctx: Context) -> None:
    assert ctx.cfg.input is not None  # PreprocessConfig.validate requires it for hh-rlhf
    pools: dict[str, list[Record]] = {}
    for split, path in split_files(ctx.cfg.input).items():
        _read_split(ctx, str(path), split, pools.setdefault(split, []))
    for split, rows in ctx.split_pools(pools).items():
        ctx.write(f"{split}.parquet", "preference", split, rows)
        ctx.write(f"rl_{split}.parquet", "rl", split, _rl_pool(ctx, split, rows))

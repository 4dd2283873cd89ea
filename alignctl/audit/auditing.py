"""``alignctl audit``: read a preference parquet, run the checks, write the report folder.

The cheap checks (empty / identical pairs, exact and near duplicates, leakage, character length
bias) need only the file. A tokenizer (``--tokenizer``, or the reward model's) adds token length
bias and the ``--max-length`` check; a reward model (``--reward-model``) adds its accuracy overall
and on length-matched pairs, and likely label errors. Conversations are tokenized and scored
exactly as ``alignctl eval`` does (:class:`alignctl.eval.scoring.RewardScorer`), so the lengths
are the ones train-rm and eval see.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alignctl.console import track
from alignctl.audit import checks
from alignctl.audit.kfold import KFoldOptions
from alignctl.audit.pairs import PAIR_COLUMNS, Messages, read_frame, read_group_labels, read_pairs, read_test_prompts
from alignctl.audit.audit_report import AuditResult, CheckResult
from alignctl.errors import UserError

DEFAULT_MAX_LENGTH = 512  # train-rm's data.max_length default


@dataclass
class AuditOptions:
    data: str
    test: str | None = None
    reward_model: str | None = None
    tokenizer: str | None = None
    max_length: int = DEFAULT_MAX_LENGTH
    out: str | None = None
    overwrite: bool = False
    device: str = "auto"
    rm_batch_size: int = 16
    likelihood_model: str | None = None
    group_key: str | None = None  # per-group accuracy of the reward model and the likelihood
    progress: bool = False
    kfold: KFoldOptions | None = None


def default_out(data: str | os.PathLike[str]) -> Path:
    return Path("audit") / Path(data).stem


# ------------------------------------------------------------------------------ checks


def cheap_checks(pairs: list[checks.PairText], test_prompts: list[str] | None, progress: bool) -> list[CheckResult]:
    """The checks that need only the file (and the other split for leakage)."""
    empty = checks.empty_fields(pairs)
    identical = checks.identical_pairs(pairs)
    groups = checks.exact_duplicate_groups(pairs)
    exact = {i: f"same pair as rows {_others(g, i)}" for g in groups for i in g}
    keep_one = {i for g in groups for i in g[1:]}
    wrap = (lambda it: track(it, "near duplicates (MinHash)", total=len(pairs))) if progress else (lambda it: it)
    near_groups = checks.near_duplicate_groups(pairs, skip=keep_one, wrap=wrap)
    near = {i: f"similar to rows {_others(g, i)}" for g in near_groups for i in g}
    results = [
        CheckResult("empty", True, "prompt, chosen or rejected empty after stripping",
                    {i: "empty " + ", ".join(v) for i, v in empty.items()}),
        CheckResult("identical", True, "chosen == rejected after normalizing", {i: "chosen == rejected" for i in identical}),
        CheckResult("exact_duplicate", True, "same normalized (prompt, chosen, rejected)", exact,
                    extra={"groups": len(groups), "removable_rows": len(keep_one)}),
        CheckResult("near_duplicate", False, f"MinHash Jaccard >= {checks.NEAR_DUP_THRESHOLD} on word "
                    f"{checks.SHINGLE_WORDS}-grams of the whole pair", near, extra={"groups": len(near_groups)}),
    ]
    if test_prompts is None:
        results.append(CheckResult("test_leakage", True, "prompt also in --test (normalized)", {}, ran=False,
                                   note="no --test file given"))
    else:
        leaked = checks.leaked_prompts(pairs, test_prompts)
        results.append(CheckResult("test_leakage", True, "prompt also in --test (normalized)",
                                   {i: "prompt is also a test prompt" for i in leaked}))
    return results


def _others(group: list[int], row: int, limit: int = 5) -> str:
    others = [str(j) for j in group if j != row]
    return ", ".join(others[:limit]) + (f" (+{len(others) - limit} more)" if len(others) > limit else "")


def token_lengths(tokenizer: Any, convs: list[tuple[Messages, Messages, Messages]], progress: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(chosen reply tokens, rejected reply tokens, prompt+chosen tokens, prompt+rejected tokens)."""
    from alignctl.eval.likelihood import plain_encoder

    encoder = plain_encoder(tokenizer)
    reply_c, reply_r, full_c, full_r = [], [], [], []
    for prompt, chosen, rejected in track(convs, "tokenizing pairs", enabled=None if progress else False):
        for reply, reply_out, full_out in ((chosen, reply_c, full_c), (rejected, reply_r, full_r)):
            text = reply[0]["content"] if reply else ""
            reply_out.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
            full_out.append(len(encoder.encode(prompt, reply)) if prompt or reply else 0)
    return tuple(np.asarray(v, dtype=np.int64) for v in (reply_c, reply_r, full_c, full_r))  # type: ignore[return-value]


def length_checks(result: AuditResult, pairs: list[checks.PairText], lengths: tuple[np.ndarray, ...] | None,
                  max_length: int) -> None:
    """Length bias in characters (always) and tokens (with a tokenizer), and the --max-length check."""
    chars_c = [len(p.chosen) for p in pairs]
    chars_r = [len(p.rejected) for p in pairs]
    result.length_bias["chars"] = checks.length_bias(chars_c, chars_r)
    if lengths is None:
        result.checks.append(CheckResult("too_long", False, f"prompt + reply > {max_length} tokens", {}, ran=False,
                                         note="needs a tokenizer (--tokenizer or --reward-model)"))
        return
    reply_c, reply_r, full_c, full_r = lengths
    result.length_bias["tokens"] = checks.length_bias(reply_c.tolist(), reply_r.tolist())
    long_rows = checks.too_long(full_c.tolist(), full_r.tolist(), max_length)
    result.checks.append(CheckResult(
        "too_long", False, f"prompt + reply > {max_length} tokens (train-rm drops these)",
        {i: f"{int(max(full_c[i], full_r[i]))} tokens" for i in long_rows}))


def scorable_rows(convs: list[tuple[Messages, Messages, Messages]]) -> list[int]:
    """Rows with a prompt and two non-blank replies: the ones a model can score (the others are the
    empty check's)."""
    return [i for i, (p, c, r) in enumerate(convs) if p and c and r and c[0]["content"].strip()
            and r[0]["content"].strip()]


def model_checks(result: AuditResult, opts: AuditOptions, convs: list[tuple[Messages, Messages, Messages]],
                 lengths: tuple[np.ndarray, ...] | None, pairs: list[checks.PairText],
                 groups: list[str] | None = None) -> None:
    """RM accuracy (overall, length-matched) and likely label errors, from one given reward model
    (--reward-model) or from K out-of-sample fold models (--kfold); skipped without either."""
    threshold = checks.LABEL_ERROR_PROBABILITY
    if opts.reward_model is None and opts.kfold is None:
        result.checks.append(CheckResult("label_error", False, f"RM P(rejected better) >= {threshold}", {},
                                         ran=False, note="needs --reward-model or --kfold"))
        return
    scorable = scorable_rows(convs)
    if opts.kfold is not None:
        chosen, rejected, truncated = _kfold_scores(opts, convs, scorable)
        prob = checks.rejected_probability(chosen, rejected)
        found = checks.confident_label_issues(1.0 - prob)
        rule = (f"confident learning (cleanlab) on out-of-sample P(rejected better) from {opts.kfold.folds} "
                "fold reward models, each scoring pairs it did not train on")
        source = f"{opts.kfold.folds}-fold from {opts.kfold.base_model}"
    else:
        chosen, rejected, truncated = _given_rm_scores(opts, convs, scorable)
        prob = checks.rejected_probability(chosen, rejected)
        found = checks.label_errors(chosen, rejected, threshold)
        rule = f"RM P(rejected better) >= {threshold} (sigmoid of the score difference; a given RM, not k-fold)"
        source = str(opts.reward_model)
    if lengths is not None:
        len_c, len_r = lengths[0][scorable], lengths[1][scorable]
    else:
        len_c = np.array([len(pairs[i].chosen) for i in scorable])
        len_r = np.array([len(pairs[i].rejected) for i in scorable])
    result.reward_model = {"path": source, "scored_pairs": len(scorable), "truncated": truncated,
                           "out_of_sample": opts.kfold is not None,
                           "length_unit": "tokens" if lengths is not None else "chars",
                           **checks.rm_accuracy(chosen, rejected, len_c, len_r)}
    flagged = {scorable[k]: f"P(rejected better) = {prob[k]:.3f}" for k in found}
    result.checks.append(CheckResult("label_error", False, rule, flagged))
    result.scores = {scorable[k]: (float(chosen[k]), float(rejected[k])) for k in range(len(scorable))}
    if groups is not None:
        result.reward_model["by_group"] = checks.accuracy_by_group(np.asarray(chosen) > np.asarray(rejected),
                                                                   [groups[i] for i in scorable])


def likelihood_checks(result: AuditResult, opts: AuditOptions, convs: list[tuple[Messages, Messages, Messages]],
                      groups: list[str] | None = None) -> None:
    """With --likelihood-model: how often that causal LM's own likelihood of the reply prefers chosen."""
    if opts.likelihood_model is None:
        return
    from alignctl.device import resolve_device
    from alignctl.eval.likelihood import reply_likelihoods

    scorable = scorable_rows(convs)
    pairs = [(convs[i][0], reply) for i in scorable for reply in convs[i][1:]]
    summed, mean = reply_likelihoods(opts.likelihood_model, pairs, device=resolve_device(opts.device, key="--device"),
                                     batch_size=opts.rm_batch_size, label="likelihood of replies",
                                     progress=opts.progress)
    total, mean = summed.reshape(-1, 2), mean.reshape(-1, 2)
    result.likelihood = {"path": opts.likelihood_model,
                         **checks.likelihood_accuracy(total[:, 0], total[:, 1], mean[:, 0], mean[:, 1])}
    if groups is not None:
        labels = [groups[i] for i in scorable]
        result.likelihood["by_group_sum"] = checks.accuracy_by_group(total[:, 0] > total[:, 1], labels)
        result.likelihood["by_group_mean"] = checks.accuracy_by_group(mean[:, 0] > mean[:, 1], labels)


def _scorer(opts: AuditOptions, path: str) -> Any:
    from alignctl.device import resolve_device
    from alignctl.eval.scoring import RewardScorer

    return RewardScorer(path, device=resolve_device(opts.device, key="--device"), dtype="float32",
                        batch_size=opts.rm_batch_size, max_length=None, normalize=False, progress=opts.progress)


def _given_rm_scores(opts: AuditOptions, convs: list[tuple[Messages, Messages, Messages]],
                     scorable: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
    scorer = _scorer(opts, str(opts.reward_model))
    try:
        chosen, rejected = scorer.score_pairs([convs[i] for i in scorable], "scoring pairs")
    finally:
        scorer.close()
    return np.asarray(chosen), np.asarray(rejected), scorer.truncated


def _kfold_scores(opts: AuditOptions, convs: list[tuple[Messages, Messages, Messages]],
                  scorable: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
    from alignctl.audit.kfold import out_of_sample_scores

    assert opts.kfold is not None
    truncated = 0

    def score(model_dir: str, conversations: list[tuple[Messages, Messages]]) -> np.ndarray:
        nonlocal truncated
        scorer = _scorer(opts, model_dir)
        try:
            return np.asarray(scorer.score(conversations, "scoring a held-out fold"))
        finally:
            truncated += scorer.truncated
            scorer.close()

    frame = read_frame(opts.data, "preference pairs", PAIR_COLUMNS)
    chosen, rejected, _ = out_of_sample_scores(frame, scorable, convs, opts.kfold, score)
    return chosen, rejected, truncated


def _load_tokenizer(opts: AuditOptions) -> Any:
    from alignctl.models.loading import load_tokenizer

    source = opts.tokenizer or opts.reward_model or (opts.kfold.base_model if opts.kfold else None)
    return None if source is None else load_tokenizer(source, padding_side="right")


def check_options(opts: AuditOptions) -> Path:
    """Every refusal before any work: inputs, --max-length, the output folder. Returns --out."""
    from alignctl.pipeline.ownership import check_output_dir

    if opts.max_length < 1:
        raise UserError(f"--max-length expected a positive number of tokens, got {opts.max_length}")
    if opts.device not in ("auto", "cpu") and not opts.device.startswith("cuda"):
        raise UserError(f"--device expected auto, cpu or cuda[:N], got {opts.device!r}")
    if opts.kfold is not None and opts.reward_model is not None:
        raise UserError("--kfold trains its own reward models; drop --reward-model (or --kfold)")
    if opts.likelihood_model is not None and not (Path(opts.likelihood_model) / "config.json").is_file():
        raise UserError(f"--likelihood-model '{opts.likelihood_model}': expected a model folder with config.json "
                        "(a causal language model, e.g. the one the reward model started from)")
    if opts.kfold is not None:
        from alignctl.audit.kfold import check_kfold_options

        check_kfold_options(opts.kfold)
    inputs = [opts.data, *(p for p in (opts.test,) if p)]
    for path in inputs:
        if not Path(path).is_file():
            raise UserError(f"{path}: {'preference data' if path == opts.data else '--test'} file not found")
    out = Path(opts.out) if opts.out else default_out(opts.data)
    check_output_dir(out, key="--out", overwrite=opts.overwrite, inputs=inputs)
    return out


def run_audit(opts: AuditOptions) -> AuditResult:
    """Run every check that the options allow and write the report folder; returns the result."""
    from alignctl.audit.audit_report import write_report
    from alignctl.pipeline.atomic import atomic_output_dir

    out = check_options(opts)
    pairs, convs = read_pairs(opts.data)
    groups = read_group_labels(opts.data, opts.group_key) if opts.group_key else None
    test_prompts = read_test_prompts(opts.test) if opts.test else None
    result = AuditResult(data=opts.data, test=opts.test, rows=len(pairs), out=str(out), max_length=opts.max_length)
    result.checks = cheap_checks(pairs, test_prompts, opts.progress)
    tokenizer = _load_tokenizer(opts)
    lengths = token_lengths(tokenizer, convs, opts.progress) if tokenizer is not None else None
    length_checks(result, pairs, lengths, opts.max_length)
    model_checks(result, opts, convs, lengths, pairs, groups)
    likelihood_checks(result, opts, convs, groups)
    result.samples = {i: pairs[i] for i in result.flagged_rows()}
    with atomic_output_dir(out, overwrite=opts.overwrite, kind="audit") as tmp:
        write_report(result, tmp)
    return result

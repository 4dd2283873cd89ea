"""The eval stage: generate with the policy and the reference, score with the reward model and the
rule scorers, compute the statistics, write the report.

    rows      = prompts (RL parquet rows; too-long ones skipped and counted)
    responses = policy / reference generations (hf engine, n per prompt, seeded per batch)
    rewards   = reward-model scores of prompt + response, per sample
    results   = win rate + bootstrap CI + length-controlled win rate, reward stats, rule accuracy,
                preference consistency, run curves  ->  results.json, report.md, report.html

Only one model is in memory at a time (policy, then reference, then reward model).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from alignctl.config.core import iter_keys, load_config, to_dict
from alignctl.config.eval import EvalConfig
from alignctl.cpu_heap import keep_freed_memory
from alignctl.device import bf16_if_native, resolve_device
from alignctl.errors import UserError
from alignctl.eval import reuse, stats
from alignctl.eval.accuracy import rule_accuracy
from alignctl.eval.data import PreferencePair, PromptRow, load_preference_pairs, load_prompt_rows, rows_from_python
from alignctl.eval.generate import Generations, generate, tokenize_prompts
from alignctl.eval.repetition import repetition_rate, repetition_warning
from alignctl.eval.results import EvalResults, number_text
from alignctl.eval.scoring import RewardScorer

STAGE = "eval"


def _models(cfg: EvalConfig) -> dict[str, str]:
    """role -> model folder, policy first."""
    assert cfg.policy is not None  # validate() requires it
    return {"policy": cfg.policy, **({"reference": cfg.reference} if cfg.reference else {})}


def prepare_prompts(cfg: EvalConfig, rows: list[PromptRow]) -> tuple[list[PromptRow], dict[str, Any], dict[str, list[list[int]]], int]:
    """Tokenize the prompts for every model; drop rows too long for any of them (counted)."""
    from alignctl.models.loading import load_tokenizer

    tokenizers = {role: load_tokenizer(path, padding_side="left") for role, path in _models(cfg).items()}
    ids = {role: tokenize_prompts(tok, rows) for role, tok in tokenizers.items()}
    keep = [i for i in range(len(rows)) if all(len(ids[r][i]) <= cfg.max_prompt_length for r in ids)]
    if not keep:
        raise UserError(f"{cfg.prompts}: every prompt is longer than max_prompt_length={cfg.max_prompt_length} tokens")
    return [rows[i] for i in keep], tokenizers, {r: [v[i] for i in keep] for r, v in ids.items()}, len(rows) - len(keep)


def generate_all(cfg: EvalConfig, tokenizers: dict[str, Any], ids: dict[str, list[list[int]]], device: str,
                 progress: bool) -> tuple[dict[str, Generations], dict[str, str], dict[str, str], reuse.ScoreBook]:
    """Every model's responses (reused from ``cfg.reuse_generations`` when the fingerprint matches),
    their fingerprints, role -> the folder reused from, and the scores stored with reused responses."""
    import dataclasses

    from alignctl.rollout import SamplingParams

    params = SamplingParams(n=cfg.n, temperature=cfg.temperature if cfg.do_sample else 0.0, top_p=cfg.top_p,
                            top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens, greedy=not cfg.do_sample,
                            logprobs=False)
    stored = reuse.read_all(cfg.reuse_generations)
    gens, fingerprints, reused, book = {}, {}, {}, reuse.ScoreBook()
    for role, path in _models(cfg).items():
        settings = {"params": dataclasses.asdict(params), "batch_size": cfg.batch_size, "seed": cfg.seed,
                    "role": role, "dtype": cfg.dtype, "device": device}
        fingerprints[role] = reuse.fingerprint(path, ids[role], settings)
        found = reuse.find(stored, fingerprints[role])
        if found is not None:
            gens[role], reused[role], book.stored[role] = found
            continue
        gens[role] = generate(path, tokenizers[role], ids[role], role=role, params=params, batch_size=cfg.batch_size,
                              seed=cfg.seed, device=device, dtype=cfg.dtype, progress=progress)
    return gens, fingerprints, reused, book


def scoring_precision(cfg: EvalConfig, device: str) -> str:
    """``rm_precision`` on ``device``: ``bf16_if_native`` becomes bf16 or float32 here, so the scores
    (and the reuse key they are stored under) say which one ran."""
    return bf16_if_native(cfg.rm_precision, device, fallback="float32")


@contextlib.contextmanager
def reward_scorer(cfg: EvalConfig, path: str, device: str, progress: bool) -> Iterator[RewardScorer]:
    """A scorer for the reward model at ``path`` with the eval's settings, closed afterwards."""
    scorer = RewardScorer(path, device=device, dtype=cfg.dtype, batch_size=cfg.rm_batch_size,
                          max_length=cfg.rm_max_length, normalize=cfg.normalize_rewards, progress=progress,
                          precision=scoring_precision(cfg, device))
    try:
        yield scorer
    finally:
        scorer.close()


def role_scores(scorer: RewardScorer, rows: list[PromptRow], gens: dict[str, Generations], label: str,
                known: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The scorer's reward [P, n] of every model's responses. Each distinct answer to a prompt is
    scored once, all models' in one call, so an answer two models share (half of them, for an RL
    policy and its SFT start) is an exact tie, not two runs that may differ in the last bit.
    ``known``: role -> scores [P, n] stored by an earlier eval with this scorer; those answers (and
    the same answers given by another model) are not scored again."""
    scores: dict[tuple[int, str], float] = {}
    for role, values in (known or {}).items():
        answers = gens[role].texts
        if np.shape(values) != (len(answers), len(answers[0]) if answers else 0):
            continue  # not shaped like these answers (a hand-edited file): score them instead
        for i, texts in enumerate(answers):
            for j, text in enumerate(texts):
                scores.setdefault((i, text), float(values[i][j]))
    pending = list(dict.fromkeys((i, text) for g in gens.values() for i, texts in enumerate(g.texts)
                                 for text in texts if (i, text) not in scores))
    if pending:
        conversations = [(rows[i].messages, [{"role": "assistant", "content": text}]) for i, text in pending]
        scores.update(zip(pending, scorer.score(conversations, f"{label} ({', '.join(gens)})").tolist()))
    return {role: np.array([[scores[(i, text)] for text in texts] for i, texts in enumerate(g.texts)],
                           dtype=np.float64) for role, g in gens.items()}


def scored_by(scorer: RewardScorer, key: str, book: reuse.ScoreBook, rows: list[PromptRow],
              gens: dict[str, Generations], label: str) -> dict[str, np.ndarray]:
    """:func:`role_scores` with the scores ``book`` holds under ``key`` taken, and the result recorded."""
    scores = role_scores(scorer, rows, gens, label, book.known(key, list(gens)))
    book.record(key, scores)
    return scores


def scorer_key(cfg: EvalConfig, path: str, device: str) -> str:
    settings = {"dtype": cfg.dtype, "device": device, "precision": scoring_precision(cfg, device),
                "max_length": cfg.rm_max_length, "normalize": cfg.normalize_rewards}
    return reuse.scorer_key(path, settings)


def score_all(cfg: EvalConfig, rows: list[PromptRow], gens: dict[str, Generations], pairs: list[PreferencePair] | None,
              book: reuse.ScoreBook, device: str, progress: bool) -> tuple[dict[str, np.ndarray], dict[str, float], int, bool]:
    """Rewards [P, n] per model, preference-pair stats, RM truncation count, normalised?"""
    assert cfg.reward_model is not None
    with reward_scorer(cfg, cfg.reward_model, device, progress) as scorer:
        rewards = scored_by(scorer, scorer_key(cfg, cfg.reward_model, device), book, rows, gens, "scoring")
        preference = preference_consistency(scorer, pairs) if pairs else {}
        return rewards, preference, scorer.truncated, scorer.normalization is not None


def preference_consistency(scorer: RewardScorer, pairs: list[PreferencePair]) -> dict[str, float]:
    """The reward model's accuracy on held-out pairs (ties count as wrong, as in train-rm)."""
    import torch

    from alignctl.algos import preference_accuracy

    chosen, rejected = scorer.score_pairs([(p.prompt, p.chosen, p.rejected) for p in pairs], "scoring preference pairs")
    accuracy = float(preference_accuracy(torch.from_numpy(chosen), torch.from_numpy(rejected)))
    return {"accuracy": accuracy, "pairs": float(len(pairs)), "ties": float(np.sum(chosen == rejected)),
            "mean_margin": float(np.mean(chosen - rejected))}


def win_rate_fields(policy: np.ndarray, reference: np.ndarray, policy_len: np.ndarray, reference_len: np.ndarray,
                    cfg: EvalConfig) -> dict[str, Any]:
    """Win rate, its bootstrap CI, the length-controlled win rate and the pair counts."""
    outcomes = stats.pair_outcomes(policy, reference)  # [P, n, n]
    length_diff = policy_len[:, :, None] - reference_len[:, None, :]
    fit = stats.length_controlled_win_rate(outcomes.ravel(), np.broadcast_to(length_diff, outcomes.shape).ravel())
    scores = outcomes.mean(axis=(1, 2))
    return {
        "win_rate": float(scores.mean()),
        "win_rate_ci": stats.bootstrap_ci(scores, num_resamples=cfg.num_bootstrap, seed=cfg.seed),
        "lc_win_rate": fit.win_rate,
        "length_slope": fit.slope,
        "wins": int(np.sum(outcomes == 1.0)), "ties": int(np.sum(outcomes == 0.5)), "losses": int(np.sum(outcomes == 0.0)),
    }


def rule_win_fields(policy: list[list[bool] | None], reference: list[list[bool] | None],
                    cfg: EvalConfig) -> dict[str, Any]:
    """Win rate by the rule scorer (right beats wrong, else a tie) over the prompts both sides could
    be scored on, with its bootstrap CI; nothing when no prompt has a ground truth."""
    both = [(p, r) for p, r in zip(policy, reference) if p is not None and r is not None]
    if not both:
        return {}
    scores = stats.win_scores(np.array([p for p, _ in both], dtype=np.float64),
                              np.array([r for _, r in both], dtype=np.float64))
    return {"rule_win_rate": float(scores.mean()),
            "rule_win_rate_ci": stats.bootstrap_ci(scores, num_resamples=cfg.num_bootstrap, seed=cfg.seed)}


def reward_fields(rewards: dict[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for role, prefix in (("policy", ""), ("reference", "reference_")):
        if role in rewards:
            values = rewards[role]
            out[f"{prefix}mean_reward"] = float(values.mean())
            out[f"{prefix}reward_std"] = float(values.std())
            out[f"{prefix}reward_quantiles"] = stats.quantiles(values)
    return out


def build_samples(rows: list[PromptRow], gens: dict[str, Generations], rewards: dict[str, np.ndarray],
                  correct: dict[str, list[list[bool] | None]]) -> list[dict[str, Any]]:
    """One record per prompt with every response, its reward, length and correctness."""
    samples = []
    for i, row in enumerate(rows):
        record: dict[str, Any] = {"index": row.index, "data_source": row.data_source, "prompt": row.text,
                                  "ground_truth": row.ground_truth}
        for role, g in gens.items():
            marks = correct[role][i]
            record[role] = [{"text": text, "reward": float(rewards[role][i, j]) if role in rewards else None,
                             "length": len(text), "tokens": g.token_lengths[i][j], "truncated": g.truncated[i][j],
                             "correct": marks[j] if marks is not None else None}
                            for j, text in enumerate(g.texts[i])]
        samples.append(record)
    return samples


def evaluate_rows(cfg: EvalConfig, rows: list[PromptRow], *, progress: bool = True) -> EvalResults:
    """Everything but writing files."""
    start = time.perf_counter()
    device = resolve_device(cfg.device, key="eval: key 'device'")
    if device == "cpu":
        keep_freed_memory()  # generation and scoring reuse their large buffers' pages (alignctl.cpu_heap)
    # Inputs that can be wrong are read before minutes of generation, not after.
    curves = curve_fields(cfg.run) if cfg.run else {}
    pairs = load_preference_pairs(cfg.preference_data, cfg.max_preference_pairs) if cfg.preference_data else None
    rows, tokenizers, ids, skipped = prepare_prompts(cfg, rows)
    gens, fingerprints, reused, book = generate_all(cfg, tokenizers, ids, device, progress)
    rewards: dict[str, np.ndarray] = {}
    preference: dict[str, float] = {}
    rm_truncated, normalized = 0, False
    if cfg.reward_model:
        rewards, preference, rm_truncated, normalized = score_all(cfg, rows, gens, pairs, book, device, progress)
    accuracy, correct = {}, {}
    for role, g in gens.items():
        accuracy[role], correct[role] = rule_accuracy(rows, g.texts)
    fields: dict[str, Any] = reward_fields(rewards)
    if "reference" in rewards:
        fields.update(win_rate_fields(rewards["policy"], rewards["reference"], gens["policy"].char_lengths,
                                      gens["reference"].char_lengths, cfg))
        fields.update(agreement_fields(rewards, correct, "rm_rule_agreement"))
    if "reference" in gens:
        fields.update(rule_win_fields(correct["policy"], correct["reference"], cfg))
        fields["reference_mean_length"] = float(gens["reference"].char_lengths.mean())
        fields["reference_truncated_fraction"] = float(np.mean(gens["reference"].truncated))
        fields["reference_repetition_rate"] = repetition_rate(t for row in gens["reference"].texts for t in row)
        fields["reference_accuracy"] = accuracy["reference"]
    fields.update(curves)
    if cfg.judge_model and "reference" in gens:
        fields.update(judge_fields(cfg, rows, gens, correct, book, device, progress))
    if cfg.likelihood_model and "reference" in gens:
        fields.update(likelihood_fields(cfg, rows, gens, correct, device, progress))
    fields["repetition_rate"] = repetition_rate(t for row in gens["policy"].texts for t in row)
    fields.update(verdict_fields(cfg, fields, accuracy))
    fields["notes"] = fields["notes"] + [f"{role} responses reused from {source} (same model, prompts and "
                                         f"generation settings)" for role, source in reused.items()]
    return EvalResults(
        num_prompts=len(rows), n=cfg.n, **fields,
        rewards_normalized=normalized,
        mean_length=float(gens["policy"].char_lengths.mean()),
        truncated_fraction=float(np.mean(gens["policy"].truncated)),
        accuracy=accuracy["policy"],
        preference_accuracy=preference.get("accuracy"), preference=preference,
        samples=build_samples(rows, gens, rewards, correct),
        skipped_prompts=skipped, rm_truncated=rm_truncated, config=to_dict(cfg),
        wall_time_s=time.perf_counter() - start,
        reused_generations=reused, generations=reuse.to_json(gens, fingerprints, book),
    )


def judge_fields(cfg: EvalConfig, rows: list[PromptRow], gens: dict[str, Generations],
                 correct: dict[str, list[list[bool] | None]], book: reuse.ScoreBook, device: str,
                 progress: bool) -> dict[str, Any]:
    """The win rate of the policy over the reference by a second reward model (the judge), and how
    often the judge sides with the rule where exactly one answer is right."""
    assert cfg.judge_model is not None
    with reward_scorer(cfg, cfg.judge_model, device, progress) as scorer:
        scores = scored_by(scorer, scorer_key(cfg, cfg.judge_model, device), book, rows,
                           {r: gens[r] for r in ("policy", "reference")}, "judging")
    outcome = win_rate_fields(scores["policy"], scores["reference"], gens["policy"].char_lengths,
                              gens["reference"].char_lengths, cfg)
    return {"judge_win_rate": outcome["win_rate"], "judge_win_rate_ci": outcome["win_rate_ci"],
            **agreement_fields(scores, correct, "judge_rule_agreement")}


def likelihood_fields(cfg: EvalConfig, rows: list[PromptRow], gens: dict[str, Generations],
                      correct: dict[str, list[list[bool] | None]], device: str, progress: bool) -> dict[str, Any]:
    """``likelihood_rule_agreement``: how often ``likelihood_model``'s summed log-probability of an
    answer ranks the right one higher, on the decisive policy-vs-reference pairs. Only the answers
    to prompts with a decisive pair are scored (the others do not count), each distinct one once."""
    from alignctl.eval.likelihood import reply_likelihoods

    assert cfg.likelihood_model is not None
    # A prompt has a decisive pair exactly when its answers, both models' together, are neither all
    # right nor all wrong (each side has at least one answer).
    decisive = [i for i, (mine, theirs) in enumerate(zip(correct["policy"], correct["reference"]))
                if mine is not None and theirs is not None and len({*mine, *theirs}) == 2]
    answers = list(dict.fromkeys((i, text) for i in decisive for role in ("policy", "reference")
                                 for text in gens[role].texts[i]))
    if not answers:
        return {}
    conversations = [(rows[i].messages, [{"role": "assistant", "content": text}]) for i, text in answers]
    summed, _ = reply_likelihoods(cfg.likelihood_model, conversations, device=device, batch_size=cfg.rm_batch_size,
                                  label="likelihood of the answers", progress=progress)
    found = dict(zip(answers, summed.tolist()))
    scores = {role: np.array([[found.get((i, text), 0.0) for text in texts] for i, texts in enumerate(gens[role].texts)])
              for role in ("policy", "reference")}
    agreement, pairs = stats.rule_agreement(scores["policy"], scores["reference"], correct["policy"],
                                            correct["reference"])
    return {} if agreement is None else {"likelihood_rule_agreement": agreement, "decisive_pairs": pairs}


def agreement_fields(scores: dict[str, np.ndarray], correct: dict[str, list[list[bool] | None]],
                     key: str) -> dict[str, Any]:
    """``key``: the scorer's :func:`~alignctl.eval.stats.rule_agreement` on the policy-vs-reference
    pairs, with the count of decisive pairs; nothing when no pair is decisive."""
    agreement, pairs = stats.rule_agreement(scores["policy"], scores["reference"], correct["policy"],
                                            correct["reference"])
    return {} if agreement is None else {key: agreement, "decisive_pairs": pairs}


def verdict_fields(cfg: EvalConfig, fields: dict[str, Any], accuracy: dict[str, Any]) -> dict[str, Any]:
    """Whether the reward model trained the policy (its manifest says), and hacking warnings."""
    from alignctl.eval.verdicts import blind_judge_note, hacking_warnings, judge_note
    from alignctl.pipeline.manifest import read_manifest

    trained_with = (read_manifest(cfg.policy or "") or {}).get("reward_model")
    trained = None if not cfg.reward_model or trained_with is None else \
        Path(trained_with).expanduser().absolute() == Path(cfg.reward_model).expanduser().absolute()
    warnings = hacking_warnings(
        win_rate=fields.get("win_rate"), win_rate_ci=fields.get("win_rate_ci"),
        judge_win_rate=fields.get("judge_win_rate"), judge_win_rate_ci=fields.get("judge_win_rate_ci"),
        accuracy=accuracy.get("policy", {}), reference_accuracy=accuracy.get("reference", {}),
        rm_trained_policy=trained)
    repeated = repetition_warning(fields["repetition_rate"], fields.get("reference_repetition_rate"))
    warnings += [repeated] if repeated else []
    notes = [judge_note(rm_trained_policy=trained, judge_win_rate=fields.get("judge_win_rate")),
             blind_judge_note(judge_rule_agreement=fields.get("judge_rule_agreement"),
                              decisive_pairs=fields.get("decisive_pairs", 0))]
    return {"rm_trained_policy": trained, "warnings": warnings, "notes": [n for n in notes if n]}


def curve_fields(run: str) -> dict[str, Any]:
    from alignctl.eval.curves import panel_series, read_metrics, summarize

    panels = panel_series(read_metrics(run))
    curves = {key: [list(p) for p in points] for _, group in panels for key, points in group.items()}
    return {"curves": curves, "curve_summary": summarize(panels)}


# ------------------------------------------------------------------------------------- stage


def run_eval(cfg: EvalConfig, *, progress: bool = True) -> EvalResults:
    """The ``alignctl eval`` stage: evaluate and write ``cfg.out`` atomically (manifest last)."""
    rows = load_prompt_rows(cfg.prompts or "", cfg.prompt_key, cfg.max_prompts)
    results = evaluate_rows(cfg, rows, progress=progress)
    write_outputs(results, cfg.out)
    return results


def write_outputs(results: EvalResults, out: str | os.PathLike[str]) -> None:
    """results.json, report.md, report.html, plots/*.png, then manifest.json, into ``out``."""
    from alignctl.eval.report import write_report
    from alignctl.pipeline.atomic import atomic_output_dir
    from alignctl.pipeline.manifest import write_manifest

    from alignctl.errors import writing

    results.out_dir = Path(out).absolute()
    with writing(out), atomic_output_dir(out) as tmp:
        write_report(results, tmp)
        if results.generations:
            (Path(tmp) / reuse.FILE).write_text(json.dumps(results.generations), encoding="utf-8")
        cfg = results.config
        inputs = {k: cfg[k] for k in ("policy", "reference", "reward_model", "prompts", "preference_data", "run")
                  if cfg.get(k)}
        write_manifest(tmp, stage=STAGE, config=cfg, inputs=inputs, metrics=results.headline(),
                       wall_time_s=results.wall_time_s)


# -------------------------------------------------------------------------------- Python API


def _config_from_kwargs(flags: dict[str, Any], options: dict[str, Any]) -> EvalConfig:
    valid = {dotted for dotted, *_ in iter_keys(EvalConfig)}
    for name in options:
        if name not in valid:
            raise UserError(f"evaluate: keyword {name!r} is not a config key; see `alignctl config show eval`")
    return load_config(EvalConfig, None, flags={**flags, **options})


def evaluate(model: str | os.PathLike[str], prompts: Any, reward_model: str | os.PathLike[str] | None = None,
             reference: str | os.PathLike[str] | None = None, n: int = 1, *, out: str | os.PathLike[str] | None = None,
             progress: bool = False, **options: Any) -> EvalResults:
    """Evaluate ``model`` (a causal LM folder) on ``prompts`` from Python::

        results = evaluate(model="runs/ppo/actor", prompts="data/arith/test.parquet",
                           reward_model="runs/rm", reference="runs/sft", n=4, do_sample=True)
        results.win_rate, results.win_rate_ci, results.lc_win_rate, results.mean_reward

    ``prompts``: an RL prompt parquet path, a DataFrame of such rows, or a list of strings /
    message lists. Other keywords are eval config keys (``max_new_tokens``, ``temperature``,
    ``seed``, ``preference_data``, ``run``, ...). With ``out`` the report files are written there.

    With a ``reward_model`` and no ``reference``, the reference is the model ``model`` started
    from, as its manifest records it (an RL policy's initial actor, an SFT model's base); a
    model without that record is a one-line error asking for ``reference=``. ``print(results)``
    shows the headline numbers as a table."""
    if reference is None and reward_model is not None:
        reference = _recorded_start(model)
    prompts_path = os.fspath(prompts) if isinstance(prompts, (str, os.PathLike)) else "<python>"
    flags = {"policy": os.fspath(model), "prompts": prompts_path, "n": n,
             "reward_model": os.fspath(reward_model) if reward_model is not None else None,
             "reference": os.fspath(reference) if reference is not None else None}
    if out is not None:
        flags["out"] = os.fspath(out)
    options = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in options.items()}
    cfg = _config_from_kwargs(flags, options)
    rows = rows_from_python(prompts, cfg.prompt_key, cfg.max_prompts)
    results = evaluate_rows(cfg, rows, progress=progress)
    if out is not None:
        write_outputs(results, out)
    return results


def _recorded_start(model: str | os.PathLike[str]) -> str:
    from alignctl.pipeline.manifest import starting_model

    start = starting_model(model)
    if start is None:
        raise UserError(f"evaluate: no reference given and {os.fspath(model)} records no starting model (its "
                        f"manifest.json, written by alignctl's sft / ppo / grpo, is missing or names none); "
                        f"pass reference=<model folder> to compare against")
    return start


def print_eval_report(results: EvalResults) -> None:
    """Headline numbers as a console table (the CLI calls this after :func:`run_eval`)."""
    from alignctl.console import print_table

    rows = [[k, number_text(v)] for k, v in results.headline().items()]
    title = f"eval -> {results.out_dir}" if results.out_dir else "eval"
    print_table(title, ["metric", "value"], rows)
    from alignctl.console import console

    for line in results.warnings:
        console.print(f"[bold yellow]warning:[/] {line}")
    for line in results.notes:
        console.print(f"note: {line}")


__all__ = ["evaluate", "evaluate_rows", "print_eval_report", "run_eval", "write_outputs"]

"""Config schema of the eval stage (``alignctl eval``): win rate, accuracy, preference
consistency, training curves and a report."""

from __future__ import annotations

from dataclasses import dataclass

from alignctl.config.core import field
from alignctl.errors import UserError


@dataclass
class EvalConfig:
    """Compare a policy with a reference under a reward model and write a report."""

    policy: str | None = field(None, help="Policy model folder (Hugging Face causal LM, e.g. an RL run's actor). Required.")
    reference: str | None = field(None, help="Reference model folder to compare against (e.g. the SFT model). "
                                             "Without it there is no win rate.")
    reward_model: str | None = field(None, help="Reward model folder (sequence classification, from train-rm). "
                                                "Without it there are no rewards and no win rate.")
    judge_model: str | None = field(None, help="A second reward model that did not train the policy (e.g. one trained "
                                               "on a disjoint half of the pairs): its win rate is reported beside "
                                               "reward_model's, and a disagreement is warned about.")
    likelihood_model: str | None = field(None, help="A causal LM folder (e.g. the model the reward models started from): "
                                                    "how often its own likelihood ranks the right answer higher, on the "
                                                    "policy-vs-reference pairs where exactly one is right "
                                                    "(likelihood_rule_agreement). Needs 'reference'.")
    prompts: str | None = field(None, help="RL prompt parquet (from 'alignctl preprocess', e.g. test.parquet). "
                                           "Rows with a ground truth also get rule accuracy. Required.")
    prompt_key: str = field("prompt", help="Column of the prompt messages in the prompts file.")
    preference_data: str | None = field(None, help="Held-out preference pairs (prompt/chosen/rejected parquet): "
                                                   "report the reward model's accuracy on them.")
    run: str | None = field(None, help="An RL run folder with metrics.jsonl: plot its training curves.")
    n: int = field(1, help="Responses per prompt and model (pass@k and maj@k use k = n; needs do_sample when > 1).")
    max_new_tokens: int = field(256, help="Longest response generated, in tokens.")
    do_sample: bool = field(False, help="Sample (seeded) instead of greedy decoding.")
    temperature: float = field(1.0, help="Sampling temperature (with do_sample).")
    top_p: float = field(1.0, help="Nucleus sampling mass (with do_sample; 1 disables).")
    top_k: int = field(-1, help="Top-k sampling (with do_sample; <= 0 disables).")
    max_prompt_length: int = field(1024, help="Prompts longer than this (in either model's tokens) are skipped "
                                              "and counted.")
    batch_size: int = field(16, help="Prompts per generation batch.")
    reuse_generations: list[str] = field(default_factory=list, help="Earlier eval output folders whose stored "
                                         "responses (generations.json) may be reused: a model's responses are taken "
                                         "from one when the model's weights, the prompts and every generation "
                                         "setting match, else generated (e.g. a second policy evaluated against the "
                                         "same reference: reuse_generations: ['${eval_grpo}']). Scores stored with "
                                         "taken responses are taken too, for the same reward model and scoring "
                                         "settings.")
    rm_batch_size: int = field(16, help="Sequences per reward-model forward pass.")
    rm_max_length: int | None = field(None, help="Longest prompt+response the reward model scores; longer ones keep "
                                                 "their last tokens and are counted (default: the model's context).")
    normalize_rewards: bool = field(True, help="Standardise rewards with the mean/std train-rm saved in the reward "
                                               "model's config (win rates do not change).")
    seed: int = field(0, help="Seed of sampling, bootstrap and the choice of report samples.")
    num_bootstrap: int = field(1000, help="Bootstrap resamples (of prompts) for the win-rate confidence interval.")
    max_prompts: int | None = field(None, help="Evaluate only the first N prompts (for quick runs).")
    max_preference_pairs: int | None = field(None, help="Score only the first N preference pairs.")
    max_samples_in_report: int = field(20, help="Prompts shown side by side in the report.")
    dtype: str = field("float32", help="Model dtype.", choices=("float32", "bfloat16", "float16"))
    rm_precision: str = field("float32", help="Forward passes of reward_model and judge_model: bf16 runs them under "
                                              "bf16 autocast (weights stay in dtype), as train-rm's "
                                              "trainer.precision=bf16 trained them; faster on GPUs and on "
                                              "CPUs with bf16 matmuls (avx512_bf16, AMX), slower on other CPUs. "
                                              "bf16_if_native: bf16 where the device has bf16 "
                                              "matmuls, else float32. Generation is not affected.",
                         choices=("float32", "bf16", "bf16_if_native"))
    device: str = field("auto", help="Torch device ('auto': cuda when available, else cpu).")
    out: str = field("runs/eval", help="Output folder (written atomically): results.json, report.md, report.html.")

    def validate(self) -> None:
        if not self.policy:
            raise UserError("eval: key 'policy' is required (a Hugging Face causal LM folder)")
        if not self.prompts:
            raise UserError("eval: key 'prompts' is required (an RL prompt parquet file)")
        if self.judge_model and not self.reference:
            raise UserError("eval: key 'judge_model' needs 'reference' (a win rate compares the policy with it)")
        if self.likelihood_model and not self.reference:
            raise UserError("eval: key 'likelihood_model' needs 'reference' (it ranks the policy's answers against "
                            "the reference's)")
        if self.preference_data and not self.reward_model:
            raise UserError("eval: key 'preference_data' needs 'reward_model' (the model whose preference accuracy "
                            "is measured)")
        for key in ("n", "max_new_tokens", "max_prompt_length", "batch_size", "rm_batch_size"):
            if getattr(self, key) < 1:
                raise UserError(f"eval: key {key!r} expected a positive integer, got {getattr(self, key)}")
        for key in ("max_prompts", "max_preference_pairs", "rm_max_length"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise UserError(f"eval: key {key!r} expected a positive integer or null, got {value}")
        if self.n > 1 and not self.do_sample:
            raise UserError(f"eval: n={self.n} with do_sample=false gives {self.n} identical greedy responses; "
                            "set do_sample=true (or n=1)")
        if self.do_sample and self.temperature <= 0:
            raise UserError(f"eval: key 'temperature' expected > 0 with do_sample=true, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"eval: key 'top_p' expected a number in (0, 1], got {self.top_p}")
        if self.num_bootstrap < 100:
            raise UserError(f"eval: key 'num_bootstrap' expected >= 100 (fewer gives a meaningless interval), "
                            f"got {self.num_bootstrap}")
        if self.max_samples_in_report < 0:
            raise UserError(f"eval: key 'max_samples_in_report' expected >= 0, got {self.max_samples_in_report}")

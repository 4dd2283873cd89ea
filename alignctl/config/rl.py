"""Config schema of the RL stages (``alignctl ppo`` / ``alignctl grpo``), with verl's key names.

A verl user's overrides carry over: ``data.train_batch_size``, ``actor_rollout_ref.rollout.n``,
``actor_rollout_ref.actor.ppo_mini_batch_size``, ``algorithm.adv_estimator`` ... Only keys that
alignctl implements exist here; an unknown key is an error, never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from alignctl.config.core import field, section
from alignctl.config.placement import DEFAULT_POOL, PlacementConfig, PoolConfig, check_placement, pool_key, pool_shapes
from alignctl.errors import UserError
from alignctl.plugins import load_plugins, where_plugins_come_from
from alignctl.rollout.registry import engine_entry

STRATEGIES = ("ddp", "fsdp2", "deepspeed")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")


@dataclass
class CustomClass:
    path: str | None = field(None, help="Python file defining the class or function.")
    name: str | None = field(None, help="Name of the class or function in that file.")


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list, help="RL prompt parquet files (preprocess output).")
    val_files: list[str] = field(default_factory=list, help="Validation prompt parquet files.")
    prompt_key: str = field("prompt", help="Column holding the chat messages of the prompt.")
    max_prompt_length: int = field(512, ge=1, help="Prompts longer than this (tokens) are filtered out and counted.")
    max_response_length: int = field(512, ge=1, help="Most new tokens per response.")
    train_batch_size: int = field(32, ge=1, help="Prompts per training step.")
    val_batch_size: int | None = field(None, ge=1, help="Prompts per validation generation call (default: all).")
    max_val_samples: int | None = field(None, ge=1, help="Use at most this many validation prompts.")
    shuffle: bool = field(True, help="Shuffle training prompts every epoch (seeded).")
    seed: int = field(1, help="Seed of the dataloader shuffle.")
    custom_cls: CustomClass = section(CustomClass, help="A user dataset class replacing the built-in one.")


@dataclass
class ModelConfig:
    path: str | None = field(None, help="HF model folder (or hub name when online).")
    tokenizer_path: str | None = field(None, help="Tokenizer folder (default: model.path).")
    dtype: str = field("float32", help="Parameter dtype.", choices=("float32", "bfloat16", "float16"))
    attn_implementation: str = field("auto", help="Attention kernel. auto: flash_attention_2 on GPU when packing "
                                                  "(use_remove_padding) and flash-attn is installed, "
                                                  "else alignctl_segment_sdpa when packing (packed sequences attend "
                                                  "segment by segment, cost sum(len^2)), else sdpa.",
                                     choices=("auto", "sdpa", "eager", "flash_attention_2", "alignctl_segment_sdpa"))
    use_remove_padding: bool | Literal["auto"] = field("auto", help="Pack sequences (block-diagonal attention) in "
                                                  "log-prob and training forwards. auto: packed on CPU workers, and on "
                                                  "GPU workers only when flash-attn is installed (without it the "
                                                  "segment kernel is slower than padded sdpa on a GPU; "
                                                  "docs/gpu_and_cluster.md).")
    max_packed_row_tokens: int = field(2048, ge=1, help="Most tokens per packed row in no-grad passes (old/ref "
                                                  "log-probs, values): with a dense block-diagonal mask (sdpa, "
                                                  "eager) attention cost grows with the square of a row. Training "
                                                  "forwards pack each micro-batch into one row.")
    share_prompt: bool | Literal["auto"] = field("auto", help="Compute each distinct prompt once per packed row, with its responses attending to that one copy "
                                           "(GRPO-style groups of n samples): same numbers, fewer tokens. auto: on "
                                           "CPU workers only (on a GPU it is the slowest layout). Needs "
                                           "use_remove_padding and alignctl_segment_sdpa, sdpa or eager attention "
                                           "(flash attention falls back to plain packing).")
    enable_gradient_checkpointing: bool = field(False, help="Recompute activations in backward to save memory.")
    freeze_layers: int = field(0, ge=0, help="Freeze the policy's input embeddings and first N transformer blocks: "
                                             "only the top blocks train and backward stops at block N (a cheaper "
                                             "actor update; docs/models.md). A model with tied embeddings "
                                             "(SmolLM2, Qwen2.5-0.5B) then keeps its output projection frozen too. "
                                             "Not with lora_rank > 0, which freezes every base weight already.")
    lora_rank: int = field(0, ge=0, help="LoRA rank; 0 trains all weights.")
    lora_alpha: int = field(16, gt=0, help="LoRA alpha.")
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
                                      help="Modules that get LoRA adapters.")


@dataclass
class OptimConfig:
    lr: float = field(1e-6, gt=0, help="Peak learning rate.")
    weight_decay: float = field(0.01, ge=0, help="AdamW weight decay.")
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], ge=0, le=1, help="AdamW betas.")
    lr_warmup_steps: int = field(-1, ge=-1, help="Warm-up steps (-1: use lr_warmup_steps_ratio).")
    lr_warmup_steps_ratio: float = field(0.0, ge=0, le=1, help="Warm-up as a fraction of total training steps.")
    warmup_style: str = field("constant", help="Schedule after warm-up.", choices=("constant", "cosine"))
    min_lr_ratio: float = field(0.0, ge=0, le=1, help="Cosine schedule floor as a fraction of lr.")


@dataclass
class PolicyLossConfig:
    loss_mode: str = field("vanilla", help="Policy loss from the registry: vanilla, gspo, gpg, cispo.")


@dataclass
class DeepSpeedConfig:
    zero_stage: int = field(2, help="ZeRO stage (strategy=deepspeed): 2 shards gradients and optimizer states over "
                                    "the workers, 3 also shards the parameters.", choices=(2, 3))
    offload_optimizer: bool = field(False, help="Keep optimizer states and the optimizer step in CPU memory "
                                                "(ZeRO-Offload); frees GPU memory, a no-op for CPU workers.")
    offload_param: bool = field(False, help="ZeRO-3 only: keep the parameter shards in CPU memory between uses; "
                                            "a no-op for CPU workers.")
    param_persistence_threshold: int = field(100000, ge=0, help="ZeRO-3: parameters with at most this many elements are "
                                                          "not sharded (DeepSpeed's stage3_param_persistence_threshold).")


@dataclass
class FSDPConfig:
    offload_policy: bool = field(False, help="strategy=fsdp2 only: torch's CPUOffloadPolicy. Parameter shards, their "
                                             "gradients and the optimizer state live in CPU memory; each block's "
                                             "shards are copied to the device for its forward and backward, and the "
                                             "optimizer steps on the CPU. Frees GPU memory for slower steps; moves "
                                             "nothing on CPU workers (verl's key).")


@dataclass
class FrozenOffloadConfig:
    param_offload: bool = field(False, help="Keep this frozen model's weights in CPU memory and put them on the "
                                            "worker's device only for its own pass (verl's key). Frees GPU memory "
                                            "between passes for a host-to-device copy per pass; a no-op on CPU workers.")


@dataclass
class ActorConfig:
    strategy: str = field("ddp", help="Training backend.", choices=STRATEGIES)
    ppo_mini_batch_size: int = field(16, ge=1, help="Prompts per optimizer step (x rollout.n responses).")
    ppo_micro_batch_size_per_gpu: int | None = field(None, ge=1, help="Responses per forward/backward per worker "
                                                                "(default: the whole local mini-batch).")
    use_dynamic_bsz: bool = field(False, help="Token-budgeted micro-batches instead of a fixed count.")
    ppo_max_token_len_per_gpu: int = field(16384, ge=1, help="Token budget of a dynamic micro-batch.")
    ppo_epochs: int = field(1, ge=1, help="Passes over each step's data.")
    shuffle: bool = field(False, help="Shuffle responses before splitting into mini-batches.")
    grad_clip: float = field(1.0, help="Max global gradient norm (<=0 disables clipping).")
    clip_ratio: float = field(0.2, gt=0, help="PPO clip range (both sides unless low/high are set).")
    clip_ratio_low: float | None = field(None, gt=0, help="Lower clip range (DAPO clip-higher).")
    clip_ratio_high: float | None = field(None, gt=0, help="Upper clip range (DAPO clip-higher).")
    clip_ratio_c: float = field(3.0, gt=1, help="Dual-clip constant for negative advantages.")
    loss_agg_mode: str = field("token-mean", help="How token losses are averaged.",
                               choices=("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                        "seq-mean-token-sum-norm"))
    entropy_coeff: float = field(0.0, help="Entropy bonus coefficient.")
    recompute_old_log_prob: bool = field(True, help="Take the PPO ratio's old log-probs from a separate forward "
                                                    "pass after generation. false reuses the log-probs the rollout "
                                                    "engine returned with each sampled token (one forward pass less per "
                                                    "step; with hf in float32 they equal the recomputed ones to ~1e-6, "
                                                    "with vllm the ratio also absorbs the engine mismatch). The "
                                                    "mismatch is logged as rollout/log_prob_diff_* when recomputing.")
    use_kl_loss: bool = field(False, help="Add a KL(actor || ref) loss term (GRPO style). With neither this nor "
                                           "algorithm.use_kl_in_reward, no reference copy is built.")
    kl_loss_coef: float = field(0.001, ge=0, help="Coefficient of the KL loss.")
    kl_loss_type: str = field("low_var_kl", help="KL estimator of the KL loss (k1, abs, k2/mse, k3/low_var_kl, k1+, k3+).")
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, help="Policy loss selection.")
    optim: OptimConfig = section(OptimConfig, help="Optimizer of the actor.")
    deepspeed: DeepSpeedConfig = section(DeepSpeedConfig, help="ZeRO options when strategy=deepspeed.")
    fsdp_config: FSDPConfig = section(FSDPConfig, help="FSDP2 options when strategy=fsdp2.")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int | None = field(None, ge=1, help="Responses per reference forward (default: all).")
    dtype: str = field("auto", help="Weights of the frozen reference copy. auto: the policy's model.dtype. bfloat16: "
                                    "a bf16 copy whose output projection stays float32 (faster where bf16 matmuls are "
                                    "native; docs/models.md). Full "
                                    "fine-tuning with actor.strategy=ddp only.", choices=("auto", "bfloat16"))
    fsdp_config: FrozenOffloadConfig = section(FrozenOffloadConfig, help="Offload of the reference weights (full "
                                                                         "fine-tuning; under LoRA there are none).")


@dataclass
class ValKwargs:
    n: int = field(1, ge=1, help="Samples per validation prompt.")
    do_sample: bool = field(False, help="Sample (true) or greedy (false) during validation.")
    temperature: float = field(0.0, ge=0, help="Validation temperature (when sampling).")
    top_p: float = field(1.0, gt=0, le=1, help="Validation nucleus threshold.")
    top_k: int = field(-1, ge=-1, help="Validation top-k (-1: off).")


@dataclass
class MultiTurnConfig:
    enable: bool = field(False, help="Tool-using multi-turn rollouts (docs/agents.md): the model may call tools, "
                                     "their results come back as tool messages, until a final answer.")
    tools: list[str] = field(default_factory=lambda: ["calculator"], help="Tools offered to the model, from the "
                                                                          "tool registry (built-in: calculator, python; "
                                                                          "more through algorithm.plugins).")
    max_turns: int = field(4, ge=1, help="Most assistant turns per trajectory (a turn that still calls a tool at the "
                                         "limit ends the trajectory).")
    tool_timeout_s: float | None = field(None, gt=0, help="Per-call timeout for every tool (default: each tool's own).")
    max_parallel_tools: int = field(8, ge=1, help="Tool calls run at once (over all trajectories of a turn).")
    lanes: int = field(1, ge=1, help="Groups of prompts that take turns at the engine: the engine decodes one "
                                     "group while the tool calls of the others run. 1 decodes each turn as one "
                                     "batch (best for fast tools such as the calculator); 2-4 keep the engine "
                                     "busy when tools are slow (a subprocess, a remote service).")
    enable_python_tool: bool = field(False, help="Allow the 'python' tool (runs model-written code in a sandboxed "
                                                 "subprocess; docs/agents.md says what it contains).")
    isolation: str = field("bwrap", help="How the python tool isolates model-written code. bwrap: bubblewrap "
                                         "namespaces (no network, no host files; refused when bwrap cannot run "
                                         "here). none: a plain subprocess with limits, as you, for those who "
                                         "accept the risk (docs/security.md).", choices=("bwrap", "none"))
    valid_call_reward: float = field(0.0, help="Added to a trajectory's reward per tool call that ran without error.")
    tool_error_penalty: float = field(0.0, ge=0, help="Subtracted from a trajectory's reward per failed tool call "
                                                      "(malformed, unknown tool, bad arguments, exception, timeout).")


@dataclass
class RolloutConfig:
    name: str = field("hf", help="Rollout engine, a registered name: hf (in-process, the training module "
                                 "itself) or vllm (its own weight copy, synced every step); docs/customize.md adds one.")
    n: int = field(1, ge=1, help="Responses per prompt.")
    temperature: float = field(1.0, ge=0, help="Sampling temperature.")
    top_p: float = field(1.0, gt=0, le=1, help="Nucleus threshold.")
    top_k: int = field(-1, ge=-1, help="Top-k (-1: off).")
    do_sample: bool = field(True, help="Sample (true) or greedy (false).")
    dtype: str = field("auto", help="hf engine: the weights it generates with. auto: the training module itself (no "
                                    "copy). bfloat16: a bf16 copy of the policy (output projection float32), "
                                    "refreshed from the training weights before every rollout (faster where bf16 "
                                    "matmuls are native, and RL learned less with it: "
                                    "docs/results.md). With actor.recompute_old_log_prob=false "
                                    "its log-probs are the old log-probs. "
                                    "Full fine-tuning with actor.strategy=ddp only.", choices=("auto", "bfloat16"))
    log_prob_micro_batch_size_per_gpu: int | None = field(None, ge=1, help="Responses per old-log-prob forward (default: all).")
    gpu_memory_utilization: float = field(0.5, gt=0, le=1, help="vllm: fraction of GPU memory for weights + KV cache.")
    tensor_model_parallel_size: int = field(1, ge=1, help="vllm: tensor-parallel degree.")
    enforce_eager: bool = field(True, help="vllm: disable CUDA graphs.")
    cpu_kv_cache_gib: float = field(1.0, gt=0, help="vllm on CPU: GiB of host memory for the KV cache "
                                                    "(VLLM_CPU_KVCACHE_SPACE, unless already set).")
    verify_sync: bool = field(True, help="After every weight sync into an engine with its own copy (vllm), "
                                         "compare its log-probs of a fixed probe sequence with the trainer's; "
                                         "a difference over sync_check_tol stops the run naming the step.")
    sync_check_tol: float | None = field(None, gt=0, help="Largest allowed absolute log-prob difference of the sync "
                                                          "check (default: 1e-3 for a float32 engine, 0.5 for "
                                                          "bf16/fp16).")
    weight_transport: str = field("collective", help="How a rollout pool of its own (trainer.placement.rollout) "
                                  "gets the actor's weights after each update. collective: broadcast from the "
                                  "actor's rank 0 over a process group of their own (gloo on CPU, NCCL on GPU, "
                                  "no copy through host memory; in asynchronous RL sent from a thread, from a "
                                  "copy of the weights, while the actor trains on). object_store: rank 0's "
                                  "export through Ray's object store. Both give the same weights.",
                                  choices=("collective", "object_store"), same_result=True)
    free_cache_engine: bool = field(True, help="Free the rollout's memory after every generation: hf drops its KV "
                                               "cache and, on CUDA, returns the cached blocks to the driver "
                                               "(torch.cuda.empty_cache); vllm sleeps (weights to CPU, KV cache "
                                               "dropped) and wakes for the next rollout. false keeps vllm awake.")
    val_kwargs: ValKwargs = section(ValKwargs, help="Sampling during validation.")
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, help="Tool-using multi-turn rollouts.")


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = section(ModelConfig, help="The policy model.")
    actor: ActorConfig = section(ActorConfig, help="Actor training.")
    ref: RefConfig = section(RefConfig, help="Reference policy.")
    rollout: RolloutConfig = section(RolloutConfig, help="Generation.")


@dataclass
class CriticModelConfig:
    path: str | None = field(None, help="Value-model init folder (default: the actor's model.path): a causal LM, a "
                                        "reward-model folder (its trunk, and a score head's weights; OpenRLHF's "
                                        "default for GAE) or a saved critic. The value head of a causal LM starts at zero.")
    use_remove_padding: bool | Literal["auto"] = field("auto", help="Pack sequences in value forwards (auto: see "
                                                                     "actor_rollout_ref.model.use_remove_padding).")
    share_prompt: bool | Literal["auto"] = field("auto", help="Compute each distinct prompt once per packed row in "
                                                              "value forwards (see actor_rollout_ref.model.share_prompt).")
    enable_gradient_checkpointing: bool = field(False, help="Recompute activations in backward.")
    freeze_layers: int = field(0, ge=0, help="Freeze the value model's input embeddings and first N transformer "
                                             "blocks: only the top blocks and the value head train, and backward "
                                             "stops at block N (a cheaper critic update; docs/models.md).")
    fsdp_config: FSDPConfig = section(FSDPConfig, help="FSDP2 options when critic.strategy=fsdp2.")


@dataclass
class CriticConfig:
    strategy: str = field("ddp", help="Training backend.", choices=STRATEGIES)
    model: CriticModelConfig = section(CriticModelConfig, help="The value model.")
    optim: OptimConfig = section(OptimConfig, help="Optimizer of the critic.")
    deepspeed: DeepSpeedConfig = section(DeepSpeedConfig, help="ZeRO options when strategy=deepspeed.")
    ppo_mini_batch_size: int | None = field(None, ge=1, help="Prompts per critic step (default: the actor's).")
    ppo_micro_batch_size_per_gpu: int | None = field(None, ge=1, help="Responses per critic forward/backward.")
    use_dynamic_bsz: bool = field(False, help="Token-budgeted micro-batches.")
    ppo_max_token_len_per_gpu: int = field(32768, ge=1, help="Token budget of a dynamic micro-batch.")
    ppo_epochs: int | None = field(None, ge=1, help="Passes over each step's data (default: the actor's).")
    cliprange_value: float = field(0.5, gt=0, help="Value clipping range around the old values.")
    loss_agg_mode: str = field("token-mean", help="How token value losses are averaged.")
    grad_clip: float = field(1.0, help="Max global gradient norm.")


@dataclass
class RewardModelSection:
    path: str | None = field(None, help="Reward model folder (train-rm artifact or any sequence classifier).")
    input_tokenizer: str | None = field(None, help="Tokenizer of the policy when it differs (re-tokenize).")
    fsdp_config: FrozenOffloadConfig = section(FrozenOffloadConfig, help="Offload of the reward model's weights "
                                                                         "between scoring passes.")


@dataclass
class RewardModelConfig:
    enable: bool = field(False, help="Score responses with a reward model.")
    model: RewardModelSection = section(RewardModelSection, help="The reward model.")
    micro_batch_size_per_gpu: int | None = field(None, ge=1, help="Pairs per reward-model forward.")
    normalize: bool = field(True, help="Normalise RM scores with the mean/std saved by train-rm.")
    reward_manager: str = field("naive", help="Rule/custom reward manager from the registry: naive, batch, dapo, "
                                              "or one a plugin registers.")
    num_workers: int = field(0, ge=0, help="Processes scoring responses in parallel (0: in the controller).")
    timeout_s: float = field(10.0, gt=0, help="Hard per-item scoring timeout (seconds); a timed-out item scores 0.")
    rule_weight: float = field(1.0, help="Weight of the rule/custom score when an RM is also used.")
    rm_weight: float = field(1.0, help="Weight of the RM score.")
    overlong_buffer_len: int = field(0, ge=0, help="dapo: length of the overlong penalty ramp (0: off).")
    overlong_penalty_factor: float = field(1.0, ge=0, help="dapo: penalty at the maximum length.")


@dataclass
class CustomRewardFunction:
    path: str | None = field(None, help="Python file with the reward function.")
    name: str = field("compute_score", help="Function name: compute_score(data_source, solution_str, ground_truth, extra_info).")


ROLLOUT_CORRECTION_MODES = ("none", "token_tis", "seq_is", "seq_mask")  # alignctl.algos.rollout_correction's


@dataclass
class KLControl:
    type: str = field("fixed", help="KL coefficient controller.", choices=("fixed", "adaptive"))
    kl_coef: float = field(0.001, ge=0, help="(Initial) KL-in-reward coefficient.")
    horizon: int = field(10000, ge=1, help="adaptive: horizon of the proportional controller.")
    target_kl: float = field(0.1, gt=0, help="adaptive: target KL.")


@dataclass
class FilterGroups:
    enable: bool = field(False, help="DAPO dynamic sampling: drop prompts whose responses all got the same score "
                                     "and keep generating until the batch is full.")
    max_num_gen_batches: int = field(10, ge=1, help="Give up (error) after this many generation rounds in one step.")


@dataclass
class RolloutCorrection:
    mode: str = field("none", help="Correct for the gap between the rollout engine's probabilities and the trainer's "
                                   "(an engine in bf16, stale weights): token_tis weights each token's loss by "
                                   "min(pi_old/pi_rollout, cap); seq_is weights a whole response by its capped "
                                   "product of ratios; seq_mask drops responses whose per-token geometric-mean ratio "
                                   "is outside [mask_low, mask_high]. none: no correction. The rollout_corr/* "
                                   "mismatch metrics are logged either way whenever the old log-probs are recomputed.",
                         choices=ROLLOUT_CORRECTION_MODES)
    cap: float = field(2.0, ge=1, help="token_tis / seq_is: the largest weight (C).")
    mask_low: float = field(0.999, gt=0, le=1, help="seq_mask: smallest geometric-mean ratio kept.")
    mask_high: float = field(1.001, ge=1, help="seq_mask: largest geometric-mean ratio kept.")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = field("grpo", help="Advantage estimator from the registry: gae, grpo, rloo, "
                                           "reinforce_plus_plus, reinforce_plus_plus_baseline, remax, opo, "
                                           "grpo_passk, or one a plugin registers.")
    estimator_kwargs: dict[str, Any] = field(default_factory=dict, help="Options of the chosen estimator, by the "
                                                                        "names it declares (a plugin's own "
                                                                        "hyperparameters; the built-ins have none); "
                                                                        "a key it does not declare is an error. Filled "
                                                                        "with the estimator's defaults.")
    gamma: float = field(1.0, ge=0, le=1, help="Discount.")
    lam: float = field(1.0, ge=0, le=1, help="GAE lambda.")
    norm_adv_by_std_in_grpo: bool = field(True, help="false gives Dr.GRPO.")
    use_kl_in_reward: bool = field(False, help="Subtract beta * KL(actor || ref) from token rewards. With neither "
                                                "this nor actor.use_kl_loss, no reference copy is built.")
    kl_penalty: str = field("kl", help="KL estimator in the reward (kl/k1, abs, mse/k2, low_var_kl/k3).")
    kl_ctrl: KLControl = section(KLControl, help="KL-in-reward coefficient controller.")
    filter_groups: FilterGroups = section(FilterGroups, help="DAPO dynamic sampling.")
    rollout_correction: RolloutCorrection = section(RolloutCorrection, help="Importance weights for the rollout "
                                                                            "engine's gap to the trainer (off).")
    plugins: list[str] = field(default_factory=list, help="Modules (my_pkg.losses) or .py files imported in the "
                                                          "controller and every worker before the registries are read: "
                                                          "they register estimators, losses, reward managers and tools "
                                                          "(docs/customize.md). "
                                                          "Installed 'alignctl.plugins' entry points load too.")


MONITOR_ALARMS = ("non_finite", "reward_hacking", "entropy_collapse", "length_blowup", "length_collapse",
                  "mode_collapse", "kl_budget", "tool_collapse", "mismatch_kl", "token_prob_ratio", "staleness_bound")
MONITOR_POLICIES = ("warn", "stop", "ignore")


@dataclass
class MonitorConfig:
    enable: bool = field(True, help="Watch every step for reward hacking, entropy / length / mode collapse, KL over "
                                    "budget, non-finite numbers, a rollout engine that disagrees with the trainer and "
                                    "samples staler than the asynchronous bound (docs/monitor.md).")
    baseline_prompts: int = field(64, ge=0, help="Training prompts the reference policy answers once before step 1 "
                                                 "(rollout.n responses each): the baseline every step is tested "
                                                 "against. 0: no baseline; the rules compare the run with its own "
                                                 "first 'window' steps.")
    false_alarm_rate: float = field(0.05, gt=0, le=0.5, help="The baseline tests' chance of a false alarm over the "
                                                           "whole run, per alarm; lower waits for more evidence.")
    policy: str = field("warn", help="What an alarm does: warn (one console line, logged), stop (checkpoint, then "
                                     "exit 1 with the reason), ignore.", choices=MONITOR_POLICIES)
    policies: dict[str, str] = field(default_factory=dict, help="Per-alarm policy overriding 'policy', e.g. "
                                                                "{reward_hacking: stop}. Alarms: " + ", ".join(MONITOR_ALARMS) + ".")
    window: int = field(4, ge=1, help="Steps averaged for 'recent' (the last W) and, without a baseline, 'start' "
                                      "(the first W).")
    gold_drop: float = field(0.05, gt=0, help="reward_hacking's trend and validation rules: fall of the gold signal "
                                              "(rule score or validation accuracy) that counts (the per-step gold must "
                                              "also fall by 3 standard errors), while the proxy reward rose.")
    entropy_floor: float = field(0.1, gt=0, le=1, help="entropy_collapse: recent entropy below this fraction of the "
                                                       "baseline's (of its start without one).")
    length_high: float = field(1.3, gt=1, help="length_blowup: mean response length above this multiple of the "
                                               "baseline (of its start without one).")
    length_low: float = field(0.75, gt=0, le=1, help="length_collapse: mean response length below this fraction of "
                                                    "the baseline (of its start without one).")
    min_unique: float = field(0.25, gt=0, le=1, help="mode_collapse: share of distinct responses in a batch below this.")
    kl_budget: float = field(0.5, gt=0, help="kl_budget: recent actor/reference_kl (nats per token) above this.")
    tool_use_low: float = field(0.25, gt=0, le=1, help="tool_collapse (multi-turn): recent tool calls per sample below "
                                                       "this fraction of their start.")
    mismatch_kl: float = field(0.01, gt=0, help="mismatch_kl: a step's rollout_corr/k3_kl (the KL between the rollout "
                                                "engine's and the trainer's probabilities of the sampled tokens, nats per "
                                                "token) above this. Judged when the old log-probs are recomputed.")
    prob_ratio: float = field(1.05, gt=1, help="token_prob_ratio: a step's geometric-mean token probability ratio "
                                               "between the rollout engine and the trainer, exp(rollout/log_prob_diff_mean), "
                                               "above this (NeMo-RL treats 1.05 as a framework bug).")


@dataclass
class AsyncRolloutConfig:
    max_staleness: int = field(0, ge=0, help="Asynchronous RL: the rollout pool generates the batches of the next k "
                                             "steps while the trainer trains, and every trained response was sampled "
                                             "by a policy at most k updates old (the trainer waits for a batch rather "
                                             "than drop a stale one). 0: the synchronous loop. k > 0 needs a rollout "
                                             "pool of its own (trainer.placement.rollout) and "
                                             "actor.recompute_old_log_prob=true; pair it with "
                                             "algorithm.rollout_correction (docs/rl.md).")


@dataclass
class TrainerConfig:
    project_name: str = field("alignctl", help="Project name (trackers).")
    experiment_name: str = field("run", help="Run name (trackers, run folder).")
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"], help="console, jsonl, tensorboard, wandb.")
    total_epochs: int = field(1, ge=1, help="Passes over the training prompts.")
    total_training_steps: int | None = field(None, ge=1, help="Stop after this many steps (overrides epochs).")
    nnodes: int = field(1, ge=1, help="Nodes in the Ray cluster.")
    n_gpus_per_node: int = field(1, ge=1, help="Workers per node (GPUs; on CPU, worker processes).")
    device: str = field("auto", help="Device of the workers.", choices=("auto", "cpu", "cuda"))
    cpus_per_worker: int | Literal["auto"] = field(1, ge=1, help="CPU cores (and torch threads) given to each worker. auto: "
                                                                 "the cores alignctl may use on this machine (its "
                                                                 "affinity mask: all of them, or a pipeline stage's "
                                                                 "cpu_share), shared "
                                                                 "evenly by the workers one node holds (every pool's "
                                                                 "workers_per_node together), at least 1; on a cluster "
                                                                 "whose nodes differ from this machine, give a number.")
    precision: str = field("fp32", help="bf16: every role's forward passes (rollout, log-probs, training, critic "
                                        "values, reward-model scores) run under bf16 autocast while parameters, "
                                        "gradients and optimizer state stay in model.dtype; the LM head runs in "
                                        "float32 and log-probs are taken in float32. Faster on GPUs and on CPUs with bf16 instructions "
                                        "(avx512_bf16/AMX; docs/results.md).",
                           choices=("fp32", "bf16"))
    test_freq: int = field(-1, ge=-1, help="Validate every N steps (-1: only at the end).")
    val_before_train: bool = field(True, help="Validate before the first step.")
    save_freq: int = field(-1, ge=-1, help="Save a checkpoint (weights, optimizer, LR schedule, KL controller, data position, "
                                    "random state) every N steps and at the last step (-1: none; the final policy "
                                    "is always saved).")
    resume_mode: str = field("auto", help="auto: continue from the newest complete checkpoint in <run folder>/checkpoints "
                                          "(a fresh start when there is none); disable: start at step 0; or the path "
                                          "of a global_step_N checkpoint folder.")
    max_ckpt_to_keep: int | None = field(None, ge=1, help="Keep only the newest K checkpoints (null: keep all).")
    trust_checkpoint: bool = field(False, help="Resume from a checkpoint that this installation did not write (no "
                                               "signed manifest, or files changed since): loading it runs pickled "
                                               "code, so only for checkpoints from a source you trust.")
    stop_on_flat_reward: bool = field(True, help="Stop with an error when every response of the first batch gets "
                                                 "the same reward (nothing to learn from: missing ground truth, a "
                                                 "reward that never fires); false only warns.")
    default_local_dir: str = field("runs", help="Parent folder of run folders.")
    run_dir: str | None = field(None, help="Exact run folder (default: default_local_dir/experiment_name).")
    critic_warmup: int = field(0, ge=0, help="Steps that train only the critic.")
    balance_batch: bool = field(True, help="Reorder each batch so workers get equal token counts.")
    seed: int = field(1, help="Seed of model init, sampling and shuffles.")
    ray_address: str | None = field(None, help="Ray cluster to join (HOST:PORT of its head, or auto); default: "
                                               "the RAY_ADDRESS environment variable, else a private local cluster.")
    pools: dict[str, PoolConfig] = field(default_factory=dict, help="Named resource pools, each its own Ray placement "
                                                                  "group and torch.distributed group, e.g. {critic_pool: "
                                                                  "{workers_per_node: 1}}. '" + DEFAULT_POOL + "' (nnodes x "
                                                                  "n_gpus_per_node workers) exists without being defined; "
                                                                  "defining it changes its shape (docs/gpu_and_cluster.md).")
    placement: PlacementConfig = section(PlacementConfig, help="Which pool each role runs on.")
    async_rollout: AsyncRolloutConfig = section(AsyncRolloutConfig, help="Rollout and training at the same time, "
                                                                         "with bounded staleness (off).")
    concurrent_roles: bool = field(True, help="Roles on different pools run at the same time where the dataflow "
                                              "allows (critic values with the log-probs, the critic update with the "
                                              "actor update); false runs them phase by phase (for measuring).")
    reuse_workers: bool = field(True, help="A run that ends cleanly keeps its CPU worker processes (no roles, heap "
                                           "returned) for the next run in the same process with the same pools, "
                                           "which skips each worker's start-up; GPU workers always stop. "
                                           "false: every run starts fresh processes.")

    @property
    def resolved_run_dir(self) -> Path:
        """The run folder: ``run_dir``, else ``default_local_dir/experiment_name`` (``~`` expanded)."""
        return Path(self.run_dir or Path(self.default_local_dir) / self.experiment_name).expanduser()


@dataclass
class RLConfig:
    """PPO / GRPO and friends, one loop for all estimators."""

    data: DataConfig = section(DataConfig, help="Prompt data.")
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig, help="Policy, rollout, reference.")
    critic: CriticConfig = section(CriticConfig, help="Value model (used by gae).")
    reward_model: RewardModelConfig = section(RewardModelConfig, help="Reward model and reward manager.")
    custom_reward_function: CustomRewardFunction = section(CustomRewardFunction, help="User reward function.")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, help="Advantages and KL.")
    trainer: TrainerConfig = section(TrainerConfig, help="Loop, workers, logging, checkpoints.")
    monitor: MonitorConfig = section(MonitorConfig, help="Training-health alarms (docs/monitor.md).")

    def _check_registries(self) -> None:
        from alignctl.algos import POLICY_LOSSES
        from alignctl.algos.kl import KL_PENALTY_KINDS
        from alignctl.rewards.managers import REWARD_MANAGERS
        from alignctl.trainers.estimators import ADV_ESTIMATORS, resolve_estimator_kwargs

        # Absolute file paths, so that workers (other folders, other nodes) import the same files.
        self.algorithm.plugins = load_plugins(self.algorithm.plugins)
        for key, name, registry in (
                ("algorithm.adv_estimator", self.algorithm.adv_estimator, ADV_ESTIMATORS),
                ("actor_rollout_ref.actor.policy_loss.loss_mode", self.actor_rollout_ref.actor.policy_loss.loss_mode,
                 POLICY_LOSSES),
                ("reward_model.reward_manager", self.reward_model.reward_manager, REWARD_MANAGERS)):
            if name not in registry:
                raise UserError(f"key {key!r} expected one of {', '.join(registry)}, got {name!r}; "
                                f"{where_plugins_come_from(self.algorithm.plugins)}")
        engine_entry(self.actor_rollout_ref.rollout.name)  # a plugin may have registered it
        try:
            self.algorithm.estimator_kwargs = resolve_estimator_kwargs(self.algorithm.adv_estimator,
                                                                       self.algorithm.estimator_kwargs)
        except ValueError as exc:
            raise UserError(f"key 'algorithm.estimator_kwargs': {exc}") from None
        for key, kind in (("actor_rollout_ref.actor.kl_loss_type", self.actor_rollout_ref.actor.kl_loss_type),
                          ("algorithm.kl_penalty", self.algorithm.kl_penalty)):
            if kind not in KL_PENALTY_KINDS:
                raise UserError(f"key {key!r} expected one of {', '.join(KL_PENALTY_KINDS)}, got {kind!r}")

    @property
    def use_critic(self) -> bool:
        """Whether the estimator declares that it needs a critic (a value model and its role)."""
        from alignctl.trainers.estimators import get_adv_estimator

        return get_adv_estimator(self.algorithm.adv_estimator).critic

    @property
    def needs_reference(self) -> bool:
        """Whether a loss term reads the reference policy (the KL loss or the KL penalty in the reward):
        without one, no reference copy is built and no reference pass runs."""
        return self.actor_rollout_ref.actor.use_kl_loss or self.algorithm.use_kl_in_reward

    @property
    def roles(self) -> tuple[str, ...]:
        """The worker roles this run uses (each placed on a pool by trainer.placement)."""
        return ("actor", *(("critic",) if self.use_critic else ()), *(("rm",) if self.reward_model.enable else ()),
                *(("rollout",) if self.separate_rollout else ()))

    @property
    def separate_rollout(self) -> bool:
        """Whether rollout workers of their own generate (trainer.placement.rollout names another pool)."""
        placement = self.trainer.placement
        return placement.rollout not in ("", placement.actor)

    def world_size(self, role: str) -> int:
        """Workers of the pool that holds ``role``: the ranks its batches are split over."""
        return pool_shapes(self.trainer, (role,))[getattr(self.trainer.placement, role)].world_size

    def _workers_of(self, role: str) -> str:
        """'workers' for the one default pool (as always), else the role's pool and its key."""
        if not self.trainer.pools:
            return "workers"
        return f"{role} workers in {pool_key(self.trainer, role)}"

    def _check_rm_batches(self) -> None:
        """The reward model scores each step's responses (and ReMax's greedy ones, one per prompt)
        split evenly over its pool."""
        if not self.reward_model.enable:
            return
        world = self.world_size("rm")
        if self.data.train_batch_size % world:
            raise UserError(f"data.train_batch_size ({self.data.train_batch_size}) must be divisible by the number "
                            f"of {self._workers_of('rm')} ({world})")

    def validate(self) -> None:
        actor = self.actor_rollout_ref.actor
        n = self.actor_rollout_ref.rollout.n
        if self.reward_model.enable and not self.reward_model.model.path:
            raise UserError("reward_model.enable is true: key 'reward_model.model.path' is required (a train-rm output)")
        if not (self.actor_rollout_ref.model.path or "").strip():
            raise UserError("key 'actor_rollout_ref.model.path' is required (an HF model folder)")
        if not self.data.train_files:
            raise UserError("key 'data.train_files' is required (RL prompt parquet files)")
        if self.data.train_batch_size % actor.ppo_mini_batch_size:
            raise UserError(f"key 'actor_rollout_ref.actor.ppo_mini_batch_size' ({actor.ppo_mini_batch_size}) "
                            f"must divide data.train_batch_size ({self.data.train_batch_size})")
        check_placement(self.trainer)
        world = self.world_size("actor")
        if self.data.train_batch_size % world:
            raise UserError(f"data.train_batch_size ({self.data.train_batch_size}) must be divisible by the number of "
                            f"{self._workers_of('actor')} ({world}): each worker generates for an equal share of the prompts")
        self._check_registries()
        if self.separate_rollout and self.data.train_batch_size % self.world_size("rollout"):
            raise UserError(f"data.train_batch_size ({self.data.train_batch_size}) must be divisible by the number of "
                            f"{self._workers_of('rollout')} ({self.world_size('rollout')}): each generates an equal share")
        if self.trainer.max_ckpt_to_keep is not None and self.trainer.max_ckpt_to_keep < 1:
            raise UserError(f"key 'trainer.max_ckpt_to_keep' must be at least 1 or null (keep all), "
                            f"got {self.trainer.max_ckpt_to_keep}")
        if (actor.ppo_mini_batch_size * n) % world:
            raise UserError(f"ppo_mini_batch_size x rollout.n ({actor.ppo_mini_batch_size * n}) must be "
                            f"divisible by the number of {self._workers_of('actor')} ({world})")
        micro = actor.ppo_micro_batch_size_per_gpu
        if micro is not None and not actor.use_dynamic_bsz and (actor.ppo_mini_batch_size * n // world) % micro:
            raise UserError(f"key 'actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu' ({micro}) must divide "
                            f"the per-worker mini-batch ({actor.ppo_mini_batch_size * n // world} responses)")
        for name, policy in self.monitor.policies.items():
            if name not in MONITOR_ALARMS or policy not in MONITOR_POLICIES:
                raise UserError(f"key 'monitor.policies': {name}: {policy!r}; expected alarms from "
                                f"{', '.join(MONITOR_ALARMS)} with a policy from {', '.join(MONITOR_POLICIES)}")
        unknown = [x for x in self.trainer.logger if x not in LOGGERS]
        if unknown:
            raise UserError(f"key 'trainer.logger': unknown logger(s) {unknown}; expected any of {', '.join(LOGGERS)}")
        self._check_critic_batches(self.world_size("critic"))
        self._check_rm_batches()
        self._check_sampling()
        self._check_multi_turn()
        self._check_offload()
        self._check_actor_freeze()
        self._check_copy_dtypes()
        for key in ("test_freq", "save_freq"):
            if getattr(self.trainer, key) == 0:
                raise UserError(f"key 'trainer.{key}' expected -1 (off) or a positive number of steps, got 0")
        self._check_estimator_needs()
        self._check_rollout_correction()
        self._check_async_rollout()

    def _check_async_rollout(self) -> None:
        """Generating ahead needs workers that are not training at the same time, and stale batches
        need the trainer's own old log-probs (the engine's are the stale policy's)."""
        k = self.trainer.async_rollout.max_staleness
        if k == 0:
            return
        if not self.separate_rollout:
            raise UserError(f"key 'trainer.async_rollout.max_staleness' ({k}) needs a rollout pool of its own: the "
                            "actor's workers cannot generate while they train; set trainer.placement.rollout to "
                            "another pool (e.g. trainer.pools.rollout_pool.workers_per_node=1 "
                            "trainer.placement.rollout=rollout_pool)")
        if not self.actor_rollout_ref.actor.recompute_old_log_prob:
            raise UserError(f"key 'trainer.async_rollout.max_staleness' ({k}) needs "
                            "actor_rollout_ref.actor.recompute_old_log_prob=true: with false the old log-probs "
                            "would be the stale sampling policy's, not the trainer's")

    def _check_rollout_correction(self) -> None:
        """The weights compare the engine's log-probs with the trainer's own: they must be recomputed."""
        if self.algorithm.rollout_correction.mode != "none" and not self.actor_rollout_ref.actor.recompute_old_log_prob:
            raise UserError(f"key 'algorithm.rollout_correction.mode' ({self.algorithm.rollout_correction.mode}) "
                            "needs actor_rollout_ref.actor.recompute_old_log_prob=true (with false the old log-probs "
                            "are the engine's own, so there is no gap to correct)")

    def _check_estimator_needs(self) -> None:
        """What the registered estimator declares it needs (trainers/estimators.py)."""
        from alignctl.trainers.estimators import get_adv_estimator

        estimator, n = get_adv_estimator(self.algorithm.adv_estimator), self.actor_rollout_ref.rollout.n
        if n < estimator.min_group_size:
            raise UserError(f"algorithm.adv_estimator={estimator.name} compares responses of a prompt: set "
                            f"actor_rollout_ref.rollout.n >= {estimator.min_group_size} (got {n})")
        if estimator.extra_rollouts and self.algorithm.filter_groups.enable:
            raise UserError(f"algorithm.adv_estimator={estimator.name} needs the extra rollout(s) "
                            f"{', '.join(estimator.extra_rollouts)}, which DAPO's dynamic sampling "
                            f"(algorithm.filter_groups.enable) does not run; use another estimator or disable it")

    def _check_critic_batches(self, world: int) -> None:
        """The critic splits each step's batch like the actor does: the same divisibility rules."""
        if not self.use_critic:
            return
        critic, n = self.critic, self.actor_rollout_ref.rollout.n
        mini = critic.ppo_mini_batch_size or self.actor_rollout_ref.actor.ppo_mini_batch_size
        if self.data.train_batch_size % mini:
            raise UserError(f"key 'critic.ppo_mini_batch_size' ({mini}) must divide data.train_batch_size "
                            f"({self.data.train_batch_size})")
        if (mini * n) % world:
            raise UserError(f"critic.ppo_mini_batch_size x rollout.n ({mini * n}) must be divisible by the number "
                            f"of {self._workers_of('critic')} ({world})")
        micro = critic.ppo_micro_batch_size_per_gpu
        if micro is not None and not critic.use_dynamic_bsz and (mini * n // world) % micro:
            raise UserError(f"key 'critic.ppo_micro_batch_size_per_gpu' ({micro}) must divide the per-worker "
                            f"critic mini-batch ({mini * n // world} responses)")

    def _check_actor_freeze(self) -> None:
        model = self.actor_rollout_ref.model
        if model.freeze_layers and model.lora_rank > 0:
            raise UserError(f"key 'actor_rollout_ref.model.freeze_layers' ({model.freeze_layers}) cannot be used with "
                            "model.lora_rank > 0: LoRA already freezes every base weight; set one of them to 0")

    def _check_copy_dtypes(self) -> None:
        """bf16 copies of the policy are whole unsharded modules built from the plain weights."""
        arr = self.actor_rollout_ref
        for key, dtype in (("rollout.dtype", arr.rollout.dtype), ("ref.dtype", arr.ref.dtype)):
            if dtype == "auto":
                continue
            why = None
            if key == "rollout.dtype" and not engine_entry(arr.rollout.name).capabilities.dtype_copy:
                continue  # the engine loads its own weights in this dtype; nothing is copied in the actor
            if arr.model.lora_rank > 0:
                why = "full fine-tuning (model.lora_rank > 0 keeps no separate weights to copy)"
            elif arr.actor.strategy != "ddp":
                why = f"actor.strategy=ddp (got {arr.actor.strategy}: a whole copy on every rank would undo its sharding)"
            if why:
                raise UserError(f"key 'actor_rollout_ref.{key}' ({dtype}) needs {why}")

    def _check_offload(self) -> None:
        """FSDP2's CPUOffloadPolicy exists only for fsdp2 (deepspeed has its own keys); LoRA keeps no
        separate reference weights to offload."""
        arr = self.actor_rollout_ref
        roles = [("actor_rollout_ref.actor", arr.actor.strategy, arr.actor.fsdp_config, "fsdp_config")]
        if self.use_critic:
            roles.append(("critic", self.critic.strategy, self.critic.model.fsdp_config, "model.fsdp_config"))
        for key, strategy, fsdp, where in roles:
            if fsdp.offload_policy and strategy != "fsdp2":
                hint = f"; with deepspeed use {key}.deepspeed.offload_optimizer / offload_param" if strategy == "deepspeed" else ""
                raise UserError(f"key '{key}.{where}.offload_policy' needs {key}.strategy=fsdp2 (FSDP2's "
                                f"CPUOffloadPolicy), got strategy={strategy}{hint}")
        if arr.ref.fsdp_config.param_offload and arr.model.lora_rank > 0:
            raise UserError("key 'actor_rollout_ref.ref.fsdp_config.param_offload' has nothing to offload with "
                            "model.lora_rank > 0: the reference is the policy with its adapters off, no second copy")

    def _check_multi_turn(self) -> None:
        mt = self.actor_rollout_ref.rollout.multi_turn
        if not mt.enable:
            return
        from alignctl.tools import TOOLS

        engine = self.actor_rollout_ref.rollout.name
        if not engine_entry(engine).capabilities.multi_turn:
            raise UserError(f"key 'actor_rollout_ref.rollout.multi_turn.enable': the rollout engine {engine!r} cannot "
                            "run tool-using conversations; use rollout.name=hf or vllm")
        if not mt.tools:
            raise UserError("key 'actor_rollout_ref.rollout.multi_turn.tools' is empty; expected at least one tool")
        for name in mt.tools:
            if name not in TOOLS:
                raise UserError(f"key 'actor_rollout_ref.rollout.multi_turn.tools': unknown tool {name!r}; expected one "
                                f"of {', '.join(TOOLS)}; {where_plugins_come_from(self.algorithm.plugins)}")
        if "python" in mt.tools and not mt.enable_python_tool:
            raise UserError("key 'actor_rollout_ref.rollout.multi_turn.tools' names 'python', which runs model-written "
                            "code: set multi_turn.enable_python_tool=true to allow it (docs/agents.md)")
        if "python" in mt.tools:
            from alignctl.tools.python_sandbox import python_tool_problem

            problem = python_tool_problem(mt.isolation)
            if problem:
                raise UserError(f"key 'actor_rollout_ref.rollout.multi_turn.isolation': {problem}")
        if self.data.custom_cls.path:
            raise UserError("multi_turn.enable with data.custom_cls: a custom dataset renders its own prompt ids, "
                            "without the tool list; use the built-in dataset")

    def _check_sampling(self) -> None:
        rollout = self.actor_rollout_ref.rollout
        if rollout.do_sample and rollout.temperature <= 0:
            raise UserError(f"key 'actor_rollout_ref.rollout.temperature' expected > 0 when sampling "
                            f"(do_sample=true), got {rollout.temperature}")
        val = rollout.val_kwargs
        if val.do_sample and val.temperature <= 0:
            raise UserError(f"key 'actor_rollout_ref.rollout.val_kwargs.temperature' expected > 0 with "
                            f"val_kwargs.do_sample=true, got {val.temperature}")
        if val.n > 1 and not val.do_sample:
            raise UserError(f"key 'actor_rollout_ref.rollout.val_kwargs.n' is {val.n} with do_sample=false: "
                            f"{val.n} identical greedy responses; set val_kwargs.do_sample=true or n=1")

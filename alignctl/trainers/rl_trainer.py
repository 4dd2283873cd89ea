"""The single-controller RL loop: one loop for every estimator (PPO, GRPO, RLOO, REINFORCE++, ReMax,
OPO, Dr.GRPO, DAPO). It holds no model weights: workers do, and the controller only moves Batches.

``train_step`` reads as the algorithm's pseudo-code: generate, score, log-probs, values, advantages,
updates. Customise the training logic by subclassing and
overriding a hook (``collect_batch`` is where DAPO's dynamic sampling plugs in).

With a rollout pool of its own, generation goes through a queue (rollout_queue.py): with
``trainer.async_rollout.max_staleness`` k > 0 the pool generates the next k steps' batches while
this step trains; k = 0 is the synchronous loop.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignctl.algos import kl_penalized_rewards, make_kl_controller
from alignctl.batch import Batch
from alignctl.config.core import to_dict, to_yaml
from alignctl.config.placement import pool_key
from alignctl.config.rl import RLConfig
from alignctl.models.batch_indices import balance_batch, balance_groups
from alignctl.monitor import Alarm, Monitor, response_diversity
from alignctl.monitor.baseline import BASELINE_FILE, Baseline
from alignctl.monitor.measure import baseline_prompts, measure_baseline
from alignctl.pipeline.ownership import check_replaceable, is_owned, mark_owned
from alignctl.trainers.estimators import compute_advantage, get_adv_estimator
from alignctl.trainers.extra_rollouts import EXTRA_ROLLOUTS
from alignctl.trainers.checkpoint_folders import (checkpoint_root, commit, read_state, remove_partials, resolve_resume,
                                          start_partial, truncate_metrics, write_state)
from alignctl.trainers.metrics import (Timer, data_metrics, kl_metrics, rollout_mismatch_metrics, throughput,
                                      tool_metrics)
from alignctl.trainers.importance_weights import apply_rollout_correction
from alignctl.trainers.rollout_queue import QUEUE_FILE, QueuedRollout, RolloutQueue, check_staleness
from alignctl.trainers.rl_setup import RLComponents, build_components, start_workers
from alignctl.trainers.validation import validate
from alignctl.console import console
from alignctl.errors import RunFailed, UserError
from alignctl.tracking import Tracker
from alignctl.workers.group import WorkerFailed
from alignctl.workers.pooled_workers import Call, run_calls
from alignctl.workers.rollout_sync import PROBE_TOKENS

# Columns each worker call needs (sending only these keeps Ray's object traffic small).
LOGP_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
ACTOR_UPDATE_INPUTS = (*LOGP_INPUTS, "old_log_probs", "advantages", "ref_log_prob", "rollout_is_weights")


@dataclass
class RunResult:
    run_dir: Path
    policy_dir: Path
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    val_history: list[dict[str, float]] = field(default_factory=list)


class RLTrainer:
    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.parts: RLComponents = build_components(cfg)
        self.kl_ctrl = make_kl_controller(cfg.algorithm.kl_ctrl.type, kl_coef=cfg.algorithm.kl_ctrl.kl_coef,
                                          target_kl=cfg.algorithm.kl_ctrl.target_kl,
                                          horizon=cfg.algorithm.kl_ctrl.horizon)
        self.global_step = 0
        self.workers = None
        self.last_batch: Batch | None = None
        self.saving = False  # a checkpoint is being written (named in failure messages)
        # The monitor's staleness alarm watches the queue's bound (none without a rollout pool of its own).
        bound = cfg.trainer.async_rollout.max_staleness if cfg.separate_rollout else None
        self.monitor = Monitor.from_config(cfg.monitor, max_staleness=bound) if cfg.monitor.enable else None
        self.need_ref = cfg.needs_reference
        self.on_policy = is_on_policy(cfg)
        self.rollout_version: int | None = None  # the actor update a rollout pool of its own generates with
        self.rollout_probe: list[int] | None = None
        self.weight_channel_open = False  # rollout.weight_transport=collective: the channel was formed
        self.queue = RolloutQueue(cfg.trainer.async_rollout.max_staleness) if cfg.separate_rollout else None
        self.epoch = 0  # the loader's epoch once this step's prompts were drawn
        self.generated_lengths: list[int] = []  # of this step's training rollouts, filtered or not

    # ------------------------------------------------------------------ the step

    def train_step(self, prompts: Batch) -> dict[str, float]:
        timer, metrics = Timer(), {}
        with timer("step"):
            with timer("gen"):
                batch, pending_reward = self.collect_batch(prompts, timer)
            rollout_metrics = self.step_rollout_metrics(batch)  # before any update: asserts the staleness bound
            order = self.balance_order(batch)
            batch = batch.index(order)
            batch = self.forward_passes(batch, timer)
            batch, correction_metrics = apply_rollout_correction(batch, self.cfg.algorithm.rollout_correction)
            with timer("reward"):
                # Scored in generation order: put the scores in the balanced order of the batch.
                batch = batch.union(pending_reward.result().index(order))
            batch, metrics = self.apply_kl_in_reward(batch)
            with timer("adv"):
                batch = batch.union(compute_advantage(batch, self.cfg.algorithm))
            metrics |= self.updates(batch, timer)
        self.last_batch = batch  # kept for inspection (tests, debugging hooks)
        metrics |= data_metrics(batch, self.cfg.data.max_response_length) | kl_metrics(batch) | tool_metrics(batch)
        metrics |= rollout_mismatch_metrics(batch, self.global_step) | correction_metrics | rollout_metrics
        metrics |= batch.meta.get("reward_metrics", {})
        metrics |= timer.metrics() | throughput(batch, timer.seconds["timing_s/step"], self.workers.total_workers)
        metrics |= response_diversity(batch["responses"], batch["response_mask"],
                                      batch["group_index"] if "group_index" in batch else None)
        return metrics

    # ------------------------------------------------------------------ hooks and helpers

    def collect_batch(self, prompts: Batch, timer: Timer) -> tuple[Batch, Future[Batch]]:
        """Generate responses and start scoring them (in the background, off the critical path).

        Override to change which responses are trained on (see DAPO's dynamic sampling)."""
        batch = self.generate(prompts, **self.rollout_request())
        batch = self.add_extra_rollouts(prompts, batch)
        return batch, self.parts.reward.submit(batch)

    def rollout_request(self) -> dict[str, Any]:
        """The sampling arguments of the training rollouts (what the queue generates ahead with)."""
        rollout = self.cfg.actor_rollout_ref.rollout
        return {"n": rollout.n, "do_sample": rollout.do_sample, "temperature": rollout.temperature,
                "top_p": rollout.top_p, "top_k": rollout.top_k, "prompt_width": None}

    def next_prompts(self) -> Batch:
        """The next training prompts. With a rollout pool of its own their generation is queued
        already (k steps ahead with async rollouts): ``generate`` then takes it from the queue."""
        if self.queue is None:
            prompts = self.parts.loader.next_batch()
            self.epoch = self.parts.loader.epoch
        else:
            self.fill_queue()
            prompts = self.queue.pop()
        prompts.meta["training_prompts"] = True  # their rollouts count as generated for training
        return prompts

    def fill_queue(self) -> None:
        """Top the queue up to k + 1 batches (none past the last step). The newest weights go to the
        pool first, so every batch queued now is generated by this version; all calls non-blocking."""
        while self.queue.wants_more(self.global_step, self.parts.total_steps):
            prompts, request = self.parts.loader.next_batch(), self.rollout_request()
            self.set_sampling_meta(prompts, self.global_step + len(self.queue), **request)
            syncs = self.submit_rollout_weights(prompts["prompt_ids"][0])
            refs = self.workers.split_async("rollout", "generate_sequences", prompts)
            self.queue.add(QueuedRollout(prompts, request, self.rollout_version, self.parts.loader.epoch, refs, syncs))

    def set_sampling_meta(self, prompts: Batch, step: int, *, n: int, do_sample: bool, temperature: float,
                          top_p: float, top_k: int, prompt_width: int | None) -> None:
        """What a rollout worker reads from the prompts' meta; seeded by the step they train at."""
        prompts.meta.update(n=n, do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k,
                            seed=self.cfg.trainer.seed * 7919 + step, global_step=step,
                            prompt_width=prompt_width or max(len(p) for p in prompts["prompt_ids"]))

    def generate(self, prompts: Batch, *, n: int, do_sample: bool, temperature: float, top_p: float,
                 top_k: int, prompt_width: int | None = None) -> Batch:
        """``prompt_width``: left-pad prompts to this width (default: the longest prompt here).
        Prompts from ``next_prompts`` asked for with ``rollout_request()`` come from the queue."""
        request = {"n": n, "do_sample": do_sample, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                   "prompt_width": prompt_width}
        batch = self._generate(prompts, request)
        if prompts.meta.get("training_prompts") and request == self.rollout_request():
            self.generated_lengths += batch["response_mask"].sum(-1).tolist()
        return batch

    def _generate(self, prompts: Batch, request: dict[str, Any]) -> Batch:
        queued = self.queue.take(prompts, request) if self.queue is not None else None
        if queued is not None:
            self.epoch = queued.epoch
            return with_pool_metrics(queued.result, queued.sync_s)
        self.set_sampling_meta(prompts, self.global_step, **request)
        if not self.cfg.separate_rollout:
            return self.workers.split("actor", "generate_sequences", prompts)
        sync_s = self.push_rollout_weights(prompts["prompt_ids"][0])
        return with_pool_metrics(self.workers.split("rollout", "generate_sequences", prompts), sync_s)

    def submit_rollout_weights(self, first_prompt: list[int]) -> list[tuple[str, str, list[Any]]]:
        """A rollout pool of its own gets the actor's weights once per update (and after a resume),
        from the actor's rank 0 straight to every rollout worker, never through this process: through
        Ray's object store, or over the weight channel (``rollout.weight_transport=collective``).
        Non-blocking: returns the calls to wait for, (role, method, refs) each (none when the pool
        has these weights)."""
        if self.rollout_version == self.global_step:
            return []
        self.rollout_probe = self.rollout_probe or list(first_prompt)[:PROBE_TOKENS]
        self.rollout_version = self.global_step
        if self.cfg.actor_rollout_ref.rollout.weight_transport == "collective":
            self.open_weight_channel()
            sends = self.workers.broadcast_async("actor", "send_rollout_weights", self.rollout_probe)
            loads = self.workers.broadcast_async("rollout", "receive_weights", self.global_step)
            return [("rollout", "receive_weights", loads), ("actor", "send_rollout_weights", sends)]
        exported = self.workers.broadcast_async("actor", "export_rollout_weights", self.rollout_probe)
        loads = self.workers.broadcast_async("rollout", "load_weights", exported[0], self.global_step)
        # The other ranks return None: rank 0's export went to the pool.
        return [("rollout", "load_weights", loads), ("actor", "export_rollout_weights", exported[1:])]

    def open_weight_channel(self) -> None:
        """Once per run: the actor's rank 0 and the rollout workers form the weight channel."""
        if self.weight_channel_open:
            return
        addr, port = self.workers.rank0("actor", "weight_channel_address")
        size = 1 + self.cfg.world_size("rollout")
        opens = [("actor", self.workers.broadcast_async("actor", "open_weight_channel", size)),
                 ("rollout", self.workers.broadcast_async("rollout", "open_weight_channel", addr, port, size))]
        for role, refs in opens:
            self.workers.gather(role, "open_weight_channel", refs)
        self.weight_channel_open = True

    def push_rollout_weights(self, first_prompt: list[int]) -> float:
        """``submit_rollout_weights`` and wait for it; the seconds it took (0 when nothing was sent)."""
        start = time.perf_counter()
        syncs = self.submit_rollout_weights(first_prompt)
        for role, method, refs in syncs:
            self.workers.gather(role, method, refs)
        return time.perf_counter() - start if syncs else 0.0

    def step_rollout_metrics(self, batch: Batch) -> dict[str, float]:
        """The mean length of the responses generated for this step against those trained (they
        differ only where responses are filtered: DAPO); with a rollout pool, the staleness of every
        response about to be trained (checked against the bound) and the waits of both sides."""
        generated, self.generated_lengths = self.generated_lengths, []
        metrics = {"rollout/trained_length/mean": float(batch["response_mask"].sum(-1).float().mean())}
        if generated:
            metrics["rollout/generated_length/mean"] = sum(generated) / len(generated)
        if self.queue is None or "policy_version" not in batch:
            return metrics
        staleness = check_staleness(batch["policy_version"], self.global_step, self.queue.max_staleness).float()
        return {**metrics, "rollout/staleness/mean": float(staleness.mean()),
                "rollout/staleness/max": float(staleness.max()), **self.queue.step_metrics()}

    def add_extra_rollouts(self, prompts: Batch, batch: Batch) -> Batch:
        """The extra rollouts the estimator declares (ReMax: its greedy baseline), unioned into ``batch``."""
        for name in get_adv_estimator(self.cfg.algorithm.adv_estimator).extra_rollouts:
            batch = batch.union(EXTRA_ROLLOUTS.get(name)(self, prompts, batch))
        return batch

    def balance_order(self, batch: Batch) -> list[int]:
        """Row order giving every worker the same token count (identity when balancing is off); with
        shared-prompt packing, whole prompt groups per worker."""
        if not self.cfg.trainer.balance_batch:
            return list(range(len(batch)))
        lengths = batch["attention_mask"].sum(-1)
        # Whole groups per worker whenever the workers may share prompts ('auto' decides per device there).
        if self.cfg.actor_rollout_ref.model.share_prompt is not False and "group_index" in batch:
            responses = batch["response_mask"].sum(-1)
            order = balance_groups(batch["group_index"].tolist(), (lengths - responses).tolist(), responses.tolist(),
                                   self.workers.world_size)
            if order is not None:
                return order
        return balance_batch(lengths.tolist(), self.workers.world_size)

    def apply_kl_in_reward(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        scores = batch["token_level_scores"]
        if not self.cfg.algorithm.use_kl_in_reward:
            return batch.union(Batch({"token_level_rewards": scores})), {}
        rewards, kl = kl_penalized_rewards(scores, batch["old_log_probs"], batch["ref_log_prob"],
                                           batch["response_mask"], self.kl_ctrl.value, self.cfg.algorithm.kl_penalty)
        metrics = {"actor/reward_kl_penalty": float(kl), "actor/reward_kl_penalty_coeff": self.kl_ctrl.value}
        self.kl_ctrl.update(float(kl), n_steps=len(batch))  # responses, as verl counts them
        return batch.union(Batch({"token_level_rewards": rewards})), metrics

    def forward_passes(self, batch: Batch, timer: Timer) -> Batch:
        """Old log-probs (off-policy), reference log-probs (with a KL) and critic values (gae): the
        actor's and the critic's run at once when they live in different pools."""
        inputs = batch.select(LOGP_INPUTS)
        reuse = not self.on_policy and self.reuses_rollout_log_probs(batch)
        if reuse:
            batch = batch.union(Batch({"old_log_probs": batch["rollout_log_probs"]}))
        calls = [Call(name, role, method, inputs) for name, role, method, wanted in (
            ("old_log_prob", "actor", "compute_log_prob", not self.on_policy and not reuse),
            ("ref", "actor", "compute_ref_log_prob", self.need_ref),
            ("values", "critic", "compute_values", self.cfg.use_critic)) if wanted]
        results, seconds = run_calls(self.workers, calls, concurrent=self.cfg.trainer.concurrent_roles)
        timer.add(seconds)
        for result in results:
            batch = batch.union(result)
        batch.meta["old_log_probs_from"] = "current" if self.on_policy else "rollout" if reuse else "recomputed"
        return batch

    def reuses_rollout_log_probs(self, batch: Batch) -> bool:
        """``actor.recompute_old_log_prob=false``: the engine's own log-probs of the sampled tokens
        serve as the old log-probs (every engine returns them unless asked not to)."""
        return not self.cfg.actor_rollout_ref.actor.recompute_old_log_prob and "rollout_log_probs" in batch

    def updates(self, batch: Batch, timer: Timer) -> dict[str, float]:
        """The critic update, then the actor update (after ``critic_warmup``); at once when the two
        live in different pools (each reads only this step's batch)."""
        calls = []
        if self.cfg.use_critic:
            calls.append(self.update_call("critic", "update_critic", batch))
        if self.global_step >= self.cfg.trainer.critic_warmup:
            calls.append(self.update_call("actor", "update_actor", batch))
        results, seconds = run_calls(self.workers, calls, concurrent=self.cfg.trainer.concurrent_roles)
        timer.add(seconds)
        metrics: dict[str, float] = {}
        for parts in results:
            metrics |= parts[0]  # metrics are all-reduced inside the workers: every rank holds the same
        return metrics

    def update_call(self, role: str, method: str, batch: Batch) -> Call:
        keys = ACTOR_UPDATE_INPUTS if role == "actor" else (*LOGP_INPUTS, "values", "returns")
        return Call(method, role, method, batch.select([k for k in keys if k in batch]), collect=True)

    # ------------------------------------------------------------------ the run

    def fit(self) -> RunResult:
        run_dir = self.parts.run_dir
        check_replaceable(run_dir)  # never write into a folder of the user's (preflight said so already)
        result = RunResult(run_dir, run_dir / "actor", 0)
        new_run = not run_dir.exists()
        refused = finished = False
        resume_from = self.restore_controller(result)
        try:
            self.workers = start_workers(self.cfg, self.parts.total_steps)
        except WorkerFailed as exc:
            raise RunFailed(f"starting workers: {exc}") from exc
        if self.queue is not None:
            self.queue.workers = self.workers
        # Only now, with every worker up, is the run folder written: a failed start leaves it as it was.
        tracker = self.open_run_dir(resume=resume_from is not None)
        if self.cfg.reward_model.enable:
            self.parts.reward.model_scorer = lambda texts: self.workers.split("rm", "compute_rm_score", texts)
        try:
            if resume_from is not None:
                for role in self.trainable_roles:
                    self.workers.broadcast(role, "load_checkpoint", str(resume_from / role))
            self._loop(tracker, result)
            self.workers.broadcast("actor", "save", str(result.policy_dir))
            self.record_policy_origin(result.policy_dir)
            finished = True
        except WorkerFailed as exc:
            raise RunFailed(f"{self.activity}: {exc}") from exc
        except UserError:
            refused = True  # e.g. a flat first-batch reward: the run trained on nothing
            raise
        finally:
            tracker.close()
            # A run that ended cleanly leaves its CPU workers for the next run in this process (group.py).
            self.workers.shutdown(keep_warm=finished and self.cfg.trainer.reuse_workers)
            if refused and new_run:
                shutil.rmtree(run_dir, ignore_errors=True)  # leave no run folder behind a refused run
        summary = _summary(result)
        if self.monitor is not None:
            summary["monitor"] = self.monitor.summary()
            if (line := self.monitor.summary_line()) is not None:
                console.print(line)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
        return result

    def record_policy_origin(self, policy_dir: Path) -> None:
        """The exported policy's manifest names the model it started from, so ``evaluate`` can
        compare against it when no reference is given."""
        from alignctl.pipeline.manifest import write_manifest

        def local(path: str | None) -> str | None:
            return str(Path(path).expanduser().absolute()) if path and Path(path).expanduser().exists() else path

        rm = self.cfg.reward_model
        write_manifest(policy_dir, stage="rl-policy", config={"algorithm": to_dict(self.cfg.algorithm)},
                       metrics={"steps": self.global_step},
                       extra={"base_model": local(self.cfg.actor_rollout_ref.model.path),
                              "reward_model": local(rm.model.path) if rm.enable else None,
                              "run_dir": str(self.parts.run_dir)})

    def open_run_dir(self, *, resume: bool) -> Tracker:
        """Create (and mark as alignctl's) the run folder; write the config and the worker layout."""
        run_dir = self.parts.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        if not is_owned(run_dir):
            mark_owned(run_dir, "rl run")
        (run_dir / "config.yaml").write_text(to_yaml(self.cfg), encoding="utf-8")
        (run_dir / "workers.json").write_text(json.dumps(self.workers.describe(), indent=2), encoding="utf-8")
        return Tracker.create(self.cfg.trainer.logger, run_dir, project=self.cfg.trainer.project_name,
                              name=self.cfg.trainer.experiment_name, config=to_dict(self.cfg), resume=resume,
                              total_steps=self.parts.total_steps)

    def check_reward_signal(self, batch: Batch) -> None:
        """The first batch of a fresh run: when every response got the same reward, every advantage
        is zero (GRPO) or pure noise (PPO): the run would train on nothing. Say so at step 1."""
        scores = batch["token_level_scores"].sum(-1)
        if len(scores) < 2 or not bool((scores == scores[0]).all()):
            return
        message = (f"every one of the {len(scores)} responses of the first batch got the same reward "
                   f"({float(scores[0]):g}): nothing to learn from; check the rows' reward_model.ground_truth, "
                   f"the reward function and data_source (set trainer.stop_on_flat_reward=false to train anyway)")
        if self.cfg.trainer.stop_on_flat_reward:
            raise UserError(message)
        console.print(f"[bold yellow]warning:[/] {message}")

    def _loop(self, tracker: Tracker, result: RunResult) -> None:
        trainer = self.cfg.trainer
        self.start_monitor(result)
        if trainer.val_before_train and self.parts.val_data is not None and self.global_step == 0:
            self._validate(tracker, result)
        while self.global_step < self.parts.total_steps:
            metrics = self.train_step(self.next_prompts())
            if self.global_step == 0 and self.last_batch is not None:
                self.check_reward_signal(self.last_batch)
            self.global_step += 1
            metrics["training/epoch"] = self.epoch
            alarms = self.watch(metrics)
            tracker.log(metrics, self.global_step)
            result.history.append(metrics)
            self.act_on(alarms)
            last = self.global_step == self.parts.total_steps
            if self.parts.val_data is not None and (last or (trainer.test_freq > 0 and self.global_step % trainer.test_freq == 0)):
                self._validate(tracker, result)
            if trainer.save_freq > 0 and (last or self.global_step % trainer.save_freq == 0):
                self.save_checkpoint()
        result.steps = self.global_step

    # ------------------------------------------------------------------ checkpoints

    @property
    def trainable_roles(self) -> list[str]:
        return ["actor", "critic"] if self.cfg.use_critic else ["actor"]

    def controller_state(self) -> dict[str, Any]:
        """What the controller itself must remember (the workers save their own state)."""
        return {"global_step": self.global_step, "loader": self.parts.loader.state_dict(),
                "kl_ctrl": self.kl_ctrl.state_dict(), "world_size": self.workers.world_size,
                "role_world_sizes": {role: self.workers.world_size_of(role) for role in self.trainable_roles}}

    def save_checkpoint(self) -> Path:
        """Every trainable role writes into a partial folder, then the controller state; then commit."""
        partial = start_partial(checkpoint_root(self.parts.run_dir), self.global_step)
        self.saving = True
        try:
            for role in self.trainable_roles:
                self.workers.broadcast(role, "save_checkpoint", str(partial / role))
            if self.queue is not None:
                self.queue.save(partial)  # the loader's position is past the queued prompts
            write_state(partial, self.controller_state())
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)  # never leave a half checkpoint (e.g. disk full)
            raise
        self.saving = False
        return self.commit_checkpoint(partial)

    @property
    def activity(self) -> str:
        """What the run was doing, for failure messages."""
        if self.saving:
            return f"saving the step {self.global_step} checkpoint"
        return f"step {self.global_step + 1}"

    def commit_checkpoint(self, partial: Path) -> Path:
        return commit(partial, checkpoint_root(self.parts.run_dir), self.global_step, self.cfg.trainer.max_ckpt_to_keep)

    def restore_controller(self, result: RunResult) -> Path | None:
        """Pick the checkpoint to resume from (``trainer.resume_mode``) and restore the controller's
        part: step, data position, KL controller, and the metrics logged up to that step."""
        root = checkpoint_root(self.parts.run_dir)
        remove_partials(root)
        folder = resolve_resume(self.cfg.trainer.resume_mode, root, trust=self.cfg.trainer.trust_checkpoint)
        if folder is None:
            return None
        state = read_state(folder)
        self.check_resume_worlds(folder, state)
        self.global_step = int(state["global_step"])
        self.parts.loader.load_state_dict(state["loader"])
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.epoch = self.parts.loader.epoch
        self.restore_queue(folder)
        for row in truncate_metrics(self.parts.run_dir / "metrics.jsonl", self.global_step):
            if any(key.startswith("val-") for key in row):
                result.val_history.append(row)
            else:
                result.history.append({k: v for k, v in row.items() if k != "step"})
        console.print(f"[bold]resuming from {folder} (step {self.global_step})[/]")
        return folder

    def restore_queue(self, folder: Path) -> None:
        """The batches the checkpoint had queued (generated before it was written, by older weights)."""
        if self.queue is not None:
            self.queue.load(folder, self.global_step)
        elif (folder / QUEUE_FILE).exists():
            raise UserError(f"{folder}: written with asynchronous rollouts (queued batches); resume it with its "
                            f"trainer.placement.rollout pool and trainer.async_rollout.max_staleness")

    def check_resume_worlds(self, folder: Path, state: dict[str, Any]) -> None:
        """Each trainable role resumes on as many workers as wrote its state (sharded optimizer
        states and per-rank random states)."""
        written = {"actor": state["world_size"], **state.get("role_world_sizes", {})}
        for role in self.trainable_roles:
            world = self.cfg.world_size(role)
            if role in written and written[role] != world:
                key = pool_key(self.cfg.trainer, role)
                raise UserError(f"{folder}: written by {written[role]} {'' if role == 'actor' else role + ' '}workers, "
                                f"this run has {world} ({key} must match to resume)")

    def _validate(self, tracker: Tracker, result: RunResult) -> None:
        start = time.perf_counter()
        metrics = validate(self, self.parts.val_data)
        metrics["timing_s/validation"] = time.perf_counter() - start
        alarms = self.watch(metrics)
        tracker.log(metrics, self.global_step)
        result.val_history.append({"step": self.global_step, **metrics})
        self.act_on(alarms)

    # ------------------------------------------------------------------ the monitor

    def start_monitor(self, result: RunResult) -> None:
        """The monitor's baseline: measured before step 1 of a fresh run, read back in a resumed one,
        whose restored steps are replayed so the tests go on where they were (docs/monitor.md)."""
        if self.monitor is None or self.cfg.monitor.baseline_prompts == 0:
            return
        path = self.parts.run_dir / BASELINE_FILE
        if self.global_step == 0:
            prompts = baseline_prompts(self.parts.train_data, self.cfg.monitor.baseline_prompts,
                                       self.workers.world_size, self.cfg.trainer.seed)
            baseline = measure_baseline(self, prompts, LOGP_INPUTS)
            path.write_text(json.dumps(baseline.to_dict(), indent=2), encoding="utf-8")
            console.print(f"monitor baseline: {baseline.line()}")
        elif path.exists():
            baseline = Baseline.from_dict(json.loads(path.read_text(encoding="utf-8")))
        else:
            return  # a run from before baselines: the window rules judge it
        self.monitor.set_baseline(baseline, self.parts.total_steps)
        for step, row in enumerate(result.history, 1):
            self.monitor.observe(step, row)  # their alarms were printed and logged when they fired

    def watch(self, metrics: dict[str, float]) -> list[Alarm]:
        """Feed the monitor; each alarm that starts now is printed and marked in ``metrics``."""
        if self.monitor is None:
            return []
        alarms = self.monitor.observe(self.global_step, metrics)
        for alarm in alarms:
            metrics[f"monitor/alarm/{alarm.name}"] = 1.0
            console.print(f"[bold yellow]alarm:[/] {alarm.line()}")
        return alarms

    def act_on(self, alarms: list[Alarm]) -> None:
        """A ``stop`` alarm: save a checkpoint, then end the run with the reason (exit 1)."""
        stops = [a for a in alarms if a.policy == "stop"]
        if not stops:
            return
        saved = self.save_checkpoint()
        raise RunFailed(f"stopped by the monitor at {stops[0].line()} (monitor policy stop; checkpoint {saved})")


def with_pool_metrics(batch: Batch, sync_s: float) -> Batch:
    """A rollout pool's batch with its weight-sync seconds and policy version in the step metrics."""
    batch.meta["rollout_metrics"] = {**batch.meta.get("rollout_metrics", {}), "timing_s/rollout_weight_sync": sync_s,
                                     "rollout/policy_version": float(batch.meta["policy_version"])}
    return batch


def is_on_policy(cfg: RLConfig) -> bool:
    """One optimizer step per batch (one epoch, one mini-batch): the policy that sampled is the one
    being updated, so the PPO ratio's "old" log-probs equal the current ones detached and the
    separate old-log-prob pass can be skipped (exact: same weights, same inputs). KL-in-reward
    still needs them before the update, and so does rollout correction (it compares them with the
    engine's)."""
    actor = cfg.actor_rollout_ref.actor
    return (actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == cfg.data.train_batch_size
            and not cfg.algorithm.use_kl_in_reward and cfg.algorithm.rollout_correction.mode == "none")


def _summary(result: RunResult) -> dict[str, Any]:
    return {"steps": result.steps, "policy": str(result.policy_dir), "validation": result.val_history,
            "last": result.history[-1] if result.history else {}, "pid": os.getpid()}

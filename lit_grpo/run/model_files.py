"""Model directories as inputs: where a path resolves, whether it holds a loadable model, its tokenizer and dtype.

Shared by the policy and by rewards that load a model of their own (``lit_grpo.tasks.RewardModel``).
"""

from __future__ import annotations

import copy
import json
import typing
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from peft import (
    LoraConfig,
    NoMatchingPeftModuleError,
    get_peft_model,
    get_peft_model_state_dict,
)
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
)

from lit_grpo.errors import InputError

PROJECT_ROOT = Path(__file__).resolve().parents[2]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def shipped_path(given: str) -> Path:
    """A file or directory as given when it exists, else relative to the project checkout when it exists there
    (``data/...``, ``examples/...`` in a shipped config run from elsewhere), else as given."""
    path = Path(given).expanduser()
    shipped = PROJECT_ROOT / given
    return shipped if not path.exists() and not path.is_absolute() and shipped.exists() else path


def resolve_model_path(model_name_or_path: str) -> str:
    """A local directory as given, else relative to the project checkout (for ``data/...``), else a hub id."""
    given = Path(model_name_or_path).expanduser()
    if given.is_dir():
        return str(given)
    shipped = PROJECT_ROOT / model_name_or_path
    if not given.is_absolute() and shipped.is_dir():
        return str(shipped)
    return model_name_or_path


def model_path_problem(model_name_or_path: str) -> str | None:
    """Why ``model_name_or_path`` cannot be loaded, or None: a path must exist; a hub id must look like one."""
    resolved = resolve_model_path(model_name_or_path)
    if Path(resolved).is_dir():
        if not (Path(resolved) / "config.json").is_file():
            return f"{resolved!r} holds no config.json"
        if not any((Path(resolved) / name).is_file() for name in TOKENIZER_FILES):
            return f"{resolved!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})"
        return model_files_problem(Path(resolved))
    looks_like_path = model_name_or_path.startswith((".", "/", "~")) or model_name_or_path.count("/") > 1
    if looks_like_path or not model_name_or_path.strip():
        return f"{model_name_or_path!r} is not a model directory (nor a hub id)"
    return None


def model_files_problem(directory: Path) -> str | None:
    """A model directory's config.json must be a JSON object of a model type this transformers knows (or one that
    ships its own code), and each safetensors file must hold every tensor its header lists (not truncated)."""
    from safetensors import safe_open
    from transformers import CONFIG_MAPPING

    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return f"{str(directory)!r}: config.json is not valid JSON ({error})"
    if not isinstance(config, dict):
        return f"{str(directory)!r}: config.json is not a JSON object"
    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING and not config.get("auto_map"):
        return (f"{str(directory)!r}: config.json's model_type {model_type!r} is unknown to transformers "
                f"{transformers_version()} (a newer transformers may know it)")
    for weights in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt") as handle:
                handle.keys()
        except Exception as error:  # noqa: BLE001 - safetensors raises its own error type
            return f"{str(weights)!r} cannot be read ({error}); the file is truncated or not safetensors"
    return None


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def load_tokenizer(model_path: str, trust_remote_code: bool = False) -> Any:
    """The model's tokenizer, with a pad token (its EOS, with a warning) if it had none."""
    refuse_remote_code(model_path, trust_remote_code)
    if Path(model_path).is_dir() and not any((Path(model_path) / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build an empty tokenizer of the model's type and train on nonsense
        raise InputError(f"model_name_or_path: {model_path!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                         "save the model's tokenizer into it with tokenizer.save_pretrained(...)")
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise InputError(f"the tokenizer of {model_path!r} has neither a pad nor an EOS token: add a pad token")
        warnings.warn(
            f"the tokenizer of {model_path!r} has no pad token: padding with its EOS token {tokenizer.eos_token!r} "
            "(padded positions are masked, so this changes no result)",
            stacklevel=2,
        )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def refuse_remote_code(model_path: str, trust_remote_code: bool) -> None:
    """Raise ``InputError`` naming ``model.trust_remote_code`` when a local model ships code it was not allowed to run
    (for a hub id, transformers refuses by itself, since ``trust_remote_code=False`` is passed explicitly)."""
    problem = remote_code_problem(model_path, trust_remote_code) if Path(model_path).is_dir() else None
    if problem:
        raise InputError(problem)


BaseDtype = Literal["float32", "bfloat16", "float16"]
BASE_DTYPES = typing.get_args(BaseDtype)


def checkpoint_dtype(model_path: str) -> Any:
    """The dtype the checkpoint's config names (its ``dtype``, or ``torch_dtype`` in older files), as written;
    ``None`` when it names none or cannot be read (``from_pretrained`` reports an unreadable config itself)."""
    try:  # the config.json of a directory or of a cached hub id, read as data (no model code runs)
        config, _ = PretrainedConfig.get_config_dict(model_path)
    except (OSError, ValueError):
        config = {}
    return config.get("dtype") or config.get("torch_dtype")


def base_dtype(model_path: str, dtype: str) -> torch.dtype:
    """A model's dtype: ``dtype`` itself, or for ``auto`` the one the checkpoint's config names (its ``dtype``, or
    ``torch_dtype`` in older files) when it is one of ``BASE_DTYPES``, else float32. A reward model's ``auto``; the
    policy's is ``lit_grpo.run.dtype_choice.auto_dtype``, which also weighs the CPU and the memory."""
    if dtype != "auto":
        return getattr(torch, dtype)
    named = checkpoint_dtype(model_path)
    return getattr(torch, named) if named in BASE_DTYPES else torch.float32


REMOTE_CODE_FLAG = "model.trust_remote_code"


def remote_code_problem(model_path: str, trust_remote_code: bool) -> str | None:
    """Why a local model directory may not be loaded: its config (or tokenizer config) maps classes to code shipped
    with the model (``auto_map``), which transformers would execute, and the user did not allow it."""
    if trust_remote_code:
        return None
    for name in ("config.json", "tokenizer_config.json"):
        path = Path(model_path) / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # an unreadable config is reported by the loader itself
        if isinstance(config, dict) and config.get("auto_map"):
            return (
                f"{model_path!r} asks to run its own Python code ({name} has an auto_map); it is refused unless you "
                f"trust that code and set {REMOTE_CODE_FLAG}=true"
            )
    return None


def expected_adapter_shapes(model_path: str, config: LoraConfig,
                            trust_remote_code: bool = False) -> tuple[Shapes, Shapes] | None:
    """The LoRA tensors the model at ``model_path`` would carry with ``config``, with their shapes: by the names the
    live PEFT model gives them (``named_parameters``, as a checkpoint holds them under ``policy.``) and by the names
    PEFT saves them under (``adapter_model.safetensors``). Built from config.json on the meta device: no weights are
    read. Empty when none of ``config``'s target modules is in the model. None when it cannot be told (not a local
    directory, an architecture that does not build so): the load then names a misfit itself."""
    if not Path(model_path).is_dir():
        return None
    config = copy.copy(config)
    config.base_model_name_or_path, config.inference_mode = None, False  # trainable; no rename warning from PEFT
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a pre-check says nothing of its own
            base = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code),
                trust_remote_code=trust_remote_code)
            model = get_peft_model(base, config)
        live = {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}
        saved = {name: tuple(t.shape) for name, t in get_peft_model_state_dict(model).items()}
    except NoMatchingPeftModuleError:
        return {}, {}
    except Exception:  # noqa: BLE001 - only a pre-check: the load names what does not fit
        return None
    return live, saved


def misfit(found: Shapes, expected: Shapes, source: str) -> str | None:
    """How the tensors ``found`` in ``source`` (``the adapter``, ``the checkpoint``) fail to fit the names and shapes
    a model ``expected`` (the first one that differs, and how many), or None when they fit."""
    shape = [name for name in expected if name in found and tuple(found[name]) != tuple(expected[name])]
    if shape:
        name = shape[0]
        return (f"{name} is {list(found[name])} in {source}, {list(expected[name])} in this model ({len(shape)} of "
                f"{len(expected)} tensors differ)")
    extra = [name for name in found if name not in expected]
    if extra:
        return f"{source} holds {len(extra)} tensor(s) this model has no place for (e.g. {extra[0]})"
    missing = [name for name in expected if name not in found]
    if missing:
        return f"{source} lacks {len(missing)} of the {len(expected)} tensors this model needs (e.g. {missing[0]})"
    return None


Shapes = dict[str, tuple[int, ...]]

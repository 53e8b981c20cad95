"""Loading the base causal LM and wrapping it in a PEFT LoRA adapter."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from lit_grpo.input_check import InputError, lora_target_problem, remote_code_problem

PROJECT_ROOT = Path(__file__).resolve().parents[1]
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


def init_adapter_problems(policy: Any, lora_rank: int, targets: str | list[str], init_adapter: str) -> list[str]:
    """An ``init_adapter`` must fit the configured LoRA (rank, target modules; the config would otherwise say one
    adapter and train another) and hold finite weights."""
    problems = []
    rank = policy.peft_config[policy.active_adapter].r
    if rank != lora_rank:
        problems.append(f"init_adapter {init_adapter!r} has rank {rank}, model.lora_rank is {lora_rank}; set "
                        f"model.lora_rank {rank}")
    adapted = {name.rsplit(".", 1)[-1] for name, module in policy.named_modules() if hasattr(module, "lora_A")}
    if targets == "all-linear":  # PEFT's all-linear: every linear layer but the output head
        base = policy.get_base_model()
        head = base.get_output_embeddings()
        wanted = {name.removesuffix(".base_layer").rsplit(".", 1)[-1] for name, m in base.named_modules()
                  if isinstance(m, torch.nn.Linear) and ".lora_" not in name and m is not head}
    else:
        wanted = set(targets) if not isinstance(targets, str) else adapted  # a regex: not compared
    if adapted != wanted:
        problems.append(f"init_adapter {init_adapter!r} adapts {sorted(adapted)}, model.lora_target_modules asks "
                        f"for {sorted(wanted)}; set model.lora_target_modules to the adapter's")
    bad = [name for name, p in policy.named_parameters() if p.requires_grad and not torch.isfinite(p).all()]
    if bad:
        problems.append(f"init_adapter {init_adapter!r} holds non-finite weights ({len(bad)} tensors, e.g. {bad[0]})")
    return problems


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


def completion_stop_ids(tokenizer: Any, model: Any) -> tuple[int, ...]:
    """The ids that end a completion: the tokenizer's EOS and every EOS id of the model's generation_config
    (released chat models list several, e.g. ``<|im_end|>`` and ``<|endoftext|>``). The generation_config is read
    for its end-of-sequence ids only, never for sampling options."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    listed = [configured] if isinstance(configured, int) else list(configured or [])
    ids = sorted({int(i) for i in [tokenizer.eos_token_id, *listed] if i is not None})
    vocab = model.config.vocab_size
    outside = [i for i in ids if not 0 <= i < vocab]
    if outside:
        raise InputError(f"model_name_or_path: EOS ids {outside} (tokenizer or generation_config.json) are outside the "
                         f"model's vocabulary of {vocab}; fix eos_token_id there")
    if not ids:
        raise InputError("model_name_or_path: neither the tokenizer nor generation_config.json names an EOS token; "
                         "set eos_token in the tokenizer")
    return tuple(ids)


def refuse_remote_code(model_path: str, trust_remote_code: bool) -> None:
    """Raise ``InputError`` naming ``model.trust_remote_code`` when a local model ships code it was not allowed to run
    (for a hub id, transformers refuses by itself, since ``trust_remote_code=False`` is passed explicitly)."""
    problem = remote_code_problem(model_path, trust_remote_code) if Path(model_path).is_dir() else None
    if problem:
        raise InputError(problem)


BASE_DTYPES = ("float32", "bfloat16", "float16")


def base_dtype(model_path: str, dtype: str) -> torch.dtype:
    """The frozen base's dtype: ``dtype`` itself, or for ``auto`` the one the checkpoint's config names (its
    ``dtype``, or ``torch_dtype`` in older files) when it is one of ``BASE_DTYPES``, else float32."""
    if dtype != "auto":
        return getattr(torch, dtype)
    try:  # the config.json of a directory or of a cached hub id, read as data (no model code runs)
        config, _ = PretrainedConfig.get_config_dict(model_path)
    except (OSError, ValueError):
        config = {}  # a missing or unreadable config is reported by from_pretrained itself
    named = config.get("dtype") or config.get("torch_dtype")
    return getattr(torch, named) if named in BASE_DTYPES else torch.float32


def load_policy(
    model_path: str,
    lora_rank: int,
    lora_alpha: float,
    lora_dropout: float,
    lora_target_modules: str | list[str],
    init_adapter: str | None = None,
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    dtype: str = "auto",
    gradient_checkpointing: bool = False,
) -> PeftModel:
    """The base model in ``dtype`` (whatever the checkpoint's own) with a trainable LoRA adapter named ``default``
    in float32 (every base weight frozen), with non-reentrant gradient checkpointing if asked.
    An ``init_adapter`` is read from safetensors only (a pickled ``adapter_model.bin`` could run code)."""
    refuse_remote_code(model_path, trust_remote_code)
    if init_adapter is not None and not (Path(init_adapter).expanduser() / "adapter_model.safetensors").is_file():
        raise InputError(
            f"init_adapter: {init_adapter!r} has no adapter_model.safetensors; adapters are read from safetensors "
            "only (convert a pickled adapter_model.bin you trust with safetensors.torch.save_file)"
        )
    base = AutoModelForCausalLM.from_pretrained(
        model_path,
        dtype=base_dtype(model_path, dtype),
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
    if gradient_checkpointing:  # reentrant checkpointing with frozen embeddings leaves LoRA without gradients
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if init_adapter is not None:
        policy = PeftModel.from_pretrained(base, init_adapter, is_trainable=True, autocast_adapter_dtype=True)
        problems = init_adapter_problems(policy, lora_rank, lora_target_modules, init_adapter)
        if problems:
            raise InputError("; ".join(problems))
    else:
        problem = lora_target_problem(base, lora_target_modules)
        if problem:
            raise InputError(problem)
        config = LoraConfig(
            r=lora_rank,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=lora_target_modules,
            task_type="CAUSAL_LM",
        )
        policy = get_peft_model(base, config, autocast_adapter_dtype=True)
    return policy  # autocast_adapter_dtype: the adapter is float32 (and so its optimizer state) on any base

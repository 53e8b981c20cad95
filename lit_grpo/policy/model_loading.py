"""Loading the base causal LM and wrapping it in a PEFT LoRA adapter (``load_module_model``: what
``PolicyModule.configure_model`` loads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from peft import (
    LoraConfig,
    NoMatchingPeftModuleError,
    PeftModel,
    get_peft_model,
)
from transformers import AutoModelForCausalLM

from lit_grpo.errors import InputError
from lit_grpo.policy.knob_groups import group
from lit_grpo.policy.logprobs import head_problem
from lit_grpo.policy.input_check import lora_target_problem
from lit_grpo.run.dtype_choice import auto_dtype
from lit_grpo.run.model_files import (
    Shapes,
    expected_adapter_shapes,
    load_tokenizer,
    misfit,
    refuse_remote_code,
    resolve_model_path,
)


def init_adapter_problems(policy: Any, lora_rank: int, targets: str | list[str], init_adapter: str) -> list[str]:
    """An ``init_adapter`` must fit the configured LoRA (rank, target modules; the config would otherwise say one
    adapter and train another) and hold finite weights."""
    problems = []
    rank = policy.peft_config[policy.active_adapter].r
    if rank != lora_rank:
        problems.append(f"init_adapter {init_adapter!r} has rank {rank}, model.lora.rank is {lora_rank}; set "
                        f"model.lora.rank {rank}")
    adapted = {name.rsplit(".", 1)[-1] for name, module in policy.named_modules() if hasattr(module, "lora_A")}
    if targets == "all-linear":  # PEFT's all-linear: every linear layer but the output head
        base = policy.get_base_model()
        head = base.get_output_embeddings()
        wanted = {name.removesuffix(".base_layer").rsplit(".", 1)[-1] for name, m in base.named_modules()
                  if isinstance(m, torch.nn.Linear) and ".lora_" not in name and m is not head}
    else:
        wanted = set(targets) if not isinstance(targets, str) else adapted  # a regex: not compared
    if adapted != wanted:
        problems.append(f"init_adapter {init_adapter!r} adapts {sorted(adapted)}, model.lora.target_modules asks "
                        f"for {sorted(wanted)}; set model.lora.target_modules to the adapter's")
    bad = [name for name, p in policy.named_parameters() if p.requires_grad and not torch.isfinite(p).all()]
    if bad:
        problems.append(f"init_adapter {init_adapter!r} holds non-finite weights ({len(bad)} tensors, e.g. {bad[0]})")
    return problems


def adapter_shapes(adapter: str) -> Shapes:
    """The tensor shapes in an adapter's ``adapter_model.safetensors``, read from its header (no weights load)."""
    from safetensors import safe_open

    with safe_open(str(Path(adapter).expanduser() / "adapter_model.safetensors"), "pt") as handle:
        return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118


def adapter_base(adapter: str) -> str | None:
    """The base model an adapter names (its adapter_config.json's ``base_model_name_or_path``), if any."""
    import json

    try:
        base = json.loads((Path(adapter).expanduser() / "adapter_config.json").read_text(encoding="utf-8")).get(
            "base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return base if isinstance(base, str) else None


def adapter_misfit_message(adapter: str, model: str, detail: str) -> str:
    """``init_adapter`` from another base model: the adapter, the base it names, this run's model and what to do."""
    base = adapter_base(adapter)
    trained = f" was trained on {base!r} (its adapter_config.json's base_model_name_or_path) and" if base else ""
    return (f"init_adapter: {adapter!r}{trained} does not fit model.model_name_or_path {model!r}: {detail}; set "
            "model.model_name_or_path to the model the adapter was trained on, or give an adapter trained on "
            f"{model!r}")


def init_adapter_misfit(adapter: str, model_path: str, model: str, trust_remote_code: bool = False) -> str | None:
    """Before any weights load: whether the adapter's tensors (safetensors header) fit the LoRA shapes of ``model``
    (config.json, on the meta device); the message naming both, or None (fits, or cannot be told before loading)."""
    try:
        config = LoraConfig.from_pretrained(str(Path(adapter).expanduser()))
        found = adapter_shapes(adapter)
    except Exception:  # noqa: BLE001 - an unreadable adapter is named by the load
        return None
    expected = expected_adapter_shapes(model_path, config, trust_remote_code)
    detail = None if expected is None else misfit(found, expected[1], "the adapter")
    return None if detail is None else adapter_misfit_message(adapter, model, detail)


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


def run_base_dtype(model_path: str, dtype: str, trainer: Any, trust_remote_code: bool = False) -> torch.dtype:
    """``dtype`` as a torch dtype. For ``auto``: ``lit_grpo.run.dtype_choice.auto_dtype`` on the ``trainer``'s device
    (the CPU without one), the memory shared by the processes of this node, said in one line by rank 0; rank 0's
    choice is every rank's (ranks that read the memory a moment apart must not train different weights)."""
    if dtype != "auto":
        return getattr(torch, dtype)
    if trainer is None:
        choice = auto_dtype(model_path, "cpu", 1, trust_remote_code)
    else:
        device = trainer.strategy.root_device.type
        processes = trainer.num_devices if device == "cpu" else 1  # CPU processes on this node share its memory
        choice = trainer.strategy.broadcast(auto_dtype(model_path, device, processes, trust_remote_code))
    rank_zero_info(choice.line)
    return choice.dtype


def load_policy(
    model_path: str,
    lora_rank: int,
    lora_alpha: float,
    lora_dropout: float,
    lora_target_modules: str | list[str],
    init_adapter: str | None = None,
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    dtype: str | torch.dtype = "auto",
    gradient_checkpointing: bool = False,
) -> PeftModel:
    """The base model in ``dtype`` (whatever the checkpoint's own; ``auto`` as ``run_base_dtype`` picks it for a run
    on the CPU, with its one line) with a trainable LoRA adapter named ``default`` in float32 (every base weight
    frozen), with non-reentrant gradient checkpointing if asked.
    An ``init_adapter`` is read from safetensors only (a pickled ``adapter_model.bin`` could run code)."""
    refuse_remote_code(model_path, trust_remote_code)
    if init_adapter is not None and not (Path(init_adapter).expanduser() / "adapter_model.safetensors").is_file():
        raise InputError(
            f"init_adapter: {init_adapter!r} has no adapter_model.safetensors; adapters are read from safetensors "
            "only (convert a pickled adapter_model.bin you trust with safetensors.torch.save_file)"
        )
    chosen = dtype if isinstance(dtype, torch.dtype) else run_base_dtype(model_path, dtype, None, trust_remote_code)
    base = AutoModelForCausalLM.from_pretrained(
        model_path,
        dtype=chosen,
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
    if gradient_checkpointing:  # reentrant checkpointing with frozen embeddings leaves LoRA without gradients
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if init_adapter is not None:
        try:
            policy = PeftModel.from_pretrained(base, init_adapter, is_trainable=True, autocast_adapter_dtype=True)
        except NoMatchingPeftModuleError:  # the pre-check could not tell (objective.adapter_config_problems)
            raise InputError(adapter_misfit_message(init_adapter, model_path, "none of the modules it adapts is in "
                                                    "this model")) from None
        except RuntimeError as error:
            lines = [line.strip() for line in str(error).splitlines() if "size mismatch" in line]
            if not lines:
                raise
            raise InputError(adapter_misfit_message(init_adapter, model_path, lines[0])) from None
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


def load_module_model(hparams: Any, trainer: Any) -> tuple[Any, PeftModel, tuple[int, ...]]:
    """``(tokenizer, policy, the ids that end a completion)`` of ``PolicyModule``'s arguments (its ``hparams``): the
    model resolved as the user named it, the base in the run's dtype on ``trainer``'s device (None: outside a
    trainer), a trainable LoRA adapter; refuses a model whose output head the log-prob passes cannot read."""
    path = resolve_model_path(hparams.model_name_or_path)
    tokenizer = load_tokenizer(path, hparams.trust_remote_code)
    lora = group(hparams, "lora")
    policy = load_policy(
        path, lora.rank, lora.alpha, lora.dropout, lora.target_modules, hparams.init_adapter,
        hparams.attn_implementation, hparams.trust_remote_code,
        run_base_dtype(path, hparams.dtype, trainer, hparams.trust_remote_code),
        group(hparams, "memory").gradient_checkpointing)
    problem = head_problem(policy)
    if problem:
        raise InputError(f"model_name_or_path: {problem}")
    return tokenizer, policy, completion_stop_ids(tokenizer, policy)

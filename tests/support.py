"""Test helpers: tiny random models saved offline, and a dense reward so random policies get a signal."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from transformers import GPT2LMHeadModel, LlamaForCausalLM

from lit_grpo.buffers.positions import FirstTokenConstraint
from lit_grpo.policy.logprobs import chunked_eval, sequence_logprobs
from lit_grpo.tasks import ArithmeticTask, PromptRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # the tiny models are not in the package
from tiny_models import (  # noqa: E402  (scripts/tiny_models.py, which scripts/build_tiny_model.py builds from)
    build_char_tokenizer,
    tiny_gpt2_config,
    tiny_llama_config,
)


def save_tiny_model(target: Path, arch: str, seed: int = 0) -> Path:
    """A randomly initialised tiny ``llama`` or ``gpt2`` with the project's character tokenizer."""
    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(tiny_llama_config(len(tokenizer), hidden_size=64, num_layers=2))
    else:
        model = GPT2LMHeadModel(tiny_gpt2_config(len(tokenizer)))
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


class DigitShareTask(ArithmeticTask):
    """Arithmetic prompts rewarded by the share of digits in the completion: dense, so a random model's
    completions differ in reward within a group and every update has a signal."""

    def reward(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        return sum(ch.isdigit() for ch in completion_text) / max(len(completion_text), 1)


class FaultyDigitTask(DigitShareTask):
    """``DigitShareTask`` whose reward raises on call number ``raise_on_call`` and hangs on ``hang_on_call``
    (counting from 1 over the run). Calls are counted in ``calls_file``, so the count survives the reward worker's
    restarts (each child is forked from the parent, which never scores itself when a timeout is set)."""

    def __init__(self, calls_file: str, raise_on_call: int = 0, hang_on_call: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls_file, self.raise_on_call, self.hang_on_call = calls_file, raise_on_call, hang_on_call

    def reward(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        with open(self.calls_file, "a+") as calls:
            calls.seek(0)
            number = len(calls.read().splitlines()) + 1
            calls.write(f"{number}\n")
        if number == self.raise_on_call:
            raise RuntimeError("injected reward failure")
        if number == self.hang_on_call:
            time.sleep(3600)
        return super().reward(prompt_record, completion_text, completion_ids)


class PoisonAdvantages(pl.Callback):
    """Test-only fault: writes NaN into one advantage of the batches of the given optimizer steps, so the loss of
    those steps is NaN through the real code path."""

    def __init__(self, steps: Sequence[int]) -> None:
        self.steps = set(steps)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step in self.steps:
            batch["advantages"] = batch["advantages"].clone()
            batch["advantages"].view(-1)[0] = float("nan")


class PromptLog(pl.Callback):
    """Test-only: appends each finished epoch's prompts (one per group, in order) to ``path`` as a JSON line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        buffer = trainer.datamodule.epoch_report.buffer
        prompts = buffer.prompt_texts[:: buffer.group_size]
        with open(self.path, "a") as log:
            log.write(json.dumps({"epoch": trainer.current_epoch, "prompts": prompts}) + "\n")


class PauseAt(pl.Callback):
    """Test-only: at batch ``batch_idx`` of epoch ``epoch`` writes ``marker`` and sleeps, for a test to kill the run
    mid-epoch (after the epoch's first optimizer step, so the live weights differ from the last checkpoint). Once the
    marker exists it no longer pauses, so the resumed run can use the same config."""

    def __init__(self, marker: str, epoch: int, batch_idx: int) -> None:
        self.marker, self.epoch, self.batch_idx = marker, epoch, batch_idx

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch_idx) and not Path(self.marker).exists():
            Path(self.marker).write_text(f"{trainer.global_step}\n")
            time.sleep(600)


def listening_addresses(port: int) -> list[str]:
    """Local IPv4 addresses with a socket in LISTEN state on ``port``, read from /proc/net/tcp."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            found.append(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))  # little-endian
    return found


# Every sampling option a released checkpoint's generation_config.json can carry that transformers or vLLM would
# apply by default: each one alone moves the sampler away from softmax(logits / T) (or stops it early).
PENALISING_GENERATION = {
    "do_sample": True, "temperature": 0.3, "top_k": 5, "top_p": 0.8, "min_p": 0.05, "typical_p": 0.5,
    "epsilon_cutoff": 0.01, "eta_cutoff": 0.01, "repetition_penalty": 1.3, "presence_penalty": 1.5,
    "frequency_penalty": 1.0, "no_repeat_ngram_size": 2, "min_new_tokens": 3, "max_new_tokens": 2,
    "suppress_tokens": [5, 6], "begin_suppress_tokens": [7], "bad_words_ids": [[8], [9]],
    "forced_bos_token_id": 10, "forced_eos_token_id": 11, "renormalize_logits": True,
    "exponential_decay_length_penalty": [1, 1.5], "sequence_bias": [[[12], 5.0]],
}


def penalised_copy(source: Path, target: Path, extra_eos: int | None = None) -> Path:
    """A copy of the model folder ``source`` whose generation_config.json sets ``PENALISING_GENERATION`` (the model's
    own EOS id kept, plus ``extra_eos`` as a second one)."""
    import shutil

    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    own = json.loads((source / "generation_config.json").read_text()) if (source / "generation_config.json").is_file() else {}
    eos = own.get("eos_token_id", config.get("eos_token_id"))
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    generation = {**own, **PENALISING_GENERATION, "eos_token_id": eos + ([extra_eos] if extra_eos is not None else [])}
    (target / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return target


def remote_code_copy(source: Path, model: Path, marker: Path) -> Path:
    """A copy of the model at ``source`` whose config maps AutoModelForCausalLM to a module shipped beside it,
    which creates ``marker`` when imported: the file exists only if the model's own code ran."""
    shutil.copytree(source, model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w')\n")
    return model


def eval_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
                  constraint: FirstTokenConstraint | None = None,
                  token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The trainer's padded log-probs ``[N, L]`` as the no-grad passes take them: eval mode, no gradients."""
    rows = input_ids.shape[0]
    return chunked_eval(model, rows, rows, lambda _: sequence_logprobs(model, input_ids, attention_mask, temperature,
                                                                       constraint, token_mask))


def weight_reads(monkeypatch: Any) -> list[str]:
    """The models whose weights are read from now on (``load_policy``'s ``from_pretrained``), filled as it happens:
    the evidence that a run was refused before any weights loaded."""
    from lit_grpo.policy import model_loading

    reads: list[str] = []
    read = model_loading.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(model_loading.AutoModelForCausalLM, "from_pretrained",
                        staticmethod(lambda *a, **k: (reads.append(str(a[0])), read(*a, **k))[1]))
    return reads


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """A checkpoint the command wrote, as any Lightning user reads it: ``torch.load``, weights only."""
    return torch.load(path, map_location="cpu", weights_only=True)


def save_lora_adapter(model_dir: Path | str, target: Path, set_b: Callable[[torch.Tensor], Any], rank: int = 4) -> Path:
    """A PEFT LoRA adapter of ``model_dir`` (rank ``rank``, alpha twice it, every linear layer) saved at ``target``,
    each B matrix set in place by ``set_b`` (a fresh adapter's B is zero: it changes nothing) after
    ``torch.manual_seed(1)``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    adapter = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                                              task_type="CAUSAL_LM"))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in adapter.named_parameters():
            if "lora_B" in name:
                set_b(param)
    adapter.save_pretrained(target)
    return target


def fit_one_small_epoch(tmp_path: Path, callbacks: list[dict[str, Any]], **data: Any) -> None:
    """One epoch of the quickstart through the command's ``main`` in this process: 2 prompts x 2 completions of at
    most 3 tokens, no logger, checkpoint or validation, ``callbacks`` as ``trainer.callbacks`` (class paths with
    ``init_args``) and ``data`` over the data section (an ``engine``, say)."""
    from lit_grpo.cli import main

    root = Path(__file__).resolve().parents[1]
    config = tmp_path / "small_epoch.yaml"  # JSON is YAML
    config.write_text(json.dumps({
        "trainer": {"max_epochs": 1, "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                    "num_sanity_val_steps": 0, "limit_val_batches": 0, "callbacks": callbacks},
        "data": {"group_size": 2, "prompts_per_epoch": 2, "minibatch_size": 4, "max_new_tokens": 3, **data},
        "model": {"model_name_or_path": str(root / "data" / "tiny-llama")},
        "metrics": {"table_every_n_epochs": 0}}))
    try:
        main(["fit", "--config", str(root / "configs" / "quickstart.yaml"), "--config", str(config),
              "--trainer.default_root_dir", str(tmp_path)])
    except SystemExit as stop:
        assert not stop.code

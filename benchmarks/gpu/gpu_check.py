"""The CUDA path through the ``lit-grpo`` command, on a machine with one NVIDIA GPU: the quickstart in fp32 and in
bf16 (with a callback added the LightningCLI way, issue 47), ``lit-grpo test`` on its checkpoint, and one epoch at
Qwen2.5-0.5B width (a random 24-layer model, 8 prompts x 8 completions of up to 256 tokens, bf16 base) with the
hf engine; each a fresh process, its wall time, the accuracies its log prints and the GPU's peak allocated memory.

    python benchmarks/gpu/gpu_check.py [--out DIR] [--skip-width]

Prints one JSON line per run and writes them to ``DIR/gpu_check.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.timed_child import run_child, with_checkout_on_path  # noqa: E402


class PeakGPUMemory(pl.Callback):
    """Prints the GPU's peak allocated memory when fit ends (named on the command line by class path)."""

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        import torch

        if torch.cuda.is_available():
            print(f"gpu-peak-gib {torch.cuda.max_memory_allocated() / 2**30:.3f}", file=sys.stderr, flush=True)


def run(name: str, args: list[str], out: Path) -> dict[str, Any]:
    """One ``lit-grpo`` command in a fresh process; what its log says."""
    command = [sys.executable, "-m", "lit_grpo.cli", *args]
    result = run_child(command, cwd=ROOT, env=with_checkout_on_path(), timeout=900)  # the callback, by class path
    seconds = result.seconds
    (out / f"{name}.log").write_text(result.stdout[-20000:] + "\n--- stderr ---\n" + result.stderr[-40000:])
    text = result.stdout + result.stderr
    row = {"run": name, "returncode": result.returncode, "wall_s": round(seconds, 1),
           "val_accuracy": re.findall(r"val/accuracy[^0-9]*([0-9.]+)", text)[-3:],
           "test_accuracy": re.findall(r"test/accuracy[^0-9]*([0-9.]+)", text)[-1:],
           "epoch_lines": [line for line in result.stderr.splitlines() if line.startswith("epoch ")][-2:],
           "gpu_peak_gib": (re.findall(r"gpu-peak-gib ([0-9.]+)", text) or [None])[-1],
           "last_error": None if result.returncode == 0 else result.stderr.strip().splitlines()[-1:]}
    print(json.dumps(row), flush=True)
    return row


def build_width_model(path: Path) -> None:
    from benchmarks.memory import memory  # the random Qwen2.5-0.5B-width model of the memory benchmark

    if not (path / "model.safetensors").is_file():
        memory.build_model(24, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    parser.add_argument("--skip-width", action="store_true")
    parser.add_argument("--accelerator", default="gpu", help="cpu: a dry run of the script itself")
    options = parser.parse_args()
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    peak = ["--trainer.callbacks+=benchmarks.gpu.gpu_check.PeakGPUMemory"]
    gpu = ["--trainer.accelerator", options.accelerator, "--trainer.devices", "1", "--trainer.enable_progress_bar", "false"]
    quick = ["--config", "configs/quickstart.yaml", *gpu, "--trainer.logger.init_args.save_dir", str(out / "runs")]
    rows = [
        run("quickstart-fp32", ["fit", *quick, *peak, "--trainer.callbacks+=EarlyStopping",
                                "--trainer.callbacks.monitor", "val/accuracy", "--trainer.callbacks.mode", "max"], out),
        run("quickstart-fp32-test", ["test", *quick, "--ckpt_path", "last"], out),
        run("quickstart-bf16", ["fit", *quick, *peak, "--model.dtype", "bfloat16", "--trainer.precision", "bf16-mixed"],
            out),
    ]
    if not options.skip_width:
        width = out / "qwen-width-L24"
        build_width_model(width)
        rows.append(run("width-24-layers-bf16", [
            "fit", *gpu, *peak, "--model.model_name_or_path", str(width), "--model.dtype", "bfloat16",
            "--data.group_size", "8", "--data.prompts_per_epoch", "8", "--data.minibatch_size", "16",
            "--data.max_new_tokens", "256", "--trainer.max_epochs", "2", "--trainer.limit_val_batches", "0",
            "--trainer.logger", "false", "--trainer.default_root_dir", str(out / "width-run")], out))
    (out / "gpu_check.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()

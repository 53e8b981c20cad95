"""Issue 42 §2: what ``model.dtype: auto`` costs against the alternatives, one GRPO step at Qwen2.5-0.5B width.

One epoch of the ``lit-grpo`` command = one GRPO step: 1 prompt x 4 completions x 512 new tokens (hf engine), the
no-grad passes, the loss, backward and one AdamW step, on ``benchmarks/memory/memory.py``'s random Qwen2 of Qwen2.5-0.5B
width (hidden 896, vocabulary 151,936, 2 layers; saved in bf16) and on the same weights saved in fp32. Arms, each a
fresh process so its peak RSS is its own:

- ``auto``: the bf16 checkpoint with ``model.dtype: auto`` (the default);
- ``fp32``: the fp32 checkpoint (auto loads it in float32);
- ``bf16``: the bf16 checkpoint with ``model.dtype: bfloat16`` forced (the path auto avoids on a CPU without bf16
  arithmetic), for reference.

Each arm prints the CPU features it saw, what auto chose (its one line), the step's seconds (from the fit's start to
its end, the model load excluded), the generation seconds of the epoch line and the process's peak RSS. Issue 42's
goal, on a CPU without AVX-512: ``auto`` peaks under 2.2 GB and takes at most 1.2x the ``fp32`` step.

``--force-no-bf16`` sets ``LIT_GRPO_CPU_NO_BF16_PACKING=1`` in every arm: the process reads the CPU as one without
AVX-512 (no bf16 arithmetic, no bf16 packing), so ``auto`` decides as there; the kernels stay this CPU's, so the
``bf16`` arm is faster than on such a CPU. ``--avx2-kernels`` also holds oneDNN and ATen to AVX2
(``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``), nearer such a CPU's speed. An arm slower than ``--timeout`` is
stopped and reported as such.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/speed/dtype_auto.py [--force-no-bf16 [--avx2-kernels]]
        [--arms auto fp32 bf16] [--timeout 1800]

Run it alone on a quiet machine: times compete for the same cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for benchmarks.*
from benchmarks.memory import memory  # noqa: E402  (the width model and where it is kept)
from benchmarks.timed_child import run_child, with_checkout_on_path  # noqa: E402

ARMS = {"auto": ("bf16", []), "fp32": ("fp32", []), "bf16": ("bf16", ["--model.dtype", "bfloat16"])}
CPU_FLAGS = ("avx2", "avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_bf16", "amx_bf16", "avx_ne_convert")
NO_BF16 = "LIT_GRPO_CPU_NO_BF16_PACKING"
GB = 1e9
GOAL_PEAK_GB, GOAL_RATIO = 2.2, 1.2


def fp32_model(model_dir: Path) -> Path:
    """``memory.py``'s 2-layer bf16 model, the same values saved in fp32 (built once, in a child process)."""
    path = model_dir / "qwen-width-L2-fp32"
    if not (path / "model.safetensors").is_file():
        subprocess.run([sys.executable, __file__, "--build-fp32", "--model-dir", str(model_dir)], check=True)
    return path


def build_fp32(model_dir: Path) -> None:
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    source = memory.model_path(model_dir, 2)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).to(torch.float32)
    model.config.dtype = "float32"
    model.save_pretrained(model_dir / "qwen-width-L2-fp32")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, model_dir / "qwen-width-L2-fp32" / name)


def arm_command(path: Path, extra: list[str], run_dir: str, new_tokens: int) -> list[str]:
    """The command of one arm, its step timed by ``benchmarks.speed.clocks.StepClock`` (named by class path)."""
    clock = json.dumps({"class_path": "benchmarks.speed.clocks.StepClock", "init_args": {"cpu_flags": list(CPU_FLAGS)}})
    return [sys.executable, "-m", "lit_grpo.cli", "fit", "--model.model_name_or_path", str(path),
            "--data.group_size", "4", "--data.prompts_per_epoch", "1", "--data.minibatch_size", "4",
            "--data.max_new_tokens", str(new_tokens), "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "0",
            "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--trainer.default_root_dir",
            run_dir, "--trainer.enable_progress_bar", "false", f"--trainer.callbacks+={clock}", *extra]


def run_arm(arm: str, model_dir: Path, env: dict[str, str], timeout: float, new_tokens: int) -> dict[str, Any]:
    checkpoint, extra = ARMS[arm]
    path = memory.model_path(model_dir, 2) if checkpoint == "bf16" else fp32_model(model_dir)
    with tempfile.TemporaryDirectory(prefix="lit-grpo-dtype-auto-") as run_dir:
        done = run_child(arm_command(path, extra, run_dir, new_tokens), cwd=run_dir, env=with_checkout_on_path(env),
                         timeout=timeout)
    if done.timed_out:
        return {"arm": arm, "checkpoint": checkpoint, "error": f"did not finish in {timeout:.0f} s"}
    result: dict[str, Any] = {"arm": arm, "checkpoint": checkpoint, **(done.result() or {}),
                              "peak_gb": done.peak_rss_bytes / GB}
    chose = [line for line in done.output.splitlines() if "model.dtype auto:" in line]
    generate = re.search(r"generate ([0-9.]+)s", done.output)
    result.update(auto_line=chose[0][chose[0].index("model.dtype auto:"):] if chose else None,
                  generate_s=float(generate.group(1)) if generate else None)
    if done.returncode != 0 or result.get("step_s") is None:
        result["error"] = f"exit {done.returncode}: {done.last_line()}"
    return result


def table(rows: list[dict[str, Any]]) -> str:
    fp32 = next((r.get("step_s") for r in rows if r["arm"] == "fp32"), None)
    lines = ["| arm | checkpoint | base loaded in | step s | generate s | peak RSS GB | / fp32 step |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['arm']} | {r['checkpoint']} | | {r['error']} | | | |")
            continue
        ratio = f"{r['step_s'] / fp32:.2f}" if fp32 else "—"
        generate = f"{r['generate_s']:.1f}" if r.get("generate_s") is not None else "—"
        lines.append(f"| {r['arm']} | {r['checkpoint']} | {', '.join(r['loaded'] or [])} | {r['step_s']:.1f} | "
                     f"{generate} | {r['peak_gb']:.2f} | {ratio} |")
    return "\n".join(lines)


def goal(rows: list[dict[str, Any]]) -> str | None:
    """Issue 42's done-when on this run: auto's peak under 2.2 GB and its step within 1.2x the fp32 one."""
    by_arm = {r["arm"]: r for r in rows if not r.get("error")}
    if "auto" not in by_arm or "fp32" not in by_arm:
        return None
    auto, fp32 = by_arm["auto"], by_arm["fp32"]
    ratio = auto["step_s"] / fp32["step_s"]
    under = "under" if auto["peak_gb"] < GOAL_PEAK_GB else "NOT under"
    within = "within" if ratio <= GOAL_RATIO else "NOT within"
    return (f"auto: peak {auto['peak_gb']:.2f} GB ({under} {GOAL_PEAK_GB} GB), step {ratio:.2f}x the fp32 "
            f"checkpoint's ({within} {GOAL_RATIO}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--force-no-bf16", action="store_true", help=f"set {NO_BF16}=1 in every arm")
    parser.add_argument("--avx2-kernels", action="store_true", help="also hold oneDNN and ATen to AVX2 kernels")
    parser.add_argument("--tokens", type=int, default=512, help="new tokens per completion")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before an arm is stopped")
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "lit-grpo-memory-models")
    parser.add_argument("--build-fp32", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_fp32:
        build_fp32(args.model_dir)
        return
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if args.force_no_bf16 or args.avx2_kernels:
        env[NO_BF16] = "1"
    if args.avx2_kernels:
        env.update(ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    forced = [f"{key}={env[key]}" for key in (NO_BF16, "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if key in env]
    print(f"forced: {', '.join(forced) or 'nothing'}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} "
          f"cores", flush=True)
    rows = []
    for arm in args.arms:
        start = time.perf_counter()
        row = run_arm(arm, args.model_dir, env, args.timeout, args.tokens)
        row["wall_s"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(table(rows))
    verdict = goal(rows)
    if verdict:
        print(verdict)


if __name__ == "__main__":
    main()

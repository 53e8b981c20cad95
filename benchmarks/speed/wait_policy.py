"""What torch's OpenMP wait policy does to a run's speed on this machine (lit_grpo/cli/idle_threads.py): the
command sets ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep); "spinning" is libgomp's default (idle threads spin for
a while after each parallel region), what the command ran with before; "brief" spins 10,000 pause loops
(``GOMP_SPINCOUNT``) instead of libgomp's 300,000. Each measurement is its own process, the two
policies alternate round by round, and the script prints each round and the medians. Rows:

- ``quickstart``: ``lit-grpo fit`` on configs/quickstart.yaml, ``--epochs`` epochs, validation and checkpoints off
  (the transformers engine; a Python-bound tiny model), wall seconds of the whole process;
- ``vllm``: the same on configs/quickstart_vllm.yaml (vLLM in process);
- ``step``: one GRPO step at Qwen2.5-0.5B width (``benchmarks/memory/memory.py``'s configuration d: 2 layers, hidden
  896, vocabulary 151,936, bf16 base, LoRA r 16 on every linear layer, ``--tokens`` x 8 rows), the median of
  ``--steps`` steps after a first one.

The spinning arm loads torch before ``lit_grpo.cli`` with the variable unset, so that the command's setting comes too
late. Run alone, one benchmark at a time:

    flock /tmp/heavy.lock .venv/bin/python benchmarks/speed/wait_policy.py [--rounds 3] [--rows quickstart vllm step]
        [--policies passive spinning brief]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.timed_child import run_child  # noqa: E402

SPIN_FIRST = "import os\nos.environ.pop('OMP_WAIT_POLICY', None)\n{spin}import torch\n"
POLICIES = {"passive": "", "spinning": SPIN_FIRST.format(spin=""),
            # a short spin (libgomp counts pause loops; 300,000 by default): back-to-back regions stay hot
            "brief": SPIN_FIRST.format(spin="os.environ['GOMP_SPINCOUNT'] = '10000'\n")}
STEP = """
import json, statistics, sys, time
sys.path.insert(0, {root!r})
from benchmarks.memory import memory
from lit_grpo.run.host_memory import return_freed_memory
return_freed_memory()
step, _ = memory.lit_step("d", memory.model_path(memory.Path({model_dir!r}), 2), {tokens})
step()
seconds = []
for _ in range({steps}):
    started = time.perf_counter()
    step()
    seconds.append(time.perf_counter() - started)
print(json.dumps(statistics.median(seconds)))
"""


def command_seconds(config: str, epochs: int, policy: str) -> float:
    """Wall seconds of a whole ``lit-grpo fit`` process on ``config``, in a fresh directory."""
    program = POLICIES[policy] + "import lit_grpo.cli\nlit_grpo.cli.main()\n"
    with tempfile.TemporaryDirectory(prefix="wait-policy-") as run_dir:
        done = run_child([sys.executable, "-c", program, "fit", "--config", str(ROOT / "configs" / config),
                          "--trainer.max_epochs", str(epochs), "--trainer.limit_val_batches", "0",
                          "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false"],
                         cwd=run_dir, merge_stderr=True)
    if done.returncode != 0:
        sys.exit(f"lit-grpo fit failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return done.seconds


def step_seconds(policy: str, tokens: int, steps: int, model_dir: Path) -> float:
    program = POLICIES[policy] + STEP.format(root=str(ROOT), model_dir=str(model_dir),
                                             tokens=tokens, steps=steps)
    done = run_child([sys.executable, "-c", program], cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"the step failed:\n{done.stderr[-3000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", nargs="+", default=["quickstart", "vllm", "step"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--policies", nargs="+", default=["passive", "spinning"], choices=list(POLICIES))
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "lit-grpo-memory-models")
    args = parser.parse_args()
    measure = {"quickstart": lambda p: command_seconds("quickstart.yaml", args.epochs, p),
               "vllm": lambda p: command_seconds("quickstart_vllm.yaml", args.epochs, p),
               "step": lambda p: step_seconds(p, args.tokens, args.steps, args.model_dir)}
    print(f"load average (1 min) {os.getloadavg()[0]:.2f}; rows {args.rows}; {args.rounds} rounds, order alternated",
          flush=True)
    for row in args.rows:
        seconds: dict[str, list[float]] = {policy: [] for policy in args.policies}
        for round_ in range(args.rounds):
            order = args.policies if round_ % 2 == 0 else args.policies[::-1]
            for policy in order:
                seconds[policy].append(measure[row](policy))
            print(f"{row} round {round_ + 1}: " + ", ".join(f"{p} {seconds[p][-1]:.2f} s" for p in args.policies)
                  + f" (load {os.getloadavg()[0]:.2f})", flush=True)
        medians = {p: statistics.median(seconds[p]) for p in args.policies}
        first = args.policies[0]
        print(f"{row} (medians): " + ", ".join(f"{p} {m:.2f} s" for p, m in medians.items()) + "; "
              + ", ".join(f"{first} / {p} {medians[first] / m:.3f}" for p, m in medians.items() if p != first),
              flush=True)


if __name__ == "__main__":
    main()

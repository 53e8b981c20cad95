"""lit-grpo's conventions against verl's and TRL's, measured by calling their code on the same numbers
(docs/conventions.md records the output).

verl's formulas are its ``verl.trainer.ppo.core_algos`` functions; TRL's GRPO advantage is an inline expression of
``GRPOTrainer`` around its ``trl.trainer.utils.nanstd``, which is called here with TRL's constant (1e-4). verl is not
a dependency of this project; install it beside the venv without its dependencies (it imports ray only for types):

    .venv/bin/pip install --no-deps --target /tmp/verl verl && \\
    .venv/bin/pip install --no-deps --target /tmp/verl tensordict codetiming hydra-core omegaconf orjson pyvers
    .venv/bin/python benchmarks/equivalence/conventions.py --verl /tmp/verl

Without ``--verl`` only TRL's side is measured.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

from lit_grpo.losses import gae, group_advantages, masked_aggregate
from lit_grpo.policy.value_head import value_loss

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.9, 0.5, 0.2, 0.1]])  # G = 4; one flat group


def import_verl(path: str) -> types.ModuleType:
    """verl's core_algos from ``path``, with a stand-in for ray (verl imports it for type hints and decorators)."""
    sys.path.insert(0, path)
    try:
        import ray  # noqa: F401
    except ImportError:
        stub = Path(tempfile.mkdtemp()) / "ray"
        stub.mkdir()
        (stub / "__init__.py").write_text("class ObjectRef: pass\ndef remote(*a, **k):\n    return a[0] if a and "
                                          "callable(a[0]) else (lambda f: f)\n")
        sys.path.insert(0, str(stub.parent))
    import verl.trainer.ppo.core_algos as core_algos

    return core_algos


def verl_outcome(core_algos: types.ModuleType, name: str, rewards: torch.Tensor) -> torch.Tensor:
    """verl's outcome advantage ``[B, G]`` of grouped rewards (each row's reward on its only token)."""
    flat = rewards.flatten()[:, None]  # [B * G, 1]: the reward on the last (only) token
    index = np.repeat(np.arange(rewards.shape[0]), rewards.shape[1])
    advantages, _ = getattr(core_algos, name)(flat, torch.ones_like(flat), index)
    return advantages[:, 0].view(rewards.shape)


def trl_grpo(rewards: torch.Tensor) -> torch.Tensor:
    """TRL 1.16 ``GRPOTrainer`` with ``scale_rewards="group"``: (r - group mean) / (nanstd(group) + 1e-4)."""
    from trl.trainer.utils import nanstd

    return (rewards - rewards.mean(1, keepdim=True)) / (nanstd(rewards, dim=1)[:, None] + 1e-4)


def show(name: str, value: torch.Tensor) -> None:
    print(f"  {name:<34} {[round(v, 6) for v in value.flatten().tolist()]}")


def advantages(core_algos: types.ModuleType | None) -> None:
    print("GRPO advantages, groups [1, 0, 0, 1], [1, 1, 1, 1] (flat), [0.9, 0.5, 0.2, 0.1]:")
    ours = group_advantages(REWARDS, "grpo")
    show("lit-grpo grpo (population std)", ours)
    show("TRL scale_rewards=group", trl_grpo(REWARDS))
    if core_algos is not None:
        theirs = verl_outcome(core_algos, "compute_grpo_outcome_advantage", REWARDS)
        show("verl compute_grpo_outcome_advantage", theirs)
        show("ratio verl / lit-grpo (non-flat)", theirs[[0, 2]] / ours[[0, 2]])
        print(f"  sqrt((G - 1) / G) = {((4 - 1) / 4) ** 0.5:.6f}")
        show("lit-grpo rloo", group_advantages(REWARDS, "rloo"))
        show("verl compute_rloo_outcome_advantage", verl_outcome(core_algos, "compute_rloo_outcome_advantage",
                                                                   REWARDS))
    single = torch.tensor([[0.7]])
    print("A group of one (G = 1), reward 0.7:")
    show("lit-grpo grpo", group_advantages(single, "grpo"))
    if core_algos is not None:
        show("verl grpo", verl_outcome(core_algos, "compute_grpo_outcome_advantage", single))


def aggregation(core_algos: types.ModuleType | None) -> None:
    # rows with 2, 1 and 0 counted tokens: the empty row is where the conventions differ
    values = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    print("Aggregation of per-token values [[1, 3, -], [2, -, -], [-, -, -]] (the third row counts nothing):")
    for ours, theirs in (("seq-mean", "seq-mean-token-mean"), ("token-mean", "token-mean"),
                         ("constant", "seq-mean-token-sum-norm")):
        line = f"  lit-grpo {ours}: {masked_aggregate(values, mask, ours, max_new_tokens=3).item():.6f}"
        if core_algos is not None:
            verl_value = core_algos.agg_loss(values, mask.float(), theirs, global_batch_size=3,
                                             batch_num_tokens=int(mask.sum()), loss_scale_factor=3)
            line += f"; verl {theirs}: {float(verl_value):.6f}"
        print(line)


def ppo(core_algos: types.ModuleType | None) -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]])  # per token, the last counted token's reward
    values = torch.tensor([[0.2, 0.4, 0.3], [0.1, 0.2, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    counted = advantages[mask]
    whitened = (counted - counted.mean()) / (counted.std(correction=0) + 1e-6)
    print("GAE (gamma 1, lambda 0.95) on two rows, then whitening over the counted tokens:")
    show("lit-grpo returns", returns[mask])
    show("lit-grpo whitened (population std)", whitened)
    if core_algos is not None:
        verl_adv, verl_ret = core_algos.compute_gae_advantage_return(rewards, values, mask.float(), 1.0, 0.95)
        show("verl returns", verl_ret[mask])
        show("verl whitened advantages", verl_adv[mask])
    new_values = values + 0.3
    ours = value_loss(new_values, values, returns, mask)[0]
    line = f"Value loss of V + 0.3 (no clipping): lit-grpo {ours.item():.6f} (mean of (V - G)^2)"
    if core_algos is not None:
        theirs = core_algos.compute_value_loss(new_values, returns, values, mask.float(), cliprange_value=1e9,
                                               global_batch_size=2, batch_num_tokens=int(mask.sum()),
                                               loss_scale_factor=None)[0]
        line += f"; verl {float(theirs):.6f}"
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl", help="a directory holding verl (see the module docstring)")
    args = parser.parse_args()
    core_algos = import_verl(args.verl) if args.verl else None
    advantages(core_algos)
    aggregation(core_algos)
    ppo(core_algos)


if __name__ == "__main__":
    main()

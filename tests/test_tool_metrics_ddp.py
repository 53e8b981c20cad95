"""The tool figures on two DDP ranks (gloo, CPU) whose episodes call different tools, and a made-up one: both ranks
finish, both log ``tools/calls/<name>`` and ``tools/failures/<name>`` for every declared tool plus the one unknown
key, every epoch, and the values equal a one-process run's on the same episodes. Each rank's trees go through the
product's logging (``RolloutMetrics.log_rollouts`` over a ``RolloutReport`` of ``tree_buffer``); only the model
and the rollouts are stand-ins. Before issue 57 the ranks logged different names under ``sync_dist`` and one died.

Run as a script by the test (Lightning re-launches it for rank 1): python tests/test_tool_metrics_ddp.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_tool_metrics import TOOLS, episode, failing_root_call_tree, turn  # noqa: E402

from lit_grpo.buffers.report import RolloutReport  # noqa: E402
from lit_grpo.buffers.tree_layout import tree_buffer  # noqa: E402
from lit_grpo.callbacks import RolloutMetrics  # noqa: E402
from lit_grpo.callbacks.episode_metrics import UNKNOWN_TOOL, tool_stats  # noqa: E402
from lit_grpo.tree import SegmentNode, depth_first  # noqa: E402

pytestmark = pytest.mark.slow
EPOCHS = 2
TOKENIZER = SimpleNamespace(pad_token_id=0, decode=lambda ids, skip_special_tokens=True: "x" * len(ids))


def rank_trees(rank: int) -> list[SegmentNode]:
    """Rank 0: add (one call fails), a made-up name (fails) and an answer, 3 episodes; rank 1: a tree of 4 episodes
    under a failing first mul call. Unequal episode counts: a mean of the ranks' ratios is not the global one."""
    if rank == 0:
        roots = [SegmentNode(episode=episode(), children=[
            turn(episode({"add": 1}, {"add": 1}), [turn(episode({"add": 1}, {"add": 1}))]),
            turn(episode({"add": 1, "ad d": 1}, {"ad d": 1}), kind="cut"), turn(episode())])]
    else:
        roots = [failing_root_call_tree("mul")]
    for node in (node for root in roots for node in depth_first(root)):
        node.record, node.reward = {"prompt": f"rank {rank}"}, float(rank)
    return roots


class ToolTrees(pl.LightningDataModule):
    """Publishes this rank's trees as the epoch's ``RolloutReport`` (``ReportsRollouts``), as RolloutDataModule
    does; the train loader serves one batch."""

    def __init__(self, shares: dict[int, list[SegmentNode]]) -> None:
        super().__init__()
        self.shares = shares

    @property
    def epoch_report(self) -> RolloutReport:
        trees = self.shares[self.trainer.global_rank]
        return RolloutReport(buffer=tree_buffer(trees, TOKENIZER, 1.0, 4, "tree", 3))

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.ones(1, 1), batch_size=1)


class Recording(pl.LightningModule):
    """One weight to train; records the ``tools/*`` names each epoch's logging gave on this rank."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.names: list[list[str]] = []

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if name.startswith("tools/"):
            self.names[-1].append(name)
        super().log(name, value, *args, **kwargs)

    def on_train_epoch_start(self) -> None:
        self.names.append([])

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return (self.weight * batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(shares: dict[int, list[SegmentNode]], out: Path, ranks: int) -> None:
    """Fit ``EPOCHS`` epochs on ``ranks`` CPU processes; each rank writes the names it logged and the reduced
    ``tools/*`` figures to ``out/rank<r>.json``."""
    out.mkdir(parents=True, exist_ok=True)
    module = Recording()
    trainer = pl.Trainer(accelerator="cpu", devices=ranks, strategy="ddp" if ranks > 1 else "auto",
                         max_epochs=EPOCHS, use_distributed_sampler=False, num_sanity_val_steps=0,
                         limit_val_batches=0, logger=False, enable_checkpointing=False, default_root_dir=out,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[RolloutMetrics(table_every_n_epochs=0)])
    trainer.fit(module, ToolTrees(shares))
    figures = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("tools/")}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps({"names": module.names, "figures": figures}))


def test_two_ranks_calling_different_tools_log_the_same_names_and_one_processs_values(tmp_path):
    # today's ~15 s; before issue 57 the ranks hung at epoch 0's reduction: the whole group is killed at 240 s
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, __file__, str(tmp_path / "ddp")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        _, stderr = child.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # rank 1 too, Lightning's child of this one
        _, stderr = child.communicate()
        pytest.fail(f"the two ranks did not finish: {stderr[-3000:]}")
    assert child.returncode == 0, stderr[-3000:]
    ranks = [json.loads((tmp_path / "ddp" / f"rank{r}.json").read_text()) for r in range(2)]
    union = rank_trees(0) + rank_trees(1)
    fit({0: union}, tmp_path / "single", 1)
    single = json.loads((tmp_path / "single" / "rank0.json").read_text())
    named = {f"tools/{kind}/{name}" for kind in ("calls", "failures") for name in (*TOOLS, UNKNOWN_TOOL)}
    for rank in ranks:
        assert len(rank["names"]) == EPOCHS  # both ranks finished every epoch
        assert all(names == ranks[0]["names"][0] for names in rank["names"])  # the same names, every epoch
        assert named <= set(rank["names"][0])
        assert rank["figures"] == pytest.approx(single["figures"], abs=1e-6) == tool_stats(union)
    assert ranks[0]["figures"]["tools/failure_frequency"] == pytest.approx(3 / 8)  # 8 calls, 3 failed
    assert ranks[0]["figures"][f"tools/calls/{UNKNOWN_TOOL}"] == pytest.approx(1 / 7)  # "ad d", one in 7 episodes


if __name__ == "__main__":
    torch.set_num_threads(1)  # two ranks on two cores
    fit({0: rank_trees(0), 1: rank_trees(1)}, Path(sys.argv[1]), 2)

"""Every row of the feature table (lit_grpo.run.rules) with every rollout kind: one epoch on the tiny model
where the kind implements the feature, a refusal naming both knobs before any weights load where it does not
(issue 18, bug 2: DPO with trees died after generation with KeyError('pair_role'); tis_cap, dynamic_sampling,
mask_truncated, overlong_cache and reward_timeout were silently ignored with trees or chains).

A run that finishes is not enough (issue 33, item 6): each run then checks what its feature must have changed in
that epoch (``CHANGED``), what its rollout kind must have built (``rollout_shape``), and that the step moved the
adapter. The grouped runs take 4 prompts so that some groups are mixed (the first two prompts' groups are all
wrong on the tiny model): without a mixed group DPO has no pair, the value head no target and the step no signal."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from support import weight_reads

from lit_grpo.cli import main
from lit_grpo.losses import group_advantages
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.run.rules import FEATURES, ROLLOUTS
from lit_grpo.tasks import ArithmeticTask
from lit_grpo.tree import depth_first, policy_nodes, tree_row_advantages

ROOT = Path(__file__).resolve().parents[1]
ON = {"model.loss_variant": "dpo", "model.advantage_mode": "gae", "model.kl.applied_to": "reward", "model.sampler_correction": '{"mode": "token_truncate", "clip_max": 2.0}',
      "data.dynamic_sampling": "true", "data.mask_truncated": "true", "data.overlong_cache": "2",
      "data.reward_timeout": "5.0", "model.tree.std_scope": "siblings",
      "model.tree.flat_groups": "drop", "model.turn_credit": "per_turn_index", "model.risk": '{"v_min": -1.0, "v_max": 1.0, "num_atoms": 5}'}
SMALL = ["--trainer.max_epochs", "1", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false", "--data.max_new_tokens", "4"]
KIND = {
    "grouped": ["--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--data.group_size", "4",
                "--data.prompts_per_epoch", "4", "--data.minibatch_size", "16"],
    "tree": ["--model.model_name_or_path", str(ROOT / "data" / "tiny-llama-clarify"), "--data.task",
             "lit_grpo.tasks.ClarifyTask", "--data.task.init_args.max_rounds", "2", "--data.rollout", "tree",
             "--data.branching", "[2, 2]",
             "--data.prompts_per_epoch", "2", "--data.minibatch_size", "64"],
    "chains": ["--model.model_name_or_path", str(ROOT / "data" / "tiny-llama-clarify"), "--data.task",
               "lit_grpo.tasks.ClarifyTask", "--data.task.init_args.max_rounds", "2", "--data.rollout", "chains",
               "--data.group_size", "2", "--data.prompts_per_epoch", "2", "--data.minibatch_size", "64"],
}
RISK_CALLBACK = ['--trainer.callbacks+={"class_path": "lit_grpo.callbacks.RiskThreshold"}']
GROUP = 4  # data.group_size of the grouped runs
MAX_NEW_TOKENS = 4  # SMALL's data.max_new_tokens


@dataclass
class Run:
    """What a finished run's module held: its trainer, DataModule and last buffer, and its trainable weights as
    they were before the first optimizer step."""

    module: Any
    initial: dict[str, torch.Tensor]

    @property
    def data(self) -> Any:
        return self.module.trainer.datamodule

    @property
    def buffer(self) -> Any:
        return self.data.epoch_report.buffer

    @property
    def metrics(self) -> dict[str, float]:
        return {name: float(value) for name, value in self.module.trainer.callback_metrics.items()}

    def moved(self, part: str) -> bool:
        """Whether a trainable weight whose name holds ``part`` differs from its value before the first step."""
        now = {n: p.detach() for n, p in self.module.named_parameters() if p.requires_grad and part in n}
        assert now, f"no trainable weight named *{part}*"
        return any(not torch.equal(value, self.initial[name]) for name, value in now.items())


def watch(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Keeps the module the CLI builds, and its trainable weights at the first epoch's start (before any step)."""
    seen: dict[str, Any] = {}
    prepare = PolicyModule.on_train_epoch_start

    def on_train_epoch_start(self: PolicyModule) -> None:
        seen.setdefault("initial", {n: p.detach().clone() for n, p in self.named_parameters() if p.requires_grad})
        seen["module"] = self
        prepare(self)

    monkeypatch.setattr(PolicyModule, "on_train_epoch_start", on_train_epoch_start)
    return seen


def perturbed_adapter(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An init_adapter whose LoRA B is not zero, so that pi_old (the adapter on) differs from pi_ref (off) from the
    first epoch: a fresh adapter is pi_ref exactly, and a KL folded into the rewards would be rounding noise."""
    torch.manual_seed(0)
    policy = load_policy(str(ROOT / "data" / "tiny-llama"), 16, 32.0, 0.0, "all-linear")
    with torch.no_grad():
        for name, weight in policy.named_parameters():
            if "lora_B" in name:
                weight.normal_(std=0.02)
    policy.save_pretrained(str(tmp / "init-adapter"))
    return ["--model.init_adapter", str(tmp / "init-adapter")]


def shorter_budget(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """3 tokens: a 3-digit sum and its stop token do not fit (truncated), a 2-digit one does."""
    return ["--data.max_new_tokens", "3"]


def pids_of_scoring(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each call of the task's scoring writes the id of the process it runs in to ``tmp/scored_in``."""
    score_group = ArithmeticTask.score_group

    def recorded(self: ArithmeticTask, *args: Any) -> Any:
        with open(tmp / "scored_in", "a") as calls:
            calls.write(f"{os.getpid()}\n")
        return score_group(self, *args)

    monkeypatch.setattr(ArithmeticTask, "score_group", recorded)
    return []


# per knob: what the run needs so that its feature has something to change in one epoch (extra CLI arguments)
SETUP: dict[str, Callable[[Path, pytest.MonkeyPatch], list[str]]] = {
    "model.kl.applied_to": perturbed_adapter,
    "data.mask_truncated": shorter_budget,
    "data.reward_timeout": pids_of_scoring,
}


def groups(values: torch.Tensor) -> torch.Tensor:
    return values.view(-1, GROUP)  # [B, G]


def check_dpo_pairs(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    rewards, roles, ids = groups(buffer.rewards), groups(buffer.pair_role), groups(buffer.pair_id)
    mixed = rewards.amax(dim=1) > rewards.amin(dim=1)
    assert mixed.sum() >= 2  # prompts 3 and 4 of the split
    for group, (row_rewards, row_roles, row_ids) in enumerate(zip(rewards, roles, ids)):
        if not mixed[group]:  # a tied group makes no pair
            assert not row_roles.any() and (row_ids == -1).all()
            continue
        assert sorted(row_roles.tolist()) == [-1, 0, 0, 1]
        assert row_rewards[row_roles == 1].item() == row_rewards.max()  # the best is chosen
        assert row_rewards[row_roles == -1].item() == row_rewards.min()  # the worst rejected
        assert set(row_ids[row_roles != 0].tolist()) == {group}
    # the epoch's one step is taken at pi_ref (a fresh adapter adds exactly 0): every pair's margin is 0, so the
    # DPO loss is -log sigmoid(0) = log 2; the clipped surrogate would be 0, a DPO step without pairs 0 too
    assert run.metrics["train/loss_epoch"] == pytest.approx(math.log(2), abs=1e-4)
    assert run.metrics["train/dpo_reward_margin"] == pytest.approx(0.0, abs=1e-4)


def check_value_head(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    mask = buffer.completion_mask
    assert buffer.values is not None and buffer.returns is not None and buffer.returns.shape == mask.shape
    assert buffer.advantages.shape == mask.shape  # per-token GAE advantages, not one per row
    assert buffer.returns[mask].abs().sum() > 0  # some rollout was rewarded: the head had a target
    assert 0 < run.metrics["train/value_loss"] < 10
    assert run.moved("value_head")  # it starts at zero: the step moved it


def check_sibling_scope(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    by_scope = {scope: tree_row_advantages(copy.deepcopy(buffer), "grpo", "mean", scope)
                for scope in ("siblings", "tree")}
    assert torch.allclose(buffer.advantages, by_scope["siblings"])
    assert (by_scope["siblings"] - by_scope["tree"]).abs().max() > 0.1  # the scope changes these trees' figures


def check_flat_groups_dropped(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    flat = []  # per policy row, in row order: is its sibling group's Q all one value (an only child included)?
    for root in buffer.trees:
        group_of = {id(child): node.children for node in depth_first(root) for child in node.children}
        spread = [max(s.q for s in group_of[id(n)]) - min(s.q for s in group_of[id(n)]) for n in policy_nodes(root)]
        flat += [gap <= 1e-9 for gap in spread]  # the flat rule's tolerance is rounding (tree.FLAT_RTOL)
    assert any(flat) and not all(flat)
    assert buffer.loss_rows.tolist() == [not f for f in flat]
    assert (buffer.advantages[~buffer.loss_rows] == 0).all()


def check_turn_credit(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    per_turn = tree_row_advantages(copy.deepcopy(buffer), "grpo", "mean", turn_credit="per_turn_index")
    episode = tree_row_advantages(copy.deepcopy(buffer), "grpo", "mean")
    assert torch.equal(buffer.advantages, per_turn)
    turns = [len(policy_nodes(chain)) for root in buffer.trees for chain in root.children]
    assert max(turns) == 1 or (per_turn - episode).abs().max() > 0  # an asked question moves its chain's credit


def check_kl_in_reward(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    kl = ((buffer.old_logp - buffer.ref_logp) * buffer.completion_mask).sum(dim=1)  # k1 of each completion
    assert kl.abs().max() > 0.01  # the init adapter sets pi_old apart from pi_ref
    shaped = group_advantages(groups(buffer.rewards - run.module.hparams.kl["coef"] * kl)).flatten()
    plain = group_advantages(groups(buffer.rewards)).flatten()
    assert torch.allclose(buffer.advantages, shaped, atol=1e-4)
    assert (buffer.advantages - plain).abs().max() > 0.1
    assert "train/kl_ref" not in run.metrics  # no KL term in the loss as well


def check_tis(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    mask = buffer.completion_mask
    assert buffer.old_logp is not buffer.sampler_logp  # pi_old recomputed by the trainer, not the sampler's
    weights = torch.where(mask, torch.exp(buffer.old_logp - buffer.sampler_logp).clamp(max=2.0), 1.0)
    assert torch.allclose(buffer.sampler_ratio, weights, atol=1e-6)  # each token's weight on its surrogate
    assert torch.equal(buffer.advantages, group_advantages(groups(buffer.rewards)).flatten())


def check_dynamic_sampling(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    rewards = groups(buffer.rewards)
    assert (rewards.amax(dim=1) > rewards.amin(dim=1)).all()  # the flat groups were dropped
    assert buffer.sampling_draws > 1  # the first draw's flat groups were replaced by drawing again
    assert run.metrics["rollout/sampling_draws"] == buffer.sampling_draws
    assert run.metrics["rollout/zero_std_frac"] == 0.0
    assert run.data.prompts.completions_generated > buffer.input_ids.shape[0]  # the dropped groups were generated too


def check_mask_truncated(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    assert buffer.truncated.any() and not buffer.truncated.all()
    assert not buffer.completion_mask[buffer.truncated].any()  # a cut-off completion carries no loss
    assert buffer.completion_mask[~buffer.truncated].any(dim=1).all()


def check_overlong_penalty(run: Run, rollout: str, tmp: Path) -> None:
    buffer = run.buffer
    # DAPO's soft punishment, cache 2 of 4 tokens: 0 up to 2 tokens, -0.5 at 3, -1 at 4
    penalty = ((MAX_NEW_TOKENS - 2 - buffer.completion_lengths.float()) / 2).clamp(-1.0, 0.0)
    assert {-0.5, -1.0} <= set(penalty.tolist())  # both 2- and 3-digit answers (with their stop token)
    assert torch.equal(buffer.rewards, buffer.correct.float() + penalty)  # ArithmeticTask: 1 iff correct


def check_reward_worker(run: Run, rollout: str, tmp: Path) -> None:
    assert isinstance(run.data.scorer, RewardWorker)
    pids = {int(pid) for pid in (tmp / "scored_in").read_text().split()}
    assert pids and os.getpid() not in pids  # every reward was computed in the worker process
    buffer = run.buffer
    assert buffer.reward_errors == 0 and run.metrics["rollout/reward_errors"] == 0
    assert buffer.rewards.tolist() == buffer.correct.float().tolist()  # the task's own rewards came back


def check_risk_head(run: Run, rollout: str, tmp: Path) -> None:
    stats = run.module.risk_fit_stats  # the detached head's fit on the epoch's probe states
    assert run.buffer.risk_probes is not None and stats["new_rows"] > 0
    assert 0 < stats["fit_loss"] < math.log(5)  # better than a uniform guess over the 5 atoms
    assert run.moved("risk_head")


CHANGED: dict[str, Callable[[Run, str, Path], None]] = {
    "model.loss_variant": check_dpo_pairs,
    "model.advantage_mode": check_value_head,
    "model.tree.std_scope": check_sibling_scope,
    "model.tree.flat_groups": check_flat_groups_dropped,
    "model.kl.applied_to": check_kl_in_reward,
    "model.turn_credit": check_turn_credit,
    "model.sampler_correction": check_tis,
    "data.dynamic_sampling": check_dynamic_sampling,
    "data.mask_truncated": check_mask_truncated,
    "data.overlong_cache": check_overlong_penalty,
    "data.reward_timeout": check_reward_worker,
    "model.risk": check_risk_head,
}


def rollout_shape(run: Run, rollout: str) -> None:
    """Grouped runs: G rows per prompt; trees: 2 roots with 2 children each, and a node below them that branched;
    chains: 2 roots with 2 chains each, no node below branching."""
    buffer = run.buffer
    if rollout == "grouped":
        assert buffer.trees is None and buffer.sizes == [GROUP] * buffer.num_groups
        return
    assert buffer.tree_mode == rollout and len(buffer.trees) == 2
    assert all(len(root.children) == 2 for root in buffer.trees)
    below = [node for root in buffer.trees for child in root.children for node in depth_first(child)]
    assert any(len(node.children) > 1 for node in below) == (rollout == "tree")


def test_the_table_names_every_rollout_kind_and_a_setting_for_every_feature():
    assert {kind for f in FEATURES for kind in f.rollouts} == set(ROLLOUTS) == set(KIND)
    assert set(ON) == {f.knob for f in FEATURES}


@pytest.mark.parametrize("feature, rollout", [  # a run (one epoch) is slow; a refusal is not
    pytest.param(feature, rollout, id=f"{feature.knob}-{rollout}",
                 marks=pytest.mark.slow if rollout in feature.rollouts else ())
    for feature in FEATURES for rollout in ROLLOUTS])
def test_each_feature_with_each_rollout_kind_runs_or_is_refused_up_front(feature, rollout, tmp_path, capsys,
                                                                        monkeypatch):
    knob = feature.knob
    args = ["fit", *KIND[rollout], f"--{knob}", ON[knob], "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger", "false", *SMALL]
    if knob == "model.risk":
        args += RISK_CALLBACK
    if rollout in feature.rollouts:
        args += SETUP.get(knob, lambda tmp, patch: [])(tmp_path, monkeypatch)
        seen = watch(monkeypatch)
        main(args)
        assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
        run = Run(seen["module"], seen["initial"])
        rollout_shape(run, rollout)
        CHANGED[knob](run, rollout, tmp_path)
        assert run.moved("lora_")  # the epoch's step had a signal
        return
    reads = weight_reads(monkeypatch)
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err and not reads
    assert f"{knob} " in err and f"with data.rollout {rollout!r}: {feature.why}" in err


def knobs(cls: type, **given: Any) -> dict[str, Any]:
    """A class's arguments: its signature's defaults with ``given`` in place."""
    from lit_grpo.cli.config_check import signature_defaults

    return {**signature_defaults(cls), **given}


# every rule between knobs that is not a row of FEATURES, each made to fire alone, with the message written by hand
RULES = [
    ({"loss_variant": "gspo", "aggregation": "token-mean"}, {}, None,
     "model.aggregation: loss_variant 'gspo' takes 'seq-mean' only, got 'token-mean'"),
    ({"loss_variant": "vespo", "sampler_correction": {"mode": "sequence_mask"}}, {}, None,
     "model.sampler_correction mode 'sequence_mask' with loss_variant 'vespo': VESPO takes the sampler's per-token "
     "ratios into its sequence weight; use mode 'token_truncate' or 'token_mask'"),
    ({"loss_variant": "gspo", "aggregation": "seq-mean", "advantage_mode": "gae"}, {}, None,
     "model.advantage_mode: 'gae' gives per-token advantages, which gspo does not take (it weighs a sequence by one "
     "advantage); use another advantage_mode or loss_variant"),
    ({"loss_variant": "luspo", "aggregation": "token-mean"}, {}, None,
     "model.aggregation: loss_variant 'luspo' takes 'seq-sum' only, got 'token-mean'"),
    ({"loss_variant": "vespo", "ratio_level": "sequence"}, {}, None,
     "model.ratio_level 'sequence' with loss_variant 'vespo': only unclipped, clip, cispo, sapo, luspo choose their "
     "ratio's level (gspo's is the sequence's; reinforce and vespo take none); leave it unset"),
    ({"loss_variant": "dpo", "kl": {"ratio_correction": True}}, {}, None,
     "model.kl.ratio_correction with loss_variant 'dpo': online DPO's loss on pairs has no policy-gradient surrogate "
     "to mask, weight or regularise; leave it unset"),
    ({"advantage_mode": "gdpo"}, {"overlong_cache": 2}, None,
     "data.overlong_cache with model.advantage_mode 'gdpo': GDPO normalises each of the task's rewards apart, and "
     "the overlong penalty is none of them; leave overlong_cache unset (data.mask_truncated takes truncated "
     "completions out of the loss instead)"),
    ({"loss_variant": "sapo", "clip": {"delta": 4.0}}, {}, None,
     "model.clip.delta with loss_variant 'sapo': it caps the clip's ratio, which only clip, gspo, luspo take; leave "
     "it unset"),
    ({"loss_variant": "cispo", "sapo": {"pos": 2.0}}, {}, None,
     "model.sapo with loss_variant 'cispo': only loss_variant 'sapo' reads it; leave it at its defaults"),
    ({"vespo": {"k_neg": 1.0}}, {}, None,
     "model.vespo with loss_variant 'clip': only loss_variant 'vespo' reads it; leave it at its defaults"),
    ({"kl": {"coef": 0.0, "ratio_correction": True}}, {}, None,
     "model.kl.ratio_correction: it corrects the KL term of the loss, which needs kl.coef > 0 and kl.applied_to "
     "'loss'"),
    ({"loss_variant": "dpo", "entropy": {"coef": 0.01}}, {}, None,
     "model.entropy with loss_variant 'dpo': online DPO's loss on pairs has no policy-gradient surrogate to mask, "
     "weight or regularise; leave it unset"),
    ({"advantage_mode": "gdpo", "kl": {"applied_to": "reward"}}, {}, None,
     "model.advantage_mode 'gdpo' with model.kl.applied_to 'reward': GDPO normalises each of the task's rewards "
     "apart, and the KL penalty is none of them; use kl.applied_to 'loss'"),
    ({"advantage_mode": "gdpo", "std_scope": "batch"}, {}, None,
     "model.std_scope 'batch' with advantage_mode 'gdpo': GDPO normalises within each group and then over the batch "
     "already; leave std_scope 'group'"),
    ({"advantage_mode": "gdpo"}, {"rollout": "tree", "branching": [2, 2]}, None,
     "model.advantage_mode 'gdpo' with data.rollout 'tree': GDPO normalises each of a task's rewards within a "
     "prompt's group of completions, and an episode is scored by its environment's one reward; use data.rollout "
     "'grouped'"),
    ({"turn_credit": "reward_to_go"}, {"rollout": "chains"}, None,
     "model.turn_credit 'reward_to_go' with advantage_mode 'grpo': it takes advantage_mode 'rloo' (its baseline is "
     "the leave-one-out mean of the other episodes' reward-to-go)"),
    ({"turn_credit": "per_turn_index", "advantage_mode": "max"}, {"rollout": "chains"}, None,
     "model.turn_credit 'per_turn_index' with advantage_mode 'max': it takes advantage_mode 'grpo' or 'centered' or "
     "'drgrpo' (grpo divides each turn index's centred rewards by their std, centered and drgrpo do not)"),
    ({"advantage_mode": "raw"}, {"group_size": 3, "minibatch_size": 8}, None,
     "data.minibatch_size: 8 is not a multiple of group_size (3); minibatches hold whole groups"),
    ({}, {"max_new_tokens": 4, "overlong_cache": 5}, None,
     "data.overlong_cache: must be in [1, max_new_tokens], got 5 (max_new_tokens 4)"),
    ({}, {"completion_budget": 4}, None, "data.completion_budget: must be >= group_size (8) or None, got 4"),
    ({}, {"group_size": 1, "minibatch_size": 8}, None,
     "data.group_size 1 with model.advantage_mode 'grpo': a group of one has advantage 0, so nothing would be "
     "learned; use group_size >= 2 (or advantage_mode 'raw')"),
    ({}, {}, {"reload_dataloaders_every_n_epochs": 0},
     "trainer.reload_dataloaders_every_n_epochs: must be 1, got 0: RolloutDataModule needs "
     "Trainer(reload_dataloaders_every_n_epochs=1), else the first epoch's rollouts would be trained on forever"),
    ({}, {"prompts_per_epoch": 6}, {"world_size": 4},
     "data.prompts_per_epoch: 6 is not a multiple of the 4 ranks; every rank trains on an equal share of the epoch's "
     "prompts"),
    ({}, {"dynamic_sampling": True}, {"world_size": 2},
     "data.dynamic_sampling: not supported with 2 ranks (ranks would keep different numbers of groups)"),
    ({}, {"completion_budget": 64}, {"world_size": 2},
     "data.completion_budget: not supported with 2 ranks (counted per process)"),
    ({}, {}, {"world_size": 2, "use_distributed_sampler": True},
     "trainer.use_distributed_sampler: must be false; each rank's buffer is already its share"),
]


@pytest.mark.parametrize(("model", "data", "trainer", "message"), RULES, ids=[rule[3][:40] for rule in RULES])
def test_each_rule_between_knobs_fires_alone_with_its_message(model, data, trainer, message):
    from lit_grpo.policy.knob_groups import plain_arguments, regroup
    from lit_grpo.policy.knob_rules import module_knob_problems
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.run.rules import TrainerFacts, cross_knob_problems

    def problems(model_args: dict, data_args: dict, facts: TrainerFacts | None) -> list[str]:
        """The module's own rules, as the command reports them (``model.``), and the rules across parts, on the
        module's arguments in their groups as the module and the command read them (``knob_groups.regroup``)."""
        grouped = plain_arguments(regroup(model_args).arguments)
        own = [f"model.{problem}" for problem in module_knob_problems(grouped)]
        return own + cross_knob_problems(grouped, data_args, trainer=facts)

    facts = None if trainer is None else TrainerFacts(**trainer)
    assert problems(knobs(PolicyModule, **model), knobs(RolloutDataModule, **data), facts) == [message]
    assert problems(knobs(PolicyModule), knobs(RolloutDataModule), TrainerFacts(1, False, 1)) == []


def test_the_module_alone_hears_its_own_rules_and_the_risk_callback_hears_the_task():
    from lit_grpo.errors import InputError
    from lit_grpo.run.rules import risk_decision_problems
    from lit_grpo.tasks import ClarifyTask
    from lit_grpo.tasks.episodes import names_answer_tokens

    with pytest.raises(InputError) as refused:
        PolicyModule(loss_variant="dpo", advantage_mode="gae")
    assert str(refused.value).endswith("- loss_variant 'dpo' learns from preference pairs; it takes no GAE "
                                       "advantages: use another advantage_mode")
    assert names_answer_tokens(ClarifyTask) and not names_answer_tokens(ArithmeticTask())
    assert risk_decision_problems("value", "ArithmeticTask", False) == [
        "RiskThreshold decision: value forces answers, but the task ArithmeticTask does not say which first tokens "
        "answer: give it an answer_token_ids(tokenizer) method, or use decision: threshold"]
    assert risk_decision_problems("threshold", "ArithmeticTask", False) == []


def test_a_reward_bounded_by_the_reward_timeout_alone_is_refused_without_one(tmp_path):
    """MathVerify (math-verify with its signal timeouts off) needs data.reward_timeout: refused without it, from the
    configuration (its class path, before anything is built) and from a built task (the Python API), one line."""
    import yaml

    from lit_grpo.cli.config_check import config_problems
    from lit_grpo.errors import InputError
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.tasks import DatasetTask
    from lit_grpo.tasks.rewards.math_answers import MathVerify

    pytest.importorskip("math_verify")
    message = ("data.reward_timeout: the MathVerify reward is bounded by it alone (a hostile answer parses for "
               "minutes or never finishes comparing, in the trainer's process without it); set data.reward_timeout, "
               "e.g. 5.0 seconds per completion")
    config = yaml.safe_load((ROOT / "configs" / "math_verify.yaml").read_text())
    assert config_problems(config) == []  # the shipped config sets one
    config["data"]["reward_timeout"] = None
    assert config_problems(config) == [message]
    config["data"]["task"]["init_args"]["rewards"] = [{"class_path": "lit_grpo.tasks.MathVerify",
                                                       "init_args": {"float_rounding": 3}}]
    assert config_problems(config) == [message]
    config["data"]["task"]["init_args"]["rewards"] = ["lit_grpo.tasks.ExactMatchReward"]
    assert config_problems(config) == []
    task = DatasetTask(str(ROOT / "data" / "math-answers" / "rows.jsonl"), rewards=[MathVerify()],
                       heldout_fraction=0.25)
    with pytest.raises(InputError) as refused:
        RolloutDataModule(task=task)
    assert str(refused.value).splitlines()[1:] == [f"  - {message}"]
    assert RolloutDataModule(task=task, reward_timeout=5.0).scorer is not task  # the reward worker scores it

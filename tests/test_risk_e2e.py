"""The risk head and RiskThreshold in a real Trainer on the shipped clarification model: the rule forces a defer
exactly where P(error) > tau, the forced first token is scored under the sampler's renormalised distribution, the
head trains, and calibration and tau survive a checkpoint."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lit_grpo.callbacks import RiskThreshold, RolloutMetrics

from lit_grpo.engines import HFEngine
from lit_grpo.errors import InputError
from lit_grpo.policy.module import PolicyModule
from lit_grpo.policy.risk_features import context_error_probability
from lit_grpo.risk.head import RiskHeadSpec
from lit_grpo.risk.rule import RiskRule
from lit_grpo.rollout.datamodule import RolloutDataModule
from support import load_checkpoint
from lit_grpo.tasks import ClarifyTask
from lit_grpo.tree import policy_nodes

CLARIFY_MODEL = "data/tiny-llama-clarify"


class CheckRule(pl.Callback):
    """At each epoch's first batch (the module has prepared the buffer; no update yet) the buffer's restrictions must
    match the rule at tau."""

    def __init__(self, tau: float) -> None:
        self.tau, self.forced_rows, self.free_rows = tau, 0, 0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx:
            return
        buffer, tokenizer = trainer.datamodule.epoch_report.buffer, pl_module.tokenizer
        nodes = [node for root in buffer.trees for node in policy_nodes(root)]
        p_error = context_error_probability(pl_module.policy, pl_module.risk_head, [list(n.context) for n in nodes],
                                            tokenizer.pad_token_id)
        ask = tokenizer("?", add_special_tokens=False)["input_ids"][0]
        forced = (buffer.first_token_allowed >= 0).any(dim=1)  # [N]
        assert (p_error - self.tau).abs().min() > 1e-6  # no row so close to tau that batch rounding could flip it
        assert torch.equal(forced, p_error > self.tau)
        rows = forced.nonzero().squeeze(1)
        columns = buffer.decision_index[rows]
        assert (buffer.input_ids[rows, columns] == ask).all()  # the forced first token is the question
        # one allowed token: probability 1 under the renormalised distribution, for the sampler and the trainer
        assert (buffer.sampler_logp[rows, columns] == 0).all() and (buffer.old_logp[rows, columns] == 0).all()
        counted = buffer.completion_mask
        assert (buffer.old_logp - buffer.sampler_logp)[counted].abs().max() < 1e-4
        assert not buffer.inferred[rows].any()  # a forced defer is never a target of the head
        self.forced_rows += len(rows)
        self.free_rows += int((~forced).sum())


def build(tau_mode: str = "fixed", tau: float = 0.5, risk: RiskHeadSpec | None = RiskHeadSpec(detach=False),
          **threshold_kwargs: Any) -> tuple[Any, Any, RiskThreshold]:
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=CLARIFY_MODEL, risk=risk, kl={"coef": 0.0}, old_logp_source="trainer",
                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0))
    # a shared engine outlives the fit, so the test can rerun the calibration's episodes afterwards
    datamodule = RolloutDataModule(task=ClarifyTask(max_rounds=2), engine=HFEngine(shared=True), rollout="tree", branching=[2, 2], prompts_per_epoch=8,
                                   minibatch_size=32, max_new_tokens=5, val_max_prompts=16)
    threshold = RiskThreshold(mode=tau_mode, tau=tau, **{"explore_fraction": 0.0, **threshold_kwargs})
    return module, datamodule, threshold


def trainer_for(tmp_path, callbacks: list[Any], epochs: int, validate: bool) -> pl.Trainer:
    return pl.Trainer(max_epochs=epochs, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                      limit_val_batches=1.0 if validate else 0, callbacks=[*callbacks, RolloutMetrics(0)],
                      default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)


@pytest.mark.slow
def test_the_rule_restricts_exactly_the_risky_contexts_and_the_head_trains(tmp_path):
    module, datamodule, _ = build()
    module.configure_model()
    # a head with random weights, so P(error) differs between contexts; tau at their median splits them
    torch.manual_seed(0)
    torch.nn.init.normal_(module.risk_head.linear.weight, std=0.5)
    records = ClarifyTask().train_records()[:8]
    tokenizer = module.tokenizer
    roots_p = context_error_probability(module.policy, module.risk_head,
                                        [tokenizer(r["prompt"])["input_ids"] for r in records], tokenizer.pad_token_id)
    ordered = roots_p.sort().values
    tau = float(ordered[3] + ordered[4]) / 2  # between two contexts' values: no float tie with any of them
    threshold = RiskThreshold(mode="fixed", tau=tau, explore_fraction=0.0)
    check = CheckRule(tau)
    before = module.risk_head.linear.weight.detach().clone()
    trainer_for(tmp_path, [threshold, check], epochs=2, validate=False).fit(module, datamodule)
    assert check.forced_rows > 0 and check.free_rows > 0
    assert not torch.equal(before, module.risk_head.linear.weight.detach())  # trained from observed outcomes


def adapter_state(module: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.policy.named_parameters() if v.requires_grad}


@pytest.mark.slow
def test_the_detached_head_learns_from_probes_and_leaves_the_policy_exactly_as_without_it(tmp_path):
    # the rule off in training (every tree explores), so a run with the detached head and one without any head
    # sample the same trees: their adapters must be equal to the bit
    detached, datamodule, threshold = build(risk=RiskHeadSpec(probe_prompts=12, fit_steps=20), explore_fraction=1.0)
    detached.configure_model()
    before = detached.risk_head.linear.weight.detach().clone()
    trainer_for(tmp_path / "a", [threshold], epochs=2, validate=False).fit(detached, datamodule)
    plain, plain_data, _ = build(risk=None)
    trainer_for(tmp_path / "b", [], epochs=2, validate=False).fit(plain, plain_data)
    with_head, without = adapter_state(detached), adapter_state(plain)
    assert with_head.keys() == without.keys() and all(torch.equal(with_head[k], without[k]) for k in without)
    assert not torch.equal(before, detached.risk_head.linear.weight.detach())  # fitted on the probes
    rows = detached.risk_replay.labels()
    assert len(rows.contexts) >= 12  # every probe prompt labels at least its first state, over two epochs
    assert not rows.infer_returns.isnan().all() and not rows.defer_returns.isnan().all()
    assert detached.risk_fit_stats["replay_rows"] == len(rows.contexts)
    assert detached.preparation_timings["risk_head_fit"] > 0  # its own phase time, not counted as the no-grad passes
    assert datamodule.timings["risk_probes"] > 0  # drawing the probes is the DataModule's, timed apart


@pytest.mark.slow
def test_calibration_in_the_loop_and_tau_in_the_checkpoint(tmp_path):
    module, datamodule, threshold = build(tau_mode="calibrated", alpha=0.3, delta=0.2, candidates=[0.0, 0.3, 0.5, 1.0])
    trainer = trainer_for(tmp_path, [threshold], epochs=1, validate=True)
    trainer.fit(module, datamodule)
    # greedy episodes are deterministic: rerun each candidate's validation episodes (the measurement), then apply
    # Learn-then-Test by hand: from the smallest tau up, keep going while P(Bin(covered, alpha) <= errors) <= delta
    outcomes = {t: datamodule.rule_outcome(module, datamodule.val_records(), t) for t in threshold.candidates}
    assert outcomes[0.0].coverage == 0.0 and outcomes[0.0].selective_error is None  # P(error) > 0: always defers
    expected = None
    for t in (0.0, 0.3, 0.5, 1.0):
        errors, covered = int(outcomes[t].errors.sum()), int(outcomes[t].covered.sum())
        p_value = sum(math.comb(covered, i) * 0.3**i * 0.7 ** (covered - i) for i in range(errors + 1)) \
            if covered else 1.0
        if p_value > 0.2:
            break
        expected = t
    assert threshold.calibrated_tau == expected
    metrics = trainer.callback_metrics
    assert {"risk/coverage", "risk/selective_error", "risk/ece", "risk/always_defer"} <= set(metrics)
    assert metrics["risk/always_defer"].item() == float(expected is None)
    if expected is not None:  # the logged outcome is the chosen tau's
        assert metrics["risk/coverage"].item() == outcomes[expected].coverage
    path = tmp_path / "risk.ckpt"
    trainer.save_checkpoint(path)
    saved = load_checkpoint(path)
    restored = RiskThreshold(mode="calibrated")
    (state,) = [v for k, v in saved["callbacks"].items() if k.startswith("RiskThreshold")]
    restored.load_state_dict(state)
    assert restored.calibrated_tau == threshold.calibrated_tau
    assert any(k.startswith("risk_head.") for k in saved["state_dict"])  # the head is checkpointed with the adapter


@pytest.mark.slow
def test_the_replay_is_in_the_checkpoint(tmp_path):
    module, datamodule, threshold = build(risk=RiskHeadSpec(probe_prompts=8, fit_steps=5), explore_fraction=1.0)
    trainer = trainer_for(tmp_path, [threshold], epochs=1, validate=False)
    trainer.fit(module, datamodule)
    trainer.save_checkpoint(tmp_path / "risk.ckpt")
    saved = load_checkpoint(tmp_path / "risk.ckpt")
    fresh, _, _ = build(risk=RiskHeadSpec(probe_prompts=8, fit_steps=5))
    fresh.configure_model()
    fresh.on_load_checkpoint(saved)
    assert fresh.risk_replay.labels().contexts == module.risk_replay.labels().contexts


def test_the_value_rule_forces_an_answer_or_a_question_by_the_heads_two_values(tmp_path):
    module, datamodule, _ = build()
    module.configure_model()
    task, tokenizer = datamodule.task, module.tokenizer
    records = task.train_records()[:6]
    contexts = [task.prompt_ids(r, tokenizer) for r in records]
    defer_ids, answer_ids = tuple(task.defer_token_ids(tokenizer)), tuple(task.answer_token_ids(tokenizer))
    assert len(answer_ids) == 10 and not set(answer_ids) & set(defer_ids)
    atoms = module.risk_head.spec.num_atoms
    for favoured, expected in ((0, answer_ids), (1, defer_ids)):  # all mass of one branch on the top atom
        with torch.no_grad():
            module.risk_head.linear.bias.zero_()
            module.risk_head.linear.bias[favoured * atoms + atoms - 1] = 10.0
        rule = RiskRule.for_task(module.context_risk(), None, task, tokenizer, decision="value")
        assert rule([list(c) for c in contexts], 1) == (expected,) * len(contexts)
    # answers forced everywhere: every greedy episode ends at round 1 in an answer the rule let through
    with torch.no_grad():
        module.risk_head.linear.bias.zero_()
        module.risk_head.linear.bias[atoms - 1] = 10.0
    outcome = datamodule.rule_outcome(module, records, None, decision="value")
    assert outcome.covered.all()


def test_the_value_rule_with_a_task_that_cannot_force_an_answer_is_refused_before_work():
    class NoAnswerIds(ClarifyTask):
        answer_token_ids = None  # a user's game that never said which tokens answer

    data = RolloutDataModule(task=NoAnswerIds())
    trainer = SimpleNamespace(datamodule=data)
    with pytest.raises(InputError, match="NoAnswerIds does not say which first tokens answer"):
        RiskThreshold(decision="value").setup(trainer, None, "fit")  # the data module refuses what its task can't do
    assert data.risk_threshold.source is None
    threshold = RiskThreshold(decision="threshold")
    threshold.setup(trainer, None, "fit")  # the threshold rule only forces questions
    assert data.risk_threshold.source is threshold


def test_a_data_module_that_takes_no_risk_threshold_is_refused_by_name():
    # the callback configures the data module through a declared method; one without it is told so, not an
    # AttributeError
    import lightning.pytorch as pl

    class PlainData(pl.LightningDataModule):
        pass

    with pytest.raises(InputError, match=r"RiskThreshold: the trainer's data module \(PlainData\) takes no risk "
                                         r"threshold"):
        RiskThreshold().setup(SimpleNamespace(datamodule=PlainData()), None, "fit")


def test_a_data_module_that_cannot_measure_the_rule_is_refused_by_name():
    # one that takes the threshold but plays no held-out episodes would never calibrate it nor draw its curve
    class ThresholdOnly(pl.LightningDataModule):
        def use_risk_threshold(self, source: Any) -> None:
            self.source = source

    data = ThresholdOnly()
    with pytest.raises(InputError, match=r"\(ThresholdOnly\) does not measure the rule on held-out prompts"):
        RiskThreshold().setup(SimpleNamespace(datamodule=data), None, "fit")
    assert not hasattr(data, "source")  # refused before it was configured

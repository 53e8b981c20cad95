"""Each objective of issue 50 against TRL 1.16's own code on the same inputs: our loss and its gradient in logp
equal ``GRPOTrainer._compute_loss``'s (run by tests/trl_losses.py on crafted inputs), in float64, with our knobs set
as docs/guide.md#from-trl maps TRL's; GDPO against TRL's own ``normalize_then_sum`` lines, executed as installed.

The inputs: 4 completions of up to 6 tokens (the last rows padded), ratios pi / pi_old between 0.35 and 2.9 so
that every clip, cap, gate and mask acts on some token, advantages of both signs, a sampler that differs from pi_old,
a reference policy, and entropies.
"""

from __future__ import annotations

import inspect
import math
import re
import textwrap
import types
from pathlib import Path

import pytest
import torch
from trl_losses import trl_loss, trl_trainer

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.losses import sampler_importance_ratio
from lit_grpo.policy.advantages import AdvantageKnobs, assign_advantages
from lit_grpo.policy.module import PolicyModule
from lit_grpo.policy.objective import Objective
from lit_grpo.policy.policy_step import EntropyCoefficient, policy_terms

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions:UserWarning")]

F64 = torch.float64
T = 6
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]]).bool()
_G = torch.Generator().manual_seed(50)
OLD = -0.2 - torch.rand(4, T, generator=_G, dtype=F64) * 2.5
RATIO = 0.35 + torch.rand(4, T, generator=_G, dtype=F64) * 2.55
SAMPLER = OLD + torch.randn(4, T, generator=_G, dtype=F64) * 0.4
REF = OLD + torch.randn(4, T, generator=_G, dtype=F64) * 0.3
ADV = torch.tensor([1.3, -0.7, -1.6, 0.4], dtype=F64)
ENTROPIES = torch.rand(4, T, generator=_G, dtype=F64) * 2.0
DEFAULTS = {name: p.default for name, p in inspect.signature(PolicyModule.__init__).parameters.items()
            if name != "self"} | {"kl": {"coef": 0.0}}
TOL = {"rtol": 0, "atol": 1e-9}
# where TRL keeps a constant in float32 whatever the inputs' dtype, the issue's 1e-6: SAPO's temperatures enter through
# torch.where(cond, float, float) (1.05 as 1.0499999523), and TRL's nanstd takes Bessel's n / (n - 1) as an
# integer-tensor division, float32 (4 / 3 off by 4e-8); our arithmetic stays in float64
FLOAT32_TOL = {"rtol": 0, "atol": 1e-6}


def ours(knobs: dict, logp: torch.Tensor, *, sampler: bool = False, entropies: bool = False) -> torch.Tensor:
    """Our loss of one minibatch that is its whole optimizer step, as PolicyModule.training_step computes it."""
    objective = Objective.from_arguments(DEFAULTS | knobs)
    batch = {"old_logp": OLD, "advantages": ADV, "completion_mask": MASK, "ref_logp": REF}
    if sampler:
        batch["sampler_logp"] = SAMPLER
    correction = objective.sampler_correction
    if correction is not None:
        batch["sampler_ratio"] = sampler_importance_ratio(OLD, SAMPLER, MASK, correction.mode, correction.clip_min,
                                                          correction.clip_max)
    terms = policy_terms(objective, batch, logp, ENTROPIES if entropies else None, MASK, T)
    coef = EntropyCoefficient.of(objective.entropy)
    return terms.loss if coef is None else terms.loss - coef.applied() * terms.entropy


def theirs(config: dict, logp: torch.Tensor, *, sampler: bool = False) -> torch.Tensor:
    trainer = trl_trainer(**({"max_completion_length": T} | config))
    return trl_loss(trainer, logp, OLD, ADV, MASK.long(), ref_logp=REF, sampler_logp=SAMPLER if sampler else None,
                    entropies=ENTROPIES)


def assert_equal_to_trl(knobs: dict, config: dict, *, sampler: bool = False, entropies: bool = False,
                        tol: dict = TOL) -> None:
    from lit_grpo.run.rules import cross_knob_problems

    args = DEFAULTS | knobs  # a setting the module accepts, as a config would give it
    assert PolicyModule.config_problems(args) + cross_knob_problems(args, None) == []
    logp_ours = (OLD + RATIO.log()).requires_grad_(True)
    logp_trl = (OLD + RATIO.log()).requires_grad_(True)
    loss_ours = ours(knobs, logp_ours, sampler=sampler, entropies=entropies)
    loss_trl = theirs(config, logp_trl, sampler=sampler)
    torch.testing.assert_close(loss_ours.detach(), loss_trl.detach(), **tol)
    (grad_ours,), (grad_trl,) = torch.autograd.grad(loss_ours, logp_ours), torch.autograd.grad(loss_trl, logp_trl)
    torch.testing.assert_close(grad_ours * MASK, grad_trl * MASK, **tol)
    assert grad_trl.abs().sum() > 0  # the example moves the policy


@pytest.mark.parametrize(("knobs", "config"), [
    # the aggregations, as TRL pairs them with loss types
    ({"clip": {"eps": 0.2}}, {"loss_type": "grpo", "epsilon": 0.2}),
    ({"clip": {"eps": 0.2}, "aggregation": "token-mean"}, {"loss_type": "bnpo", "epsilon": 0.2}),
    ({"clip": {"eps": 0.2}, "aggregation": "constant"}, {"loss_type": "dr_grpo", "epsilon": 0.2}),
    ({"clip": {"eps": 0.2, "eps_high": 0.28}, "aggregation": "token-mean"},
     {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28}),
    # CISPO: TRL's absolute cap epsilon_high 5.0 is our clip_eps_high 4.0 (its default here)
    ({"loss_variant": "cispo"}, {"loss_type": "cispo", "epsilon_high": 5.0}),
    ({"loss_variant": "cispo", "clip": {"eps_high": 1.0}}, {"loss_type": "cispo", "epsilon_high": 2.0}),
    # SAPO, default and other temperatures
    ({"loss_variant": "sapo"}, {"loss_type": "sapo"}),
    ({"loss_variant": "sapo", "sapo": {"pos": 2.0, "neg": 3.0}},
     {"loss_type": "sapo", "sapo_temperature_pos": 2.0, "sapo_temperature_neg": 3.0}),
    # LUSPO: the sequence ratio summed over the sequence (TRL's recommended level), and at token level
    ({"loss_variant": "luspo"}, {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 3e-4,
                                 "epsilon_high": 4e-4}),
    ({"loss_variant": "luspo", "ratio_level": "token", "clip": {"eps": 0.2, "eps_high": 0.2}},
     {"loss_type": "luspo", "importance_sampling_level": "token", "epsilon": 0.2}),
    # VESPO with its default and other shapes
    ({"loss_variant": "vespo"}, {"loss_type": "vespo"}),
    ({"loss_variant": "vespo", "vespo": {"k_pos": 1.0, "lambda_pos": 0.5, "k_neg": 4.0, "lambda_neg": 1.5}},
     {"loss_type": "vespo", "vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5, "vespo_k_neg": 4.0, "vespo_lambda_neg": 1.5}),
    # two-sided clipping
    ({"clip": {"eps": 0.2, "delta": 1.5}}, {"loss_type": "grpo", "epsilon": 0.2, "delta": 1.5}),
    ({"clip": {"eps": 0.2, "eps_high": 0.28, "delta": 2.0}, "aggregation": "token-mean"},
     {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "delta": 2.0}),
    # sequence-level ratios with a token-level loss, and GSPO (TRL's grpo at sequence level)
    ({"clip": {"eps": 0.2}, "ratio_level": "sequence", "aggregation": "token-mean"},
     {"loss_type": "dapo", "epsilon": 0.2, "importance_sampling_level": "sequence"}),
    ({"loss_variant": "gspo"}, {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4,
                                "epsilon_high": 4e-4}),
    ({"loss_variant": "cispo", "ratio_level": "sequence"}, {"loss_type": "cispo", "epsilon_high": 5.0,
                                                            "importance_sampling_level": "sequence"}),
    # the KL term, with and without TRL's bias correction (its default), token and sequence ratios
    ({"clip": {"eps": 0.2}, "kl": {"coef": 0.04, "ratio_correction": True}},
     {"loss_type": "grpo", "epsilon": 0.2, "beta": 0.04, "use_bias_correction_kl": True}),
    ({"clip": {"eps": 0.2}, "kl": {"coef": 0.04}}, {"loss_type": "grpo", "epsilon": 0.2, "beta": 0.04,
                                          "use_bias_correction_kl": False}),
    ({"loss_variant": "gspo", "kl": {"coef": 0.04, "ratio_correction": True}},
     {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4,
      "beta": 0.04, "use_bias_correction_kl": True}),
])
def test_loss_and_gradient_equal_trl(knobs: dict, config: dict) -> None:
    default_sapo = config.get("loss_type") == "sapo" and "sapo_temperature_neg" not in config
    assert_equal_to_trl(knobs, config, tol=FLOAT32_TOL if default_sapo else TOL)


@pytest.mark.parametrize(("mode", "clip_min", "clip_max", "variant", "loss_type"), [
    ("token_truncate", None, 1.5, "clip", "grpo"), ("token_mask", 0.7, 1.4, "clip", "grpo"),
    ("sequence_truncate", 0.5, 1.2, "clip", "grpo"), ("sequence_mask", None, 1.3, "clip", "grpo"),
    ("sequence_mask", 0.3, 3.0, "cispo", "cispo"), ("token_truncate", None, 1.5, "sapo", "sapo"),
    ("token_truncate", None, 1.5, "vespo", "vespo"), ("token_mask", 0.7, 1.4, "vespo", "vespo"),
])
def test_sampler_correction_equals_trl(mode: str, clip_min, clip_max, variant: str, loss_type: str) -> None:
    knobs = {"loss_variant": variant, "clip": {"eps": 0.2 if variant == "clip" else None},
             "sampler_correction": {"mode": mode, "clip_min": clip_min, "clip_max": clip_max}}
    config = {"loss_type": loss_type, "use_vllm": True, "vllm_importance_sampling_correction": True,
              "vllm_importance_sampling_mode": mode, "vllm_importance_sampling_clip_min": clip_min,
              "vllm_importance_sampling_clip_max": clip_max}
    config |= {"epsilon": 0.2} if variant == "clip" else {"epsilon_high": 5.0} if variant == "cispo" else {}
    assert_equal_to_trl(knobs, config, sampler=True, tol=FLOAT32_TOL if variant == "sapo" else TOL)


@pytest.mark.parametrize("threshold", [0.05, 0.3, 2.0])
def test_off_policy_mask_equals_trl(threshold: float) -> None:
    assert_equal_to_trl({"clip": {"eps": 0.2}, "off_policy_mask_threshold": threshold},
                        {"loss_type": "grpo", "epsilon": 0.2, "off_policy_mask_threshold": threshold}, sampler=True)


@pytest.mark.parametrize(("entropy", "config"), [
    ({"top_quantile": 0.5}, {"top_entropy_quantile": 0.5}),
    ({"top_quantile": 0.2, "coef": 0.05}, {"top_entropy_quantile": 0.2, "entropy_coef": 0.05}),
    ({"coef": 0.01}, {"entropy_coef": 0.01}),
    ({"coef": 0.01, "adaptive": True}, {"entropy_coef": 0.01, "use_adaptive_entropy": True}),  # first step: none
])
def test_entropy_control_equals_trl(entropy: dict, config: dict) -> None:
    assert_equal_to_trl({"clip": {"eps": 0.2}, "entropy": entropy}, {"loss_type": "grpo", "epsilon": 0.2} | config,
                        entropies=True)


def test_adaptive_entropy_coefficient_follows_trl_over_steps() -> None:
    """Three optimizer steps: TRL's coefficient after each (its own update at sync_gradients) equals ours."""
    trainer = trl_trainer(loss_type="grpo", epsilon=0.2, entropy_coef=0.01, use_adaptive_entropy=True,
                          entropy_target=0.9, entropy_coef_delta=0.004, max_completion_length=T)
    ours_coef = EntropyCoefficient(Objective.from_arguments(DEFAULTS | {"entropy": {
        "coef": 0.01, "adaptive": True, "target": 0.9, "coef_delta": 0.004}}).entropy)
    import trl_losses

    trl_losses._reset_loss_state(trainer)
    for scale in (0.3, 1.5, 0.2):  # mean entropies below, above and below the target
        inputs = trl_losses.trl_inputs(trainer, OLD.clone(), OLD, ADV, MASK.long())
        entropies = ENTROPIES * scale
        trainer._get_per_token_logps_and_entropies = lambda *a, e=entropies, **k: (OLD.clone(), e, None)
        trainer._compute_loss(trainer.model, inputs)
        del trainer._get_per_token_logps_and_entropies
        ours_coef.observe(torch.stack([(entropies * MASK).sum(), MASK.sum().to(F64)]))
        ours_coef.step()
        assert ours_coef.coef == pytest.approx(trainer.entropy_coef, abs=1e-15)
        assert ours_coef.last_entropy == pytest.approx(trainer._last_world_entropy, abs=1e-12)


def _trl_gdpo_block() -> str:
    """TRL's own normalize_then_sum lines, cut from its source as installed."""
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    match = re.search(r'elif self\.multi_objective_aggregation == "normalize_then_sum":\n(.*?)\n *else:', source,
                      re.DOTALL)
    assert match, "TRL's normalize_then_sum block moved: re-check GDPO against it"
    return textwrap.dedent(match.group(1))


def test_gdpo_advantages_equal_trl_normalize_then_sum() -> None:
    from trl.trainer.utils import nanstd

    generator = torch.Generator().manual_seed(7)
    parts = (torch.rand(3, 4, 2, generator=generator) > 0.5).to(F64)  # 3 prompts x 4 completions x 2 rewards
    parts[:, :, 1] = parts[:, :, 1] * 3.0 + torch.rand(3, 4, generator=generator, dtype=F64)
    parts[1, :, 0] = 1.0  # a flat reward in one group
    parts[2, 3, 1] = float("nan")  # a reward that did not apply
    weights = torch.tensor([1.0, 0.5], dtype=F64)
    flat = parts.view(12, 2)
    owner = types.SimpleNamespace(reward_funcs=[None, None], reward_weights=weights)
    namespace = {"self": owner, "torch": torch, "nanstd": nanstd, "rewards_per_func": flat, "num_generations": 4,
                 "device": "cpu", "unscorable_mask": torch.isnan(flat).all(dim=1)}
    exec(_trl_gdpo_block(), namespace)  # noqa: S102 - TRL's own installed source lines, unchanged
    expected = torch.nan_to_num(namespace["advantages"], nan=0.0)  # TRL's next line
    buffer = RolloutBuffer(
        input_ids=torch.zeros(12, 2, dtype=torch.long), attention_mask=torch.ones(12, 2, dtype=torch.bool),
        completion_mask=torch.ones(12, 2, dtype=torch.bool), rewards=torch.zeros(12, dtype=F64),
        correct=torch.zeros(12, dtype=torch.bool), truncated=torch.zeros(12, dtype=torch.bool), group_size=4,
        temperature=1.0, max_new_tokens=2, reward_parts={"a": flat[:, 0], "b": flat[:, 1]},
        reward_weights={"a": 1.0, "b": 0.5})
    assign_advantages(buffer, Objective.from_arguments(DEFAULTS | {"advantage_mode": "gdpo"}), AdvantageKnobs())
    torch.testing.assert_close(buffer.advantages, expected, **FLOAT32_TOL)
    assert expected.abs().sum() > 0 and not math.isnan(float(expected.sum()))


@pytest.mark.parametrize(("knobs", "config", "names"), [
    ({"clip": {"eps": 0.2, "eps_high": 0.28}, "aggregation": "token-mean"},
     {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28},
     ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "entropy"]),
    ({"loss_variant": "cispo", "clip": {"eps_high": 1.0}}, {"loss_type": "cispo", "epsilon_high": 2.0},
     ["cispo_clip_ratio", "entropy"]),
    ({"loss_variant": "vespo"}, {"loss_type": "vespo"}, ["vespo/phi_seq_mean", "entropy"]),
])
def test_the_figures_trl_logs_equal_ours(knobs: dict, config: dict, names: list[str]) -> None:
    objective = Objective.from_arguments(DEFAULTS | knobs | {"entropy": {"top_quantile": 1.0}})
    logp = OLD + RATIO.log()
    batch = {"old_logp": OLD, "advantages": ADV, "completion_mask": MASK}
    stats = policy_terms(objective, batch, logp, ENTROPIES, MASK, T).stats
    trainer = trl_trainer(**({"max_completion_length": T} | config))
    trl_loss(trainer, logp.clone().requires_grad_(True), OLD, ADV, MASK.long(), entropies=ENTROPIES)
    logged = trainer._metrics["train"]
    for name in names:
        assert stats[name].item() == pytest.approx(logged[name][0], abs=1e-7), name
    assert any(stats[name].item() > 0 for name in names[:-1])  # a mechanism acted on these inputs


def test_gdpo_through_a_run_weighs_the_tasks_rewards_as_trl_does(tmp_path) -> None:
    """configs/trl_style.yaml's task (two TRL reward functions weighted 1.0 and 0.5) with advantage_mode gdpo: the
    buffer carries the task's weights, and its advantages are TRL's normalize_then_sum of its rewards."""
    import lightning.pytorch as pl
    from trl.trainer.utils import nanstd

    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.tasks import DatasetTask

    root = Path(__file__).resolve().parents[1]
    task = DatasetTask(str(root / "data" / "chat-addition" / "train.parquet"), heldout_fraction=0.1,
                       answer_column="solution", rewards=[f"{root}/examples/trl_rewards.py:accuracy",
                                                          f"{root}/examples/trl_rewards.py:brevity"],
                       reward_weights=[1.0, 0.5], failure_reward=-1.0)
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(root / "data" / "tiny-qwen2-chat"), dtype="float32", lora={"rank": 4},
                          advantage_mode="gdpo", kl={"coef": 0.0})
    data = RolloutDataModule(task=task, group_size=4, prompts_per_epoch=4, minibatch_size=16, max_new_tokens=8,
                             val_max_prompts=4)
    trainer = pl.Trainer(max_epochs=1, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, logger=False,
                         default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0)
    trainer.fit(module, data)
    buffer = data.epoch_report.buffer
    assert buffer.reward_weights == {"accuracy": 1.0, "brevity": 0.5}
    flat = torch.stack([buffer.reward_parts["accuracy"], buffer.reward_parts["brevity"]], dim=-1).double()
    owner = types.SimpleNamespace(reward_funcs=[None, None], reward_weights=torch.tensor([1.0, 0.5], dtype=F64))
    namespace = {"self": owner, "torch": torch, "nanstd": nanstd, "rewards_per_func": flat, "num_generations": 4,
                 "device": "cpu", "unscorable_mask": torch.isnan(flat).all(dim=1)}
    exec(_trl_gdpo_block(), namespace)  # noqa: S102 - TRL's own installed source lines, unchanged
    expected = torch.nan_to_num(namespace["advantages"], nan=0.0).to(buffer.advantages.dtype)
    torch.testing.assert_close(buffer.advantages, expected, rtol=0, atol=1e-6)
    assert expected.abs().sum() > 0 and flat[:, 1].isnan().any()  # brevity applies to some rows only (None)

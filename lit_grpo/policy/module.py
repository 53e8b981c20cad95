"""PolicyModule: the LoRA policy, the loss variant and the optimizer (docs/guide.md#layout)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.buffers.epoch import EpochBatches
from lit_grpo.buffers.protocols import ReferenceSource
from lit_grpo.errors import refuse
from lit_grpo.losses import Aggregation, KLEstimator, TurnCredit
from lit_grpo.losses.advantages import AdvantageMode
from lit_grpo.losses.policy import PolicyVariant, RatioLevel
from lit_grpo.losses.surrogates import SapoTemperatures, VespoShape
from lit_grpo.policy import epoch_passes, sampling_view, trained_state
from lit_grpo.policy.advantages import AdvantageKnobs, assign_advantages
from lit_grpo.policy.evaluation import GreedyEvaluation
from lit_grpo.policy.interrupt import SaveOnInterrupt
from lit_grpo.policy.learning_signal import LearningSignalWatch
from lit_grpo.policy.knob_groups import (GROUPS, ClipRange, KLPenalty, LoraAdapter, MemoryUse, TreeAdvantages,
                                         ValueBaseline, flat_names_doc, group, plain_arguments, regroup)
from lit_grpo.policy.logprobs import CHUNK_TOKENS
from lit_grpo.policy.measures import HeldOutMeasures
from lit_grpo.policy.model_loading import load_module_model
from lit_grpo.policy.objective import (Objective, module_config_problems, refuse_base_evaluation,
                                       warn_deprecated_knobs)
from lit_grpo.policy.optimizers import module_optimizers
from lit_grpo.policy.packed import TokenLogprobs
from lit_grpo.policy.policy_step import EntropyCoefficient, PolicyStep
from lit_grpo.policy.risk_features import HeadOnContexts
from lit_grpo.policy.value_head import ValueHead
from lit_grpo.risk.fit import RiskReplay
from lit_grpo.risk.head import RiskHead, RiskHeadSpec
from lit_grpo.run.model_files import BaseDtype
from lit_grpo.run.objective_knobs import FLAT_NAMES, EntropyControl, SamplerCorrection, plain
from lit_grpo.run.rules import choice_problems
from lit_grpo.run.run_callbacks import EVERY_RUN, missing_run_callbacks
from lit_grpo.tree import FlatGroups, StdScope, ValueMode


class PolicyModule(pl.LightningModule):
    """A Hugging Face causal LM with a trainable LoRA adapter, trained with a GRPO-family loss.

    Its state and Lightning's hooks are here, each hook handing its work to a helper (in ``policy/``) that holds its
    own state or is a function of what it is given: the model loads with ``model_loading.py``, its optimizers are
    ``optimizers.py``'s; the rollout side's view (``buffers.protocols.SamplingPolicy``) and ``use_reference`` call
    ``sampling_view.py``; ``prepare_epoch`` readies the ``EpochBatches`` the train loader hands over with
    ``epoch_passes.py`` and ``advantages.py``; a training step's loss is its ``PolicyStep``'s (``policy_step.py``);
    the policy measured on held-out prompts outside Lightning's loops and the run's end when the completion budget
    is spent are its ``HeldOutMeasures``' (``measures.py``, with the ``GreedyEvaluation`` Lightning's validation and
    test steps feed); what checkpoints hold (``state_dict``: always the trained weights) and the adapter's save are
    ``trained_state.py``'s.

    Args:
        model_name_or_path: a local model directory (relative paths also resolve against the project checkout)
            or a hub id; the default is the tiny model the project ships.
        lora: the trainable LoRA adapter: rank, alpha, dropout, target modules (``knob_groups.LoraAdapter``).
        init_adapter: a PEFT adapter directory to continue training from (or to validate / test) instead of a fresh one.
        evaluate_base: validate / test the base model alone (no adapter, checkpoint or fit; docs/guide.md).
        advantage_mode: group advantages: ``raw``, ``centered``, ``grpo``, ``drgrpo``, ``rloo``, ``max``;
            ``gdpo`` (each of the task's rewards normalised in its group, weighted, summed, normalised over the
            batch: TRL's ``normalize_then_sum``); or ``gae``: PPO, with a value head on the policy's hidden states
            and per-token GAE advantages (whitened over the buffer's counted tokens).
        std_scope: for ``grpo``, normalise by the std of each ``group`` or of the whole ``batch``.
        loss_variant: a row of the loss variants' table, ``lit_grpo.losses.variants`` (its formula, defaults, knobs
            and statistics; docs/guide.md#loss-family), or ``dpo``: online DPO on each group's best-versus-worst pair.
        dpo_beta: DPO's beta (``dpo`` only).
        clip: the clip's epsilons and two-sided delta, each unset the variant's row's (``ClipRange``).
        ratio_level: the ratio per ``token`` or per ``sequence`` (exp of the mean log ratio); ``None``: the row's.
        aggregation: ``seq-mean`` (GRPO), ``token-mean`` (DAPO), ``constant`` (Dr. GRPO, divides by
            ``max_new_tokens``; a tool task's chain by its ``max_completion_length``, as TRL) or ``seq-sum``
            (LUSPO); a tool task's chain weighs an episode as one sequence (TRL's multi-turn completion), its
            sequence ratio taken over the episode; the normaliser counts the whole optimizer step (``None``: the row's).
        kl: the KL penalty to the reference policy: weight, estimator, where it applies (the loss, or grouped
            rollouts' rewards), the off-policy ratio correction (``KLPenalty``).
        loss_knobs: the variant's knobs, the fields of its row's knob type (``None``: its defaults); ``sapo``,
            ``vespo``: their old names (deprecated).
        entropy: entropy control, the high-entropy token mask and the entropy bonus (``EntropyControl``); ``None``.
        off_policy_mask_threshold: DeepSeek-V3.2's off-policy sequence mask: a negative-advantage sequence whose mean
            KL(sampler || pi_theta) over its tokens exceeds this leaves the loss; ``None``: off.
        tree: ``tree`` rollouts' node values, advantage scale and flat sibling groups (``TreeAdvantages``).
        turn_credit: ``chains``' credit per turn: ``episode``, ``reward_to_go`` or ``per_turn_index`` (guide.md).
        value: PPO's value head and GAE (``advantage_mode: gae`` only): loss weight, clip, gamma, lambda
            (``ValueBaseline``).
        risk: a distributional risk head at each decision point of tree rollouts (``lit_grpo.risk.head``), trained
            with the policy on the returns of inferring; the ``RiskThreshold`` callback turns it into the
            infer/defer rule. ``None``: no head.
        head_lr: the learning rate of the value and risk heads, in their own optimizer parameter group (``None``:
            the optimizer's own, as for the adapter).
        old_logp_source: pi_old from the ``sampler``'s log-probs, or recomputed by the ``trainer``.
        sampler_correction: importance sampling against the sampler (``SamplerCorrection``): pi_old recomputed by the
            trainer, each token's surrogate weighted by pi_old / pi_sampler truncated or masked (TIS, MIS). ``None``
            turns it off (right for fp32, where the two agree).
        attn_implementation: the transformers attention kernel: ``sdpa`` or ``eager``.
        trust_remote_code: allow the model's own code from its repository to run; off unless you trust it.
        dtype: the dtype of the frozen base weights: ``auto`` (the checkpoint's own on a GPU; on a CPU without
            arithmetic in the checkpoint's half precision, float32 where it fits in memory, docs/guide.md#dtype),
            ``float32``, ``bfloat16`` (half the memory) or ``float16``. The LoRA weights, their gradients and
            optimizer state, the heads and every log-softmax stay in float32.
        memory: what trades memory for compute: gradient checkpointing, output-head chunks, no-grad batches, the
            packed forward (``MemoryUse``).
        optimizer: the optimizer over the trainable parameters; ``None`` means AdamW(lr=5e-4, weight_decay=0).
        lr_scheduler: an optional learning-rate scheduler, stepped every optimizer step (``--model.lr_scheduler StepLR
            --model.lr_scheduler.step_size 100``); a plateau scheduler is stepped once an epoch on its metric:
            ``lightning.pytorch.cli.ReduceLROnPlateau`` with ``monitor`` (``rollout/reward_mean``, say).
    """

    # what configure_model loads beside the policy and the heads (submodules, set in __init__)
    tokenizer: Any = None
    stop_token_ids: tuple[int, ...] = ()  # what ends a completion
    token_logprobs: TokenLogprobs | None = None  # the trainer's log-prob passes
    policy_step: PolicyStep | None = None  # a training step's loss
    risk_replay: RiskReplay | None = None  # the detached risk head's labelled states (risk/fit.py)
    reference_source: ReferenceSource | None = None  # what pi_ref is (use_reference); None: the base model
    risk_fit_stats: Mapping[str, float] = MappingProxyType({})  # the last fit of the detached risk head
    preparation_timings: Mapping[str, float] = MappingProxyType({})  # the last epoch's no-grad passes and risk fit

    def __init__(
        self,
        model_name_or_path: str = "data/tiny-llama",
        lora: LoraAdapter = LoraAdapter(),
        init_adapter: str | None = None,
        evaluate_base: bool = False,
        advantage_mode: Literal[AdvantageMode, "gdpo", "gae"] = "grpo",
        std_scope: Literal["group", "batch"] = "group",
        loss_variant: Literal[PolicyVariant, "dpo"] = "clip",
        dpo_beta: float = 0.1,
        clip: ClipRange = ClipRange(),
        ratio_level: RatioLevel | None = None,
        aggregation: Aggregation | None = None,
        kl: KLPenalty = KLPenalty(),
        loss_knobs: dict[str, Any] | None = None,
        sapo: SapoTemperatures | None = None,
        vespo: VespoShape | None = None,
        entropy: EntropyControl | None = None,
        off_policy_mask_threshold: float | None = None,
        tree: TreeAdvantages = TreeAdvantages(),
        turn_credit: TurnCredit = "episode",
        value: ValueBaseline = ValueBaseline(),
        risk: RiskHeadSpec | None = None,
        head_lr: float | None = None,
        old_logp_source: Literal["sampler", "trainer"] = "sampler",
        sampler_correction: SamplerCorrection | None = None,
        attn_implementation: Literal["sdpa", "eager"] = "sdpa",
        trust_remote_code: bool = False,
        dtype: Literal["auto", BaseDtype] = "auto",
        memory: MemoryUse = MemoryUse(),
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
        # the groups' flat names (deprecated): away from their default, each fills its group's field with a warning
        lora_rank: int = 16, lora_alpha: float = 32.0, lora_dropout: float = 0.0,
        lora_target_modules: str | list[str] = "all-linear", kl_coef: float = 0.04, kl_estimator: KLEstimator = "k3",
        kl_in: Literal["loss", "reward"] = "loss", kl_ratio_correction: bool = False, clip_eps: float | None = None,
        clip_eps_high: float | None = None, clip_delta: float | None = None, tree_value_mode: ValueMode = "mean",
        tree_std_scope: StdScope = "tree", tree_flat_groups: FlatGroups = "count", vf_coef: float = 0.5,
        vf_clip: float | None = 0.2, gamma: float = 1.0, gae_lambda: float = 0.95, gradient_checkpointing: bool = False,
        logprob_chunk_tokens: int = CHUNK_TOKENS, no_grad_batch_tokens: int = 16384, packed_forward: bool = True,
    ) -> None:
        super().__init__()
        given = {k: v for k, v in locals().items() if k not in ("self", "__class__", "optimizer", "lr_scheduler")}
        refuse("invalid PolicyModule configuration", self.config_problems(given))  # its own knobs' rules too
        arguments, _, flat_names = regroup(given)  # every reader reads these: the groups, no flat name
        warn_deprecated_knobs(arguments, flat_names)
        self.save_hyperparameters(plain_arguments(arguments))  # weights_only checkpoints: plain mappings
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.strict_loading = False  # checkpoints hold the trainable weights only, not the frozen base
        self.objective = Objective.from_arguments(arguments)
        self.entropy_coef = EntropyCoefficient.of(self.objective.entropy)  # None without an entropy bonus
        self.risk_spec = None if risk is None else RiskHeadSpec(**plain(risk))
        self.policy, self.value_head, self.risk_head = None, None, None  # submodules once configure_model built them
        self.evaluation = GreedyEvaluation()  # a submodule, so that its metric states move with the policy
        self.measures = HeldOutMeasures(self.evaluation)

    @classmethod
    def config_problems(cls, args: dict[str, Any]) -> list[str]:
        """Every problem with these arguments on their own: choices (the signature's ``Literal`` types, the groups'
        fields' in ``regroup``), the spelling of the groups (``knob_groups.regroup``) and values."""
        arguments, problems, _ = regroup(args)
        ungrouped = {name: value for name, value in args.items() if name not in (*FLAT_NAMES, *GROUPS)}
        return choice_problems(cls.__init__, ungrouped) + problems + module_config_problems(arguments)

    # --- model -------------------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        hp, memory, value = self.hparams, group(self.hparams, "memory"), group(self.hparams, "value")
        self.tokenizer, self.policy, self.stop_token_ids = load_module_model(hp, self._trainer)
        self.token_logprobs = TokenLogprobs(self.policy, memory.packed_forward, memory.logprob_chunk_tokens)
        trained_state.OnlyTrainedMissing(self)  # from now on a load misses the frozen base in no state dict
        spec, hidden = self.risk_spec, self.policy.config.hidden_size
        self.value_head = ValueHead(hidden) if hp.advantage_mode == "gae" else None
        self.risk_head = None if spec is None else RiskHead(hidden, spec)
        self.risk_replay = RiskReplay(spec.replay_size) if spec is not None and spec.detach else None
        joint_risk = None if spec is None or spec.detach else (self.risk_head, spec.coef)
        value = None if self.value_head is None else (self.value_head, value.coef, value.clip)
        self.policy_step = PolicyStep(self.objective, self.policy, self.token_logprobs, memory.logprob_chunk_tokens,
                                      self.entropy_coef, hp.dpo_beta, joint_risk, value)

    def configure_callbacks(self) -> list[Any]:
        """What every run needs, under the command or any ``Trainer``: ``NonFiniteGuard``, ``RngState``,
        ``StopOnSigterm``, the adapter kept on an interrupt (``SaveOnInterrupt``) and a run without a learning signal
        named (``LearningSignalWatch``), each unless the trainer's callbacks hold one (a user's own keeps its settings)."""
        return missing_run_callbacks(self.trainer.callbacks, (*EVERY_RUN, SaveOnInterrupt, LearningSignalWatch))

    def configure_optimizers(self) -> Any:
        heads = [head for head in (self.value_head, self.risk_head) if head is not None]
        return module_optimizers(self, heads, self.hparams.head_lr, self.optimizer_factory, self.scheduler_factory)

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        if self.entropy_coef is not None:  # the adaptive coefficient, from this step's entropy over every rank
            self.entropy_coef.step(*epoch_passes.ranks(self._trainer))

    # --- what the rollout side sees (buffers.protocols.SamplingPolicy) and callbacks set: sampling_view.py ---------
    @property
    def model_arguments(self) -> Mapping[str, Any]:
        return dict(self.hparams)

    @property
    def model_name(self) -> str:
        return str(self.hparams.model_name_or_path)

    @property
    def context_length(self) -> int | None:
        return None if self.policy is None else sampling_view.context_length(self.policy.config)

    def weights_version(self) -> int:
        return sampling_view.weights_version(self._trainer)

    def adapter_copy(self) -> dict[str, torch.Tensor]:
        return sampling_view.adapter_weights(self.policy)

    def adapter_swapped(self, adapter: dict[str, torch.Tensor] | None) -> AbstractContextManager[None]:
        return sampling_view.adapter_swapped(self.policy, adapter)

    def use_reference(self, source: ReferenceSource | None) -> None:
        """Compute π_ref with ``source``'s adapter weights (``ReferencePolicy``); ``None``: the base model."""
        self.reference_source = source

    def reference_active(self) -> AbstractContextManager[None]:
        return sampling_view.reference_active(self.policy, self.reference_source)

    def context_risk(self) -> HeadOnContexts | None:
        """The risk head at open contexts, for the rollout side's infer/defer rule; None without a head."""
        return None if self.risk_head is None else HeadOnContexts(self.policy, self.risk_head, self.tokenizer.pad_token_id)

    @property
    def risk_probe_prompts(self) -> int:
        """Prompts of greedy probes the DataModule labels each epoch for the detached risk head (0: none)."""
        return self.risk_spec.probe_prompts if self.risk_replay is not None else 0

    # --- the epoch's buffer: no-grad passes, advantages, the risk head's fit (docs/guide.md#layout) ------------------
    def on_train_epoch_start(self) -> None:
        epoch = epoch_passes.served_epoch(self.trainer)
        if epoch is not None and epoch.batches is None:
            self.prepare_epoch(epoch)

    def prepare_epoch(self, epoch: EpochBatches) -> None:
        """Prepare the buffer the DataModule handed over (``EpochBatches``, the train loader's dataset), then cut
        its minibatches with each optimizer step's counts over all ranks."""
        clock = time.perf_counter()
        buffer = epoch.buffer
        self.run_no_grad_passes(buffer)
        self.assign_advantages(buffer)
        done = time.perf_counter()
        self.preparation_timings = {"no_grad_passes": done - clock}
        if self.risk_replay is not None and buffer.risk_probes is not None:  # the detached head's fit (its replay)
            self.risk_fit_stats = epoch_passes.fit_detached_risk_head(
                self.policy, self.risk_head, self.risk_replay, buffer.risk_probes, self.tokenizer.pad_token_id,
                self.risk_spec, epoch_passes.ranks(self._trainer))
            self.preparation_timings["risk_head_fit"] = time.perf_counter() - done
        epoch_passes.serve_minibatches(epoch, self.trainer, self.objective.aggregation)

    def run_no_grad_passes(self, buffer: RolloutBuffer) -> None:
        """pi_old (unless the sampler's log-probs are used), pi_ref log-probs and old values of the whole buffer."""
        recompute_old = self.hparams.old_logp_source == "trainer" or bool(self.objective.sampler_correction)
        reference = self.reference_active if self.objective.needs_reference else None
        epoch_passes.no_grad_passes(buffer, self.policy, self.token_logprobs, self.device,
                                    group(self.hparams, "memory").no_grad_batch_tokens, recompute_old, reference,
                                    self.value_head)

    def assign_advantages(self, buffer: RolloutBuffer) -> None:
        """The buffer's advantages (``policy/advantages.py``) with this module's knobs."""
        knobs = AdvantageKnobs.of(self.hparams, value_head=self.value_head is not None)
        assign_advantages(buffer, self.objective, knobs, epoch_passes.ranks(self._trainer))

    # --- training ----------------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, Any] | None:
        return self.policy_step(batch, batch_idx, self.log, self.trainer)

    # --- held-out measures and the budget's end: measures.py -----------------------------------------------------
    def setup(self, stage: str) -> None:
        refuse_base_evaluation(self.hparams.evaluate_base, self.trainer.ckpt_path, stage)
        if stage == "fit":
            self.measures.warn_without_source(self.trainer)

    def on_train_start(self) -> None:
        self.measures.before_training(self.trainer, self.logger)

    def on_train_epoch_end(self) -> None:
        self.measures.end_if_budget_spent(self.trainer, epoch_passes.served_epoch(self.trainer), self)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self.evaluation.update(batch)

    def on_validation_epoch_end(self) -> None:
        self.evaluation.log_to(self, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.evaluation.update(batch)

    def on_test_epoch_end(self) -> None:
        self.evaluation.log_to(self, "test")

    # --- what checkpoints and the final adapter keep: trained_state.py --------------------------------------------
    def state_dict(self, *, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Any:
        """The trained weights (the parameters with ``requires_grad``), always: bare as Lightning asks for a
        checkpoint, or under ``prefix`` into ``destination`` when a wrapping module's ``state_dict`` recurses."""
        return trained_state.trained_weights(self.named_parameters(), destination, prefix, keep_vars)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """What ``state_dict`` gives back: only a trained weight is reported missing (``OnlyTrainedMissing``)."""
        keys = super().load_state_dict(state_dict, strict=False, assign=assign)
        return trained_state.refuse_incomplete(keys, strict, type(self).__name__)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trained_state.keep_trained_state(checkpoint, self.named_parameters(), self.risk_replay, self.entropy_coef)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trained_state.restore_trained_state(checkpoint, self.named_parameters(), self._trainer,
                                            self.hparams.model_name_or_path, self.risk_replay, self.entropy_coef)

    def on_fit_end(self) -> None:
        self.save_adapter(trained_state.adapter_directory(self.trainer))

    def save_adapter(self, target: Any) -> Any:
        """The trained adapter in PEFT format under ``target`` (rank 0 writes; ``trained_state.save_adapter``)."""
        return trained_state.save_adapter(self.policy, self.tokenizer, target)


PolicyModule.__init__.__doc__ = flat_names_doc()  # --help names each deprecated flat name's new spelling

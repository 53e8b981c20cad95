"""PolicyModule: the LoRA policy, the loss variant and the optimizer (docs/guide.md#layout)."""

from __future__ import annotations

import time
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_grpo.buffers.buffer import RolloutBuffer, policy_mask
from lit_grpo.buffers.epoch import EpochBatches
from lit_grpo.buffers.tree_layout import FlatGroups
from lit_grpo.buffers.positions import batch_constraint
from lit_grpo.errors import InputError, refuse
from lit_grpo.losses import Aggregation, KLEstimator, aggregation_terms
from lit_grpo.losses.advantages import AdvantageMode
from lit_grpo.losses.policy import PolicyVariant, RatioLevel
from lit_grpo.policy.advantages import AdvantageKnobs, assign_advantages
from lit_grpo.policy.evaluation import GreedyEvaluation
from lit_grpo.policy.head_losses import head_losses, nothing_to_learn, share
from lit_grpo.policy.interrupt import SaveOnInterrupt
from lit_grpo.policy.learning_signal import LearningSignalWatch
from lit_grpo.policy.logprobs import (
    CHUNK_TOKENS,
    body_and_head,
    head_problem,
    logprobs_and_hidden,
    sampler_agreement,
)
from lit_grpo.policy.measures import HeldOutMeasures
from lit_grpo.policy.model_loading import completion_stop_ids, load_policy, run_base_dtype
from lit_grpo.policy.objective import Objective, module_config_problems
from lit_grpo.policy.online_dpo import online_dpo_loss
from lit_grpo.policy.optimizers import module_optimizers
from lit_grpo.policy.policy_step import EntropyCoefficient, policy_terms
from lit_grpo.policy.packed import TokenLogprobs
from lit_grpo.policy.risk_features import HeadOnContexts, fit_on_replay
from lit_grpo.policy.sampling_view import SamplingView
from lit_grpo.policy.trained_state import TrainedState
from lit_grpo.policy.value_head import ValueHead, old_values
from lit_grpo.risk.fit import RiskReplay
from lit_grpo.risk.head import RiskHead, RiskHeadSpec
from lit_grpo.run.distributed import global_step_denominators
from lit_grpo.run.model_files import BaseDtype, load_tokenizer, resolve_model_path
from lit_grpo.run.objective_knobs import EntropyControl, SamplerCorrection, SapoTemperatures, VespoShape, plain
from lit_grpo.run.rules import choice_problems, cross_knob_problems
from lit_grpo.run.run_callbacks import EVERY_RUN, missing_run_callbacks
from lit_grpo.tree import StdScope, ValueMode


class PolicyModule(SamplingView, TrainedState, HeldOutMeasures):
    """A Hugging Face causal LM with a trainable LoRA adapter, trained with a GRPO-family loss.

    The rollout side sees it as a ``buffers.protocols.SamplingPolicy`` (``SamplingView``); callbacks configure it
    through ``use_reference``; it reads the epoch's buffer and ``RolloutReport`` from the ``EpochBatches`` the train
    loader hands over. It delegates: the policy measured on held-out prompts, inside Lightning's validation and test
    loops and outside them (the data module's ``ServesHeldOutScores``), and the run's end when the report says the
    completion budget is spent, to ``HeldOutMeasures`` (``policy/measures.py``); what a checkpoint holds and the
    adapter's save to ``TrainedState`` (``policy/trained_state.py``); the rollout side's view to ``SamplingView``.

    Args:
        model_name_or_path: a local model directory (relative paths also resolve against the project checkout)
            or a hub id; the default is the tiny model the project ships.
        lora_rank: LoRA rank r.
        lora_alpha: LoRA alpha (the update is scaled by alpha / r).
        lora_dropout: dropout on the LoRA input during training updates; 0 keeps the update forward identical
            to the sampler's.
        lora_target_modules: module names to adapt, or ``all-linear`` for every linear layer but the output head.
        init_adapter: a PEFT adapter directory to continue training from instead of a fresh adapter.
        advantage_mode: group advantages: ``raw``, ``centered``, ``grpo``, ``drgrpo``, ``rloo``, ``max``;
            ``gdpo`` (each of the task's rewards normalised in its group, weighted, summed, normalised over the
            batch: TRL's ``normalize_then_sum``); or ``gae``: PPO, with a value head on the policy's hidden states
            and per-token GAE advantages (whitened over the buffer's counted tokens).
        std_scope: for ``grpo``, normalise by the std of each ``group`` or of the whole ``batch``.
        loss_variant: ``reinforce``, ``unclipped``, ``clip`` (PPO/GRPO), ``gspo`` (sequence-level ratio), ``luspo``
            (gspo summed over each sequence's tokens), ``cispo`` (the detached ratio, capped, on REINFORCE), ``sapo``
            (a soft gate for the clip), ``vespo`` (a smooth sequence weight on REINFORCE), or ``dpo``: online DPO on
            each group's best-versus-worst pair (tied groups give none), against pi_ref (docs/guide.md#the-math).
        dpo_beta: DPO's beta (``dpo`` only).
        clip_eps: lower clip epsilon; ``None`` means 0.2, or 3e-4 for ``gspo`` and ``luspo``.
        clip_eps_high: upper clip epsilon (DAPO's clip-higher); ``None`` means ``clip_eps``, 4e-4 for ``gspo`` and
            ``luspo`` when ``clip_eps`` is unset too, 4.0 for ``cispo`` (whose cap on the ratio is 1 + this).
        clip_delta: two-sided clipping (INTELLECT-2): delta caps the unclipped term's ratio (> 1 + clip_eps_high).
        ratio_level: the importance ratio per ``token`` or per ``sequence`` (exp of the mean log ratio); ``None``:
            sequence for ``gspo`` and ``luspo``, token for the others.
        aggregation: ``seq-mean`` (GRPO), ``token-mean`` (DAPO), ``constant`` (Dr. GRPO, divides by
            ``max_new_tokens``) or ``seq-sum`` (LUSPO); the normaliser counts the whole optimizer step. ``None``:
            the variant's own (seq-sum for luspo, token-mean for cispo and vespo, else seq-mean).
        kl_coef: beta, the weight of the KL to the reference policy; 0 skips the reference pass.
        kl_estimator: ``k1``, ``k2`` or ``k3`` per-token KL estimate.
        kl_in: ``loss`` adds beta * KL to the loss (GRPO); ``reward`` subtracts beta * sum of k1 from each
            sequence's reward before the advantages (grouped rollouts only).
        kl_ratio_correction: each token's KL term times pi_theta / pi_old (unbiased off-policy; DeepSeek-V3.2's).
        sapo: SAPO's temperatures (``SapoTemperatures``). vespo: VESPO's weight shape (``VespoShape``).
        entropy: entropy control, the high-entropy token mask and the entropy bonus (``EntropyControl``); ``None``.
        off_policy_mask_threshold: DeepSeek-V3.2's off-policy sequence mask: a negative-advantage sequence whose mean
            KL(sampler || pi_theta) over its tokens exceeds this leaves the loss; ``None``: off.
        tree_value_mode: node values of ``tree`` rollouts: ``mean`` (Bellman expectation over the sampled
            children), ``optimal_stopping`` (the better of answering now and asking, by the sampled future) or
            ``optimal_stopping_split`` (that choice made on one half of the children and scored on the other,
            halves swapped and averaged; the mean where a kind has one child: not biased upward).
        tree_std_scope: what divides a ``tree`` rollout's sibling-relative advantages: the std of the whole
            ``tree``'s leaf returns, of each ``siblings`` group's Q, or nothing (``none``: advantages in the
            reward's units, as ``drgrpo`` leaves chains; docs/benchmarks.md compares them).
        tree_flat_groups: a ``tree``'s rows in flat sibling groups (advantage exactly 0, only children included):
            ``count`` keeps them in the loss and its normaliser, ``drop`` leaves them out as DAPO leaves flat groups.
        vf_coef: weight of the value loss (``gae`` only).
        vf_clip: PPO's value clipping range around the old values; ``None`` turns it off.
        gamma: GAE discount.
        gae_lambda: GAE lambda.
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
        gradient_checkpointing: keep one activation per layer and recompute the rest in backward (non-reentrant,
            so it works with PEFT's frozen embeddings and the packed forward): activation memory drops from every
            layer's intermediates to one layer's, for about a third more compute.
        logprob_chunk_tokens: tokens per output-head chunk: log-probs are computed from the last hidden states of
            the counted tokens only, this many at a time, each chunk's ``[tokens, vocab]`` logits recomputed in
            backward instead of kept (docs/guide.md#your-own-model). Lower it for a larger vocabulary or less memory.
        no_grad_batch_tokens: padded tokens per forward in the no-grad passes (pi_old, pi_ref, old values).
        packed_forward: compute each shared prefix once (a group's prompt, a tree node's ancestors) by packing rows
            into one with a 4-D ancestor mask (docs/guide.md#your-own-model); same log-probs and gradients as the
            padded forward. Falls back to the padded forward, with an info message, where the attention kernel takes
            no custom mask. PPO's value-head forward (``advantage_mode: gae``) stays padded.
        optimizer: the optimizer over the trainable parameters; ``None`` means AdamW(lr=5e-4, weight_decay=0).
        lr_scheduler: an optional learning-rate scheduler, stepped every optimizer step (``--model.lr_scheduler StepLR
            --model.lr_scheduler.step_size 100``); a plateau scheduler is stepped once an epoch on its metric:
            ``lightning.pytorch.cli.ReduceLROnPlateau`` with ``monitor`` (``rollout/reward_mean``, say).
    """

    def __init__(
        self,
        model_name_or_path: str = "data/tiny-llama",
        lora_rank: int = 16,
        lora_alpha: float = 32.0,
        lora_dropout: float = 0.0,
        lora_target_modules: str | list[str] = "all-linear",
        init_adapter: str | None = None,
        advantage_mode: Literal[AdvantageMode, "gdpo", "gae"] = "grpo",
        std_scope: Literal["group", "batch"] = "group",
        loss_variant: Literal[PolicyVariant, "dpo"] = "clip",
        dpo_beta: float = 0.1,
        clip_eps: float | None = None,
        clip_eps_high: float | None = None,
        clip_delta: float | None = None,
        ratio_level: RatioLevel | None = None,
        aggregation: Aggregation | None = None,
        kl_coef: float = 0.04,
        kl_estimator: KLEstimator = "k3",
        kl_in: Literal["loss", "reward"] = "loss",
        kl_ratio_correction: bool = False,
        sapo: SapoTemperatures = SapoTemperatures(),
        vespo: VespoShape = VespoShape(),
        entropy: EntropyControl | None = None,
        off_policy_mask_threshold: float | None = None,
        tree_value_mode: ValueMode = "mean",
        tree_std_scope: StdScope = "tree",
        tree_flat_groups: FlatGroups = "count",
        vf_coef: float = 0.5,
        vf_clip: float | None = 0.2,
        gamma: float = 1.0,
        gae_lambda: float = 0.95,
        risk: RiskHeadSpec | None = None,
        head_lr: float | None = None,
        old_logp_source: Literal["sampler", "trainer"] = "sampler",
        sampler_correction: SamplerCorrection | None = None,
        attn_implementation: Literal["sdpa", "eager"] = "sdpa",
        trust_remote_code: bool = False,
        dtype: Literal["auto", BaseDtype] = "auto",
        gradient_checkpointing: bool = False,
        logprob_chunk_tokens: int = CHUNK_TOKENS,
        no_grad_batch_tokens: int = 16384,
        packed_forward: bool = True,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__", "optimizer", "lr_scheduler")}
        # the rules between its own knobs too (the module alone, before it meets a data module)
        problems = self.config_problems(arguments) + cross_knob_problems(arguments, None)
        refuse("invalid PolicyModule configuration", problems)
        # hparams go into checkpoints, which load with weights_only=True: the grouped knobs as plain mappings there
        risk, sapo, vespo, entropy, sampler_correction = map(plain, (risk, sapo, vespo, entropy, sampler_correction))
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.objective = Objective.from_arguments(arguments)
        self.entropy_coef = EntropyCoefficient.of(self.objective.entropy)  # None without an entropy bonus
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.strict_loading = False  # checkpoints hold the trainable weights only, not the frozen base
        self.policy: Any = None  # the PEFT model and its tokenizer (configure_model)
        self.tokenizer: Any = None
        self.stop_token_ids: tuple[int, ...] = ()  # what ends a completion (configure_model)
        self.value_head: ValueHead | None = None  # the heads, built in configure_model when configured
        self.risk_head: RiskHead | None = None
        self.risk_spec = None if risk is None else RiskHeadSpec(**plain(risk))
        self.risk_replay: RiskReplay | None = None  # the detached head's labelled states (risk/fit.py)
        self.risk_fit_stats: dict[str, float] = {}
        self.token_logprobs: TokenLogprobs | None = None
        self.evaluation = GreedyEvaluation()
        self.preparation_timings: dict[str, float] = {}  # the last epoch's no-grad passes and risk head fit

    @classmethod
    def config_problems(cls, args: dict[str, Any]) -> list[str]:
        """Every problem with these arguments on their own: choices (the signature's ``Literal`` types) and values."""
        return choice_problems(cls.__init__, args) + module_config_problems(args)

    # --- model -------------------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        hp = self.hparams
        path = resolve_model_path(hp.model_name_or_path)
        self.tokenizer = load_tokenizer(path, hp.trust_remote_code)
        self.policy = load_policy(
            path, hp.lora_rank, hp.lora_alpha, hp.lora_dropout, hp.lora_target_modules,
            hp.init_adapter, hp.attn_implementation, hp.trust_remote_code,
            run_base_dtype(path, hp.dtype, self._trainer, hp.trust_remote_code), hp.gradient_checkpointing)
        problem = head_problem(self.policy)
        if problem:
            raise InputError(f"model_name_or_path: {problem}")
        self.stop_token_ids = completion_stop_ids(self.tokenizer, self.policy)
        self.token_logprobs = TokenLogprobs(self.policy, hp.packed_forward, hp.logprob_chunk_tokens)
        if hp.advantage_mode == "gae":
            self.value_head = ValueHead(self.policy.config.hidden_size)
        if self.risk_spec is not None:
            self.risk_head = RiskHead(self.policy.config.hidden_size, self.risk_spec)
            self.risk_replay = RiskReplay(self.risk_spec.replay_size) if self.risk_spec.detach else None

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
            self.entropy_coef.step(*self.ranks())

    # --- the epoch's buffer: no-grad passes, advantages, the risk head's fit (docs/guide.md#layout) ------------------
    def on_train_epoch_start(self) -> None:
        """Prepare the buffer the DataModule handed over (``EpochBatches``, the train loader's dataset), then cut
        its minibatches with each optimizer step's counts over all ranks."""
        epoch = getattr(self.trainer.train_dataloader, "dataset", None)
        if isinstance(epoch, EpochBatches) and epoch.batches is None:
            self.prepare_epoch(epoch)

    def prepare_epoch(self, epoch: EpochBatches) -> None:
        clock = time.perf_counter()
        buffer = epoch.buffer
        self.run_no_grad_passes(buffer)
        self.assign_advantages(buffer)
        done = time.perf_counter()
        self.preparation_timings = {"no_grad_passes": done - clock}
        if self.risk_replay is not None and buffer.risk_probes is not None:
            self.fit_risk_head(buffer.risk_probes)
            self.preparation_timings["risk_head_fit"] = time.perf_counter() - done
        trainer = self.trainer
        batches = epoch.serve(trainer.accumulate_grad_batches, self.objective.aggregation)
        global_step_denominators(batches, trainer.strategy, trainer.world_size)  # over all ranks

    def run_no_grad_passes(self, buffer: RolloutBuffer) -> None:
        """pi_old (unless the sampler's log-probs are used) and pi_ref log-probs of the whole buffer."""
        batch_tokens = self.hparams.no_grad_batch_tokens
        args = (buffer.input_ids.to(self.device), buffer.attention_mask.to(self.device))
        rows = (*args, buffer.completion_mask.to(self.device), buffer.temperature, batch_tokens)
        constraint = buffer.first_token_constraint()  # the risk rule's forced defers, scored as sampled
        if self.hparams.old_logp_source == "trainer" or self.objective.sampler_correction or buffer.sampler_logp is None:
            buffer.old_logp = self.token_logprobs.batched(self.policy, *rows, constraint).cpu()
        else:
            buffer.old_logp = buffer.sampler_logp
        if self.objective.needs_reference:
            with self.reference_active():
                buffer.ref_logp = self.token_logprobs.batched(self.policy, *rows, constraint).cpu()
        if self.value_head is not None:
            buffer.values = old_values(self.policy, self.value_head, *args, batch_tokens).cpu()

    def context_risk(self) -> HeadOnContexts | None:
        """The risk head at open contexts, for the rollout side's infer/defer rule; None without a head."""
        return None if self.risk_head is None else HeadOnContexts(self.policy, self.risk_head, self.tokenizer.pad_token_id)

    @property
    def risk_probe_prompts(self) -> int:
        """Prompts of greedy probes the DataModule labels each epoch for the detached risk head (0: none)."""
        return self.risk_spec.probe_prompts if self.risk_replay is not None else 0

    def fit_risk_head(self, labels: Any) -> None:
        """The detached risk head's fit of the epoch on its replay (``risk_fit.fit_on_replay``); under DDP every
        rank then takes rank 0's head, so the rule is the same everywhere."""
        spec = self.risk_spec
        self.risk_fit_stats = fit_on_replay(self.policy, self.risk_head, self.risk_replay, labels,
                                            self.tokenizer.pad_token_id, spec.fit_steps, spec.fit_lr)
        if self._trainer is not None and self.trainer.world_size > 1:
            self.risk_head.load_state_dict(self.trainer.strategy.broadcast(self.risk_head.state_dict(), src=0))

    def assign_advantages(self, buffer: RolloutBuffer) -> None:
        """The buffer's advantages (``rollout_advantages.assign_advantages``) with this module's knobs."""
        hp = self.hparams
        knobs = AdvantageKnobs(hp.std_scope, hp.tree_value_mode, hp.tree_std_scope, hp.gamma, hp.gae_lambda,
                               value_head=self.value_head is not None, tree_flat_groups=hp.tree_flat_groups)
        assign_advantages(buffer, self.objective, knobs, self.ranks())

    def ranks(self) -> tuple[Any, int]:
        """``(strategy, world size)`` for statistics pooled over ranks; ``(None, 1)`` outside a trainer."""
        trainer = self._trainer
        return (None, 1) if trainer is None else (trainer.strategy, trainer.world_size)

    # --- training ----------------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, Any] | None:
        if self.objective.variant == "dpo":
            return self.dpo_step(batch)
        heads = self.joint_risk_head is not None or self.value_head is not None
        if nothing_to_learn(batch, heads, self.trainer.world_size):
            return None  # no optimizer step: AdamW would move the weights by its momentum on a zero gradient
        completion_mask, max_new_tokens = batch["completion_mask"], int(batch["max_new_tokens"])
        args = (batch["input_ids"], batch["attention_mask"])
        constraint, entropy = batch_constraint(batch), self.objective.needs_entropy
        if not heads:
            out = self.token_logprobs(self.policy, *args, completion_mask, float(batch["temperature"]), constraint,
                                      entropy)
        else:
            out, hidden = logprobs_and_hidden(self.policy, *args, float(batch["temperature"]), constraint,
                                              completion_mask, self.hparams.logprob_chunk_tokens, entropy)
        logp, token_entropy = out.unbind(-1) if entropy else (out, None)  # [n, L] each
        counted = policy_mask(batch)  # [n, L]: a tree's rows left out of the loss count in none of its terms
        terms = policy_terms(self.objective, batch, logp, token_entropy, counted, max_new_tokens)
        stats = terms.stats if counted.any() else {}  # a minibatch with nothing counted gives no figures (they'd read 0)
        local_count = aggregation_terms(logp.detach(), counted, self.objective.aggregation, max_new_tokens)[1]
        # each loss is its minibatch mean times the minibatch's share of that loss's count over the optimizer step
        # (every rank's minibatches): a step's gradient is each loss's sum over the step divided by its own count
        loss, reported = terms.loss * share(local_count, batch["step_denominator"]), terms.loss.detach()
        if heads:
            risk = None if self.joint_risk_head is None else (self.joint_risk_head, self.risk_spec.coef)
            value = None if self.value_head is None else (self.value_head, self.hparams.vf_coef, self.hparams.vf_clip)
            scaled, unscaled, head_stats = head_losses(hidden, batch, body_and_head(self.policy)[1], risk, value)
            loss, reported, stats = loss + scaled, reported + unscaled, {**stats, **head_stats}
        if batch_idx == 0 and "sampler_logp" in batch:  # no update yet this epoch: logp is the trainer's pi_old
            stats.update(sampler_agreement(logp.detach(), batch["sampler_logp"], completion_mask))
        self.log("train/loss", reported, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(logp),
                 sync_dist=True)
        # Lightning divides by the accumulation count and DDP averages over ranks: undo both (docs/guide.md#the-math)
        loss = loss * self.trainer.accumulate_grad_batches * self.trainer.world_size
        if self.entropy_coef is not None:  # the bonus stays a mean over the step's minibatches and ranks, as TRL's
            self.entropy_coef.observe(terms.entropy_sums)
            loss, stats["entropy_coef"] = loss - self.entropy_coef.applied() * terms.entropy, self.entropy_coef.coef
        return {"loss": loss, "stats": stats}

    @property
    def joint_risk_head(self) -> RiskHead | None:
        """The risk head when it trains jointly with the policy (``risk.detach`` false), else None."""
        return None if self.risk_spec is None or self.risk_spec.detach else self.risk_head

    def dpo_step(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Online DPO: the mean DPO loss over the minibatch's pairs (a minibatch without a pair gives 0)."""
        logp = self.token_logprobs(self.policy, batch["input_ids"], batch["attention_mask"], batch["completion_mask"],
                                   float(batch["temperature"]))
        loss, stats = online_dpo_loss(logp, batch["ref_logp"], batch["completion_mask"], batch["pair_role"],
                                      batch["pair_id"], self.hparams.dpo_beta)
        self.log("train/loss", loss.detach(), prog_bar=True, on_step=True, on_epoch=True, batch_size=len(logp))
        return {"loss": loss, "stats": {f"dpo_{k}": v for k, v in stats.items()}}

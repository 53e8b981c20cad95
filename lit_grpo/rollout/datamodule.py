"""RolloutDataModule: each epoch, fresh rollouts from the current policy, scored and served (docs/guide.md#layout)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import lightning.pytorch as pl
import torch
from jsonargparse import lazy_instance
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lit_grpo.buffers.buffer import RolloutBuffer, minibatch_plan
from lit_grpo.buffers.epoch import EpochBatches
from lit_grpo.buffers.protocols import RiskThresholdSource, SamplingPolicy
from lit_grpo.buffers.report import RolloutReport, frozen
from lit_grpo.engines import HFEngine, RolloutEngine, SamplingSpec
from lit_grpo.engines.base import context_limit
from lit_grpo.errors import refuse
from lit_grpo.risk.probes import probe_records
from lit_grpo.rollout.ahead import RolloutPrefetcher, rollouts_ahead
from lit_grpo.rollout.cursor import PromptCursor
from lit_grpo.rollout.engine_sync import EngineSync
from lit_grpo.rollout.epoch_draw import rollouts_now
from lit_grpo.rollout.eval_sets import EvalSet, as_batches, close_scoring, due_sets, held_out_sets
from lit_grpo.rollout.grouped import GroupedDraw
from lit_grpo.rollout.held_out import HeldOutPrompts, SampledEvaluation, Scores
from lit_grpo.rollout.probes import probe_labels
from lit_grpo.rollout.prompt_check import LongPrompts, check_inputs
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.rollout.rule_outcomes import RuleOutcome, rule_outcome
from lit_grpo.rollout.scoring import TimedScoring
from lit_grpo.rollout.threshold import ThresholdedRule
from lit_grpo.rollout.settings import data_config_problems, fit_problems, resuming_after_finished_epoch
from lit_grpo.rollout.trees import TREE_BRANCHING, grow_epoch_trees, turn_limit
from lit_grpo.run.distributed import minibatch_padding, rank_and_world
from lit_grpo.run.resume import task_notes
from lit_grpo.run.rules import RolloutKind, choice_problems, cross_knob_problems, staleness_problems
from lit_grpo.run.seeds import derived_seed
from lit_grpo.tasks import ArithmeticTask, PromptRecord, Task
from lit_grpo.tasks.tools.rewards import RewardContext, draw_context


class RolloutDataModule(pl.LightningDataModule):
    """Prompts, rollout engine and rewards; regenerates the rollout buffer at the start of every epoch.

    Needs ``Trainer(reload_dataloaders_every_n_epochs=1)`` (the CLI sets it), else the first buffer is reused.

    It delegates: the prompt cursor and the completion budget to ``PromptCursor`` (``rollout/cursor.py``); the grouped
    draw with dynamic sampling and DAPO's overlong terms to ``GroupedDraw`` (``rollout/grouped.py``); pushing the
    policy to ``EngineSync`` (``rollout/engine_sync.py``); drawing now to ``rollouts_now`` (``rollout/epoch_draw.py``),
    ahead to ``RolloutPrefetcher`` and ``rollouts_ahead`` (``rollout/ahead.py``); trees and greedy episodes to
    ``rollout/trees.py``, under the rule of ``ThresholdedRule`` (``rollout/threshold.py``); scoring, timed, to
    ``TimedScoring`` (``rollout/scoring.py``; in a ``RewardWorker`` with a ``reward_timeout``); the prompt checks to
    ``check_inputs``; the held-out prompts to ``HeldOutPrompts`` (``rollout/held_out.py``), one per named set
    (``rollout/eval_sets.py``); the rule's greedy episodes to ``rule_outcome`` (``rollout/rule_outcomes.py``). It
    sees the LightningModule as a ``SamplingPolicy``; it publishes each epoch's ``RolloutReport`` (``epoch_report``,
    and in the ``EpochBatches`` the module prepares) and serves held-out scores (``ServesHeldOutScores``) and the
    rule's outcomes (``MeasuresRiskRule``).

    Args:
        task: the prompts and rewards, by class path (``lit_grpo.tasks.ArithmeticTask``, ``SortTask``,
            ``JsonlTask`` or your own ``Task`` subclass).
        engine: the rollout engine; ``None`` means ``HFEngine()`` (decoding on the live policy).
        group_size: G, completions sampled per prompt.
        prompts_per_epoch: prompts taken (in order, wrapping around) from the task's training split per epoch.
        minibatch_size: sequences per minibatch (a multiple of ``group_size``); use the trainer's
            ``accumulate_grad_batches`` to put several minibatches in one optimizer step.
        ppo_epochs: passes (mu) over each epoch's buffer.
        max_new_tokens: the generation budget per completion.
        temperature: sampling temperature; the trainer's log-probs use the same.
        dynamic_sampling: DAPO's dynamic sampling: drop groups whose rewards are all equal (no signal) and draw
            fresh prompts for them until the epoch has ``prompts_per_epoch`` informative groups or
            ``max_sampling_rounds`` draws were made (``rollout/sampling_draws`` logs how many).
        max_sampling_rounds: the cap on draws per epoch for ``dynamic_sampling``.
        completion_budget: total completions (or tree segments) to generate over the run, every draw counted;
            a draw is cut to the whole groups that still fit, and training stops after the epoch that spends the
            budget, with a final validation (``None``: no budget, ``trainer.max_epochs`` rules). Compares
            variants at an equal sample cost, e.g. DAPO's dynamic sampling against plain GRPO.
        overlong_cache: DAPO's soft overlong punishment: a reward term falling from 0 to -1 over the last
            ``overlong_cache`` tokens of the ``max_new_tokens`` budget (``None``: off).
        mask_truncated: DAPO's overlong filtering: completions that hit ``max_new_tokens`` carry no loss.
        rollout: ``grouped`` (``group_size`` completions per prompt), ``tree`` (multi-round trees with ``branching``
            children per open node at each round) or ``chains`` (``group_size`` independent multi-round episodes per
            prompt, group advantages on their returns); the last two need a multi-round task.
        branching: a ``tree``'s children per open node at each round, one width per round the task runs (None: [4, 2,
            2]); ``chains`` take ``group_size`` episodes and their turns from the task and refuse one.
        reward_timeout: seconds one reward call may take; with a timeout, rewards of grouped rollouts and of
            validation run in a worker process, and a call that hangs (or raises) scores the task's
            ``failure_reward`` and counts in ``rollout/reward_errors`` (``None``: in-process, no limit, no overhead).
        long_prompts: a prompt whose tokens plus the generation budget exceed the model's context is ``refuse``d (the
            run stops before any rollout, naming it) or ``drop``ped (counted and logged as ``data/dropped_prompts``).
        val_max_prompts: held-out prompts used per validation (``None``: the whole held-out split).
        val_batch_size: held-out prompts per validation batch.
        evaluation: ``n`` samples per held-out prompt (``SampledEvaluation``: pass@k, mean@n, ...); None: greedy.
        eval_sets: named evaluation sets, a list or a mapping by name (fields: ``--data.eval_sets.help EvalSet``), each
            a split or a data file with its own evaluation, max_prompts, interval; logged as ``val/<set>/...``.
        max_staleness: asynchronous rollouts (docs/scaling.md): with k >= 1, the next epoch's rollouts are drawn in the
            background, from an adapter at most k versions (epochs) old, while this epoch's train; the current
            adapter is pushed only when the next draw would otherwise be older (k = 1: every epoch; k = 2: every
            other). pi_old is the sampler's log-probs. Needs grouped rollouts and an engine that samples from a copy
            of the weights (``VLLMEngine``, ``VLLMServerEngine``); ``rollout/staleness`` logs the lag. 0: draw, train.
        seed: seeds the sampling and the minibatch order (each epoch derives its own from it).
    """

    def __init__(
        self,
        task: Task = lazy_instance(ArithmeticTask),
        engine: RolloutEngine | None = None,
        group_size: int = 8,
        prompts_per_epoch: int = 32,
        minibatch_size: int = 64,
        ppo_epochs: int = 1,
        max_new_tokens: int = 6,
        temperature: float = 1.0,
        dynamic_sampling: bool = False,
        max_sampling_rounds: int = 4,
        completion_budget: int | None = None,
        overlong_cache: int | None = None,
        mask_truncated: bool = False,
        rollout: RolloutKind = "grouped",
        branching: list[int] | None = None,
        reward_timeout: float | None = None,
        long_prompts: LongPrompts = "refuse",
        val_max_prompts: int | None = None,
        val_batch_size: int = 256,
        evaluation: SampledEvaluation | None = None,
        eval_sets: dict[str, EvalSet] | list[EvalSet] | None = None,
        max_staleness: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__", "task", "engine")}
        problems = self.config_problems(arguments) + cross_knob_problems(None, arguments, engine or HFEngine, task)
        refuse("invalid RolloutDataModule configuration", problems)
        self.settings, self.task = arguments, task  # the settings are checked again beside the module's in setup
        self.scorer: Task | RewardWorker = task if reward_timeout is None else RewardWorker(task, reward_timeout)
        self.engine: RolloutEngine = engine if engine is not None else HFEngine()
        self.group_size, self.prompts_per_epoch = group_size, prompts_per_epoch
        self.minibatch_size, self.ppo_epochs = minibatch_size, ppo_epochs
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.rollout, self.branching = rollout, list(branching or TREE_BRANCHING)
        self.grouped = GroupedDraw(group_size, prompts_per_epoch, temperature, max_new_tokens, dynamic_sampling,
                                   max_sampling_rounds, overlong_cache, mask_truncated)
        self.prompts = PromptCursor(prompts_per_epoch, group_size, completion_budget)  # carried by checkpoints
        self.risk_threshold = ThresholdedRule(task)  # use_risk_threshold's source: the infer/defer rule, if any
        self.held_out = HeldOutPrompts(task, self.engine, self.scorer, turn_limit(task, self.branching),
                                       val_max_prompts, val_batch_size, evaluation)
        self.eval_sets = held_out_sets(self.held_out, eval_sets)  # one HeldOutPrompts per named set (eval_sets.py)
        self.seed, self.long_prompts = seed, long_prompts
        self.prompts_checked = False  # against the loaded tokenizer and context, at the first loader
        self._report: RolloutReport | None = None
        self.timings, self.reward_context = {}, RewardContext()  # the latest draw's phase seconds; its rewards' logs
        self.engine_metrics: dict[str, float] = {}  # an engine's own figures (servers_alive), logged as rollout/*
        self.scoring = TimedScoring(self.scorer)  # the grouped draw's reward calls, timed apart from generation
        self.max_staleness, self.staleness = max_staleness, 0  # the lag allowed, and the lag of the epoch's rollouts
        self.prefetch = RolloutPrefetcher(max_staleness)
        self.engine_sync = EngineSync(self.engine, self.prefetch)

    @classmethod
    def config_problems(cls, args: dict[str, Any]) -> list[str]:
        """Every problem with these arguments on their own: choices (the signature's ``Literal`` types) and values."""
        return choice_problems(cls.__init__, args) + data_config_problems(args)

    def setup(self, stage: str) -> None:
        """Refuse what the rules between knobs refuse (run/rules.py) and unreadable ``eval_sets``, before weights load."""
        module, trainer = self.trainer.lightning_module, self.trainer
        refuse("the module and the data do not fit together",
               fit_problems(trainer, module, self.settings, self.engine, self.task, stage))
        self.task.use_device(self.trainer.strategy.root_device)  # a reward model runs beside the policy
        self.task_identity()  # before the first loader may drop long prompts

    def use_risk_threshold(self, source: RiskThresholdSource | None) -> None:
        """Apply the infer/defer rule at ``source``'s tau (``RiskThreshold`` gives itself); ``None``: no rule."""
        self.risk_threshold.use(source)

    @property
    def epoch_report(self) -> RolloutReport | None:
        """The last epoch's ``RolloutReport`` (None before the first epoch's rollouts)."""
        return self._report

    # --- the epoch's buffer (docs/guide.md#layout) -------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        epoch = self.trainer.current_epoch
        if resuming_after_finished_epoch(self.trainer):
            # Lightning asks for the finished epoch's loader before moving on to the next one and never iterates
            # it: generating here would draw (and skip) a whole epoch of prompts
            return DataLoader([{}], batch_size=None)
        if self.budget_spent:  # resumed after the epoch that spent it (the module stopped that run: the one place)
            # nothing to draw: no batches, and Lightning ends the fit ("No training batches")
            rank_zero_info(f"completion budget spent ({self.prompts.completions_generated} generated): nothing to draw")
            return DataLoader([], batch_size=None)
        buffer = self.collect_rollouts(self.checked_module(), epoch)  # the steps: lit_grpo/epoch/one_epoch.py
        return DataLoader(self.hand_over(buffer, epoch), batch_size=None, shuffle=False)

    def hand_over(self, buffer: RolloutBuffer, epoch: int) -> EpochBatches:
        """The epoch's rollouts as the module receives them: their ``RolloutReport`` and their minibatches' order."""
        self._report = self.report(buffer)
        generator = torch.Generator().manual_seed(self.epoch_seed(epoch, "shuffle"))
        plan = minibatch_plan(buffer, self.minibatch_size, self.ppo_epochs, generator)
        # trees differ in size from rank to rank (grouped rollouts never do): every rank steps as often as the others
        # (decided by the setting, not the buffer: every rank must reach the collective, one without trees too)
        trainer = self.trainer
        padding = 0 if self.rollout == "grouped" else minibatch_padding(len(plan), trainer.strategy, trainer.world_size)
        return EpochBatches(buffer, plan, self._report, padding)

    def report(self, buffer: RolloutBuffer) -> RolloutReport:
        """The epoch's ``RolloutReport``, once its rollouts are drawn (a draw ahead may be running already)."""
        return RolloutReport(
            buffer, frozen(self.timings), frozen(self.engine_metrics), **self.reward_context.report_fields(),
            sampling_draws=buffer.sampling_draws if self.grouped.dynamic_sampling else None,
            staleness=self.staleness if self.max_staleness else None,
            can_draw_ahead=not staleness_problems(1, self.rollout, self.engine, None, None),
            completions_generated=self.prompts.completions_generated, budget_spent=self.budget_spent)

    @property
    def budget_spent(self) -> bool:
        """The completion budget pays for no further group (``PromptCursor.budget_spent``)."""
        return self.prompts.budget_spent(drawing_ahead=self.prefetch.pending is not None)

    def collect_rollouts(self, module: SamplingPolicy, epoch: int) -> RolloutBuffer:
        """Generate (or take those drawn ahead) and score; a detached risk head's probes labelled (``risk_probes``)."""
        clock = time.perf_counter()
        self.scoring.seconds = 0.0  # rewards scored while generating (grouped draws) are not generation time
        drawn = rollouts_ahead(self, module, epoch) if self.max_staleness else rollouts_now(self, module, epoch)
        buffer, records, phases = drawn.buffer, drawn.records, drawn.phases
        self.timings, self.engine_metrics, self.staleness = dict(phases), drawn.engine_metrics, drawn.staleness
        done = time.perf_counter()
        if module.risk_probe_prompts:  # the detached risk head learns from greedy probes
            probes = probe_records(self.task, records, self.prompts.cursor, module.risk_probe_prompts)
            buffer.risk_probes = probe_labels(self.task, self.engine, module.tokenizer, probes, self.held_out.rounds,
                                              self.sampling_spec(module, greedy=True, seed=None))
            self.timings["risk_probes"], done = time.perf_counter() - done, time.perf_counter()
        rank_zero_info(
            f"epoch {epoch}: {len(records)} prompts, {buffer.input_ids.shape[0]} segments in {done - clock:.2f}s "
            f"({', '.join(f'{name} {seconds:.2f}s' for name, seconds in phases.items())}); "
            f"reward mean {buffer.rewards.mean():.3f}, accuracy {buffer.correct.float().mean():.3f}")
        return buffer

    def draw_grouped(self, module: SamplingPolicy, records: list[PromptRecord], epoch: int) -> RolloutBuffer:
        """Epoch ``epoch``'s grouped rollouts of ``records``, scored (on the background thread when drawn ahead)."""
        # each stream's seed is derived from the epoch's, then offset by this rank's first prompt (share_start):
        # an engine seeding request i with seed + i then samples each prompt as a one-process run would
        sampling = self.sampling_spec(module, greedy=False, seed=self.epoch_seed(epoch))
        return self.grouped.draw(self.task, self.engine, module.tokenizer, records, sampling, self.prompts,
                                 self.scoring, self.next_prompts)

    def next_prompts(self, count: int | None = None) -> list[PromptRecord]:
        """This rank's share of the next ``count`` (default ``prompts_per_epoch``) training prompts."""
        return self.prompts.take(self.task.train_records(), count, *rank_and_world(self.trainer))

    # --- engine ------------------------------------------------------------------------------------------------
    def sync_policy(self, module: SamplingPolicy) -> None:
        self.engine_sync.sync(module)  # the current policy into the engine, once per optimizer step at most

    def push_policy_now(self, module: SamplingPolicy) -> None:
        self.engine_sync.push_now(module)  # the weights as they are, once the draw ahead is done with the engine

    def sampling_spec(self, module: SamplingPolicy, greedy: bool, seed: int | None) -> SamplingSpec:
        return SamplingSpec(self.max_new_tokens, self.temperature, greedy, seed, module.stop_token_ids,
                            context_limit=context_limit(self.engine, module.context_length))

    def grow_trees(self, module: SamplingPolicy, records: list[PromptRecord], widths: list[int],
                   sampling: SamplingSpec) -> list[Any]:
        """The epoch's trees (``grow_epoch_trees``), ``risk_threshold.explore_fraction`` of them without the rule."""
        rule = self.risk_threshold.at(module, self.trainer.current_epoch, training=True)
        self.reward_context = draw_context(self.task, self.trainer)  # what this draw's rewards are given and log
        return grow_epoch_trees(self.task, self.engine, module.tokenizer, records, widths, sampling, rule,
                                self.risk_threshold.explore_fraction(rule), self.prompts.share_start,
                                self.reward_context)

    def checked_module(self) -> SamplingPolicy:
        """The trainer's module, the prompts checked against its tokenizer and context first (``check_inputs``)."""
        module = self.trainer.lightning_module
        if not self.prompts_checked:
            rounds = (self.held_out.rounds or 1) if self.rollout != "grouped" else 1  # a generation budget a round
            check_inputs(module, self.task, self.max_new_tokens * rounds, self.long_prompts, self.engine, self.trainer.loggers)
            self.prompts_checked = True
        return module

    def epoch_seed(self, epoch: int, stream: str = "rollout") -> int:
        """The base seed of one of an epoch's random streams (``rollout`` sampling, minibatch ``shuffle``)."""
        return derived_seed(self.seed, epoch, stream)

    # --- held-out prompts: validation, test, the risk rule's calibration ----------------------------------------
    def val_records(self) -> list[PromptRecord]:
        """The validation prompts a validation (and a calibration) uses (``HeldOutPrompts.validation``)."""
        return self.held_out.validation()

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """Batches of validation prompts, each scored greedily with the current policy when the loop reaches it; with
        ``eval_sets``, one loader per set due now (``due_sets``), each Lightning's ``dataloader_idx``."""
        due = due_sets(self.eval_sets, self.trainer)
        return [self.greedy_loader(s.validation, s) for s in due] if self.eval_sets else self.greedy_loader(self.held_out.validation)

    def held_out_scores(self) -> Iterable[dict[str, torch.Tensor]]:
        return as_batches(self.val_dataloader())  # the module's measures outside Lightning's loop (ServesHeldOutScores)

    def test_dataloader(self) -> DataLoader:
        return self.greedy_loader(self.held_out.test)  # the test split, scored as validation's is

    def greedy_loader(self, held_out: Callable[[], list[PromptRecord]], prompts: HeldOutPrompts | None = None) -> DataLoader:
        module, prompts = self.checked_module(), prompts or self.held_out  # the check may drop prompts too long
        return prompts.loader(held_out(), lambda records: self.greedy_scores(module, records, prompts))

    def greedy_scores(self, module: SamplingPolicy, records: list[PromptRecord], prompts: HeldOutPrompts) -> Scores:
        self.prefetch.wait()  # the engine serves one caller at a time
        self.sync_policy(module)
        sampling = self.sampling_spec(module, greedy=True, seed=None)
        rule = self.risk_threshold.at(module, self.trainer.current_epoch, training=False)
        return prompts.scores(module.tokenizer, records, sampling, rule)

    def rule_outcome(self, module: SamplingPolicy, records: list[PromptRecord], tau: float | None,
                     decision: str = "threshold", cvar_level: float = 0.0) -> RuleOutcome:
        """Greedy episodes of ``records`` under the rule at ``tau`` (the rest as in ``RiskRule``): ``MeasuresRiskRule``."""
        self.sync_policy(module)
        return rule_outcome(self.task, self.engine, module, records, self.held_out.rounds,
                            self.sampling_spec(module, greedy=True, seed=None), tau, decision, cvar_level)

    # --- state and teardown ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The loop state; with a draw ahead pending, as before that draw, with its adapter (drawn again on resume)."""
        pending = self.prefetch.pending
        loop_state = pending.loop_state if pending is not None else self.prompts.loop_state()
        return {**loop_state, **self.prefetch.state_dict(), "task": self.task_identity()}

    def task_identity(self) -> dict[str, Any]:
        """What the cursor indexes, taken before any prompt is dropped (``PromptCursor.task_identity``)."""
        return self.prompts.task_identity(self.task)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # a resume from Python is refused onto another task as the command's is (its cursor counts that task's prompts)
        task_notes(str(self.trainer.ckpt_path if self.trainer is not None else "the checkpoint"), state_dict,
                   self.task_identity())
        self.prompts.load_loop_state(state_dict)
        self.prefetch.load_state_dict(state_dict)

    def on_exception(self, exception: BaseException) -> None:
        self.prefetch.abandon()  # a Ctrl-C or an error stops the run now, not after the draw in flight

    def teardown(self, stage: str) -> None:
        self.prefetch.close()  # the draw ahead finishes before its engine closes
        if not self.engine.shared:
            self.engine.close()
            self.engine_sync.forget()  # a closed engine holds no policy: the next stage pushes it again
        close_scoring(self.held_out, self.eval_sets)  # reward workers, a tool task's worker process

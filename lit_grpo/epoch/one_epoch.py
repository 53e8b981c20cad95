"""One epoch, top to bottom, as Lightning's fit loop runs it: each step in order, the Lightning hook it runs in, and
the part that does it. CleanRL's ``ppo.py`` shows collect → advantages → minibatch epochs → log in one screen; here
the same epoch is spread over two objects and four hooks whose order is Lightning's, so this function calls the
same methods those hooks call, in the same order, outside Lightning's loop. ``tests/test_one_epoch.py`` holds it to
the truth: from the same seed it trains the adapter ``Trainer.fit`` trains in one epoch, to the bit.

The steps, with the hook that runs each in a real fit (``Trainer(reload_dataloaders_every_n_epochs=1)``):

1. ``RolloutDataModule.train_dataloader`` (Lightning asks for it at every epoch's start, before any epoch hook):
   the prompts are checked against the tokenizer once (``check_inputs``); ``collect_rollouts`` takes this rank's
   next prompts (``PromptCursor``), pushes the policy's weights into the engine (``EngineSync``), generates and
   scores them (``GroupedDraw`` with ``TimedScoring``; trees: ``grow_epoch_trees``, scored round by round), or takes
   the rollouts drawn ahead (``rollouts_ahead``); ``hand_over`` adds the epoch's ``RolloutReport`` and the order of
   its minibatches: an ``EpochBatches``, the train loader's dataset, is all the module receives.
2. ``PolicyModule.on_train_epoch_start``: ``prepare_epoch`` runs the no-grad passes over the whole buffer (π_old,
   π_ref, the old values), the advantages (``policy/advantages.py``), the detached risk head's fit, and cuts the
   minibatches with each optimizer step's loss counts summed over every rank.
3. ``training_step``, once per minibatch (``ppo_epochs`` passes over the buffer): the loss of the module's
   ``PolicyStep``; Lightning divides it by the accumulation count and runs ``backward``; after every
   ``accumulate_grad_batches`` minibatches (and the epoch's last) ``on_before_optimizer_step`` (the adaptive
   entropy coefficient), gradient clipping, the optimizer's step and ``zero_grad``.
4. The validation loop, when the epoch is one it validates after: held-out prompts scored greedily
   (``RolloutDataModule.val_dataloader``, ``PolicyModule.validation_step``).
5. ``on_train_epoch_end``: callbacks log the epoch (``RolloutMetrics`` reads ``datamodule.epoch_report``),
   ``ReferencePolicy`` refreshes π_ref, the module ends a run whose completion budget is spent, and
   ``ModelCheckpoint`` writes the checkpoint (``StopOnSigterm`` holds a SIGTERM back while it does).

Steps 4 and 5 read and record; they change no weight, so this function leaves them to the loop. It steps the
optimizer as Lightning's default precision does (lit-grpo's: the base weights' dtype is ``model.dtype``, the LoRA
weights and their optimizer stay float32); a mixed-precision plugin's loss scaling is not shown here.
"""

from __future__ import annotations

import lightning.pytorch as pl

from lit_grpo.buffers.epoch import EpochBatches
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule


def one_epoch(trainer: pl.Trainer, module: PolicyModule, data: RolloutDataModule) -> EpochBatches:
    """Epoch ``trainer.current_epoch`` of a fit whose trainer, ``module`` and ``data`` are set up (from a callback's
    ``on_fit_start`` on, with ``trainer.optimizers`` built): steps 1 to 3 above, with the trainer's single
    optimizer and accumulation count. Returns the epoch's prepared ``EpochBatches``."""
    epoch = trainer.current_epoch
    # 1. train_dataloader: rollouts from the current policy, scored, handed over with their report
    buffer = data.collect_rollouts(data.checked_module(), epoch)
    served = data.hand_over(buffer, epoch)
    # 2. on_train_epoch_start: pi_old, pi_ref, values, advantages, the risk head's fit; the minibatches cut
    module.prepare_epoch(served)
    # 3. training_step per minibatch, backward, and an optimizer step per accumulate_grad_batches minibatches
    (optimizer,) = trainer.optimizers
    accumulate, count = trainer.accumulate_grad_batches, len(served)
    for index in range(count):
        batch = trainer.strategy.batch_to_device(served[index])  # Lightning moves each batch to the module's device
        out = module.policy_step(batch, index, no_logging, trainer)
        if out is not None:  # None: nothing to learn in this minibatch, no backward (Lightning skips it too)
            (out["loss"] / accumulate).backward()
        if (index + 1) % accumulate == 0 or index + 1 == count:
            module.on_before_optimizer_step(optimizer)
            module.configure_gradient_clipping(optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
            optimizer.step()
            optimizer.zero_grad()
    return served


def no_logging(*args: object, **kwargs: object) -> None:
    """``LightningModule.log``'s place outside Lightning's loop, which alone can record a figure."""

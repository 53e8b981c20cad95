"""Credit where the decision is (issue 49): zero advantages counted per round, flat sibling groups left out of the
loss and its normaliser (``model.tree.flat_groups: drop``), and branching named one width per round of the task."""

from __future__ import annotations


import pytest
import torch

from lit_grpo.buffers.buffer import serve_minibatches
from lit_grpo.callbacks.metrics import round_credit
from lit_grpo.errors import InputError
from lit_grpo.rollout.trees import SegmentNode
from lit_grpo.tree import assign_advantages, loss_rows
from test_buffer import serve_buffer, served_rows


def credit_tree() -> SegmentNode:
    """root -> [answer 1, question -0.1 -> [answer 1, answer 1], question -0.1 -> [answer 1]]: with ``mean`` values
    and no std, both questions are worth 0.9, so round 1 compares 1, 0.9, 0.9 (advantages 1/15, -1/30, -1/30: none
    is 0); round 2 holds a flat pair and an only child, every one of its rows exactly 0."""
    def answer() -> SegmentNode:
        return SegmentNode(reward=1.0, terminal=True, segment=(5,), kind="answer")

    def question(*children: SegmentNode) -> SegmentNode:
        return SegmentNode(reward=-0.1, segment=(6,), kind="ask", children=list(children))

    root = SegmentNode(children=[answer(), question(answer(), answer()), question(answer())])
    assign_advantages(root, "mean", std_scope="none")
    return root


def test_zero_advantages_are_counted_per_round():
    root = credit_tree()
    rows = [child.advantage for child in root.children]
    assert rows[0] == pytest.approx(1 / 15, abs=1e-15) and rows[1] == pytest.approx(-1 / 30, abs=1e-15)
    # six policy rows: three in round 1 (none zero), three in round 2 (all zero), none in round 3 (named all the same)
    assert round_credit([root], 3) == {"rows_round1": 3.0, "zero_advantage_rows_round1": 0.0,
                                       "rows_round2": 3.0, "zero_advantage_rows_round2": 3.0,
                                       "rows_round3": 0.0, "zero_advantage_rows_round3": 0.0}
    unassigned = SegmentNode(children=[SegmentNode(terminal=True, segment=(5,))])
    assert round_credit([unassigned], 3) == {}


def test_drop_keeps_the_rows_outside_flat_sibling_groups_in_row_order():
    root = credit_tree()
    # policy rows depth first: answer, question, its two answers (flat), question, its only child
    assert loss_rows([root], "drop").tolist() == [True, True, False, False, True, False]
    assert loss_rows([root], "count") is None


def test_a_member_at_its_groups_mean_is_not_a_flat_group():
    # Q 1, 0 and -1 among siblings: the middle one's advantage is exactly 0, yet its group carries signal
    root = SegmentNode(children=[SegmentNode(reward=r, terminal=True, segment=(5,)) for r in (1.0, 0.0, -1.0)])
    assign_advantages(root, "mean", std_scope="none")
    assert [c.advantage for c in root.children] == [1.0, 0.0, -1.0]
    assert loss_rows([root], "drop").tolist() == [True, True, True]


def test_rows_left_out_stay_in_their_minibatch_but_count_in_no_policy_term():
    from lit_grpo.buffers.buffer import policy_mask

    buffer = serve_buffer()  # 3 groups of 2 rows; advantages carry the row index
    buffer.loss_rows = torch.tensor([True, False, False, False, True, True])  # group 1 wholly out, row 1 too
    batches = serve_minibatches(buffer, 2, 1, 3, "seq-mean", torch.Generator().manual_seed(0))
    assert len(batches) == 3 and sorted(r for b in batches for r in served_rows(b)) == list(range(6))
    for batch in batches:
        kept = batch["loss_rows"]
        assert torch.equal(policy_mask(batch), batch["completion_mask"] & kept[:, None])
        assert not policy_mask(batch)[~kept].any()
        assert batch["completion_mask"][~kept].sum() == buffer.completion_mask[served_rows(batch)][~kept].sum()
    # one optimizer step over the three minibatches: seq-mean counts the rows that stay in the loss, rows 0, 4, 5
    assert {b["step_denominator"].item() for b in batches} == {3.0}
    token_mean = serve_minibatches(buffer, 2, 1, 3, "token-mean", torch.Generator().manual_seed(0))
    assert {b["step_denominator"].item() for b in token_mean} == {float(buffer.completion_mask[[0, 4, 5]].sum())}


def test_a_step_with_no_row_in_the_loss_is_skipped_on_one_process_and_counts_zero():
    from lit_grpo.policy.head_losses import nothing_to_learn, share

    buffer = serve_buffer()
    buffer.loss_rows = torch.zeros(6, dtype=torch.bool)
    batches = serve_minibatches(buffer, 2, 1, 1, "seq-mean", torch.Generator().manual_seed(0))
    assert all(b["step_denominator"].item() == 0.0 for b in batches)
    assert nothing_to_learn(batches[0], heads=False, world_size=1)  # Lightning skips the optimizer step
    assert not nothing_to_learn(batches[0], heads=True, world_size=1)  # a head still has rows to learn from
    assert not nothing_to_learn(batches[0], heads=False, world_size=2)  # DDP refuses a skipped step
    assert share(torch.tensor(2.0), batches[0]["step_denominator"]).item() == 0.0  # the loss is 0, not 0/0
    buffer.loss_rows = None
    assert not nothing_to_learn(serve_minibatches(buffer, 2, 1, 1, "seq-mean", torch.Generator())[0], False, 1)


def test_drop_is_refused_for_chains_and_branching_must_name_every_round():
    from lit_grpo.cli.config_check import signature_defaults
    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.run.rules import cross_knob_problems
    from lit_grpo.tasks.games.stale_digits import StaleDigitsTask

    model = {**signature_defaults(PolicyModule), "tree": {"flat_groups": "drop"}}
    defaults = signature_defaults(RolloutDataModule)
    data = {**defaults, "rollout": "chains", "group_size": 8}
    problems = cross_knob_problems(model, data, task=StaleDigitsTask)
    assert any(p.startswith("model.tree.flat_groups") and "only a tree has sibling groups" in p for p in problems)
    # the decision-hard game runs 4 rounds: a 3-round list is refused, by class (config time) and by instance
    tree = {**defaults, "rollout": "tree", "branching": [4, 2, 2]}
    message = ("data.branching [4, 2, 2] names 3 round(s), data.task StaleDigitsTask runs max_rounds 4: give one "
               "width per round, or set data.task.init_args.max_rounds")
    assert message in cross_knob_problems(None, tree, task=StaleDigitsTask)
    assert message in cross_knob_problems(None, tree, task=StaleDigitsTask, task_args={"max_rounds": 4})
    assert cross_knob_problems(None, tree, task=StaleDigitsTask, task_args={"max_rounds": 3}) == []
    assert cross_knob_problems(None, tree, task=StaleDigitsTask, task_args={"max_rounds": 0}) == [
        "data.task StaleDigitsTask: max_rounds must be >= 1 (the rounds an episode runs at most), got 0"]
    with pytest.raises(InputError, match=r"names 3 round\(s\), data.task StaleDigitsTask runs max_rounds 4"):
        RolloutDataModule(task=StaleDigitsTask(), rollout="tree", branching=[4, 2, 2])
    RolloutDataModule(task=StaleDigitsTask(max_rounds=3), rollout="tree", branching=[4, 2, 2])  # accepted


def test_a_task_that_declares_its_rounds_as_a_class_attribute_is_checked_before_it_is_built():
    from lit_grpo.cli.config_check import signature_defaults
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.run.rules import cross_knob_problems
    from lit_grpo.tasks import ClarifyTask, GameTask

    class TwoRounds(ClarifyTask):  # the README's way: a class attribute, no __init__ argument
        def __init__(self) -> None:
            super().__init__(max_rounds=2)

        max_rounds = 2

    class Undeclared(GameTask):
        def split(self):
            return [], [], []

        def step(self, prompt_record, round_index, segment_text):
            raise NotImplementedError

        no_answer_reward = malformed_reward = failure_reward = -1.0

    data = {**signature_defaults(RolloutDataModule), "rollout": "tree", "branching": [2, 2, 2]}
    assert cross_knob_problems(None, data, task=TwoRounds) == [
        "data.branching [2, 2, 2] names 3 round(s), data.task TwoRounds runs max_rounds 2: give one width per round"]
    assert cross_knob_problems(None, data, task=Undeclared) == [
        "data.task Undeclared declares no max_rounds (the rounds an episode runs at most, one width of "
        "data.branching each): give it a max_rounds attribute or __init__ argument"]

"""A tool task's chain weighs each episode as TRL weighs its multi-turn completion (issue 57, "What to build" 3).

TRL's sequence is the whole multi-turn completion, its tool tokens masked out; here each assistant turn is a row.
The buffer of a tool task's chains carries each row's episode (``sequence_tokens``, ``sequence_rows``) and the
aggregation weighs an episode as one sequence (``losses.Sequences``). The games' chains and tree rollouts carry none
and keep the per-row numbers.

The example throughout: one root, two chains. Episode A has three turns of 2, 3 and 1 counted tokens, episode B one
turn of 4; under ``reinforce`` with advantage -1 the per-token surrogate is logp itself, set to A [1, 3], [2, 2, 2],
[5] and B [1, 1, 1, 5]. By hand: ``seq-mean`` (15 / 6 + 8 / 4) / 2 = 2.25 (per row it was (2 + 2 + 5 + 2) / 4 =
2.75); ``token-mean`` 23 / 10; ``seq-sum`` 23 / 2 (per row 23 / 4); ``constant`` with max_new_tokens 8:
23 / (2 * 8) (per row 23 / 32).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from lit_grpo.buffers.buffer import batch_sequences, policy_mask, serve_plan
from lit_grpo.buffers.tree_layout import tree_buffer
from lit_grpo.losses import Sequences, aggregation_terms, masked_aggregate
from lit_grpo.policy.head_losses import share
from lit_grpo.policy.module import PolicyModule
from lit_grpo.policy.objective import Objective
from lit_grpo.policy.policy_step import policy_terms
from lit_grpo.tree import SegmentNode

PROMPT = (7, 8)
TURNS_A = ((1.0, 3.0), (2.0, 2.0, 2.0), (5.0,))  # episode A's per-token values, one tuple per turn
TURN_B = (1.0, 1.0, 1.0, 5.0)
MAX_NEW_TOKENS = 8
BY_HAND = {"seq-mean": 2.25, "token-mean": 2.3, "seq-sum": 11.5, "constant": 23 / 16}
PER_ROW = {"seq-mean": 2.75, "token-mean": 2.3, "seq-sum": 5.75, "constant": 23 / 32}
DEFAULTS = {name: p.default for name, p in inspect.signature(PolicyModule.__init__).parameters.items()
            if name != "self"} | {"kl": {"coef": 0.0}}


class Tokenizer:
    pad_token_id = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def chain_tree(episode: object | None) -> SegmentNode:
    """root -> A1 -> A2 -> A3 and root -> B1; a node's tokens are its turn's length (ids 11, 12, ...), each
    turn followed by a 2-token reply. ``episode``: what the nodes carry (a tool task's state; None: a game)."""
    record = {"prompt": "q"}

    def node(context: tuple[int, ...], length: int, children: list[SegmentNode]) -> SegmentNode:
        return SegmentNode(context=context, segment=tuple(range(11, 11 + length)), reply=(3, 4), record=record,
                           episode=episode, children=children, kind="answer" if not children else "call")

    a3_context = PROMPT + (11, 12, 3, 4) + (11, 12, 13, 3, 4)
    a3 = node(a3_context, 1, [])
    a2 = node(PROMPT + (11, 12, 3, 4), 3, [a3])
    a1 = node(PROMPT, 2, [a2])
    b1 = node(PROMPT, 4, [])
    return SegmentNode(context=PROMPT, children=[a1, b1], record=record)


def chain_buffer(episode: object | None, mode: str = "chains"):
    buffer = tree_buffer([chain_tree(episode)], Tokenizer(), 1.0, MAX_NEW_TOKENS, mode, 3)
    values = torch.zeros(buffer.input_ids.shape)  # [4, L]: each row's turn values where it counts
    for row, turn in enumerate(TURNS_A + (TURN_B,)):
        values[row, buffer.completion_mask[row]] = torch.tensor(turn)
    buffer.old_logp, buffer.advantages = values.clone(), torch.full((4,), -1.0)
    return buffer, values


def step_loss(buffer, values: torch.Tensor, plan: list[list[int]], aggregation: str) -> torch.Tensor:
    """The optimizer step's policy loss as ``PolicyStep`` makes it: each minibatch's ``policy_terms`` loss times
    its share of the step's count (``local / step_denominator``), summed over the minibatches of one step."""
    objective = Objective.from_arguments(DEFAULTS | {"loss_variant": "reinforce", "aggregation": aggregation})
    batches = serve_plan(buffer, [torch.tensor(rows) for rows in plan], len(plan), aggregation)
    total = torch.tensor(0.0)
    for rows, batch in zip(plan, batches):
        width = batch["input_ids"].shape[1]
        logp, counted = values[rows, :width], policy_mask(batch)
        terms = policy_terms(objective, batch, logp, None, counted, MAX_NEW_TOKENS)
        local = aggregation_terms(logp, counted, aggregation, MAX_NEW_TOKENS, batch_sequences(batch))[1]
        total = total + terms.loss * share(local, batch["step_denominator"])
    return total


def test_a_tool_chain_buffer_carries_each_rows_episode():
    buffer, _ = chain_buffer(episode=object())
    assert buffer.completion_mask.sum(dim=1).tolist() == [2, 3, 1, 4]
    assert buffer.sequence_tokens.tolist() == [6, 6, 6, 4]
    assert buffer.sequence_rows.tolist() == [3, 3, 3, 1]
    (batch,) = serve_plan(buffer, [torch.tensor([3, 1])], 1, "seq-mean")
    assert batch["sequence_tokens"].tolist() == [4, 6] and batch["sequence_rows"].tolist() == [1, 3]


def test_a_three_turn_and_a_one_turn_episode_weigh_half_each():
    # the issue's example: values 1 on A's turns, 0 on B's; the loss is A's weight
    mask = chain_buffer(episode=object())[0].completion_mask
    values = mask.float() * torch.tensor([1.0, 1.0, 1.0, 0.0])[:, None]
    sequences = Sequences(torch.tensor([6.0, 6.0, 6.0, 4.0]), torch.tensor([3.0, 3.0, 3.0, 1.0]),
                          torch.tensor([0, 0, 0, 1]))
    assert masked_aggregate(values, mask, "seq-mean", sequences=sequences).item() == pytest.approx(0.5, abs=1e-7)
    assert masked_aggregate(values, mask, "seq-mean").item() == pytest.approx(0.75, abs=1e-7)  # per row


@pytest.mark.parametrize("aggregation", list(BY_HAND))
@pytest.mark.parametrize("plan", [
    [[0, 1, 2, 3]],
    [[0, 3], [1, 2]],  # episode A's rows in two minibatches
    [[0], [1, 2, 3]],  # a minibatch holding a third of an episode: its count 1/3 is not clamped up to 1
    [[3], [2], [1], [0]],
])
def test_an_episode_weighs_one_sequence_however_the_step_is_split(aggregation, plan):
    buffer, values = chain_buffer(episode=object())
    assert step_loss(buffer, values, plan, aggregation).item() == pytest.approx(BY_HAND[aggregation], abs=1e-6)


@pytest.mark.parametrize("aggregation", list(BY_HAND))
@pytest.mark.parametrize("episode, mode", [(None, "chains"), (object(), "tree")])
def test_games_chains_and_trees_keep_one_sequence_per_row(aggregation, episode, mode):
    buffer, values = chain_buffer(episode, mode)
    assert buffer.sequence_tokens is None and buffer.sequence_rows is None
    batches = serve_plan(buffer, [torch.tensor([0, 3]), torch.tensor([1, 2])], 2, aggregation)
    assert all("sequence_tokens" not in batch for batch in batches)
    loss = step_loss(buffer, values, [[0, 3], [1, 2]], aggregation)
    assert loss.item() == pytest.approx(PER_ROW[aggregation], abs=1e-6)
    # the per-row path is the code before episodes existed: the whole buffer's aggregate, to the bit
    (whole,) = serve_plan(buffer, [torch.arange(4)], 1, aggregation)
    expected = masked_aggregate(values, buffer.completion_mask, aggregation, MAX_NEW_TOKENS)
    assert torch.equal(step_loss(buffer, values, [[0, 1, 2, 3]], aggregation), expected)
    rows_count = {"token-mean": 10.0, "constant": 4.0 * MAX_NEW_TOKENS}.get(aggregation, 4.0)
    assert whole["step_denominator"].item() == rows_count


def test_sequences_are_checked():
    values, mask = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="one per row"):
        aggregation_terms(values, mask, "seq-mean", sequences=Sequences(torch.ones(3), torch.ones(3), torch.zeros(3, dtype=torch.long)))
    with pytest.raises(ValueError, match="one per row"):
        aggregation_terms(values, mask, "seq-mean", sequences=Sequences(torch.ones(2), torch.ones(2, 1), torch.zeros(2, dtype=torch.long)))


# TRL's layout of the same two episodes: A's completion is turn 1 (2 tokens), a tool reply (3), turn 2 (3), a tool
# reply (2), turn 3 (1), its tool tokens out of the loss by tool_mask; B's is one turn of 4, then padding
TRL_T = 11
TURN_COLUMNS = ([0, 1], [5, 6, 7], [10], [0, 1, 2, 3])  # our rows: A1, A2, A3 on TRL's row 0, B1 on its row 1
TRL_ROW = [0, 0, 0, 1]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions:UserWarning")
@pytest.mark.parametrize(("aggregation", "loss_type"), [("seq-mean", "grpo"), ("constant", "dr_grpo"),
                                                         ("token-mean", "bnpo")])
def test_a_tool_chains_loss_and_gradient_equal_trls_multi_turn_completion(aggregation, loss_type):
    from trl_losses import trl_loss, trl_trainer

    f64, generator = torch.float64, torch.Generator().manual_seed(57)
    old = -0.2 - torch.rand(2, TRL_T, generator=generator, dtype=f64) * 2.5
    logp_trl = (old + (0.35 + torch.rand(2, TRL_T, generator=generator, dtype=f64) * 2.55).log()).requires_grad_()
    ref = old + torch.randn(2, TRL_T, generator=generator, dtype=f64) * 0.3
    advantages = torch.tensor([0.9, -1.3], dtype=f64)
    completion_mask = torch.zeros(2, TRL_T, dtype=torch.long)
    completion_mask[0], completion_mask[1, :4] = 1, 1
    tool_mask = torch.ones(2, TRL_T, dtype=torch.long)
    tool_mask[0, [2, 3, 4, 8, 9]] = 0
    trainer = trl_trainer(loss_type=loss_type, epsilon=0.2, beta=0.04, use_bias_correction_kl=True,
                          max_completion_length=MAX_NEW_TOKENS)
    theirs = trl_loss(trainer, logp_trl, old, advantages, completion_mask, ref_logp=ref, tool_mask=tool_mask)

    logp_leaf = logp_trl.detach().clone().requires_grad_()
    counted = torch.zeros(4, TRL_T, dtype=torch.bool)
    for row, columns in enumerate(TURN_COLUMNS):
        counted[row, columns] = True
    batch = {"old_logp": old[TRL_ROW], "advantages": advantages[TRL_ROW], "completion_mask": counted,
             "ref_logp": ref[TRL_ROW], "sequence_tokens": torch.tensor([6.0, 6.0, 6.0, 4.0]),
             "sequence_rows": torch.tensor([3.0, 3.0, 3.0, 1.0]), "sequence_ids": torch.tensor([0, 0, 0, 1])}
    objective = Objective.from_arguments(DEFAULTS | {"clip": {"eps": 0.2},
                                                     "kl": {"coef": 0.04, "ratio_correction": True},
                                                     "aggregation": aggregation})
    ours = policy_terms(objective, batch, logp_leaf[TRL_ROW], None, counted, MAX_NEW_TOKENS).loss

    torch.testing.assert_close(ours, theirs.to(f64), rtol=0, atol=1e-9)
    loss_mask = (completion_mask * tool_mask).bool()
    grad_ours, grad_trl = (torch.autograd.grad(loss, leaf)[0] for loss, leaf in ((ours, logp_leaf),
                                                                                 (theirs, logp_trl)))
    torch.testing.assert_close(grad_ours * loss_mask, grad_trl * loss_mask, rtol=0, atol=1e-9)
    assert grad_trl.abs().sum() > 0
    if aggregation != "token-mean":  # the per-row weighting TRL does not share
        per_row = {key: value for key, value in batch.items() if not key.startswith("sequence_")}
        rows_loss = policy_terms(objective, per_row, logp_leaf[TRL_ROW], None, counted, MAX_NEW_TOKENS).loss
        assert abs(rows_loss.item() - theirs.item()) > 1e-3


def chain_inputs(seed: int) -> dict[str, torch.Tensor]:
    """TRL's two rows (A's three turns with its tool tokens, B's one turn) of random log-probs, float64: ratios
    pi_theta / pi_old per token between 0.35 and 2.9 (times e^0.5 on B's), a sampler near pi_old."""
    f64, generator = torch.float64, torch.Generator().manual_seed(seed)
    old = -0.2 - torch.rand(2, TRL_T, generator=generator, dtype=f64) * 2.5
    logp = old + (0.35 + torch.rand(2, TRL_T, generator=generator, dtype=f64) * 2.55).log()
    logp[1] += 0.5  # B's sequence ratio well above 1 + 0.2: a clip acts on it (A's stays inside)
    sampler = old + torch.randn(2, TRL_T, generator=generator, dtype=f64) * 0.3
    completion_mask = torch.zeros(2, TRL_T, dtype=torch.long)
    completion_mask[0], completion_mask[1, :4] = 1, 1
    tool_mask = torch.ones(2, TRL_T, dtype=torch.long)
    tool_mask[0, [2, 3, 4, 8, 9]] = 0
    counted = torch.zeros(4, TRL_T, dtype=torch.bool)
    for row, columns in enumerate(TURN_COLUMNS):
        counted[row, columns] = True
    return {"old": old, "logp": logp, "sampler": sampler, "completion_mask": completion_mask,
            "tool_mask": tool_mask, "counted": counted}


def episode_a_threshold(inputs: dict[str, torch.Tensor]) -> float:
    """A threshold on the mean KL(sampler || pi_theta) between episode A's (over its 6 counted tokens) and its
    highest row's, so that the episode is kept and that row alone would be dropped."""
    kl = inputs["sampler"][0] - inputs["logp"][0]  # [T] TRL's row 0 is episode A
    rows = [kl[columns].mean().item() for columns in TURN_COLUMNS[:3]]
    episode = kl[[c for columns in TURN_COLUMNS[:3] for c in columns]].mean().item()
    assert max(rows) > episode
    return (episode + max(rows)) / 2


SEQUENCE_LEVEL = [  # (our knobs, TRL's config, the figures both log)
    ({"loss_variant": "gspo", "clip": {"eps": 0.2}}, {"loss_type": "grpo", "importance_sampling_level": "sequence",
                                                 "epsilon": 0.2},
     ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]),
    ({"loss_variant": "luspo", "clip": {"eps": 0.2}}, {"loss_type": "luspo", "importance_sampling_level": "sequence",
                                                  "epsilon": 0.2},
     ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]),
    ({"loss_variant": "vespo"}, {"loss_type": "vespo"}, ["vespo/phi_seq_mean"]),
    ({"clip": {"eps": 0.2}, "off_policy_mask_threshold": "episode A's"},
     {"loss_type": "grpo", "epsilon": 0.2, "off_policy_mask_threshold": "episode A's"}, []),
]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions:UserWarning")
@pytest.mark.parametrize(("knobs", "config", "figures"), SEQUENCE_LEVEL,
                         ids=["gspo", "luspo", "vespo", "off_policy_mask"])
def test_what_is_taken_per_sequence_spans_the_whole_episode_as_in_trl(knobs, config, figures):
    """GSPO's and LUSPO's sequence ratio, VESPO's weight w and the off-policy mask's mean KL are taken over a tool
    episode's three turns together, as TRL takes them over its multi-turn completion: TRL's own loss, gradient and
    figures on its layout equal ours on our rows; taken per turn (the rows without their episode) they differ."""
    from trl_losses import trl_loss, trl_trainer

    inputs = chain_inputs(58)
    if config.get("off_policy_mask_threshold") == "episode A's":
        threshold = episode_a_threshold(inputs)
        knobs, config = knobs | {"off_policy_mask_threshold": threshold}, config | {"off_policy_mask_threshold":
                                                                                    threshold}
    advantages = torch.tensor([-0.9, 1.3], dtype=torch.float64)  # A's negative: the off-policy mask may act on it
    logp_trl = inputs["logp"].clone().requires_grad_()
    trainer = trl_trainer(max_completion_length=MAX_NEW_TOKENS, **config)
    theirs = trl_loss(trainer, logp_trl, inputs["old"], advantages, inputs["completion_mask"],
                      sampler_logp=inputs["sampler"], tool_mask=inputs["tool_mask"])
    logged = trainer._metrics["train"]

    logp_leaf = inputs["logp"].clone().requires_grad_()
    batch = {"old_logp": inputs["old"][TRL_ROW], "advantages": advantages[TRL_ROW], "completion_mask":
             inputs["counted"], "sampler_logp": inputs["sampler"][TRL_ROW],
             "sequence_tokens": torch.tensor([6.0, 6.0, 6.0, 4.0]), "sequence_rows": torch.tensor([3.0, 3.0, 3.0, 1.0]),
             "sequence_ids": torch.tensor([0, 0, 0, 1])}
    objective = Objective.from_arguments(DEFAULTS | knobs)
    terms = policy_terms(objective, batch, logp_leaf[TRL_ROW], None, inputs["counted"], MAX_NEW_TOKENS)

    torch.testing.assert_close(terms.loss, theirs.to(torch.float64), rtol=0, atol=1e-9)
    loss_mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    grad_ours, grad_trl = (torch.autograd.grad(loss, leaf)[0] for loss, leaf in ((terms.loss, logp_leaf),
                                                                                 (theirs, logp_trl)))
    torch.testing.assert_close(grad_ours * loss_mask, grad_trl * loss_mask, rtol=0, atol=1e-9)
    assert grad_trl.abs().sum() > 0
    for name in figures:
        assert terms.stats[name].item() == pytest.approx(logged[name][0], abs=1e-12), name
    if "clip_ratio/region_mean" in figures:  # B clipped, A not: 1 of 2 sequences (per token it was 4 of 10)
        assert terms.stats["clip_ratio/region_mean"].item() == 0.5
    per_turn = {key: value for key, value in batch.items() if not key.startswith("sequence_")}
    rows_terms = policy_terms(objective, per_turn, logp_leaf[TRL_ROW], None, inputs["counted"], MAX_NEW_TOKENS)
    assert abs(rows_terms.loss.item() - theirs.item()) > 1e-3


def test_sequence_totals_and_means_by_hand():
    from lit_grpo.losses.aggregation import per_sequence_mean, sequence_log_mean, sequence_totals

    sequences = Sequences(torch.tensor([3.0, 3.0, 3.0, 1.0]), torch.tensor([3.0, 3.0, 3.0, 1.0]),
                          torch.tensor([4, 4, 4, 9]))
    assert sequence_totals(torch.tensor([1.0, 2.0, 4.0, 8.0]), sequences).tolist() == [7.0, 7.0, 7.0, 8.0]
    assert sequence_totals(torch.tensor([1.0, 2.0, 4.0, 8.0]), None).tolist() == [1.0, 2.0, 4.0, 8.0]
    # per token [1, 2 | 3 | 6, -] and [4, -, -]: the episode's mean (1 + 2 + 3 + 6) / 4 = 3 on its rows, 4 on B's
    values = torch.tensor([[1.0, 2.0], [3.0, 0.0], [6.0, 9.0], [4.0, 5.0]])
    mask = torch.tensor([[True, True], [True, False], [True, False], [True, False]])
    assert sequence_log_mean(values, mask, sequences).tolist() == [3.0, 3.0, 3.0, 4.0]
    assert sequence_log_mean(values, mask, None).tolist() == [1.5, 3.0, 6.0, 4.0]
    # a figure each sequence has once: episode A 1 (on its three rows), B 0: the mean over 2 sequences is 1/2
    assert per_sequence_mean(torch.tensor([1.0, 1.0, 1.0, 0.0]), sequences).item() == 0.5
    assert per_sequence_mean(torch.tensor([1.0, 1.0, 1.0, 0.0]), None).item() == 0.75


def test_constant_divides_a_tool_episode_by_the_tasks_whole_conversation_budget():
    """TRL's dr_grpo divides by max_completion_length, the budget of the whole multi-turn completion: a tool
    task's chain carries it (``sequence_budget``), where a game's chain and a tree keep max_new_tokens (per turn)."""
    from lit_grpo.tasks.tools.task import ToolTask

    assert ToolTask.sequence_budget(type("Task", (), {"max_completion_length": 20})()) == 20
    tool = tree_buffer([chain_tree(object())], Tokenizer(), 1.0, MAX_NEW_TOKENS, "chains", 3, sequence_budget=20)
    game = tree_buffer([chain_tree(None)], Tokenizer(), 1.0, MAX_NEW_TOKENS, "chains", 3, sequence_budget=20)
    for buffer in (tool, game):
        buffer.old_logp, buffer.advantages = torch.zeros(buffer.input_ids.shape), torch.zeros(4)
    (batch,) = serve_plan(tool, [torch.arange(4)], 1, "constant")
    assert batch["max_new_tokens"].item() == 20 and batch["step_denominator"].item() == 2 * 20  # 2 episodes
    (batch,) = serve_plan(game, [torch.arange(4)], 1, "constant")
    assert batch["max_new_tokens"].item() == MAX_NEW_TOKENS and batch["step_denominator"].item() == 4 * 8

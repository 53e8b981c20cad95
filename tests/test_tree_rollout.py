"""Tree rollouts with a scripted engine: node layout, environment tokens masked, one advantage per node."""

from __future__ import annotations

import statistics

import pytest

from lit_grpo.buffers.tree_layout import tree_buffer, tree_rows
from lit_grpo.engines import Completion, SamplingSpec
from lit_grpo.rollout.trees import expand_trees
from lit_grpo.tasks import ClarifyTask
from lit_grpo.tree import assign_advantages, policy_nodes, tree_row_advantages
from support import build_char_tokenizer

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id


class ScriptedEngine:
    """Answers each context with scripted segments (a fake engine: the unit under test is the tree logic)."""

    shared = True

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.script = script
        self.calls: list[int] = []

    def generate(self, prompts, n, sampling):
        self.calls.append(len(prompts))
        out = []
        for prompt in prompts:
            texts = self.script[TOKENIZER.decode(prompt, skip_special_tokens=False)]
            assert len(texts) == n
            out.append([Completion(tuple(TOKENIZER(t, add_special_tokens=False)["input_ids"]) + (EOS,),
                                   tuple(-0.5 for _ in range(len(t) + 1)), "stop") for t in texts])
        return out

    def push_policy(self, model):
        pass

    def close(self):
        pass


def test_tree_expansion_rows_and_advantages():
    record = ClarifyTask.record(37, 25, hidden=True)
    script = {
        "<s>37+?=": ["?", "61"],
        "<s>37+?=?</s>b=25;": ["62", "?"],  # the second question is cut off at max_depth = 2
    }
    engine = ScriptedEngine(script)
    (root,) = expand_trees(ClarifyTask(), engine, TOKENIZER, [record], branching=[2, 2],
                           sampling=SamplingSpec(max_new_tokens=4, stop_token_ids=(EOS,)))
    assert engine.calls == [1, 1]  # one batched call per round
    ask, wrong = root.children
    right, ask_again = ask.children
    assert (ask.kind, ask.reward, wrong.kind, wrong.reward) == ("ask", -0.1, "answer", -1.0)
    assert (right.reward, right.correct, ask_again.reward) == (1.0, True, -0.1)
    (closing,) = ask_again.children  # closed by the environment: no tokens, the no-answer reward
    assert closing.terminal and closing.reward == -0.5 and not getattr(closing, "segment", ())

    assign_advantages(root, "mean")
    rows = tree_rows([root], TOKENIZER.pad_token_id)
    nodes = policy_nodes(root)
    assert nodes == [ask, right, ask_again, wrong]  # depth-first; the closing child has no row
    assert rows["group_sizes"].tolist() == [4]
    # row 1 (the right answer): context "<s>37+?=" + "?</s>" (policy, earlier node) + "b=25;" (environment), then "62</s>"
    text = TOKENIZER.decode(rows["input_ids"][1][rows["attention_mask"][1]].tolist(), skip_special_tokens=False)
    assert text == "<s>37+?=?</s>b=25;62</s>"
    counted = TOKENIZER.decode(rows["input_ids"][1][rows["completion_mask"][1]].tolist(), skip_special_tokens=False)
    assert counted == "62</s>"  # only the node's own segment counts: no environment or ancestor token
    # positions: <s> 0, "37+?=" 1-5, "?" 6, </s> 7 (the ancestor's segment), "b=25;" 8-12, "62</s>" 13-15
    assert not rows["completion_mask"][1, :13].any() and rows["completion_mask"][1, 13:16].all()
    assert rows["completion_mask"].sum(dim=1).tolist() == [2, 3, 2, 3]
    # the buffer's one advantage per row, as the module takes it, in row order (ask, right, ask again, wrong):
    # Q(ask) = -0.1 + 0.2, Q(wrong) = -1, root baseline (0.1 - 1) / 2; below ask, Q(right) = 1, Q(ask again) = -0.6,
    # baseline 0.2; each over the tree's sigma of leaf returns (next lines)
    buffer = tree_buffer([root], TOKENIZER, 1.0, 4, "tree", 2)
    sigma_eps = statistics.pstdev([0.9, -0.7, -1.0]) + 1e-6
    by_hand = [(0.1 + 0.45) / sigma_eps, (1.0 - 0.2) / sigma_eps, (-0.6 - 0.2) / sigma_eps, (-1.0 + 0.45) / sigma_eps]
    assert tree_row_advantages(buffer, "grpo", "mean").tolist() == pytest.approx(by_hand, abs=1e-7)  # float32
    # hand check (mean values): V(ask_again) = -0.5, Q = -0.6; V(ask) = (1 - 0.6) / 2 = 0.2, Q(ask) = 0.1;
    # leaf returns: 0.9 (ask, right), -0.7 (ask, ask, no answer), -1 (wrong): mean -4/15, sigma 0.8498366
    sigma = statistics.pstdev([0.9, -0.7, -1.0])
    assert ask.advantage == pytest.approx((0.1 - (0.1 - 1.0) / 2) / (sigma + 1e-6), abs=1e-9)
    assert right.advantage == pytest.approx((1.0 - (1.0 - 0.6) / 2) / (sigma + 1e-6), abs=1e-9)
    assert closing.advantage == 0.0


class SilentEngine(ScriptedEngine):
    """The scripted engine, reporting no log-probs (as an engine may)."""

    def generate(self, prompts, n, sampling):
        return [[Completion(c.token_ids, None, c.finish_reason) for c in group]
                for group in super().generate(prompts, n, sampling)]


@pytest.mark.parametrize("engine_class, reported", [(ScriptedEngine, True), (SilentEngine, False)])
def test_sampler_logprobs_only_when_the_engine_reported_them(engine_class, reported):
    script = {"<s>37+?=": ["?", "61"], "<s>37+?=?</s>b=25;": ["62", "?"]}
    (root,) = expand_trees(ClarifyTask(), engine_class(script), TOKENIZER, [ClarifyTask.record(37, 25, hidden=True)],
                           branching=[2, 2], sampling=SamplingSpec(max_new_tokens=4, stop_token_ids=(EOS,)))
    rows = tree_rows([root], TOKENIZER.pad_token_id)
    if not reported:  # zeros here were taken for pi_old (every ratio exp(logp - 0))
        assert rows["sampler_logp"] is None
        return
    counted = rows["sampler_logp"][rows["completion_mask"]]
    assert counted.tolist() == [-0.5] * 10 and not rows["sampler_logp"][~rows["completion_mask"]].any()


def test_an_environment_that_edits_its_record_changes_nothing_of_the_run():
    # issue 34: user code gets copies; a step() that edits the record it is given must not change the prompt records
    # (held-out prompts of later validations, the nodes' records)
    class EditingClarifyTask(ClarifyTask):
        def step(self, prompt_record, round_index, segment_text):
            step = super().step(prompt_record, round_index, segment_text)
            prompt_record["b"], prompt_record["prompt"] = -1, "edited"
            return step

    record = ClarifyTask.record(37, 25, hidden=True)
    kept = dict(record)
    script = {"<s>37+?=": ["?", "61"], "<s>37+?=?</s>b=25;": ["62", "?"]}
    (root,) = expand_trees(EditingClarifyTask(), ScriptedEngine(script), TOKENIZER, [record], branching=[2, 2],
                           sampling=SamplingSpec(max_new_tokens=4, stop_token_ids=(EOS,)))
    assert record == kept and root.record is record
    asked = next(child for child in root.children if child.kind == "ask")
    assert TOKENIZER.decode(list(asked.reply)) == "b=25;"  # both rounds saw the record as it was


def test_a_games_rounds_ask_the_engine_to_keep_nothing():
    """The games' prompts are a few ids: their rounds do not ask an engine to keep a cache (their runs keep their
    numbers to the last bit; a relaid cache rounds otherwise)."""
    specs = []

    class Recording(ScriptedEngine):
        def generate(self, prompts, n, sampling):
            specs.append(sampling)
            return super().generate(prompts, n, sampling)

    record = ClarifyTask.record(37, 25, hidden=True)
    engine = Recording({"<s>37+?=": ["?"], "<s>37+?=?</s>b=25;": ["62"]})
    expand_trees(ClarifyTask(), engine, TOKENIZER, [record], branching=[1, 1],
                 sampling=SamplingSpec(max_new_tokens=4, stop_token_ids=(EOS,)))
    assert [spec.next_turn for spec in specs] == [False, False]

"""The rules of benchmarks/research/trees/tree_vs_chains.py's protocol (issues 41 and 49), worked out by hand: the
rate grid, the policy-token budget's last epoch, one width per round of each game, the t-interval and the gap closed."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for benchmarks.*

from benchmarks.research.trees.token_budget import prompts_paid_for  # noqa: E402
from benchmarks.research.trees.tree_vs_chains import (  # noqa: E402
    chosen_rate, load_rows, model_id, variant_arguments)
from benchmarks.research.trees.tree_vs_chains_report import gap_closed, interval  # noqa: E402


@pytest.mark.parametrize("returns, expected", [
    ({5e-4: 0.1, 1e-3: 0.3, 2e-3: 0.2}, (1e-3, None)),  # interior best: chosen
    ({5e-4: 0.1, 1e-3: 0.2, 2e-3: 0.3}, (None, 4e-3)),  # best at the top: the grid grows up
    ({5e-4: 0.3, 1e-3: 0.2, 2e-3: 0.1}, (None, 2.5e-4)),  # best at the bottom: it grows down
    ({5e-4: 0.096, 1e-3: 0.096, 2e-3: 0.096}, (1e-3, None)),  # a flat grid: the interior tie
    ({2.5e-4: 0.4, 5e-4: 0.4, 1e-3: 0.4, 2e-3: 0.1}, (5e-4, None)),  # ties: the smaller interior one
    ({2e-3: 0.1, 4e-3: 0.2, 8e-3: 0.3}, (8e-3, None)),  # 1.6e-2 is past the limit 8e-3: chosen at the edge
    ({6.25e-5: 0.3, 1.25e-4: 0.2, 2.5e-4: 0.1}, (6.25e-5, None)),  # and at the lower limit
])
def test_the_rate_grid_grows_until_the_best_rate_is_interior(returns, expected):
    assert chosen_rate(returns) == expected


@pytest.mark.parametrize("rest, spent, prompts, expected", [
    (36000, 0, 0, 16),  # before any epoch: a full epoch
    (20000, 16000, 16 * 25, 16),  # 40 tokens a prompt: 500 prompts' worth left
    (100, 400, 16, 4),  # 25 tokens a prompt: 4 prompts
    (110, 400, 16, 4),  # 4.4 rounds to 4
    (10, 400, 16, 0),  # 0.4 of a prompt: the run stops
    (0, 36000, 900, 0),
    (-5, 36005, 900, 0),  # the budget overshot: stop
])
def test_the_last_epoch_draws_the_prompts_the_rest_of_the_budget_pays_for(rest, spent, prompts, expected):
    assert prompts_paid_for(rest, spent, prompts, 16) == expected


def test_every_variant_names_one_width_per_round_of_its_game():
    from lit_grpo.tasks.games import CalculatorTask, HiddenOperandsTask
    from lit_grpo.tasks.games.stale_digits import StaleDigitsTask

    rounds = {"stale-digits": StaleDigitsTask().max_rounds, "hidden-operands": HiddenOperandsTask().max_rounds,
              "calculator": CalculatorTask().max_rounds}
    assert rounds == {"stale-digits": 4, "hidden-operands": 3, "calculator": 3}
    for game, count in rounds.items():
        for variant in ("tree-os-sd-none", "tree-split-sd-none", "tree-os-drop-flat",
                        "tree-chains-shape", "tree-wide-answers", "tree-wide-first", "tree-wide-questions"):
            arguments = variant_arguments(variant, game)
            assert len(json.loads(arguments[arguments.index("--data.branching") + 1])) == count, (variant, game)
        assert "--data.branching" not in variant_arguments("chains-centred", game)  # chains take the game's rounds
    # the 8-wide answers sit at round 3 of the decision-hard game, the last round where an answer can be wrong
    assert variant_arguments("tree-wide-answers", "stale-digits")[3] == "[2,2,8,1]"
    assert variant_arguments("tree-os-sd-none", "stale-digits")[-4:] == [
        "--model.tree.value_mode", "optimal_stopping", "--model.tree.std_scope", "none"]
    assert variant_arguments("tree-split-sd-none", "stale-digits")[-3] == "optimal_stopping_split"
    assert variant_arguments("tree-os-drop-flat", "stale-digits")[-2:] == ["--model.tree.flat_groups", "drop"]
    assert variant_arguments("tree-chains-shape", "stale-digits")[3] == "[8,1,1,1]"
    assert variant_arguments("chains-centred", "stale-digits")[-2:] == ["--model.advantage_mode", "centered"]


def test_each_ablation_widens_one_group_of_the_4_2_2_tree():
    tail = ["--model.tree.value_mode", "optimal_stopping", "--model.tree.std_scope", "none"]
    assert variant_arguments("tree-wide-first", "stale-digits") == [
        "--data.rollout", "tree", "--data.branching", "[8,2,2,2]", *tail]
    assert variant_arguments("tree-wide-questions", "stale-digits") == [
        "--data.rollout", "tree", "--data.branching", "[4,4,4,2]", *tail]
    assert variant_arguments("tree-wide-questions", "calculator")[3] == "[4,4,2]"  # 3 rounds


def test_a_run_written_twice_counts_once(tmp_path):
    row = {"protocol": 3, "model": model_id("calculator"), "game": "calculator", "variant": "chains-centred",
           "seed": 3, "lr": 5e-4, "budget": 11000, "test_return": 0.677}
    other = {**row, "seed": 4, "test_return": 0.6}
    results = tmp_path / "rows.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in (row, other, {**row, "test_return": 0.1})))
    assert load_rows(results, "calculator") == [row, other]  # the first of the two seed-3 rows


def test_interval_and_gap_closed_by_hand():
    # 0.4, 0.5, 0.6: mean 0.5, sample sd 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.2484338
    mean, half = interval([0.4, 0.5, 0.6])
    assert mean == pytest.approx(0.5, abs=1e-12) and half == pytest.approx(0.2484338, abs=1e-7)
    assert interval([0.3]) == (0.3, 0.0)
    assert gap_closed(0.096, 0.096, 0.644) == 0.0
    assert gap_closed(0.508, 0.096, 0.644) == pytest.approx(0.7518248, abs=1e-7)  # the goal's 0.508 is 75%

"""Is the cue in the warm start's representation? (issue 49: every run's first decision stayed cue-blind.)

The decision-hard game's warm start (``data/tiny-llama-stale``) decides ask-or-answer from the hidden state at the
prompt's last token. This script reads that state at every layer for the training prompts and for the held-out
ones, fits a linear probe (multinomial logistic regression, full batch, L2 1e-3) that names the cue (``A``..``D``)
from it on the training prompts, and reports its held-out accuracy per layer (chance: 0.25), beside the warm
start's own probability of answering at once per cue. A cue the last layer carries linearly is one a policy update
at the output could use at once; a cue it does not carry has to be routed there first, a change the policy
gradient makes slowly when the four cues' signals point opposite ways on the same weights.

    .venv/bin/python benchmarks/research/trees/cue_probe.py [--model data/tiny-llama-stale] [--adapter DIR]

``--adapter``: the same for a trained adapter (a run of benchmarks/research/trees/tree_vs_chains.py saves none; train
one with the command to probe it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from lit_grpo.policy.model_loading import load_policy  # noqa: E402
from lit_grpo.run.model_files import load_tokenizer  # noqa: E402
from lit_grpo.tasks.games.stale_digits import CUES, StaleDigitsTask  # noqa: E402


def last_token_states(policy, tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``([layers + 1, P, H] hidden states at each prompt's last token, [P] probability that the first sampled
    token answers (a digit) rather than asks)``; the prompts of this game all have the same length."""
    ids = torch.tensor([tokenizer(p)["input_ids"] for p in prompts])  # [P, S]
    with torch.no_grad():
        out = policy(input_ids=ids, output_hidden_states=True)
    states = torch.stack([h[:, -1, :] for h in out.hidden_states])  # [layers + 1, P, H]
    probs = out.logits[:, -1, :].float().softmax(-1)  # [P, V]
    digits = [tokenizer(str(d), add_special_tokens=False)["input_ids"][0] for d in range(10)]
    ask = tokenizer("?", add_special_tokens=False)["input_ids"][0]
    answer = probs[:, digits].sum(-1)
    return states, answer / (answer + probs[:, ask])


def probe_accuracy(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                   steps: int = 500) -> float:
    """Held-out accuracy of a multinomial logistic probe fitted on standardised features (LBFGS, L2 1e-3)."""
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    weight = torch.zeros(train_x.shape[1], len(CUES), requires_grad=True)
    bias = torch.zeros(len(CUES), requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(train_x @ weight + bias, train_y) + 1e-3 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return float(((test_x @ weight + bias).argmax(-1) == test_y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "data" / "tiny-llama-stale"))
    parser.add_argument("--adapter", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    task = StaleDigitsTask()
    train, held_out = list(task.train_records()), list(task.heldout_records())
    tokenizer = load_tokenizer(args.model)
    policy = load_policy(args.model, 16, 32, 0.0, "all-linear", init_adapter=args.adapter, dtype="float32").eval()
    train_states, _ = last_token_states(policy, tokenizer, [r["prompt"] for r in train])
    test_states, answer_p = last_token_states(policy, tokenizer, [r["prompt"] for r in held_out])
    train_y = torch.tensor([CUES.index(r["cue"]) for r in train])
    test_y = torch.tensor([CUES.index(r["cue"]) for r in held_out])
    print(f"model {args.model}{' + ' + args.adapter if args.adapter else ''}: {len(train)} training prompts, "
          f"{len(held_out)} held out")
    print("| layer | held-out accuracy of a linear probe for the cue (chance 0.25) |")
    print("|---|---|")
    for layer in range(train_states.shape[0]):
        accuracy = probe_accuracy(train_states[layer], train_y, test_states[layer], test_y)
        print(f"| {'embeddings' if layer == 0 else layer} | {accuracy:.3f} |")
    print("\nprobability of answering at once (a digit before '?'), held-out prompts, per cue:")
    for index, cue in enumerate(CUES):
        values = answer_p[test_y == index].tolist()
        print(f"- {cue}: {statistics.fmean(values):.3f} (min {min(values):.3f}, max {max(values):.3f})")


if __name__ == "__main__":
    main()

"""Turns without paying for the prefix again (issue 48, item 7): the engine time of a 4-turn tool episode against one
completion from the same prompt with as many generated tokens, on the hf engine and the in-process vLLM engine.

Prompts: ``--episodes`` rows of the shipped tool task (``configs/tools.yaml``) rendered by Qwen2.5's template with
the ``Registers`` tools' schemas (about 350 ids), the shipped warm start ``data/tiny-qwen2-tools`` with a LoRA
adapter, fp32. Each turn generates exactly ``--turn-tokens`` tokens (no stop id: the lengths are fixed, so both
sides generate the same number), then a tool message as Qwen's template renders it (``reply_ids``) is appended, and
the next turn is one ``generate`` call over the grown contexts, as ``rollout/trees.py`` makes it. The baseline
generates ``4 x --turn-tokens`` tokens in one call. No tool runs: engine time only. Each figure is the median of
``--repeats``; the ratio is episode / baseline.

Engines: ``hf`` keeps a turn's key/value cache for the next (``HFEngine(keep_turn_cache=True)``, the default:
``lit_grpo/engines/hf_turns.py``), so a later turn runs only its new ids; ``hf-refill`` is the same engine
prefilling each turn's whole context again (``keep_turn_cache=False``), the cost the cache saves; ``vllm`` keeps the
blocks of a context it has seen (prefix caching, pinned on by ``VLLMEngine``).

Run alone (one benchmark at a time):

    .venv/bin/python benchmarks/speed/multiturn_generation.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lit_grpo.engines import HFEngine, SamplingSpec, VLLMEngine  # noqa: E402
from lit_grpo.policy.model_loading import load_policy  # noqa: E402
from lit_grpo.rollout.turn_tokens import reply_ids  # noqa: E402
from lit_grpo.tasks.tools.arithmetic import Registers, register_answer  # noqa: E402
from lit_grpo.tasks.tools.task import ToolTask  # noqa: E402

MODEL = ROOT / "data" / "tiny-qwen2-tools"
TURNS = 4


def prompts_and_reply(episodes: int, tokenizer: Any) -> tuple[list[list[int]], list[int]]:
    """The tool task's first ``episodes`` training prompts as ids, and one tool message's ids as the template renders
    it after a call."""
    task = ToolTask(path=str(ROOT / "data" / "tool-arithmetic" / "rows.jsonl"), environment=Registers,
                    rewards=[register_answer], max_turns=TURNS, tool_timeout=None)
    rows = task.split()[0][:episodes]
    prompts = [task.episode_prompt_ids(row, task.start_episode(row), tokenizer) for row in rows]
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"x": "a", "y": "b"}}}]}
    conversation = [{"role": "user", "content": "What is 12+30+4?"}, call]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    reply = reply_ids(tokenizer, conversation, [{"role": "tool", "name": "add", "content": "r1 = 42"}], None, end, 1)
    return prompts, [end, *reply]  # the turn's own end of turn, then the template's tool message


def episode_seconds(engine: Any, prompts: list[list[int]], reply: list[int], turn_tokens: int) -> float:
    contexts = [list(p) for p in prompts]
    start = time.perf_counter()
    for turn in range(TURNS):  # each turn but the last tells the engine another follows, as rollout/trees.py does
        spec = SamplingSpec(max_new_tokens=turn_tokens, stop_token_ids=(), seed=turn, next_turn=turn < TURNS - 1)
        groups = engine.generate(contexts, 1, spec)
        contexts = [c + list(g[0].token_ids) + (reply if turn < TURNS - 1 else []) for c, g in zip(contexts, groups)]
    return time.perf_counter() - start


def completion_seconds(engine: Any, prompts: list[list[int]], tokens: int) -> float:
    start = time.perf_counter()
    engine.generate(prompts, 1, SamplingSpec(max_new_tokens=tokens, stop_token_ids=(), seed=0))
    return time.perf_counter() - start


def measure(name: str, engine: Any, policy: Any, prompts: list[list[int]], reply: list[int],
            options: argparse.Namespace) -> None:
    engine.push_policy(policy)
    episode_seconds(engine, prompts, reply, options.turn_tokens)  # warm-up: start-up, caches, first allocations
    episodes, singles = [], []
    for _ in range(options.repeats):  # alternated, so that drift hits both sides alike
        episodes.append(episode_seconds(engine, prompts, reply, options.turn_tokens))
        singles.append(completion_seconds(engine, prompts, TURNS * options.turn_tokens))
    episode, single = statistics.median(episodes), statistics.median(singles)
    print(f"{name:9s} | {len(prompts)} episodes x {TURNS} turns x {options.turn_tokens} tokens, "
          f"{len(reply)} reply ids a turn | episode {episode:.2f} s | one completion of "
          f"{TURNS * options.turn_tokens} tokens {single:.2f} s | ratio {episode / single:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turn-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=["hf", "hf-refill", "vllm"])
    options = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    policy = load_policy(str(MODEL), 8, 16, 0.0, "all-linear")
    prompts, reply = prompts_and_reply(options.episodes, AutoTokenizer.from_pretrained(MODEL))
    print(f"prompt ids: {min(map(len, prompts))}-{max(map(len, prompts))}")
    engines = {"hf": HFEngine, "hf-refill": lambda: HFEngine(keep_turn_cache=False),
               "vllm": lambda: VLLMEngine(dtype="float32", kv_cache_gib=1.0)}
    for name in options.engines:
        engine = engines[name]()
        measure(name, engine, policy, prompts, reply, options)
        engine.close()


if __name__ == "__main__":
    main()

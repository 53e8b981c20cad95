"""Helpers of ``tests/test_trl_families.py``: every chat template TRL 1.16's ``add_response_schema`` recognises, each on
the tiny BPE tokenizer of ``data/tiny-qwen2-chat`` given the family's special tokens and TRL's shipped ``.jinja``
(text only, no weights), with scripted assistant turns in the family's own call syntax, run through TRL's own
``GRPOTrainer._generate`` / ``_tool_call_loop`` / ``_get_tool_suffix_ids`` / ``_calculate_rewards`` (unbound, on a
minimal stand-in ``self``) and through lit-grpo's ``expand_trees`` with a ``ToolTask`` (chains of width 1), so a test
compares the two episodes aspect by aspect.

Only two pieces of TRL are copied here, because they are inline in methods too large to call alone (they are marked
where they are copied): the per-rollout environment set-up of ``_generate_and_score_completions`` (one instance per
rollout, the sync/async tool dicts, ``reset(**row)`` appended to the last message) and the ``get_reward`` wrapper of
``GRPOTrainer.__init__``. Everything that parses, renders, masks, drops and scores is TRL's own function."""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import sys
import types
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

TINY = "data/tiny-qwen2-chat"


@dataclass(frozen=True)
class Family:
    """A chat template family as TRL 1.16 ships it.

    ``special``: tokens added as special (stripped by ``decode(skip_special_tokens=True)``); ``plain``: tokens added as
    ordinary added tokens (Qwen's ``<tool_call>`` and ``<think>`` are added but not special in the released
    tokenizers). ``eos``: the tokenizer's ``eos_token`` as the released model sets it; ``stops``: the ids the engine
    stops on (a turn ends on the first); ``second_eos``: another stop id the released model's generation config also
    ends on (``<|endoftext|>`` for Qwen); ``call_end`` / ``answer_end``: the token a sampled call / answer turn ends
    on where the template's rendering of the assistant message has none (GLM, Gemma 4). ``thinking``: the family
    renders reasoning; ``reasoning``: the message field it reads (``reasoning_content``, or ``thinking`` for GPT-OSS
    and LFM2.5). ``one_call``: the template renders one call per turn (Llama 3.x, GPT-OSS). ``kwargs``:
    chat_template_kwargs."""

    name: str
    jinja: str
    special: tuple[str, ...]
    eos: str
    stops: tuple[str, ...]
    second_eos: str | None
    plain: tuple[str, ...] = ()
    bos: str | None = None
    call_end: str | None = None
    answer_end: str | None = None
    thinking: bool = False
    reasoning: str = "reasoning_content"
    one_call: bool = False
    kwargs: dict = field(default_factory=dict)
    parse_only: str | None = None  # why TRL runs no tools on it

    def __hash__(self) -> int:
        return hash(self.name)


QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_PLAIN = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
THINK = ("<think>", "</think>")
VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
LLAMA_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "<|eom_id|>", "<|python_tag|>")
GPTOSS_SPECIAL = ("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                  "<|constrain|>", "<|return|>", "<|call|>")
GLM_SPECIAL = ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
GLM_PLAIN = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
             "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
LFM_SPECIAL = ("<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|tool_list_start|>",
               "<|tool_list_end|>", "<|tool_call_start|>", "<|tool_call_end|>", "<|tool_response_start|>",
               "<|tool_response_end|>")
GEMMA_SPECIAL = ("<bos>", "<eos>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>",
                 "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>', "<|image|>",
                 "<|audio|>", "<|video|>")
DEEPSEEK_SPECIAL = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                    "<｜tool▁output▁end｜>", "<｜tool▁sep｜>")


def _qwen(name, jinja, thinking=False, vision=False, **kw):
    return Family(name, jinja, QWEN_SPECIAL + (VISION if vision else ()), "<|im_end|>", ("<|im_end|>", "<|endoftext|>"),
                  "<|endoftext|>", plain=QWEN_PLAIN + THINK, thinking=thinking, **kw)


def _gemma(name, jinja):
    # eos "<eos>" as in Gemma 3's released tokenizer (TRL's _get_tool_suffix_ids: "Gemma uses <turn|>" to end turns,
    # not its EOS); a turn ends on <turn|>, a call on <|tool_response>
    return Family(name, jinja, GEMMA_SPECIAL, "<eos>", ("<turn|>", "<|tool_response>", "<eos>"), "<eos>", bos="<bos>",
                  call_end="<|tool_response>", answer_end="<turn|>", thinking=True, kwargs={})


FAMILIES: dict[str, Family] = {f.name: f for f in [
    _qwen("Qwen2.5", "qwen2_5"),
    _qwen("Qwen3", "qwen3", thinking=True),
    _qwen("Qwen3-Instruct-2507", "qwen3_instruct_2507"),
    _qwen("Qwen3-VL", "qwen3_vl", vision=True),
    _qwen("Qwen3.5-think", "qwen3_5_think", thinking=True, vision=True),
    _qwen("Qwen3.5-nothink", "qwen3_5_nothink", vision=True),
    _qwen("Qwen3.6", "qwen3_6", thinking=True, vision=True),
    _qwen("Qwen3.8", "qwen3_8", thinking=True, vision=True),
    _qwen("Nemotron-3-Nano", "nemotron_3_nano", thinking=True),
    _qwen("Nemotron-3-Super", "nemotron_3_super", thinking=True),
    _qwen("Nemotron-3-Ultra", "nemotron_3_ultra", thinking=True),
    _qwen("Nemotron-3.5-Lightning", "nemotron_3_5_lightning", thinking=True),
    Family("Llama-3.1", "llama3_1", LLAMA_SPECIAL, "<|eot_id|>", ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
           "<|eom_id|>", bos="<|begin_of_text|>", one_call=True),
    Family("Llama-3.2", "llama3_2", LLAMA_SPECIAL, "<|eot_id|>", ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
           "<|end_of_text|>", bos="<|begin_of_text|>", one_call=True),
    Family("GPT-OSS", "gptoss", GPTOSS_SPECIAL, "<|return|>", ("<|return|>", "<|call|>", "<|endoftext|>"),
           "<|endoftext|>", thinking=True, reasoning="thinking", one_call=True),
    Family("GLM-4-MoE", "glm4moe", GLM_SPECIAL, "<|endoftext|>", ("<|endoftext|>", "<|user|>", "<|observation|>"),
           "<|endoftext|>", plain=GLM_PLAIN, call_end="<|observation|>", answer_end="<|user|>", thinking=True),
    Family("LFM2-v2", "lfm2_v2", LFM_SPECIAL, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>",
           bos="<|startoftext|>"),
    Family("LFM2.5", "lfm2_2_5", LFM_SPECIAL, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>",
           plain=THINK, bos="<|startoftext|>", thinking=True, reasoning="thinking"),
    Family("LFM2.5-v2", "lfm2_2_5_v2", LFM_SPECIAL, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>",
           plain=THINK, bos="<|startoftext|>", thinking=True, reasoning="thinking"),
    Family("LFM2.5-VL", "lfm2_2_5_vl", LFM_SPECIAL, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>",
           plain=THINK, bos="<|startoftext|>", thinking=True, reasoning="thinking"),
    _gemma("Gemma-4", "gemma4"),
    _gemma("Gemma-4-v2", "gemma4_v2"),
    _gemma("Gemma-4-v3", "gemma4_v3"),
    _gemma("Gemma-4-v4", "gemma4_v4"),
    _gemma("Gemma-4-v5", "gemma4_v5"),
    Family("DeepSeek-R1-Distill", "deepseek_r1_distill", DEEPSEEK_SPECIAL, "<｜end▁of▁sentence｜>",
           ("<｜end▁of▁sentence｜>",), None, plain=THINK, bos="<｜begin▁of▁sentence｜>", thinking=True,
           parse_only="TRL refuses its template for tools (supports_tool_calling is False: it drops tool_calls when "
                      "content is set and never closes a one-call turn); add_response_schema gives it a parser for "
                      "reasoning and content only"),
]}


def jinja_text(name: str) -> str:
    from importlib.resources import files

    return (files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def family_tokenizer(name: str) -> tuple[Any, str | None]:
    """The tiny tokenizer with the family's tokens and TRL's template, after TRL's ``add_response_schema``; and the
    chat template TRL's trainer renders with (``get_training_chat_template`` where the template is not
    prefix-preserving, else None), as ``GRPOTrainer.__init__`` chooses it."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import (add_response_schema, get_training_chat_template,
                                         is_chat_template_prefix_preserving)

    family = FAMILIES[name]
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.special)},
                                 replace_extra_special_tokens=False)
    if family.plain:
        tokenizer.add_tokens(list(family.plain), special_tokens=False)
    tokenizer.eos_token = family.eos
    if family.bos is not None:
        tokenizer.bos_token = family.bos
    tokenizer.chat_template = jinja_text(family.jinja)
    tokenizer.name_or_path = f"tiny-{family.jinja}"
    add_response_schema(tokenizer)
    template = None if family.parse_only or is_chat_template_prefix_preserving(tokenizer) else (
        get_training_chat_template(tokenizer))
    return tokenizer, template


# ---------------------------------------------------------------------------------------------------------------
# Tools, an environment and rewards, written as a TRL user writes them


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


async def mul(a: int, b: int) -> int:
    """Multiply two integers (an async tool).

    Args:
        a: The first number.
        b: The second number.
    """
    await asyncio.sleep(0)
    return a * b


def text(n: int) -> str:
    """A long text of n words.

    Args:
        n: How many words.
    """
    return " ".join(["word"] * n)


TOOLS = (add, mul, text)


class Counter:
    """A TRL environment: ``reset`` reads the row and adds text to the prompt; its method is a tool; it owns a
    reward."""

    def reset(self, **row) -> str:
        self.total = 0
        self.row_keys = sorted(row)
        return " Count with bump."

    def bump(self, by: int) -> int:
        """Add to the count.

        Args:
            by: How much.
        """
        self.total += by
        return self.total

    def get_reward(self) -> float:
        return float(self.total)


def exact_answer(prompts, completions, answer, **kwargs):
    """TRL's conversational reward: the last assistant message's content against the row's answer."""
    return [float(c[-1].get("content", "").strip() == a) for c, a in zip(completions, answer)]


class Recorder:
    """A reward that records what it is given (the reward inputs) and scores the number of completion messages."""

    def __init__(self):
        self.calls: list[dict[str, Any]] = []
        self.__name__ = "recorder"

    def __call__(self, prompts, completions, **kwargs):
        self.calls.append({"prompts": copy.deepcopy(prompts), "completions": copy.deepcopy(completions),
                           "completion_ids": copy.deepcopy(kwargs.get("completion_ids")),
                           "keys": sorted(kwargs)})
        return [float(len(c)) for c in completions]


# ---------------------------------------------------------------------------------------------------------------
# Scripted assistant turns, rendered by the family's own template


def schemas(tools) -> list[dict]:
    from transformers.utils import get_json_schema

    return [get_json_schema(t) for t in tools]


def assistant_message(family: Family, content: str = "", calls=(), reasoning: str | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": dict(a)}} for n, a in calls]
    if reasoning is not None:
        message[family.reasoning] = reasoning
    return message


def turn_text(name: str, message: dict, tools=TOOLS, end: str | None = None) -> str:
    """The text a model of the family samples for ``message``: the template's rendering of the conversation with it
    minus without it (after the generation prompt), cut after the first stop token, or closed with the family's
    end token where the template writes none (``end`` overrides the stop token the turn ends on)."""
    family = FAMILIES[name]
    tokenizer, template = family_tokenizer(name)
    user = [{"role": "user", "content": "What is 3+4?"}]
    render = functools.partial(tokenizer.apply_chat_template, tools=schemas(tools), tokenize=False,
                               chat_template=template, **family.kwargs)
    prompt = render(user, add_generation_prompt=True)
    full = render(user + [message])
    if full.startswith(prompt):  # the generation prompt opens what the message renders (e.g. "<think>\n")
        body = full[len(prompt):]
    else:  # Nemotron: the prompt opens "<think>\n", an empty reasoning renders "<think></think>": the model goes on
        common = 0
        while common < min(len(prompt), len(full)) and prompt[common] == full[common]:
            common += 1
        if prompt[common:].strip():
            raise AssertionError(f"{name}: the rendered assistant message does not continue the generation prompt "
                                 f"(from char {common}: {prompt[common:]!r} vs {full[common:common + 80]!r})")
        body = full[common:].lstrip()
    cut = [(body.index(s), s) for s in family.stops if s in body]
    if cut:
        at, stop = min(cut)
        body = body[:at]
    else:
        stop = (family.call_end if message.get("tool_calls") else family.answer_end) or family.stops[0]
        body = body.rstrip("\n") if family.call_end else body
    return body + (end or stop)


def ids_of(name: str, text_: str) -> list[int]:
    tokenizer, _ = family_tokenizer(name)
    return tokenizer(text_, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------------------------
# The episode as TRL 1.16 plays it


@functools.lru_cache(maxsize=1)
def trl_event_loop():
    """TRL's daemon event loop for async tools and rewards (``GRPOTrainer.__init__`` starts one the same way)."""
    from trl.trainer.utils import start_event_loop_in_daemon

    _, loop, ready = start_event_loop_in_daemon(name="trl-families")
    ready.wait()
    return loop


@dataclass
class Episode:
    """One episode, as either side played it, in TRL's terms."""

    prompt_messages: list[dict]  # the prompt after reset
    prompt_ids: list[int]
    completion_ids: list[int]
    tool_mask: list[int]
    completion: list[dict]  # the completion conversation
    reward: float  # the weighted sum TRL advantages start from (nan: unscorable)
    tool_calls: int
    tool_failures: int
    contexts: list[list[int]]  # what the engine was given at each turn
    reward_inputs: list[dict]  # what the recording reward received


class ScriptedTurns:
    """The turns a scripted model samples, in order (the k-th generation call gets the k-th turn)."""

    def __init__(self, turns: list[list[int]]):
        self.turns, self.contexts = turns, []

    def next(self, context: list[int]) -> list[int]:
        self.contexts.append(list(context))
        return list(self.turns[len(self.contexts) - 1])


def trl_episode(name: str, record: dict, turns: list[list[int]], tools=TOOLS, environment=None,
                rewards=(exact_answer,), max_completion_length: int = 4096) -> Episode:
    """One rollout through TRL 1.16's ``GRPOTrainer._generate`` (its ``_tokenize_prompts``, ``parse_response`` with
    the prompt as prefix, ``_tool_call_loop``, ``_get_tool_suffix_ids``) and ``_calculate_rewards``, on a stand-in
    ``self`` with the attributes they read; the model is ``turns``."""
    from trl import GRPOTrainer

    family = FAMILIES[name]
    tokenizer, template = family_tokenizer(name)
    script = ScriptedTurns(turns)
    recorder = Recorder()
    self = types.SimpleNamespace()
    self.processing_class = self._tokenizer = tokenizer
    self.chat_template, self.chat_template_kwargs = template, dict(family.kwargs)
    self._is_vlm, self.rollout_func, self.use_vllm, self.vllm_mode = False, None, False, None
    self.model = types.SimpleNamespace(training=True, config=types.SimpleNamespace(max_position_embeddings=1 << 20))
    self.accelerator = types.SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, is_main_process=True)
    self.args = types.SimpleNamespace(report_to=[])
    from transformers import TrainerState

    self.state = TrainerState()
    self.num_generations = self.num_generations_eval = 1
    self.eos_token_ids = [tokenizer.eos_token_id]
    self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    self._pending_metrics, self._pending_extra_logs = defaultdict(list), defaultdict(list)
    self.max_completion_length = max_completion_length
    self.max_tool_calling_iterations = sys.maxsize  # TRL's default, max_tool_calling_iterations=None
    self.async_loop = trl_event_loop()
    bind = functools.partial
    self._get_tool_suffix_ids = bind(GRPOTrainer._get_tool_suffix_ids, self)
    self._tokenize_prompts = bind(GRPOTrainer._tokenize_prompts, self)
    self._log_completion_extra = bind(GRPOTrainer._log_completion_extra, self)
    self._log_metric = bind(GRPOTrainer._log_metric, self)
    counts = {}

    def tool_call_loop(*args):
        out = GRPOTrainer._tool_call_loop(self, *args)
        counts["calls"], counts["failures"] = out[4], out[5]
        return out

    self._tool_call_loop = tool_call_loop
    self._generate_single_turn = lambda ids, *args, **kwargs: ([script.next(c) for c in ids], None)

    # __init__'s tools and environments (GRPOTrainer.__init__, grpo_trainer.py ~656-745; copied: inline there)
    self._standalone_tools = list(tools)
    self.reward_funcs = [*rewards, recorder]
    self.reward_func_names = [getattr(f, "__name__", "reward") for f in self.reward_funcs]
    self.reward_processing_classes = [None] * len(self.reward_funcs)
    if environment is None:
        self.environment_factories, self.tools, self.environments = None, list(tools), None
    else:
        self.environment_factories = {None: environment}
        probe = environment()
        methods = [getattr(probe, m) for m, _ in inspect.getmembers(type(probe), predicate=inspect.isfunction)
                   if m not in ("reset", "get_reward") and not m.startswith("_")]
        self._env_tools = {None: list(tools) + methods}
        self.tools = list(tools) + methods
        if callable(getattr(probe, "get_reward", None)):
            env_type = type(probe)

            def get_reward(environments, _env_type=env_type, **kwargs):
                return [e.get_reward() if type(e) is _env_type else None for e in environments]

            self.reward_funcs.append(get_reward)
            self.reward_func_names.append(env_type.__name__)
            self.reward_processing_classes.append(None)
        # _generate_and_score_completions (~2340-2398; copied: inline there): one instance per rollout, its tools,
        # reset(**row) with the whole row, the text it returns appended to the last message
        self._batch_environments = [None]
        self.environments = [environment()]
    prompts = [copy.deepcopy(record["prompt"])]
    self._sync_tool_dicts, self._async_tool_dicts = [], []
    methods = []
    if self.environments:
        env = self.environments[0]
        methods = [getattr(env, m) for m, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
                   if m not in ("reset", "get_reward") and not m.startswith("_")]
    sync_tools, async_tools = {}, {}
    for tool in list(tools) + methods:
        (async_tools if inspect.iscoroutinefunction(tool) else sync_tools)[tool.__name__] = tool
    self._sync_tool_dicts.append(sync_tools)
    self._async_tool_dicts.append(async_tools)
    if self.environments:
        observation = self.environments[0].reset(**record)
        if observation is not None:
            prompts[0] = prompts[0][:-1] + [{**prompts[0][-1], "content": prompts[0][-1]["content"] + observation}]

    prompt_ids, completion_ids, tool_mask, completions, *_ = GRPOTrainer._generate(self, prompts)
    rewards_per_func = GRPOTrainer._calculate_rewards(self, [record], prompts, completions, completion_ids)
    reward = float("nan") if torch.isnan(rewards_per_func).all() else float(rewards_per_func.nansum())
    return Episode(prompts[0], list(prompt_ids[0]), list(completion_ids[0]), list(tool_mask[0]), completions[0],
                   reward, counts.get("calls", 0), counts.get("failures", 0), script.contexts, recorder.calls)


# ---------------------------------------------------------------------------------------------------------------
# The same episode through lit-grpo: expand_trees with a ToolTask, a chain of width 1


@functools.lru_cache(maxsize=None)
def lit_tokenizer(name: str):
    """lit-grpo's copy of the family's tokenizer as a TRL user hands it over (the released template, TRL's response
    template set), so nothing lit-grpo does to it reaches TRL's side."""
    return copy.deepcopy(family_tokenizer(name)[0])


class ScriptedEngine:
    """A rollout engine that emits the scripted turns' token ids (``tests/test_tool_turns.py``'s, by id)."""

    shared = True

    def __init__(self, script: ScriptedTurns):
        self.script = script

    def end_turns(self):
        pass

    def generate(self, prompts, n, sampling):
        from lit_grpo.engines import Completion

        out = []
        for prompt in prompts:
            ids = self.script.next(prompt)
            out.append([Completion(tuple(ids), tuple(-0.25 for _ in ids), "stop") for _ in range(n)])
        return out


def tool_task(tools, environment, rewards, max_turns: int, max_completion_length: int, family: Family):
    """A ToolTask as a TRL user configures it, passing each option the constructor knows of (it is being rewritten
    to follow TRL: ``max_completion_length``, ``chat_template_kwargs`` arrive there)."""
    from lit_grpo.tasks.tools.task import ToolTask

    known = inspect.signature(ToolTask.__init__).parameters
    wanted = {"records": [{"prompt": "unused", "answer": "0"}] * 4, "tools": list(tools), "environment": environment,
              "rewards": list(rewards), "max_turns": max_turns, "tool_timeout": None,
              "max_completion_length": max_completion_length, "chat_template_kwargs": dict(family.kwargs)}
    return ToolTask(**{k: v for k, v in wanted.items() if k in known})


def lit_episode(name: str, record: dict, turns: list[list[int]], tools=TOOLS, environment=None,
                rewards=(exact_answer,), max_completion_length: int = 4096) -> Episode:
    """The episode ``trl_episode`` plays, through ``expand_trees`` (one chain, one turn per scripted turn)."""
    from lit_grpo.engines import SamplingSpec
    from lit_grpo.rollout.trees import expand_trees
    from lit_grpo.tree import chain_returns, depth_first

    family = FAMILIES[name]
    tokenizer = lit_tokenizer(name)
    script, recorder = ScriptedTurns(turns), Recorder()
    task = tool_task(tools, environment, [*rewards, recorder], len(turns), max_completion_length, family)
    stops = tuple(tokenizer.convert_tokens_to_ids(list(family.stops)))
    (root,) = expand_trees(task, ScriptedEngine(script), tokenizer, [copy.deepcopy(record)], [1] * len(turns),
                           SamplingSpec(max_new_tokens=max_completion_length, stop_token_ids=stops))
    nodes = [n for n in depth_first(root) if n is not root]
    completion_ids, mask = [], []
    for node in nodes:
        segment, reply = list(node.segment), list(getattr(node, "reply", ()) or ())
        completion_ids += segment + reply
        mask += [1] * len(segment) + [0] * len(reply)
    last = nodes[-1]
    episode = getattr(last, "episode", None)
    completion = list(getattr(episode, "completion", []) or [])
    prompt_messages = list(getattr(episode, "messages", [])[:getattr(episode, "prompt_messages", 0)])
    (ret,) = chain_returns(root)
    return Episode(prompt_messages, list(root.context), completion_ids, mask, completion, float(ret),
                   sum((getattr(episode, "calls", None) or {}).values()),
                   sum((getattr(episode, "failures", None) or {}).values()), script.contexts, recorder.calls)


# ---------------------------------------------------------------------------------------------------------------
# The cases


RECORD = {"prompt": [{"role": "user", "content": "What is 3+4?"}], "answer": "7"}
BROKEN = [('"b": 4}', '"b": }'), ("b:4}", "b:}"), ("b=4)", "b=)"),
          ("<parameter=b>\n4\n</parameter>\n", "<parameter=b>\n4\n"), ("<arg_value>4</arg_value>", "<arg_value>4")]


@dataclass(frozen=True)
class Case:
    turns: tuple[tuple[int, ...], ...]
    tools: tuple = TOOLS
    environment: Any = None
    rewards: tuple = (exact_answer,)
    max_completion_length: int = 4096


def _turn(name: str, calls=(), content: str = "", reasoning: str | None = None, end: str | None = None,
          tools=TOOLS) -> tuple[int, ...]:
    message = assistant_message(FAMILIES[name], content, calls, reasoning)
    return tuple(ids_of(name, turn_text(name, message, tools, end)))


def malformed(name: str, turn_text_: str) -> str:
    for old, new in BROKEN:
        if old in turn_text_:
            return turn_text_.replace(old, new, 1)
    raise AssertionError(f"{name}: no way to break {turn_text_!r}")


CASE_NAMES = ("call", "calls", "async_sync", "reasoning", "malformed", "second_eos", "overflow", "reset", "answer")


def case_applies(family: Family, case: str) -> bool:
    """Reasoning only where the family thinks, the second EOS only where it has one."""
    return not family.parse_only and (case != "reasoning" or family.thinking) and (
        case != "second_eos" or family.second_eos is not None)


@functools.lru_cache(maxsize=None)
def family_cases(name: str) -> dict[str, Case]:
    """The scripted cases of a family (reasoning only where it thinks, the second EOS only where it has one)."""
    family = FAMILIES[name]
    if family.parse_only:
        return {}
    add34, add12, mul25 = ("add", {"a": 3, "b": 4}), ("add", {"a": 1, "b": 2}), ("mul", {"a": 2, "b": 5})
    answer = _turn(name, content="7")
    one_turn = (lambda *calls: tuple(_turn(name, [c]) for c in calls)) if family.one_call else (
        lambda *calls: (_turn(name, list(calls)),))
    broken_call = tuple(ids_of(name, malformed(name, turn_text(name, assistant_message(family, "", [add34])))))
    cases = {
        "call": Case((_turn(name, [add34]), answer)),
        "calls": Case((*one_turn(add34, add12), answer)),
        "async_sync": Case((*one_turn(mul25, add34), answer)),
        "malformed": Case((broken_call, answer)),
        "overflow": Case((_turn(name, [("text", {"n": 300})]), answer), max_completion_length=160),
        "reset": Case((_turn(name, [("bump", {"by": 3})], tools=(Counter.bump,)), _turn(name, content="done")),
                      tools=(), environment=Counter, rewards=()),
        "answer": Case((answer,)),
    }
    if family.thinking:
        cases["reasoning"] = Case((_turn(name, [add34], reasoning="I add 3 and 4."),
                                   _turn(name, content="7", reasoning="3+4 is 7.")))
    if family.second_eos is not None:
        cases["second_eos"] = Case((_turn(name, [add34], end=family.second_eos), answer))
    return cases


@functools.lru_cache(maxsize=None)
def episodes(name: str, case: str) -> tuple[Episode, Episode | BaseException]:
    """TRL's episode and lit-grpo's for one (family, case); lit-grpo's error where it raised."""
    c = family_cases(name)[case]
    args = (name, RECORD, [list(t) for t in c.turns], c.tools, c.environment, c.rewards, c.max_completion_length)
    trl = trl_episode(*args)
    try:
        lit = lit_episode(*args)
    except Exception as error:  # noqa: BLE001 - reported per aspect by the test
        lit = error
    return trl, lit


# ---------------------------------------------------------------------------------------------------------------
# The table of docs/trl_families.md: ``.venv/bin/python tests/trl_families.py`` prints it from today's code

ASPECT_FIELDS = {"prompt": ("prompt_messages",), "prompt_ids": ("prompt_ids",), "messages": ("completion",),
                 "completion_ids": ("completion_ids",), "tool_mask": ("tool_mask",), "contexts": ("contexts",),
                 "reward": ("reward",), "reward_inputs": ("reward_inputs",),
                 "tool_counts": ("tool_calls", "tool_failures")}


def differing_aspects(trl: Episode, lit: Episode | BaseException) -> list[str]:
    """The aspects on which lit-grpo's episode differs from TRL's (all of them where lit-grpo raised)."""
    if isinstance(lit, BaseException):
        return ["raised"]
    same = lambda a, b: a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)  # noqa: E731
    return [aspect for aspect, fields in ASPECT_FIELDS.items()
            if not all(same(getattr(trl, f), getattr(lit, f)) for f in fields)]


def table() -> str:
    rows = ["| family | template | " + " | ".join(CASE_NAMES) + " |", "|---|---|" + "---|" * len(CASE_NAMES)]
    for name, family in FAMILIES.items():
        if family.parse_only:
            rows.append(f"| {name} | `{family.jinja}.jinja` | " + " | ".join(["parse only"] * len(CASE_NAMES)) + " |")
            continue
        cells = []
        for case in CASE_NAMES:
            if not case_applies(family, case):
                cells.append("—")
                continue
            bad = differing_aspects(*episodes(name, case))
            cells.append("✓" if not bad else "✗ " + ", ".join(bad))
        rows.append(f"| {name} | `{family.jinja}.jinja` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    print(table())

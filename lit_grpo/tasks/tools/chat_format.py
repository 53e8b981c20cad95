"""How a tool task's conversations become token ids and back, as TRL 1.16's ``GRPOTrainer`` does it
(docs/guide.md#tools-and-environments): TRL's own ``trl.chat_template_utils`` functions, no copy of them.

- A tokenizer without a response template gets TRL's for its family (``add_response_schema``, matched by the exact
  template text); a template TRL does not know is refused by name.
- A template that does not render a whole tool-calling exchange is refused (``supports_tool_calling``), as TRL
  refuses it.
- A template that is not prefix-preserving (Qwen3's drops past reasoning) is replaced, for every rendering of the run,
  by TRL's training variant of it (``get_training_chat_template``); one TRL has no variant of is refused by name.
- Each assistant turn is parsed from its token ids with everything before it as the prefix (``parse_response``): calls
  written with special tokens (Llama 3.x, GPT-OSS, Gemma 4) are read, and reasoning comes back as
  ``reasoning_content`` beside ``content``. A turn whose call cannot be parsed is kept as text, as TRL keeps it.

``chat_template_kwargs`` (``enable_thinking`` and the like) pass to every rendering. TRL is a runtime extra of tool
tasks (``pip install 'lit-grpo[tools]'``).
"""

from __future__ import annotations

import functools

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_grpo.errors import InputError


def trl_templates() -> Any:
    """``trl.chat_template_utils``, or ``InputError`` saying how to install it."""
    try:
        import trl.chat_template_utils as templates
    except ImportError as error:
        raise InputError(f"tool tasks read calls with TRL's response parsing, and TRL does not import ({error}): "
                         "pip install 'lit-grpo[tools]' (trl==1.16.0)") from None
    return templates


def model_name(tokenizer: Any) -> str:
    return repr(getattr(tokenizer, "name_or_path", None) or "the model")


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn as the conversation holds it, and whether its calls could not be parsed (then the turn is
    its text: ``malformed``)."""

    message: dict[str, Any]
    malformed: bool


@dataclass(frozen=True)
class ChatFormat:
    """A tokenizer prepared for tool calling as TRL prepares it: ``chat_template`` is the template every rendering
    uses (TRL's training variant where the model's own is not prefix-preserving; None: the tokenizer's own), and
    ``template_kwargs`` pass through to each rendering."""

    tokenizer: Any
    chat_template: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
               generation_prompt: bool) -> list[int]:
        """The template's ids of ``messages`` with the tools' schemas (``tools or None``: an empty list makes some
        templates, Llama's, render their tool preamble)."""
        ids = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tools=list(tools) if tools else None, chat_template=self.chat_template,
            add_generation_prompt=generation_prompt, tokenize=True, return_dict=False, **self.template_kwargs)
        return list(ids)

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """The most bytes one token of the vocabulary spells (its text as the vocabulary writes it, an upper bound
        for byte-level vocabularies), read once."""
        return max((len(token.encode()) for token in self.tokenizer.get_vocab()), default=1)

    def parse(self, ids: Sequence[int], prefix: Sequence[int], tools: Sequence[Mapping[str, Any]]) -> ParsedTurn:
        """The assistant message of a turn's ``ids`` sampled after ``prefix`` (TRL's ``parse_response``: a call that
        cannot be parsed leaves the turn as its decoded text, ``malformed``)."""
        templates = trl_templates()
        tools_list = [dict(t) for t in tools] or None
        try:
            message = templates.parse_response(self.tokenizer, list(ids), prefix=list(prefix), tools=tools_list)
        except Exception:  # noqa: BLE001 - what TRL's fallback does not catch: the turn is its text all the same
            message = {"content": self.tokenizer.decode(list(ids), skip_special_tokens=True)}
        malformed = False
        if not message.get("tool_calls"):  # an answer, or TRL's silent fallback to the text: the strict parse tells
            try:
                strict = self.tokenizer.parse_response(list(ids), prefix=list(prefix), tools=tools_list)
                # None: nothing parsed; calls TRL dropped (a call without a name): malformed too
                malformed = strict is None or bool(isinstance(strict, dict) and strict.get("tool_calls"))
            except Exception:  # noqa: BLE001 - the parser's own error on the model's text: a malformed turn
                malformed = True
        return ParsedTurn({"role": "assistant", **{k: v for k, v in message.items() if k != "role"}}, malformed)


def chat_format(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> ChatFormat:
    """``tokenizer`` prepared for tool calling as TRL's ``GRPOTrainer`` prepares it (the module docstring); the
    response template is set on the tokenizer itself, as TRL sets it. ``InputError`` naming the model where TRL
    raises."""
    templates = trl_templates()
    name = model_name(tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"the tokenizer of {name} has no chat template: a tool task renders its conversations and "
                         "tools with the model's own template (use an instruction-tuned model's tokenizer)")
    if not templates.supports_tool_calling(tokenizer):
        raise InputError(f"the chat template of {name} does not render tools: a conversation with tool calls and "
                         "tool messages loses them (TRL refuses such a template too); use the model family's own "
                         "template with tool support (e.g. Qwen2.5's, Llama 3.1's)")
    has_template = getattr(tokenizer, "response_template", None) is not None
    if not has_template and getattr(tokenizer, "response_schema", None) is None:
        try:
            templates.add_response_schema(tokenizer)
        except ValueError:
            raise InputError(f"the tool calls of {name} cannot be read: its tokenizer has no response_template and "
                             "TRL's add_response_schema does not know its chat template (TRL 1.16 knows Qwen2.5/3/3.5, "
                             "Llama 3.1/3.2, GPT-OSS, GLM-4-MoE, LFM2, Gemma 4, Nemotron 3); set "
                             "tokenizer.response_template (transformers' response parsing docs)") from None
    kwargs = dict(template_kwargs or {})
    training = None
    if not templates.is_chat_template_prefix_preserving(tokenizer):
        try:
            training = templates.get_training_chat_template(tokenizer)
        except ValueError:
            raise InputError(f"the chat template of {name} is not prefix-preserving (a later message rewrites an "
                             "earlier turn), and TRL has no training variant of it: the tokens trained would not be "
                             "the tokens the model saw; give a template that renders earlier turns the same whatever "
                             "follows") from None
    return ChatFormat(tokenizer, training, kwargs)

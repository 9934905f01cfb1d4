"""A model folder's tokenizer and chat template without transformers: ``tokenizers`` and jinja2 only.

``ChatTokenizer`` renders ``chat_template.jinja`` (or ``tokenizer_config.json``'s ``chat_template``) the way
transformers' ``apply_chat_template`` does (same jinja environment, filters and globals, the special tokens as
variables), encodes the text as ``apply_chat_template(tokenize=True)`` does (no special tokens added), and
decodes generated ids incrementally. It keeps torch and transformers out of a process that only generates.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from s2s.config_errors import ConfigError, ValidationContext
from s2s.models import local_path

THINKING_SWITCH = "enable_thinking"  # Qwen3-style chat templates turn thinking on and off with this variable
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken mapping."""
    return token.get("content") if isinstance(token, dict) else token


def _environment() -> Any:
    """transformers' template environment: sandboxed, trim_blocks + lstrip_blocks, its tojson and globals."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (assistant masks, which generation never asks for)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # jinja's own escapes HTML characters; transformers' does not
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[Generation, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment


def chat_template_text(folder: Path) -> str | None:
    """The folder's chat template: chat_template.jinja (transformers 5), else tokenizer_config.json's entry."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    template = json.loads(config.read_text(encoding="utf-8")).get("chat_template") if config.is_file() else None
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, {"name": "tool_use"...}]
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default", next(iter(named.values()), None))
    return template


class ChatTokenizer:
    """Tokenizer (``tokenizer.json``), chat template and special tokens of one model folder."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.chat_template = chat_template_text(folder)
        if self.chat_template is None:
            raise ValueError(f"{folder} has no chat template (chat_template.jinja or tokenizer_config.json)")
        self._template = _environment().from_string(self.chat_template)
        config = folder / "tokenizer_config.json"
        settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
        special_map = folder / "special_tokens_map.json"
        if special_map.is_file():
            settings = {**json.loads(special_map.read_text(encoding="utf-8")), **settings}
        self.special_tokens = {key: _content(settings[key]) for key in SPECIAL_KEYS if _content(settings.get(key))}

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, **switches: Any) -> str:
        """What ``apply_chat_template(messages, tokenize=False, ...)`` returns; ``switches`` are the template's
        own variables (``enable_thinking``), as transformers passes its extra keyword arguments."""
        return self._template.render(messages=messages, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt, **self.special_tokens, **switches)

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered chat text (special tokens in the text are matched, none are added)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def tokens(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(index) for index in ids]

    def decoder(self) -> Callable[[int], str]:
        """:func:`incremental_decoder` of this folder's tokenizer."""
        return incremental_decoder(self.tokenizer)


def incremental_decoder(tokenizer: Any) -> Callable[[int], str]:
    """A decoder of a ``tokenizers.Tokenizer`` fed one generated id at a time: it returns the new text ("" while a
    multi-byte character waits for its last byte, and for special tokens), with the spaces between words where
    they belong."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=True)
    return lambda index: stream.step(tokenizer, index) or ""


def thinking_problem(template: str | None) -> str | None:
    """Why ``llm.thinking`` cannot be set for a model with this chat template (None: it can)."""
    if template is not None and THINKING_SWITCH in template:
        return None
    return (f"null (the model's chat template has no {THINKING_SWITCH} switch to pass it to; Qwen3-style "
            "thinking models have one)")


def thinking_error(thinking: bool | None, model: str, context: ValidationContext,
                   packaged: tuple[str, ...] = ()) -> ConfigError | None:
    """``thinking`` set for a model whose chat template cannot take it: refused before loading.

    A local folder's template is read here; a packaged model (``packaged``) has none; a hub id is checked when
    it loads (:func:`check_thinking`).
    """
    if thinking is None:
        return None
    folder = None if model in packaged else local_path(model)
    if folder is not None and not folder.is_dir():
        return None  # the model key's own check says what is wrong
    if folder is not None:
        try:
            template = chat_template_text(folder)
        except (OSError, ValueError):
            template = None
    elif model in packaged:
        template = None
    else:
        return None
    problem = thinking_problem(template)
    return None if problem is None else context.error("thinking", str(thinking).lower(), problem)


def check_thinking(thinking: bool | None, template: str | None, group: str) -> None:
    """At setup, for a model validation could not read (a hub id): ``thinking`` needs the template's switch."""
    if thinking is not None and (problem := thinking_problem(template)):
        raise ConfigError(f"{group}.thinking", str(thinking).lower(), problem)

"""Reasoning models think between ``<think>`` and ``</think>`` before they answer; the
parser splits an output into ``reasoning_content`` and ``content``, as it streams.

- ``qwen3``: the thinking is there when the output opens with ``<think>``, or when the
  prompt already opened it (templates that write ``<think>`` into the generation prompt).
- ``deepseek_r1``: the output is thinking until ``</think>`` even without the opening tag
  (DeepSeek-R1 often leaves it out, and newer templates put it into the prompt).

Either way a prompt that already closed the thinking (Qwen3's ``enable_thinking: false``
writes an empty ``<think></think>``) makes the whole output the answer."""

from __future__ import annotations

from dataclasses import dataclass

from ferrolm.errors import InvalidInputError
from ferrolm.tools.formats import held_back

_WS = " \t\n\r"
OPEN, CLOSED, UNSAID = "open", "closed", "unsaid"  # where the prompt leaves the thinking


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    name: str
    start: str = "<think>"
    end: str = "</think>"
    # the output is thinking from its first character, whether or not it opens the tag
    thinks_without_start: bool = False

    def prompt_state(self, prompt: str) -> str:
        """``open``: the prompt ends inside the thinking; ``closed``: it ends right after it
        (the model answers at once); ``unsaid``: the output decides."""
        tail = prompt.rstrip(_WS)
        if tail.endswith(self.end):
            return CLOSED
        opened, closed = prompt.rfind(self.start), prompt.rfind(self.end)
        return OPEN if opened > closed else UNSAID

    def thinking_expected(self, prompt: str) -> bool:
        """Whether an output to this prompt is to think first (structure applies after)."""
        return self.prompt_state(prompt) != CLOSED

    def stream(self, prompt: str) -> ReasoningStream:
        state = self.prompt_state(prompt)
        if state == CLOSED:
            return ReasoningStream(self, "content")
        if state == OPEN or self.thinks_without_start:
            return ReasoningStream(self, "opening", then="reasoning")
        return ReasoningStream(self, "opening", then="content")


REASONING_FORMATS = {f.name: f for f in (ReasoningFormat("qwen3"), ReasoningFormat("deepseek_r1", thinks_without_start=True))}
REASONING_ALIASES = {"deepseek-r1": "deepseek_r1"}
REASONING_CHOICES = ("auto", "none", *REASONING_FORMATS, *REASONING_ALIASES)
# DeepSeek's role markers (with full-width bars), in its R1 templates
_DEEPSEEK_ASSISTANT = "<\uff5cAssistant\uff5c>"


def reasoning_format(name: str | None, chat_template: str | None = None) -> ReasoningFormat | None:
    """The format ``--reasoning-parser`` names; ``auto``: the chat template's, if it shows
    one (``detect_reasoning``); ``none``: no parsing."""
    if name is None or name == "none":
        return None
    if name == "auto":
        return detect_reasoning(chat_template)
    name = REASONING_ALIASES.get(name, name)
    if name not in REASONING_FORMATS:
        raise InvalidInputError(f"reasoning_parser: {name!r} is not one of {', '.join(REASONING_CHOICES)}",
                                "reasoning_parser")
    return REASONING_FORMATS[name]


def detect_reasoning(chat_template: str | None) -> ReasoningFormat | None:
    """The reasoning format a chat template shows: a template that writes or strips
    ``</think>`` is a thinking model's; DeepSeek's (its role markers) thinks even without
    the opening tag (``deepseek_r1``), the others (Qwen3, QwQ) as ``qwen3``. None when the
    template shows no thinking."""
    if not chat_template or REASONING_FORMATS["qwen3"].end not in chat_template:
        return None
    return REASONING_FORMATS["deepseek_r1" if _DEEPSEEK_ASSISTANT in chat_template else "qwen3"]


class ReasoningStream:
    """Splits text into (reasoning, content) parts. States: ``opening`` (the output may
    open with the start tag: held until it says; then ``then``), ``reasoning`` (until the
    end tag), ``content`` (the rest)."""

    def __init__(self, fmt: ReasoningFormat, state: str, then: str = "content") -> None:
        self.fmt = fmt
        self.state = state
        self.then = then
        self.buf = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        """``[(kind, text)]``, kind ``reasoning`` or ``content``."""
        self.buf += text
        out: list[tuple[str, str]] = []
        while self.buf:
            if self.state == "content":
                out.append(("content", self.buf))
                self.buf = ""
            elif self.state == "opening":
                head = self.buf.lstrip(_WS)
                start = self.fmt.start
                if not head or (len(head) < len(start) and start.startswith(head)):
                    break
                if head.startswith(start):
                    self.buf = head[len(start):]
                    self.state = "reasoning"
                else:
                    self.state = self.then
            else:
                i = self.buf.find(self.fmt.end)
                if i < 0:
                    keep = held_back(self.buf, self.fmt.end)
                    if len(self.buf) > keep:
                        out.append(("reasoning", self.buf[:len(self.buf) - keep]))
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                if i:
                    out.append(("reasoning", self.buf[:i]))
                self.buf = self.buf[i + len(self.fmt.end):]
                self.state = "content"
                out.append(("end", ""))
        return out

    def finish(self) -> list[tuple[str, str]]:
        """What was held back: a partial tag is text after all."""
        out: list[tuple[str, str]] = []
        if self.buf:
            kind = "reasoning" if self.state == "reasoning" or (self.state == "opening" and self.then == "reasoning") \
                else "content"
            out.append((kind, self.buf))
        self.buf = ""
        return out

"""Tool calling and reasoning for chat: the functions a request offers and how a call is
chosen (``definitions``), how model families write calls (``formats``) and thinking
(``reasoning``), reading an output as it streams (``output``), and what a request changes
about the prompt and the grammar (``plan``)."""

from ferrolm.tools.definitions import FunctionTool, ToolChoice, parse_tool_choice, parse_tools
from ferrolm.tools.formats import FORMATS, PARSER_CHOICES, ToolCallFormat, detect_format, tool_call_format
from ferrolm.tools.messages import template_messages
from ferrolm.tools.output import ChatOutputParser
from ferrolm.tools.pieces import MessageBuilder, Piece, ToolCall
from ferrolm.tools.plan import ChatPlan, plan_chat
from ferrolm.tools.reasoning import REASONING_CHOICES, ReasoningFormat, reasoning_format

__all__ = [
    "FORMATS",
    "PARSER_CHOICES",
    "REASONING_CHOICES",
    "ChatOutputParser",
    "ChatPlan",
    "FunctionTool",
    "MessageBuilder",
    "Piece",
    "ReasoningFormat",
    "ToolCall",
    "ToolCallFormat",
    "ToolChoice",
    "detect_format",
    "parse_tool_choice",
    "parse_tools",
    "plan_chat",
    "reasoning_format",
    "template_messages",
    "tool_call_format",
]

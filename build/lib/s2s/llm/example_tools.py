"""An example ``llm.tools`` module: python run.py llm=openai llm.tools=s2s.llm.example_tools

A tools module is trusted code: s2s imports it and runs ``call_tool`` with the arguments the model chose.
"""
from __future__ import annotations

import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current local time in a time zone.",
        "parameters": {"type": "object",
                       "properties": {"timezone": {"type": "string", "description": "IANA name, e.g. Europe/Paris"}},
                       "required": ["timezone"]},
    },
}]


def call_tool(name: str, arguments: dict[str, Any]) -> Any:
    if name != "get_time":
        raise ValueError(f"unknown tool {name}")
    try:
        now = datetime.datetime.now(ZoneInfo(arguments["timezone"]))
    except ZoneInfoNotFoundError:
        return {"error": f"unknown time zone {arguments['timezone']!r}"}
    return {"timezone": arguments["timezone"], "time": now.strftime("%H:%M")}

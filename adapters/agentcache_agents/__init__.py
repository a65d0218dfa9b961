"""Agent loops on agentcache's `AgentSession` and shipped templates: Reflexion, a MemGPT-style
memory agent and a SWE-style tool loop, with offline tools. Each records every model call's
reuse and TTFT (`records`) and counts the outputs it had to replace (`fallbacks`)."""

from agentcache_agents.calls import Call, parse_calls
from agentcache_agents.loop import AgentLoop, TurnRecord
from agentcache_agents.memgpt import BlockSpec, MemGPTAgent
from agentcache_agents.reflexion import QATask, ReflexionAgent, TrialResult, parse_action
from agentcache_agents.report import summary_line, turn_table
from agentcache_agents.shell import Workspace
from agentcache_agents.swe import SWEAgent, SWEResult, SWETask, parse_command
from agentcache_agents.wiki import KnowledgeBase

__all__ = [
    "AgentLoop",
    "BlockSpec",
    "Call",
    "KnowledgeBase",
    "MemGPTAgent",
    "QATask",
    "ReflexionAgent",
    "SWEAgent",
    "SWEResult",
    "SWETask",
    "TrialResult",
    "TurnRecord",
    "Workspace",
    "parse_action",
    "parse_calls",
    "parse_command",
    "summary_line",
    "turn_table",
]

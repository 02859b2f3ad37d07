"""The memory agent: after a completed exchange (in the background) it reads the new messages and decides
what to remember, by rules or, when one is configured, by an LLM with tools. Every change goes through the
memory services, so it is logged as a MemoryOperation (actor agent; actor_name the model, or "rules"; the
trigger names the tool or rule and the message #seq).

Its parts: run (one run: who decides, the cursor, the writes), queue (queueing a run after an exchange),
rules, standing and remember (what the rules keep), llm and tools (the LLM's tool loop), batch and report
(what a run reads and reports)."""

from memory.agent.queue import memory_agent_request
from memory.agent.report import AgentRun
from memory.agent.run import memory_agent_run
from memory.agent.standing import standing_kind, standing_statements

__all__ = [
    "AgentRun",
    "memory_agent_request",
    "memory_agent_run",
    "standing_kind",
    "standing_statements",
]

"""OpenAI Agents SDK as a Polar harness: a `triage` agent hands the task off to a `coder` agent, which writes
files with a `bash` tool. Copy it for your own agents; run it through adapters/openai-agents.yaml.

    polar-openai-agents MODEL TASK

The model client is the SDK's own (`OpenAIChatCompletionsModel` on an `AsyncOpenAI` client), which reads
OPENAI_BASE_URL and OPENAI_API_KEY, so it reaches Polar's proxy either way in. Each agent tags its requests
with its name in OpenAI's request `metadata` (ModelSettings.metadata): Polar's trajectories carry it as
`metadata.agent`, one chain per agent.
"""
from __future__ import annotations

import subprocess
import sys

from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, handoff,
                    set_tracing_disabled)
from agents.extensions import handoff_filters
from openai import AsyncOpenAI


@function_tool
def bash(command: str) -> str:
    """Run a shell command in the working directory and return its output."""
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120)
    return (done.stdout + done.stderr) or f"(exit status {done.returncode}, no output)"


def agents(model: str) -> Agent:
    """The triage agent, which hands off to the coder; both on one model client."""
    llm = OpenAIChatCompletionsModel(model=model, openai_client=AsyncOpenAI())
    coder = Agent(name="coder", model=llm, tools=[bash], model_settings=ModelSettings(metadata={"agent": "coder"}),
                  instructions="You are a coding agent. Do the task with the bash tool, then say what you did.")
    # The coder starts from the task alone: the handoff's own tool call and result are dropped from its input.
    to_coder = handoff(coder, input_filter=handoff_filters.remove_all_tools)
    return Agent(name="triage", model=llm, handoffs=[to_coder],
                 model_settings=ModelSettings(metadata={"agent": "triage"}),
                 instructions="You route tasks. Hand every coding task to the coder.")


def main(argv: list[str]) -> int:
    if argv == ["--help"]:
        print(__doc__)
        return 0
    if len(argv) != 2:
        print("usage: polar-openai-agents MODEL TASK", file=sys.stderr)
        return 2
    model, task = argv
    set_tracing_disabled(True)  # else the SDK uploads traces to OpenAI's tracing endpoint
    result = Runner.run_sync(agents(model), task, max_turns=10)
    print(f"[{result.last_agent.name}] {result.final_output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

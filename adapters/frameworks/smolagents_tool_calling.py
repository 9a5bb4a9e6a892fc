"""smolagents as a Polar harness: one `ToolCallingAgent` with a `bash` tool (and smolagents' own
`final_answer`). Copy it for your own agent; run it through adapters/smolagents.yaml.

    polar-smolagents MODEL TASK

The model client is smolagents' own `OpenAIServerModel` (the openai package underneath) on OPENAI_BASE_URL
and OPENAI_API_KEY, so it reaches Polar's proxy either way in. The agent tags its requests with its name in
OpenAI's request `metadata`, which Polar's trajectories carry as `metadata.agent`.
"""
from __future__ import annotations

import os
import subprocess
import sys

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

AGENT = "coder"


@tool
def bash(command: str) -> str:
    """Run a shell command in the working directory and return its output.

    Args:
        command: the shell command line to run.
    """
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120)
    return (done.stdout + done.stderr) or f"(exit status {done.returncode}, no output)"


def main(argv: list[str]) -> int:
    if argv == ["--help"]:
        print(__doc__)
        return 0
    if len(argv) != 2:
        print("usage: polar-smolagents MODEL TASK", file=sys.stderr)
        return 2
    model_id, task = argv
    model = OpenAIServerModel(model_id, api_base=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"],
                              metadata={"agent": AGENT})  # extra keyword arguments go into every request
    agent = ToolCallingAgent(tools=[bash], model=model, name=AGENT, max_steps=6, verbosity_level=0)
    print(agent.run(task))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""LangGraph as a Polar harness: two agents that talk to each other. A `coder` agent does the task with a
`bash` tool and reports; a `reviewer` agent reads the report and approves it or sends the coder back with
what to fix (at most ROUNDS reviews). Copy it for your own graph; run it through adapters/langgraph.yaml.

    polar-langgraph MODEL TASK

Each agent keeps its own conversation in the graph's state and calls the model through LangChain's own
`ChatOpenAI` client, which reads OPENAI_BASE_URL and OPENAI_API_KEY, so it reaches Polar's proxy either way
in. Each agent tags its requests with its name in OpenAI's request `metadata` (sent as `extra_body`):
Polar's trajectories carry it as `metadata.agent`, one chain per agent (and per review round).
"""
from __future__ import annotations

import operator
import subprocess
import sys
from typing import Annotated, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

ROUNDS = 2
CODER = "You are a coding agent. Do the task with the bash tool, then report what you did in one line."
REVIEWER = ("You review a coder's work. Reply 'Approved.' when the report shows the task is done, else say what "
            "the coder must fix.")


@tool
def bash(command: str) -> str:
    """Run a shell command in the working directory and return its output."""
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120)
    return (done.stdout + done.stderr) or f"(exit status {done.returncode}, no output)"


class Team(TypedDict):
    task: str
    coder: Annotated[list[AnyMessage], operator.add]  # the coder's conversation
    reviews: Annotated[list[str], operator.add]  # the reviewer's verdicts, one per round


def model(name: str, model_id: str) -> ChatOpenAI:
    return ChatOpenAI(model=model_id, temperature=0, extra_body={"metadata": {"agent": name}})


def build(model_id: str):
    coder_llm = model("coder", model_id).bind_tools([bash])
    reviewer_llm = model("reviewer", model_id)

    def coder(state: Team) -> dict:
        return {"coder": [coder_llm.invoke(state["coder"])]}

    def tools(state: Team) -> dict:
        calls = state["coder"][-1].tool_calls
        return {"coder": [ToolMessage(bash.invoke(c["args"]), tool_call_id=c["id"]) for c in calls]}

    def reviewer(state: Team) -> dict:
        report = state["coder"][-1].content
        ask = f"Task: {state['task']}\nThe coder reports: {report}"
        verdict = reviewer_llm.invoke([SystemMessage(REVIEWER), HumanMessage(ask)]).content
        back = [] if approved(verdict) else [HumanMessage(f"The reviewer says: {verdict}")]
        return {"reviews": [verdict], "coder": back}

    def after_coder(state: Team) -> str:
        return "tools" if state["coder"][-1].tool_calls else "reviewer"

    def after_review(state: Team) -> str:
        done = approved(state["reviews"][-1]) or len(state["reviews"]) >= ROUNDS
        return END if done else "coder"

    graph = StateGraph(Team)
    graph.add_node("coder", coder)
    graph.add_node("tools", tools)
    graph.add_node("reviewer", reviewer)
    graph.add_edge(START, "coder")
    graph.add_conditional_edges("coder", after_coder, ["tools", "reviewer"])
    graph.add_edge("tools", "coder")
    graph.add_conditional_edges("reviewer", after_review, ["coder", END])
    return graph.compile()


def approved(verdict: str) -> bool:
    return verdict.strip().lower().startswith("approved")


def main(argv: list[str]) -> int:
    if argv == ["--help"]:
        print(__doc__)
        return 0
    if len(argv) != 2:
        print("usage: polar-langgraph MODEL TASK", file=sys.stderr)
        return 2
    model_id, task = argv
    start = {"task": task, "coder": [SystemMessage(CODER), HumanMessage(task)], "reviews": []}
    final = build(model_id).invoke(start, {"recursion_limit": 20})
    print(f"[reviewer] {final['reviews'][-1]}")
    return 0 if approved(final["reviews"][-1]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`polar redteam TASKS`: a library of reward hacks (hacks.py), each a scripted policy that makes one shell call and
never does the task, run against a task file or Harbor folder with a real harness (runner.py); the table says
whether each one paid (cli.py). docs/tasks.md "Red team"."""

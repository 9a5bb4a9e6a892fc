"""What a task is: its plain values (task.py), the readers of task files, Harbor folders and SWE instances, its
starting workspace, the tests it expects, its steps. How a sample is scored lives in polar/scoring."""

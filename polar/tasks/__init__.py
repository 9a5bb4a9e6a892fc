"""Tasks (a YAML/JSONL spec per task) and the evaluators that score a finished sample."""

"""A conversation as the served model's token ids and back: the model (model.py), prompt ids from its chat template
with history substitution (prompt.py) and the shared prefix cache (prefix_cache.py); sampled ids to text
(detok.py) and to reasoning, content and tool calls (reply_parser.py)."""

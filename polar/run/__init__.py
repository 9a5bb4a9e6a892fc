"""polar run: one harness session or one scored sample on this machine, the services they start, their summary."""

"""Sandboxes: the runtime protocol (local, bwrap, apptainer), resource limits and the socket bridge to the proxy."""

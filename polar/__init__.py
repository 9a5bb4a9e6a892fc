"""polar: command line entry point."""

"""polar: the command line (polar.cli) and the single-machine side of Polar: run/, tasks/, harness/, sandbox/, report/."""

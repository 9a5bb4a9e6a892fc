"""polar report: a single-page HTML report of a batch folder (data, sections, SVG charts, token view)."""

"""The one-command pipeline: YAML config -> stages with reuse -> sweeps, report and recommendation."""

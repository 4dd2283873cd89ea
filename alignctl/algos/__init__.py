"""alignctl.algos."""

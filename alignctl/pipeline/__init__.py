"""alignctl.pipeline."""

"""alignctl.models."""

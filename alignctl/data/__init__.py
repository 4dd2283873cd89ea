"""alignctl.data."""

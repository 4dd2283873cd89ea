"""alignctl.eval."""

"""alignctl.rewards."""

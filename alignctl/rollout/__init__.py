"""alignctl.rollout."""

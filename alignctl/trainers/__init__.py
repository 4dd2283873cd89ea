"""alignctl.trainers."""
